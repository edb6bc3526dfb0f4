"""Snapshots: Delta-backed immutable releases, semantic versions, reproducible content, diff and verify.

Curated tables are written by hand here (one shard partition per institution, real PNG/npy payloads), so
every release is fast to publish; the end-to-end checks on a real build are in test_snapshot_api.py.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import os
import shutil
import uuid
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import yaml
from PIL import Image

from etl.snapshots import (
    FORMAT,
    PUBLISH_LOG,
    TABLES_DIR,
    SnapshotError,
    bump_version,
    content_hash,
    delta_table_id,
    diff,
    list_versions,
    publish,
    read_manifest,
    read_publish_log,
    verify,
)
from etl.storage import Storage, put_if_absent
from schemas.config import PROJECT_ROOT
from schemas.tables import SCHEMAS, SNAPSHOT_TABLES

DEID_CODES = (
    ("113100", "Basic Application Confidentiality Profile"),
    ("113107", "Retain Longitudinal Temporal Information Modified Dates Option"),
)


# ---- hand-built curated tables ------------------------------------------------------------------------------


def png_payload(seed: int, shape: tuple[int, int] = (24, 32)) -> tuple[bytes, np.ndarray]:
    """A random 8-bit grayscale image and its PNG bytes (lossless)."""
    arr = np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue(), arr


def npy_payload(seed: int, shape: tuple[int, int, int] = (3, 8, 8)) -> tuple[bytes, np.ndarray]:
    """A random float32 volume (HU-like) as the normaliser stores it (one ``.npy``)."""
    vol = np.random.default_rng(seed).uniform(-1000, 1000, shape).astype(np.float32)
    buf = io.BytesIO()
    np.save(buf, vol)
    return buf.getvalue(), vol


def _fill(schema: pa.Schema, rows: list[dict]) -> pa.Table:
    """Rows -> table; required fields the test does not care about get a neutral value of their type."""

    def neutral(f: pa.Field):
        if pa.types.is_list(f.type):
            return []
        if pa.types.is_integer(f.type):
            return 0
        if pa.types.is_floating(f.type):
            return 0.0
        if pa.types.is_binary(f.type):
            return b""
        return "x"

    full = [{f.name: r[f.name] if f.name in r else (None if f.nullable else neutral(f)) for f in schema} for r in rows]
    return pa.Table.from_pylist(full, schema=schema)


def institution_rows(inst: str, shard: int) -> dict[str, list[dict]]:
    """Rows of every table for one institution: 2 patients x 2 CR studies (1 PNG each, 1 pair), plus a CT
    volume for the first patient, VQA items over pairs and the CT study, splits, labels and mentions."""
    t: dict[str, list[dict]] = {k: [] for k in SNAPSHOT_TABLES}
    for j in range(2):
        patient = f"{inst}-p{j}"
        t["splits"].append(
            {"patient_key": patient, "institution": inst, "split": "train" if j == 0 else "test", "shard": shard}
        )
        studies = [f"{patient}-s{n}" for n in range(2)]
        for n, study in enumerate(studies):
            payload, _ = png_payload(zlib.crc32(f"{inst}/{j}/{n}".encode()))
            t["studies"].append(
                {
                    "study_key": study,
                    "patient_key": patient,
                    "institution": inst,
                    "country": "US",
                    "modality": "CR",
                    "family": "chest_xr",
                    "n_series": 1,
                    "n_images": 1,
                    "study_datetime": dt.datetime(2020 + n, 1, 1 + j),
                    "report_id": f"{study}-r",
                    "shard": shard,
                }
            )
            t["series"].append(
                {
                    "series_key": f"{study}-se",
                    "study_key": study,
                    "patient_key": patient,
                    "institution": inst,
                    "modality": "CR",
                    "n_instances": 1,
                    "shard": shard,
                }
            )
            t["images"].append(
                {
                    "image_key": f"{study}-i",
                    "series_key": f"{study}-se",
                    "study_key": study,
                    "patient_key": patient,
                    "institution": inst,
                    "modality": "CR",
                    "view": "PA",
                    "kind": "2d",
                    "rows": 24,
                    "cols": 32,
                    "n_slices": 1,
                    "spacing_mm": [0.2, 0.2],
                    "payload_format": "png",
                    "payload": payload,
                    "payload_sha256": hashlib.sha256(payload).hexdigest(),
                    "shape": [24, 32],
                    "dtype": "uint8",
                    "recipe": "{}",
                    "transfer_syntax": "1.2.840.10008.1.2.1",
                    "shard": shard,
                }
            )
            t["reports"].append(
                {
                    "report_id": f"{study}-r",
                    "study_key": study,
                    "patient_key": patient,
                    "institution": inst,
                    "language": "en",
                    "link_status": "linked",
                    "text": "No acute findings.",
                    "redactions": 0,
                    "redaction_counts": "{}",
                    "shard": shard,
                }
            )
            t["study_labels"].append(
                {
                    "study_key": study,
                    "patient_key": patient,
                    "family": "chest_xr",
                    "entity_id": "F001",
                    "state": "present" if n else "absent",
                    "change": "none",
                    "shard": shard,
                }
            )
            t["entity_mentions"].append(
                {
                    "mention_id": f"{study}-m0",
                    "report_id": f"{study}-r",
                    "study_key": study,
                    "patient_key": patient,
                    "entity_id": "F001",
                    "category": "finding",
                    "span_start": 0,
                    "span_end": 2,
                    "text": "x",
                    "assertion": "present",
                    "temporality": "current",
                    "change": "none",
                    "shard": shard,
                }
            )
        t["pairs"].append(
            {
                "pair_id": f"{patient}-pair",
                "patient_key": patient,
                "prior_study_key": studies[0],
                "current_study_key": studies[1],
                "family": "chest_xr",
                "modality": "CR",
                "view": "PA",
                "gap_days": 365,
                "n_conflicts": 0,
                "shard": shard,
                "change_labels": [{"entity_id": "F001", "change": "new", "source": "state_difference"}],
            }
        )
        t["vqa"].append(
            {
                "item_id": f"{patient}-q0",
                "pair_id": f"{patient}-pair",
                "patient_key": patient,
                "question_type": "change",
                "question": "Is there a new finding?",
                "study_keys": studies,
                "options": ["yes", "no"],
                "answer": "A",
                "answer_text": "yes",
                "entity_ids": ["F001"],
                "split": "train" if j == 0 else "test",
                "shard": shard,
            }
        )
    ct_study, patient = f"{inst}-ct", f"{inst}-p0"
    payload, _ = npy_payload(zlib.crc32(inst.encode()))
    t["studies"].append(
        {
            "study_key": ct_study,
            "patient_key": patient,
            "institution": inst,
            "country": "US",
            "modality": "CT",
            "n_series": 1,
            "n_images": 1,
            "shard": shard,
        }
    )
    t["images"].append(
        {
            "image_key": f"{ct_study}-v",
            "series_key": f"{ct_study}-se",
            "study_key": ct_study,
            "patient_key": patient,
            "institution": inst,
            "modality": "CT",
            "view": None,
            "kind": "3d",
            "rows": 8,
            "cols": 8,
            "n_slices": 3,
            "spacing_mm": [0.7, 0.7, 1.5],
            "payload_format": "npy",
            "payload": payload,
            "payload_sha256": hashlib.sha256(payload).hexdigest(),
            "shape": [3, 8, 8],
            "dtype": "float32",
            "recipe": "{}",
            "transfer_syntax": "1.2.840.10008.1.2",
            "shard": shard,
        }
    )
    t["vqa"].append(
        {
            "item_id": f"{ct_study}-q",
            "study_key": ct_study,
            "patient_key": patient,
            "question_type": "presence",
            "question": "Is there a nodule?",
            "study_keys": [ct_study],
            "options": ["yes", "no"],
            "answer": "B",
            "answer_text": "no",
            "entity_ids": ["F002"],
            "split": "train",
            "shard": shard,
        }
    )
    return t


def write_institution(st: Storage, inst: str, shard: int) -> dict[str, list[tuple]]:
    """Write one institution's rows as shard ``shard`` of every table; return the key tuples per table."""
    from schemas.base import key_columns

    keys = {}
    for table, rows in institution_rows(inst, shard).items():
        schema = SCHEMAS[table]
        st.write_table(f"curated/{table}/shard={shard:05d}/part-0.parquet", _fill(schema, rows))
        keys[table] = sorted(tuple(r[k] for k in key_columns(schema)) for r in rows)
    return keys


