"""Incremental ingestion: a second delivery ingests only its new files, re-delivered files are duplicates,
untouched shards are kept, the snapshot's diff lists exactly the additions, and the result equals a clean
build of both deliveries (same snapshot content hash)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import config_for

pytestmark = pytest.mark.slow  # runs the build stages several times

INST = "ie-cork-mercy"
#: the delivery held back from the first run: one MR study (its folder) and its report
HELD_STUDY = "MR_20200427"
SHARDS = 4


def build(cfg_path: Path, run_id: str) -> dict:
    """Every stage of the build DAG in its order (dags/medreco_build.py), in this process, then publish.

    The quality gate is left out (it is tested on the whole DAG in test_build_e2e); returns the per-shard
    stage results and the run summary.
    """
    from etl.pipeline import stages
    from etl.pipeline.context import BuildContext
    from etl.pipeline.ledger import finalise
    from etl.pipeline.publish_stage import publish_stage

    ctx = BuildContext.from_config_file(cfg_path, run_id=run_id)
    ctx.check_key()
    for inst in ctx.cfg.institutions:
        stages.discover(ctx, inst.id)
    shards = [s for batch in stages.plan(ctx) for s in batch]
    out = {"deidentify": [stages.deidentify_shard(ctx, s) for s in shards]}
    out["normalise"] = [stages.normalise_shard(ctx, s) for s in shards]
    stages.reports(ctx)
    out["entities"] = [stages.entities_shard(ctx, s) for s in shards]
    out["assemble"] = [stages.assemble_shard(ctx, s) for s in shards]
    stages.retrieval(ctx)
    out["ledger"] = finalise(ctx)
    out["summary"] = publish_stage(ctx)
    out["ctx"] = ctx
    return out


def _split_delivery(template: Path, first: Path, second: Path) -> tuple[list[str], str]:
    """Delivery 1 (``first``): the corpus without one study and its report. Delivery 2 (``second``): that
    study, its report in a new report file, and a re-delivered copy of a file of delivery 1."""
    shutil.copytree(template / "sources", first / "sources")
    dicom = next((first / "sources" / INST / "dicom").glob(f"*/{HELD_STUDY}"))
    held = sorted(str(p.relative_to(first)) for p in dicom.rglob("*.dcm"))
    shutil.move(str(dicom), second / "study")
    reports = first / "sources" / INST / "reports" / "reports.jsonl"
    lines = reports.read_text().splitlines(keepends=True)
    uids = {json.loads(line)["study_instance_uid"] for line in lines}
    held_uid = next(u for u in uids if _study_uid(second / "study") == u)
    keep = [ln for ln in lines if json.loads(ln)["study_instance_uid"] != held_uid]
    reports.write_text("".join(keep))
    (second / "reports-0002.jsonl").write_text("".join(ln for ln in lines if ln not in keep))
    return held, str(dicom.relative_to(first))


def _study_uid(folder: Path) -> str:
    import pydicom

    return str(pydicom.dcmread(next(folder.glob("*.dcm")), stop_before_pixels=True).StudyInstanceUID)


def _deliver_second(root: Path, staged: Path, study_rel: str) -> list[str]:
    """Put delivery 2 under ``root``'s sources; returns its new files (root-relative)."""
    shutil.copytree(staged / "study", root / study_rel)
    shutil.copy(staged / "reports-0002.jsonl", root / "sources" / INST / "reports" / "reports-0002.jsonl")
    redelivered = root / "sources" / INST / "dicom" / "redelivered" / "IM0001.dcm"
    redelivered.parent.mkdir(parents=True)
    shutil.copy(next((root / study_rel).parent.glob("MR_2017*/IM0001.dcm")), redelivered)
    return sorted(
        [str(p.relative_to(root)) for p in (root / study_rel).rglob("*.dcm")]
        + [f"sources/{INST}/reports/reports-0002.jsonl"]
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from etl.demo.corpus import generate_corpus

    base = tmp_path_factory.mktemp("incremental")
    template = base / "template"
    generate_corpus(template, seed=7, n_patients=8)
    inc, full, staged = base / "inc", base / "full", base / "staged"
    for p in (inc, full, staged):
        p.mkdir()
    held, study_rel = _split_delivery(template, inc, staged)
    # the clean build sees both deliveries at once
    shutil.copytree(inc / "sources", full / "sources")
    _deliver_second(full, staged, study_rel)
    cfg_inc = config_for(inc, shard_count=SHARDS, max_map_length=2)
    first = build(cfg_inc, "run-1")
    v1_tables = _tables(first["ctx"].storage, first["summary"]["version"])
    new_files = _deliver_second(inc, staged, study_rel)
    second = build(cfg_inc, "run-2")
    clean = build(config_for(full, shard_count=SHARDS, max_map_length=2), "clean")
    return {
        "inc": inc,
        "first": first,
        "second": second,
        "clean": clean,
        "new_files": new_files,
        "held": held,
        "v1_tables": v1_tables,
    }


def _tables(storage, version: str) -> dict[str, pa.Table]:
    from etl.snapshots import read_manifest, read_snapshot_table

    return {t: read_snapshot_table(storage, version, t) for t in read_manifest(storage, version)["tables"]}


def _ledger(run) -> list[dict]:
    ctx = run["ctx"]
    return ctx.storage.read_table(ctx.ledger_path).to_pylist()


def test_second_run_ingests_exactly_the_new_files(runs):
    inc = str(runs["inc"])
    first = {r["source_uri"]: r for r in _ledger(runs["first"])}
    second = {r["source_uri"]: r for r in _ledger(runs["second"])}
    new = {f"{inc}/{f}" for f in runs["new_files"]}
    redelivered = f"{inc}/sources/{INST}/dicom/redelivered/IM0001.dcm"
    assert set(second) == set(first) | new | {redelivered}
    assert {u for u, r in second.items() if r["status"] == "ingested"} == new
    # every file of the first delivery: its first outcome stands, re-seen content is a duplicate
    for uri, r in first.items():
        want = {"ingested": "duplicate", "duplicate": "duplicate"}.get(r["status"], r["status"])
        assert second[uri]["status"] == want, uri
        if want == "duplicate":
            assert (second[uri]["reason"], second[uri]["duplicate_of"]) == ("seen_in_earlier_run", uri)
            assert second[uri]["detail"] == "same sha256 as a file recorded in run run-1"
        if want == "quarantined":
            assert second[uri]["reason"] == r["reason"] and "run run-1" in second[uri]["detail"]
    # the same bytes at a new path: a duplicate naming the run and path it repeats
    original = next(u for u in first if u.endswith("IM0001.dcm") and "/MR_2017" in u and f"/{INST}/" in u)
    assert (second[redelivered]["status"], second[redelivered]["duplicate_of"]) == ("duplicate", original)
    assert second[redelivered]["sha256"] == first[original]["sha256"]
    for run in ("first", "second"):
        b = runs[run]["ledger"]
        assert b["balanced"] and b["files_seen"] == b["ingested"] + b["quarantined"] + b["duplicate"] + b["skipped"]
    assert runs["second"]["ledger"]["ingested"] == len(new)


def test_untouched_shards_are_kept(runs):
    from etl.pipeline.incremental import deid_inputs as _deid_inputs

    ctx = runs["second"]["ctx"]
    plan = _deid_inputs(ctx, 0).to_arrow().schema  # the plan exists for the run
    assert "seen_run" in plan.names
    inc = str(runs["inc"])
    new = {f"{inc}/{f}" for f in runs["new_files"] if f.endswith(".dcm")}
    import polars as pl

    from etl.pipeline.incremental import read_plan as _plan

    dirty = set(_plan(ctx).filter(pl.col("source_uri").is_in(list(new)))["shard"].to_list())
    assert len(dirty) == 1
    for stage in ("deidentify", "normalise", "entities", "assemble"):
        skipped = {r["shard"] for r in runs["second"][stage] if r["skipped"]}
        assert skipped == set(range(SHARDS)) - dirty, stage
    assert not any(r["skipped"] for r in runs["first"]["deidentify"])


def test_snapshot_is_minor_and_diff_lists_exactly_the_additions(runs):
    from etl.snapshots import diff

    s1, s2 = runs["first"]["summary"], runs["second"]["summary"]
    assert (s1["version"], s2["version"], s2["change"]) == ("0.1.0", "0.2.0", "minor")
    ctx = runs["second"]["ctx"]
    d = diff(ctx.storage, s1["version"], s2["version"])
    v1, v2 = runs["v1_tables"], _tables(ctx.storage, s2["version"])
    for table, td in d.items():
        key = list(td.key)
        k1 = set(zip(*(v1[table][k].to_pylist() for k in key)))
        k2 = set(zip(*(v2[table][k].to_pylist() for k in key)))
        assert set(td.added) == k2 - k1 and set(td.removed) == k1 - k2, table
    # the tables of the delivered files: additions only, exactly the new instances and their report
    new_sops = {
        e["sop_key"]
        for e in ctx.storage.read_table(f"{ctx.run_dir}/events/deidentify").to_pylist()
        if e["status"] == "ingested"
        and e["source_uri"].split("/sources/", 1)[1] in {f.removeprefix("sources/") for f in runs["new_files"]}
    }
    assert len(new_sops) == len(runs["held"]) > 0
    instances = ctx.storage.read_table("curated/instances").to_pylist()
    new_study = {r["study_key"] for r in instances if r["sop_key"] in new_sops}
    assert len(new_study) == 1
    assert d["studies"].added == [tuple(new_study)]
    for table in ("images", "series", "studies", "reports"):
        assert d[table].added and not d[table].removed and not d[table].changed, table
        rows = v2[table].to_pylist()
        of_new = {tuple(r[k] for k in d[table].key) for r in rows if r["study_key"] in new_study}
        assert set(d[table].added) == of_new, table


def _inputs_digest(ctx) -> str:
    """sha256 of a run's clean-view ledger rows as the snapshot's input lineage hashes them."""
    import hashlib

    t = ctx.storage.read_table(ctx.inputs_ledger_path)
    cols = ("institution", "sha256", "bytes", "kind", "status", "reason")
    rows = sorted(zip(*(t[c].to_pylist() for c in cols)), key=lambda r: tuple(str(x) for x in r))
    return hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()


def test_equals_a_clean_build_of_both_deliveries(runs):
    second, clean = runs["second"]["summary"], runs["clean"]["summary"]
    assert second["tables"] == clean["tables"]
    st_i, st_c = runs["second"]["ctx"].storage, runs["clean"]["ctx"].storage
    assert st_i.list_files("curated") == st_c.list_files("curated")
    for rel in st_c.list_files("curated"):
        assert st_i.read_bytes(rel) == st_c.read_bytes(rel), rel
    # the clean-view ledger of the incremental run is the clean build's ledger (paths and run ids aside)
    assert _inputs_digest(runs["second"]["ctx"]) == _inputs_digest(runs["clean"]["ctx"])
    clean_ledger = st_c.read_table(runs["clean"]["ctx"].ledger_path)
    assert _inputs_digest(runs["clean"]["ctx"]) != _inputs_digest(runs["first"]["ctx"])
    assert clean_ledger.num_rows == st_i.read_table(runs["second"]["ctx"].inputs_ledger_path).num_rows
    # hence the same snapshot (needs etl.snapshots.input_ledger_summary to hash inputs.parquet)
    assert second["content_hash"] == clean["content_hash"]
