"""Benchmark: the build's quality task on synthetic curated metadata at sizes that double, its peak RSS and seconds.

What is built. A storage root holding only what the quality task reads, written directly in the curated layout
(:mod:`etl.zones`): every curated table as one partition file per shard (``images`` partitioned by institution,
modality and shard), no pixels (payload columns null: the task never reads them), and this run's plan, ledger,
ledger balance and per-shard payload-integrity records. ``images`` has ``--sizes`` rows; the other tables are in
proportion (a series per 10 images, a study per 20, a patient per 40; a report, a label, a retrieval target per
study; two entity mentions per report; a pair and a VQA item per two studies; a ledger row per image). Rows per
shard are fixed (``--rows-per-shard``, default 25,000 images): the archive doubles, so do its shards, as a real
deployment's shard count follows its archive (a task is bounded by one shard, not by a fixed share of the archive).
Values are clean (every gate passes), so the figures are those of a publishing build.

How it is run. Each size's quality task (:func:`quality.gate.quality_stage`, the DAG task's callable) runs in a
fresh Python process; the process reports its own peak resident set (``VmHWM``, see ``bench_build.py`` for why not
``ru_maxrss``) and the stage's seconds. A ``floor`` process (imports only) gives the interpreter's share.

Ends with ``BENCH quality rows=<sizes> rss=<MiB each> rss_ratio=<per doubling, worst> s=<each>
s_per_row=<each> floor_rss=<MiB>``. Target: ``rss_ratio <= 1.2``.

Usage: ``python benchmarks/bench_quality.py [--sizes 200000,400000] [--rows-per-shard 25000] [--keep DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RUN_ID = "bench-quality-run"
BENCH_KEY = "medreco-bench-key-" + "cd" * 24
INSTITUTION = "bench-inst"


def _peak_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


# ---- the synthetic root ---------------------------------------------------------------------------------


def _tables(lo: int, hi: int, shard: int):
    """Every curated table's rows for images ``lo..hi`` (one shard), as pyarrow tables of the schemas."""
    import datetime as dt

    import pyarrow as pa

    from schemas.tables import SCHEMAS

    def table(name: str, n: int, cols: dict) -> pa.Table:
        s = SCHEMAS[name]
        arrays = [pa.array(cols[f.name], type=f.type) if f.name in cols else pa.nulls(n, f.type) for f in s]
        return pa.Table.from_arrays(arrays, schema=s)

    def const(v, n):
        return [v] * n

    img = range(lo, hi)
    ser = range(lo // 10, hi // 10)
    stu = range(lo // 20, hi // 20)
    pat = range(lo // 40, hi // 40)
    n_i, n_se, n_st, n_p = len(img), len(ser), len(stu), len(pat)
    k = lambda p, r: [f"{p}{i:09d}" for i in r]  # noqa: E731
    base = dt.datetime(2015, 1, 1, 8, 0)
    when = [base + dt.timedelta(days=(i % 3000), minutes=i % 600) for i in stu]
    out = {
        "images": table(
            "images",
            n_i,
            {
                "image_key": k("i", img),
                "series_key": [f"se{i // 10:09d}" for i in img],
                "study_key": [f"st{i // 20:09d}" for i in img],
                "patient_key": [f"p{i // 40:09d}" for i in img],
                "institution": const(INSTITUTION, n_i),
                "modality": const("CT", n_i),
                "view": const("AXIAL", n_i),
                "kind": const("3d", n_i),
                "rows": const(512, n_i),
                "cols": const(512, n_i),
                "n_slices": const(200, n_i),
                "spacing_mm": const([0.75, 0.75, 1.5], n_i),
                "payload_format": const("nifti", n_i),
                "payload_sha256": [f"{i:064x}" for i in img],
                "payload_uri": [f"curated/volumes/{i:064x}.nii.gz" for i in img],
                "payload_bytes": const(30_000_000, n_i),
                "shape": const([200, 512, 512], n_i),
                "dtype": const("int16", n_i),
                "origin_mm": const([0.0, 0.0, 0.0], n_i),
                "direction": const([1.0, 0, 0, 0, 1, 0, 0, 0, 1], n_i),
                "recipe": const('{"resample": "linear"}', n_i),
                "transfer_syntax": const("1.2.840.10008.1.2.1", n_i),
                "shard": const(shard, n_i),
            },
        )
    }
    out["series"] = table(
        "series",
        n_se,
        {
            "series_key": k("se", ser),
            "study_key": [f"st{i // 2:09d}" for i in ser],
            "patient_key": [f"p{i // 4:09d}" for i in ser],
            "institution": const(INSTITUTION, n_se),
            "modality": const("CT", n_se),
            "orientation": const("AXIAL", n_se),
            "spacing_mm": const([0.75, 0.75, 1.5], n_se),
            "n_instances": const(200, n_se),
            "manufacturer": const("BENCH", n_se),
            "shard": const(shard, n_se),
        },
    )
    out["studies"] = table(
        "studies",
        n_st,
        {
            "study_key": k("st", stu),
            "patient_key": [f"p{i // 2:09d}" for i in stu],
            "institution": const(INSTITUTION, n_st),
            "country": const("US", n_st),
            "modality": const("CT", n_st),
            "body_part": const("CHEST", n_st),
            "family": const("3D-CT", n_st),
            "study_datetime": when,
            "study_date_shifted": [w.date() for w in when],
            "n_series": const(2, n_st),
            "n_images": const(20, n_st),
            "report_id": k("r", stu),
            "shard": const(shard, n_st),
        },
    )
    text = "Findings: small nodule in the right upper lobe. Impression: stable."
    out["reports"] = table(
        "reports",
        n_st,
        {
            "report_id": k("r", stu),
            "study_key": k("st", stu),
            "patient_key": [f"p{i // 2:09d}" for i in stu],
            "institution": const(INSTITUTION, n_st),
            "language": const("en", n_st),
            "link_status": const("linked", n_st),
            "findings": const("small nodule in the right upper lobe", n_st),
            "impression": const("stable", n_st),
            "text": const(text, n_st),
            "redactions": const(0, n_st),
            "redaction_counts": const("{}", n_st),
            "report_date_shifted": [w.date() for w in when],
            "shard": const(shard, n_st),
        },
    )
    men = range(2 * stu.start, 2 * stu.stop)
    out["entity_mentions"] = table(
        "entity_mentions",
        len(men),
        {
            "mention_id": k("m", men),
            "report_id": [f"r{i // 2:09d}" for i in men],
            "study_key": [f"st{i // 2:09d}" for i in men],
            "patient_key": [f"p{i // 4:09d}" for i in men],
            "entity_id": const(_CONCEPT, len(men)),
            "category": const("finding", len(men)),
            "span_start": const(10, len(men)),
            "span_end": const(16, len(men)),
            "text": const("nodule", len(men)),
            "assertion": const(_ASSERTION, len(men)),
            "temporality": const(_TEMPORALITY, len(men)),
            "change": const(_CHANGE, len(men)),
            "shard": const(shard, len(men)),
        },
    )
    out["study_labels"] = table(
        "study_labels",
        n_st,
        {
            "study_key": k("st", stu),
            "patient_key": [f"p{i // 2:09d}" for i in stu],
            "family": const("3D-CT", n_st),
            "entity_id": const(_CONCEPT, n_st),
            "state": const(_STATE, n_st),
            "change": const(_CHANGE, n_st),
            "shard": const(shard, n_st),
        },
    )
    prs = range(stu.start // 2, stu.stop // 2)  # pair j: studies 2j (prior) and 2j+1 (current) of patient j
    out["pairs"] = table(
        "pairs",
        len(prs),
        {
            "pair_id": k("pr", prs),
            "patient_key": k("p", prs),
            "prior_study_key": [f"st{2 * j:09d}" for j in prs],
            "current_study_key": [f"st{2 * j + 1:09d}" for j in prs],
            "family": const("3D-CT", len(prs)),
            "modality": const("CT", len(prs)),
            "view": const("AXIAL", len(prs)),
            "gap_days": [
                round(((when[2 * j + 1 - stu.start] - when[2 * j - stu.start]).total_seconds()) / 86400) for j in prs
            ],
            "change_labels": const([{"entity_id": _CONCEPT, "change": "unchanged", "source": "stated"}], len(prs)),
            "n_conflicts": const(0, len(prs)),
            "shard": const(shard, len(prs)),
        },
    )
    letters = [chr(ord("A") + j % 4) for j in prs]
    opts = ["yes", "no", "unsure", "not stated"]
    out["vqa"] = table(
        "vqa",
        len(prs),
        {
            "item_id": k("q", prs),
            "pair_id": k("pr", prs),
            "study_key": [f"st{2 * j + 1:09d}" for j in prs],
            "patient_key": k("p", prs),
            "question_type": const("change", len(prs)),
            "answer_format": const("multiple_choice", len(prs)),
            "question": const("Is the nodule unchanged?", len(prs)),
            "options": const(opts, len(prs)),
            "answer": letters,
            "answer_text": [opts[j % 4] for j in prs],
            "entity_ids": const([_CONCEPT], len(prs)),
            "split": const("train", len(prs)),
            "shard": const(shard, len(prs)),
        },
    )
    out["splits"] = table(
        "splits",
        n_p,
        {
            "patient_key": k("p", pat),
            "institution": const(INSTITUTION, n_p),
            "split": const("train", n_p),
            "shard": const(shard, n_p),
        },
    )
    out["retrieval_targets"] = table(
        "retrieval_targets",
        n_st,
        {
            "query_study_key": k("st", stu),
            "entity_id": const(_CONCEPT, n_st),
            "candidate_study_key": [f"st{i ^ 1:09d}" for i in stu],
            "rank": const(1, n_st),
            "relevance": const(0.5, n_st),
            "family": const("3D-CT", n_st),
            "state": const(_STATE, n_st),
            "query_patient_key": [f"p{i // 2:09d}" for i in stu],
            "candidate_patient_key": [f"p{(i ^ 1) // 2:09d}" for i in stu],
            "split": const("train", n_st),
            "shard": const(shard, n_st),
        },
    )
    out["ledger"] = table(
        "ledger",
        n_i,
        {
            "run_id": const(RUN_ID, n_i),
            "source_uri": [f"sources/{INSTITUTION}/f{i:09d}.dcm" for i in img],
            "sha256": [f"{i:064x}" for i in img],
            "bytes": const(525_000, n_i),
            "institution": const(INSTITUTION, n_i),
            "kind": const("dicom", n_i),
            "shard": const(shard, n_i),
            "status": const("ingested", n_i),
            "stage": const("normalise", n_i),
        },
    )
    return out


def _vocabulary() -> None:
    """Valid codes from the project's own enums (so the synthetic rows pass every gate)."""
    global _CONCEPT, _ASSERTION, _TEMPORALITY, _CHANGE, _STATE
    from schemas.entity_mentions import ASSERTIONS, CHANGES, TEMPORALITIES
    from schemas.ontology import load_ontology
    from schemas.study_labels import STATES

    _CONCEPT = sorted(load_ontology().concepts)[0]
    _ASSERTION, _TEMPORALITY, _STATE = ASSERTIONS[0], TEMPORALITIES[0], STATES[0]
    _CHANGE = "unchanged" if "unchanged" in CHANGES else CHANGES[0]


def build_root(rows: int, rows_per_shard: int, root: Path) -> Path:
    """Write the synthetic root for ``rows`` images rows; returns its config file."""
    import pyarrow as pa
    import yaml

    from etl import zones
    from etl.storage import Storage

    _vocabulary()
    shards = max(1, rows // rows_per_shard)
    data = yaml.safe_load((ROOT / "config" / "demo.yaml").read_text())
    data.update(name="medreco-bench-quality", storage={"root": str(root)}, shard_count=shards)
    root.mkdir(parents=True, exist_ok=True)
    cfg = root.parent / f"{root.name}.yaml"
    cfg.write_text(yaml.safe_dump(data, sort_keys=False))
    st = Storage.open(str(root))
    ledgers = []
    for s in range(shards):
        lo, hi = s * rows_per_shard, (s + 1) * rows_per_shard if s < shards - 1 else rows
        for name, t in _tables(lo, hi, s).items():
            if name == "ledger":
                ledgers.append(t)
            elif name == "images":
                st.write_table(zones.curated_modality_partition(name, INSTITUTION, "CT", s), t)
            else:
                st.write_table(zones.curated_partition(name, s), t)
        st.write_text(
            zones.incremental_state("normalise", s),
            json.dumps({"result": {"payload_integrity": {"rows": hi - lo, "verified": hi - lo, "mismatches": []}}}),
        )
    ledger = pa.concat_tables(ledgers)
    st.write_table(zones.ledger_file(RUN_ID), ledger)
    run_dir = zones.run_dir(RUN_ID)
    st.write_table(f"{run_dir}/plan.parquet", ledger.select(["sha256"]))
    st.write_text(
        f"{run_dir}/ledger_balance.json", json.dumps({"ingested": rows, "quarantined": 0, "duplicate": 0, "skipped": 0})
    )
    return cfg


# ---- the child: the quality task in this process --------------------------------------------------------


def _child(cfg: str, out: str) -> None:
    from etl.pipeline.context import BuildContext
    from etl.pipeline.runtime import quiet_library_logs
    from quality.gate import quality_stage

    quiet_library_logs()
    t = time.perf_counter()
    result = None
    if cfg != "floor":
        result = quality_stage(BuildContext.from_config_file(cfg, run_id=RUN_ID))
    Path(out).write_text(json.dumps({"s": time.perf_counter() - t, "peak_rss": _peak_rss(), "result": result}))


def run_quality(cfg: str, env: dict) -> dict:
    """The quality task for the root of ``cfg`` (or ``"floor"``) in a fresh process: ``{"s", "peak_rss", "cpu_s"}``.

    Raises
    ------
    RuntimeError
        when the task fails (the stderr's last lines are in the message).
    """
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp) / "out.json", Path(tmp) / "err"
        with open(err, "wb") as ferr:
            proc = subprocess.Popen(
                [sys.executable, __file__, "--child", cfg, str(out)], stdout=subprocess.DEVNULL, stderr=ferr, env=env
            )
            _, status, usage = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            tail = err.read_text(errors="replace").strip().splitlines()[-8:]
            raise RuntimeError("quality task failed: " + " | ".join(tail))
        data = json.loads(out.read_text())
    data["cpu_s"] = usage.ru_utime + usage.ru_stime
    return data


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="200000,400000", help="images rows per size (comma-separated, doubling)")
    p.add_argument("--rows-per-shard", type=int, default=25_000)
    p.add_argument("--keep", help="build the roots under this folder and keep them")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        _child(*a.child)
        return
    sizes = [int(x) for x in a.sizes.split(",")]
    env = {
        **os.environ,
        "MEDRECO_PSEUDONYM_KEY": os.environ.get("MEDRECO_PSEUDONYM_KEY", BENCH_KEY),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="bench-quality-"))
    load = os.getloadavg()
    try:
        floor = run_quality("floor", env)
        figs = []
        for n in sizes:
            t = time.perf_counter()
            cfg = build_root(n, a.rows_per_shard, work / f"root-{n}")
            gen_s = time.perf_counter() - t
            f = run_quality(str(cfg), env)
            figs.append(f)
            print(
                f"rows={n} shards={max(1, n // a.rows_per_shard)} generate_s={gen_s:.1f} quality_s={f['s']:.1f} "
                f"cpu_s={f['cpu_s']:.1f} peak_rss_mib={f['peak_rss'] / 2**20:.0f} checks={f['result']['checks']} "
                f"warnings={f['result']['warnings']}",
                flush=True,
            )
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    mib = [f["peak_rss"] / 2**20 for f in figs]
    ratios = [mib[i + 1] / mib[i] for i in range(len(mib) - 1)]
    print(
        f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
        f"floor_rss={floor['peak_rss'] / 2**20:.0f} MiB"
    )
    print(
        "BENCH quality rows="
        + ",".join(map(str, sizes))
        + " rss_mib="
        + ",".join(f"{m:.0f}" for m in mib)
        + f" rss_ratio={max(ratios, default=1.0):.3f} s="
        + ",".join(f"{f['s']:.1f}" for f in figs)
        + " s_per_row="
        + ",".join(f"{f['s'] / n:.2e}" for f, n in zip(figs, sizes, strict=True))
        + f" floor_rss_mib={floor['peak_rss'] / 2**20:.0f}"
    )


if __name__ == "__main__":
    main()