def do_publish(st: Storage, **overrides):
    kw = dict(
        config_hash="c" * 64,
        ontology_version="0.1.0",
        run_id="run-1",
        key_fingerprint="f" * 16,
        deid_method_codes=DEID_CODES,
    )
    return publish(st, **{**kw, **overrides})


@pytest.fixture()
def store(tmp_path) -> Storage:
    st = Storage.open(str(tmp_path / "root"))
    write_institution(st, "us-a", 0)
    write_institution(st, "gb-b", 1)
    return st


def _writable(st: Storage) -> None:
    for f in st.list_files("snapshots"):
        os.chmod(st.path(f), 0o644)


# ---- publish: versions, Delta, immutability ------------------------------------------------------------------


def test_first_publish_pins_one_delta_commit_per_table_and_is_read_only(store):
    from deltalake import DeltaTable

    rel = do_publish(store)
    m = rel.manifest
    assert (rel.version, rel.created, m["parent"], m["change"], m["format"]) == ("0.1.0", True, None, "initial", FORMAT)
    assert set(m["tables"]) == set(SNAPSHOT_TABLES)
    assert (
        m["tables"]["studies"]["rows"] == 10
        and m["tables"]["images"]["rows"] == 10
        and m["tables"]["pairs"]["rows"] == 4
    )
    assert m["schema_versions"] == {t: SCHEMAS[t].metadata[b"medreco.schema_version"].decode() for t in SNAPSHOT_TABLES}
    assert m["deid_method_codes"] == [list(c) for c in DEID_CODES]
    assert m["content_hash"] == content_hash(m)
    for t, v in m["tables"].items():
        # version 0 creates the table, version 1 is this release's commit; it holds exactly the manifest's files
        assert v["delta_version"] == 1, t
        dtab = DeltaTable(store.path(f"{TABLES_DIR}/{t}"), version=1)
        assert sorted(os.path.basename(u) for u in dtab.file_uris()) == sorted(f["path"] for f in v["files"])
        assert dtab.to_pyarrow_table().num_rows == v["rows"]
        for f in v["files"]:
            data = Path(store.path(f"{TABLES_DIR}/{t}/{f['path']}")).read_bytes()
            assert hashlib.sha256(data).hexdigest() == f["sha256"] and f["path"].endswith(
                f"-{f['sha256']}.zstd.parquet"
            )
            assert oct(os.stat(store.path(f"{TABLES_DIR}/{t}/{f['path']}")).st_mode & 0o777) == "0o444"
    assert oct(os.stat(store.path("snapshots/0.1.0/manifest.json")).st_mode & 0o777) == "0o444"
    assert verify(store, "0.1.0") == []


def test_publishing_unchanged_content_returns_the_existing_release(store):
    first = do_publish(store)
    again = do_publish(store, run_id="run-2")
    assert (again.version, again.created, again.manifest["content_hash"]) == (
        "0.1.0",
        False,
        first.manifest["content_hash"],
    )
    assert list_versions(store) == ["0.1.0"]
    # and no Delta commit was made for it
    assert all(not store.is_file(f"{TABLES_DIR}/{t}/_delta_log/{2:020d}.json") for t in SNAPSHOT_TABLES)


def _release_bytes(st: Storage) -> dict[str, bytes]:
    """Every file a release consists of (manifest, its sha256, card, data files, Delta commits), by path."""
    return {f: Path(st.path(f)).read_bytes() for f in st.list_files("snapshots") if not f.endswith(f"/{PUBLISH_LOG}")}


def test_rebuild_at_the_same_release_time_is_byte_identical(store, tmp_path, monkeypatch):
    """Same curated tables, config, code and key: a rebuild in a fresh root, by another run, with
    SOURCE_DATE_EPOCH set to the first release's ``source_date_epoch``, writes the same bytes: manifest
    (so manifest.sha256), card, data files and Delta commit files; then the next release too."""
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    a = do_publish(store)  # release time from the clock
    epoch = a.manifest["source_date_epoch"]
    assert a.manifest["created_at"] == dt.datetime.fromtimestamp(epoch, dt.UTC).isoformat(timespec="seconds")
    assert read_publish_log(store, "0.1.0")["source_date_epoch_from"] == "clock"
    other = Storage.open(str(tmp_path / "rebuilt"))
    shutil.copytree(store.path("curated"), other.path("curated"))
    monkeypatch.setenv("SOURCE_DATE_EPOCH", str(epoch))
    b = do_publish(other, run_id="another-run")
    assert b.manifest == a.manifest
    fa, fb = _release_bytes(store), _release_bytes(other)
    assert fa == fb
    assert (
        fa["snapshots/0.1.0/manifest.sha256"].decode().strip()
        == hashlib.sha256(fa["snapshots/0.1.0/manifest.json"]).hexdigest()
    )
    # all of it is there: per table one data file per non-empty curated partition (one empty file for an empty
    # table), its create and data commits; + 3 release files and the ecosystem files (views, Hugging Face card,
    # Croissant, one file list per table), byte-identical as well
    n_files = sum(len(v["files"]) for v in a.manifest["tables"].values())
    assert n_files == 2 * len(SNAPSHOT_TABLES) - 1  # two shards; retrieval_targets is empty
    assert len(a.manifest["release_files"]) == 2 + 2 + len(SNAPSHOT_TABLES)
    assert len(fa) == n_files + 2 * len(SNAPSHOT_TABLES) + 3 + len(a.manifest["release_files"])
    # only the publish logs differ: they hold the run ids and the wall-clock time
    la, lb = read_publish_log(store, "0.1.0"), read_publish_log(other, "0.1.0")
    assert (la["publish_run_id"], lb["publish_run_id"], lb["source_date_epoch_from"]) == (
        "run-1",
        "another-run",
        "SOURCE_DATE_EPOCH",
    )

    # the next delivery, published in both roots at the same (later) release time: 0.2.0 identical too,
    # Delta commit 2 included (add and remove actions)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", str(epoch + 86400))
    for st in (store, other):
        write_institution(st, "ie-c", 2)
        assert do_publish(st, run_id=f"run-{st.root[-4:]}").version == "0.2.0"
    fa, fb = _release_bytes(store), _release_bytes(other)
    assert fa == fb and f"{TABLES_DIR}/studies/_delta_log/{2:020d}.json" in fa
    assert read_manifest(store, "0.2.0")["created_at"] == dt.datetime.fromtimestamp(epoch + 86400, dt.UTC).isoformat(
        timespec="seconds"
    )
    assert verify(store, "0.2.0") == [] and verify(other, "0.2.0") == []


def test_delta_commits_carry_the_release_time_and_a_key_derived_table_id(store, monkeypatch):
    from deltalake import DeltaTable

    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    do_publish(store)
    first = [f["path"] for f in read_manifest(store, "0.1.0")["tables"]["studies"]["files"]]
    write_institution(store, "ie-c", 2)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700003600")
    rel = do_publish(store)
    log = [
        [
            json.loads(line)
            for line in Path(store.path(f"{TABLES_DIR}/studies/_delta_log/{v:020d}.json")).read_text().splitlines()
        ]
        for v in range(3)
    ]
    create, write1, write2 = log
    assert [next(iter(a)) for a in create] == ["commitInfo", "protocol", "metaData"]
    meta = create[2]["metaData"]
    assert (
        meta["id"]
        == delta_table_id("studies", "f" * 16)
        == str(uuid.uuid5(uuid.NAMESPACE_URL, f"medreco-db:{TABLES_DIR}/studies?key_fingerprint={'f' * 16}"))
    )
    assert delta_table_id("studies", "e" * 16) != meta["id"] != delta_table_id("pairs", "f" * 16)
    assert (meta["createdTime"], meta["configuration"]) == (1700000000000, {"delta.enableExpiredLogCleanup": "false"})
    # study_datetime is a timestamp without time zone: deltalake's protocol choice is kept
    assert create[1]["protocol"] == {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": ["timestampNtz"],
        "writerFeatures": ["timestampNtz"],
    }
    assert write1[0]["commitInfo"]["timestamp"] == 1700000000000
    assert [a["add"]["path"] for a in write1[1:]] == sorted(first)
    assert all(a["add"]["modificationTime"] == 1700000000000 for a in write1[1:])
    info = write2[0]["commitInfo"]
    assert (info["timestamp"], info["readVersion"], info["medreco.release"]) == (1700003600000, 1, "0.2.0")
    # content-addressed partition files: the new shard's file is added, the unchanged ones stay
    new = [f["path"] for f in rel.manifest["tables"]["studies"]["files"] if f["path"] not in first]
    assert [(k, a[k]["path"]) for a in write2[1:] for k in a] == [("add", p) for p in new] and len(new) == 1
    dtab = DeltaTable(store.path(f"{TABLES_DIR}/studies"))
    assert (dtab.metadata().id, dtab.version(), dtab.to_pyarrow_table().num_rows) == (meta["id"], 2, 15)
    assert [h["timestamp"] for h in dtab.history()] == [1700003600000, 1700000000000, 1700000000000]


def test_malformed_source_date_epoch_is_refused(store, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "2024-01-01")
    with pytest.raises(SnapshotError, match="SOURCE_DATE_EPOCH must be a whole number of seconds"):
        do_publish(store)
    assert list_versions(store) == [] and not store.exists(TABLES_DIR)
    # an explicit argument wins over the environment
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    rel = do_publish(store, source_date_epoch=86400)
    assert (rel.manifest["source_date_epoch"], rel.manifest["created_at"]) == (86400, "1970-01-02T00:00:00+00:00")
    with pytest.raises(SnapshotError, match="argument must be a whole number"):
        do_publish(store, source_date_epoch="-5")


def test_a_schema_change_commits_new_delta_metadata_and_protocol(store, monkeypatch):
    """A new column of a type the table's protocol lacks (timestamp without time zone on ``pairs``): the data
    commit carries a metaData (same table id, new schema) and an upgraded protocol; old versions still read."""
    from deltalake import DeltaTable

    from schemas import tables as snapshots

    first = do_publish(store)
    assert first.manifest["tables"]["pairs"]["delta_version"] == 1
    base = SCHEMAS["pairs"]
    wider = pa.schema(
        [*base, pa.field("reviewed_at", pa.timestamp("us"))],
        metadata={**base.metadata, b"medreco.schema_version": b"2.0.0"},
    )
    monkeypatch.setitem(snapshots.SCHEMAS, "pairs", wider)
    rel = do_publish(store)
    assert (rel.version, rel.manifest["tables"]["pairs"]["delta_version"]) == ("1.0.0", 2)
    actions = [
        json.loads(line)
        for line in Path(store.path(f"{TABLES_DIR}/pairs/_delta_log/{2:020d}.json")).read_text().splitlines()
    ]
    # both partitions are re-encoded in the new schema: their old files removed, the new ones added
    assert [next(iter(a)) for a in actions] == ["commitInfo", "protocol", "metaData", "remove", "remove", "add", "add"]
    assert actions[1]["protocol"] == {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": ["timestampNtz"],
        "writerFeatures": ["timestampNtz"],
    }
    assert actions[2]["metaData"]["id"] == delta_table_id("pairs", "f" * 16)
    new, old = DeltaTable(store.path(f"{TABLES_DIR}/pairs")), DeltaTable(store.path(f"{TABLES_DIR}/pairs"), version=1)
    assert "reviewed_at" in new.to_pyarrow_table().column_names
    assert "reviewed_at" not in old.to_pyarrow_table().column_names and old.to_pyarrow_table().num_rows == 4
    assert verify(store, "0.1.0") == [] and verify(store, "1.0.0") == []


def test_put_if_absent_creates_once(store):
    assert put_if_absent(store, "x/commit.json", b"first") is True
    assert put_if_absent(store, "x/commit.json", b"second") is False
    assert store.read_bytes("x/commit.json") == b"first" and store.list_files("x") == ["x/commit.json"]


def test_new_institution_is_a_minor_release_whose_diff_lists_exactly_its_rows(store):
    first = do_publish(store)
    added = write_institution(store, "ie-c", 2)  # a new institution's delivery: new shard partitions everywhere
    rel = do_publish(store, run_id="run-2")
    assert (rel.version, rel.created, rel.manifest["parent"], rel.manifest["change"]) == (
        "0.2.0",
        True,
        "0.1.0",
        "minor",
    )
    assert list_versions(store) == ["0.1.0", "0.2.0"]
    d = diff(store, "0.1.0", "0.2.0")
    assert set(d) == set(SNAPSHOT_TABLES)
    for t in SNAPSHOT_TABLES:
        if added[t]:
            assert (d[t].status, d[t].added, d[t].removed, d[t].changed) == ("changed", added[t], [], []), t
            assert rel.manifest["tables"][t]["delta_version"] == 2
        else:  # retrieval_targets: nothing delivered, nothing committed, same Delta version pinned
            assert (d[t].status, d[t].added) == ("unchanged", [])
            assert rel.manifest["tables"][t]["delta_version"] == first.manifest["tables"][t]["delta_version"]
    assert rel.manifest["tables"]["studies"]["rows"] == first.manifest["tables"]["studies"]["rows"] + 5
    # the old release still reads as it was (Delta time travel)
    from etl.snapshots import read_snapshot_table

    assert read_snapshot_table(store, "0.1.0", "studies").num_rows == 10
    assert verify(store, "0.1.0") == [] and verify(store, "0.2.0") == []


def test_diff_reports_changed_and_removed_rows_by_key(store):
    do_publish(store)
    store.delete("curated/pairs/shard=00001")  # gb-b's pairs withdrawn
    rows = institution_rows("us-a", 0)["studies"]
    rows[0]["n_images"] = 7  # one study corrected
    store.write_table("curated/studies/shard=00000/part-0.parquet", _fill(SCHEMAS["studies"], rows))
    assert do_publish(store).version == "0.2.0"
    d = diff(store, "0.1.0", "latest")
    assert (d["studies"].added, d["studies"].removed, d["studies"].changed) == ([], [], [(rows[0]["study_key"],)])
    assert (d["pairs"].added, d["pairs"].removed, d["pairs"].changed) == (
        [],
        [("gb-b-p0-pair",), ("gb-b-p1-pair",)],
        [],
    )
    assert d["images"].status == "unchanged" and d["study_labels"].key == ("study_key", "entity_id")


def test_metadata_only_change_is_a_patch_and_schema_change_a_major(store, monkeypatch):
    first = do_publish(store)
    patch = do_publish(store, config_hash="d" * 64)
    assert (patch.version, patch.manifest["change"]) == ("0.1.1", "patch")
    # tables identical: the same Delta versions are pinned, no commit was made
    assert {t: v["delta_version"] for t, v in patch.manifest["tables"].items()} == {
        t: v["delta_version"] for t, v in first.manifest["tables"].items()
    }
    assert do_publish(store, config_hash="d" * 64).created is False

    from schemas import tables as snapshots

    bumped = SCHEMAS["pairs"].with_metadata({**SCHEMAS["pairs"].metadata, b"medreco.schema_version": b"2.0.0"})
    monkeypatch.setitem(snapshots.SCHEMAS, "pairs", bumped)
    major = do_publish(store, config_hash="d" * 64)
    assert (major.version, major.manifest["change"], major.manifest["schema_versions"]["pairs"]) == (
        "1.0.0",
        "major",
        "2.0.0",
    )
    assert diff(store, "0.1.1", "1.0.0")["pairs"].schema == ("1.0.0", "2.0.0")


def test_bump_version_rules():
    assert bump_version(None, "initial") == "0.1.0"
    assert [bump_version("1.4.2", c) for c in ("major", "minor", "patch")] == ["2.0.0", "1.5.0", "1.4.3"]
    with pytest.raises(ValueError, match="unknown change kind"):
        bump_version("1.0.0", "huge")


def test_lineage_records_the_run_and_a_path_free_input_ledger_hash(store, tmp_path):
    from schemas.ledger import SCHEMA as LEDGER

    def ledger(st: Storage, run: str, source_prefix: str) -> None:
        rows = [
            {
                "run_id": run,
                "source_uri": f"{source_prefix}/sources/us-a/{i}.dcm",
                "sha256": f"{i:064x}",
                "bytes": 100 + i,
                "institution": "us-a",
                "kind": "dicom",
                "status": "quarantined" if i == 2 else "ingested",
                "reason": "not_dicom" if i == 2 else None,
            }
            for i in range(3)
        ]
        st.write_table(f"ledger/run_id={run}/ledger.parquet", _fill(LEDGER, rows))

    ledger(store, "run-1", "/hospital/a")
    lin = do_publish(store, run_ids=["ingest-us-a", "run-1"]).manifest["lineage"]
    # the manifest holds what is the same on every rebuild: the inputs' hash and counts, no run id
    assert set(lin) == {"input_ledger_sha256", "files_seen", "by_status", "quarantined_by_reason"}
    assert (lin["files_seen"], lin["by_status"], lin["quarantined_by_reason"]) == (
        3,
        {"ingested": 2, "quarantined": 1},
        {"not_dicom": 1},
    )
    # the runs are in the release's publish log
    log = read_publish_log(store, "latest")
    assert (log["version"], log["publish_run_id"], log["run_ids"], log["ledger_run_id"]) == (
        "0.1.0",
        "run-1",
        ["ingest-us-a", "run-1"],
        "run-1",
    )
    assert dt.datetime.fromisoformat(log["published_at"]).tzinfo is not None
    # the same inputs seen from another root and run: same hash, so the same content hash
    other = Storage.open(str(tmp_path / "other"))
    shutil.copytree(store.path("curated"), other.path("curated"))
    ledger(other, "run-9", "/mnt/elsewhere")
    rel = do_publish(other, run_id="run-9")
    assert rel.manifest["lineage"] == lin and read_publish_log(other, "0.1.0")["ledger_run_id"] == "run-9"
    assert rel.manifest["content_hash"] == read_manifest(store, "0.1.0")["content_hash"]
    card = other.read_text("snapshots/0.1.0/DATASET_CARD.md")
    assert "- quarantined: 1" in card and "not_dicom 1" in card


def test_dataset_card_counts(store):
    rel = do_publish(store)
    card = store.read_text(f"snapshots/{rel.version}/DATASET_CARD.md")
    assert hashlib.sha256(card.encode()).hexdigest() == rel.manifest["card_sha256"]
    # per institution: patients, studies, images, reports
    assert "| us-a | 2 | 5 | 5 | 4 |" in card and "| gb-b | 2 | 5 | 5 | 4 |" in card
    # per modality: studies, images, pairs
    assert "| CR | 8 | 8 | 4 |" in card and "| CT | 2 | 2 | 0 |" in card
    # per split: patients, studies, pairs, VQA items (the CT study and its item belong to a train patient)
    assert "| train | 2 | 6 | 2 | 4 |" in card and "| test | 2 | 4 | 2 | 2 |" in card
    # entity F001: present in the 4 current studies, 8 mentions
    assert any(line.startswith("| F001") and line.endswith("| 4 | 8 |") for line in card.splitlines())
    assert "- `113107` Retain Longitudinal Temporal Information Modified Dates Option" in card
    assert "## Known limitations" in card and "retrieval_targets" in card  # the empty table is named


# ---- verify -------------------------------------------------------------------------------------------------


def _data_file(st: Storage, table: str) -> str:
    f = read_manifest(st, "0.1.0")["tables"][table]["files"][0]["path"]
    return f"{TABLES_DIR}/{table}/{f}"


@pytest.mark.parametrize(
    ("tamper", "expected"),
    [
        (lambda st: open(st.path(_data_file(st, "pairs")), "ab").write(b"x"), "pairs: sha256 mismatch in {pairs}"),
        (lambda st: os.remove(st.path(_data_file(st, "vqa"))), "vqa: missing file {vqa}"),
        (
            lambda st: os.remove(st.path(f"{TABLES_DIR}/images/_delta_log/{1:020d}.json")),
            f"images: missing file {TABLES_DIR}/images/_delta_log/{1:020d}.json",
        ),
        (
            lambda st: open(st.path(f"{TABLES_DIR}/studies/_delta_log/{1:020d}.json"), "a").write("\n"),
            f"studies: sha256 mismatch in {TABLES_DIR}/studies/_delta_log/{1:020d}.json",
        ),
        (
            lambda st: open(st.path("snapshots/0.1.0/DATASET_CARD.md"), "a").write("edited"),
            "snapshots/0.1.0/DATASET_CARD.md: sha256 mismatch",
        ),
        (
            lambda st: open(st.path("snapshots/0.1.0/extra.parquet"), "wb").write(b"x"),
            "unlisted file snapshots/0.1.0/extra.parquet",
        ),
        (
            lambda st: open(st.path(f"snapshots/0.1.0/{PUBLISH_LOG}"), "w").write('{"version": "0.0.9"}'),
            f"snapshots/0.1.0/{PUBLISH_LOG}: not the publish log of 0.1.0",
        ),
    ],
    ids=[
        "tampered-data",
        "deleted-data",
        "deleted-delta-log",
        "tampered-delta-log",
        "edited-card",
        "extra-file",
        "foreign-publish-log",
    ],
)
def test_verify_names_the_tampered_or_missing_file(store, tamper, expected):
    do_publish(store)
    expected = expected.format(pairs=_data_file(store, "pairs"), vqa=_data_file(store, "vqa"))
    _writable(store)
    tamper(store)
    problems = verify(store, "0.1.0")
    assert any(expected in p for p in problems), problems
    with pytest.raises(SnapshotError, match="failed verification, refusing to publish"):
        do_publish(store, config_hash="e" * 64)


def test_verify_catches_an_edited_manifest(store):
    do_publish(store)
    _writable(store)
    m = read_manifest(store, "0.1.0")
    m["tables"]["studies"]["rows"] = 999
    m["tables"]["studies"]["files"][0]["rows"] = 999
    Path(store.path("snapshots/0.1.0/manifest.json")).write_text(json.dumps(m, indent=1, sort_keys=True))
    problems = verify(store, "0.1.0")
    assert "snapshots/0.1.0/manifest.json does not match manifest.sha256 (manifest edited)" in problems
    assert f"studies: 5 rows in {_data_file(store, 'studies')}, manifest says 999" in problems
    assert "snapshots/0.1.0/manifest.json: content_hash does not match its tables and metadata" in problems


def test_verify_and_read_refuse_an_unknown_release(store):
    do_publish(store)
    with pytest.raises(SnapshotError, match="no snapshot 9.9.9"):
        verify(store, "9.9.9")
    with pytest.raises(SnapshotError, match="no table 'nope'"):
        from etl.snapshots import read_snapshot_table

        read_snapshot_table(store, "0.1.0", "nope")


# ---- command line -------------------------------------------------------------------------------------------


@pytest.fixture()
def cli(store, tmp_path):
    from typer.testing import CliRunner

    from medreco.cli.app import app

    data = yaml.safe_load((PROJECT_ROOT / "config" / "demo.yaml").read_text())
    data["storage"]["root"] = store.root
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(data))
    runner = CliRunner()
    return lambda *args: runner.invoke(app, ["snapshot", *args, "--config", str(cfg)])


def test_cli_publish_list_show_diff_verify(cli, store):
    out = cli("publish")
    assert out.exit_code == 0, out.output
    version, state, chash, _ = out.stdout.strip().split("\t")
    assert (version, state) == ("0.1.0", "created")
    assert cli("publish").stdout.startswith("0.1.0\tunchanged\t" + chash)
    write_institution(store, "ie-c", 2)
    assert cli("publish").stdout.startswith("0.2.0\tcreated")
    listed = cli("list").stdout.strip().splitlines()
    assert listed[0].startswith("version\tcreated_at")  # a header row
    listed = listed[1:]
    assert [line.split("\t")[0] for line in listed] == ["0.1.0", "0.2.0"] and listed[1].split("\t")[2] == "minor"
    assert json.loads(cli("show", "latest").stdout)["version"] == "0.2.0"
    text = cli("diff", "0.1.0", "0.2.0").stdout
    assert "studies            changed        +5 -0 ~0" in text and "  + ie-c-ct" in text
    as_json = json.loads(cli("diff", "0.1.0", "0.2.0", "--json").stdout)
    assert as_json["pairs"]["added"] == [["ie-c-p0-pair"], ["ie-c-p1-pair"]]
    ok = cli("verify", "0.2.0")
    assert (ok.exit_code, ok.stdout.strip()) == (0, "snapshot 0.2.0: all files match the manifest")


def test_cli_verify_fails_with_one_line_naming_the_file(cli, store):
    assert cli("publish").exit_code == 0
    _writable(store)
    victim = _data_file(store, "images")
    os.remove(store.path(victim))
    out = cli("verify", "0.1.0")
    assert out.exit_code == 1
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("error: snapshot 0.1.0 failed verification:")
    assert f"images: missing file {victim}" in out.stderr
    missing = cli("show", "7.0.0")
    assert missing.exit_code == 1 and "no snapshot 7.0.0" in missing.stderr


# ---- S3 (moto) ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def moto_endpoint():
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def test_publish_verify_diff_and_load_on_s3(moto_endpoint, monkeypatch):
    import boto3
    import polars as pl

    from etl.snapshots import load_snapshot

    for k, v in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket="medreco-snap")
    st = Storage.open("s3://medreco-snap/deploy", endpoint_url=moto_endpoint)
    write_institution(st, "us-a", 0)
    first = do_publish(st)
    assert (first.version, first.path) == ("0.1.0", "s3://medreco-snap/deploy/snapshots/0.1.0")
    assert do_publish(st).created is False  # (versions, diff and Delta time travel: the local tests above)
    assert verify(st, "0.1.0") == []
    snap = load_snapshot("s3://medreco-snap/deploy", "latest", endpoint_url=moto_endpoint)
    assert snap.table("studies").select(pl.len()).collect().item() == 5  # polars through Delta on S3
    assert snap.dataset("pairs").count_rows() == 2
    keys = [
        o["Key"]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket="medreco-snap")
        for o in page.get("Contents", [])
    ]
    assert f"deploy/{TABLES_DIR}/studies/_delta_log/{1:020d}.json" in keys
    # Delta commits are conditional writes (If-None-Match): a second writer of the same version is refused
    log = f"{TABLES_DIR}/studies/_delta_log/{1:020d}.json"
    before = st.read_bytes(log)
    assert put_if_absent(st, log, b"{}") is False and st.read_bytes(log) == before
    assert (
        put_if_absent(st, "scratch/once.json", b"1") is True and put_if_absent(st, "scratch/once.json", b"2") is False
    )
    assert st.read_bytes("scratch/once.json") == b"1"
    st.delete("scratch")
    assert all(k.startswith("deploy/") for k in keys) and not [k for k in keys if "tmp" in k.rsplit("/", 1)[-1]]
    # tamper with one object in the bucket (not through our code): verify names it
    victim = f"deploy/{_data_file(st, 'pairs')}"
    s3.put_object(Bucket="medreco-snap", Key=victim, Body=b"not parquet")
    assert f"pairs: sha256 mismatch in {victim.removeprefix('deploy/')}" in " ".join(verify(st, "0.1.0"))


def test_a_release_adds_only_the_changed_partitions_and_rehashes_nothing_else(store, monkeypatch):
    """One changed partition: its file is hard-linked into the Delta table and added; the unchanged partitions are
    neither re-read nor re-hashed (partition hash cache), and keep their files; the old release still verifies."""
    import etl.snapshots.delta as delta

    monkeypatch.setattr(delta, "RACY_NS", 0)  # the fixture writes and publishes within the same second
    first = do_publish(store)
    rows = institution_rows("us-a", 0)["studies"]
    rows[0]["n_images"] = 7
    store.write_table("curated/studies/shard=00000/part-0.parquet", _fill(SCHEMAS["studies"], rows))
    hashed = []
    real = delta.sha256_file
    monkeypatch.setattr(delta, "sha256_file", lambda st, rel, *a: hashed.append(rel) or real(st, rel, *a))
    rel = do_publish(store)
    # hashed: the changed curated file, and its linked copy once placed
    assert [h for h in hashed if h.startswith("curated/")] == ["curated/studies/shard=00000/part-0.parquet"]
    changed = {
        t
        for t in SNAPSHOT_TABLES
        if rel.manifest["tables"][t]["delta_version"] != first.manifest["tables"][t]["delta_version"]
    }
    assert changed == {"studies"}
    old = {f["partition"]: f["path"] for f in first.manifest["tables"]["studies"]["files"]}
    new = {f["partition"]: f["path"] for f in rel.manifest["tables"]["studies"]["files"]}
    assert old["shard=00001/part-0.parquet"] == new["shard=00001/part-0.parquet"]
    assert old["shard=00000/part-0.parquet"] != new["shard=00000/part-0.parquet"]
    linked = store.path(f"{TABLES_DIR}/studies/{new['shard=00000/part-0.parquet']}")
    assert os.stat(linked).st_ino == os.stat(store.path("curated/studies/shard=00000/part-0.parquet")).st_ino
    assert read_publish_log(store, rel.version)["data_bytes_added"] == os.stat(linked).st_size
    assert verify(store, "0.1.0") == [] and verify(store, rel.version) == []
    assert diff(store, "0.1.0", rel.version)["studies"].changed == [(rows[0]["study_key"],)]
