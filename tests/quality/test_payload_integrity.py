"""Issue 20 item 2: the quality task never reads a payload; payload hashes are checked where payloads are written.

A demo corpus (8 patients, 4 shards) is built stage by stage in this process (no Airflow). Then:

- the quality stage, with ``Storage.read_table`` and ``Storage.read_bytes`` instrumented, never requests the
  ``payload`` column and never reads an ``images`` partition file whole;
- an ``images`` partition whose payload bytes are replaced on disk after the recorded check still passes the
  quality task (its checks are metadata-only, the payload check is the recorded one), while the normalise-side
  check (:func:`etl.pixels.integrity.verify_image_files`) catches the corruption;
- the recorded check fails closed: a shard without a record, or a record with a mismatch, fails ``payload_sha256``.
"""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import config_for

from etl.pixels.integrity import recorded_integrity, verify_image_files
from etl.storage import Storage
from quality.checks import check_recorded_payload_integrity

pytestmark = pytest.mark.slow

SHARDS = 4


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from etl.demo.corpus import generate_corpus
    from etl.pipeline import stages
    from etl.pipeline.context import BuildContext
    from etl.pipeline.ledger import finalise

    root = tmp_path_factory.mktemp("integrity") / "root"
    generate_corpus(root, seed=7, n_patients=8)
    ctx = BuildContext.from_config_file(config_for(root, shard_count=SHARDS, max_map_length=2), run_id="run-1")
    ctx.check_key()
    for inst in ctx.cfg.institutions:
        stages.discover(ctx, inst.id)
    shards = [s for batch in stages.plan(ctx) for s in batch]
    for s in shards:
        stages.deidentify_shard(ctx, s)
    normalised = [stages.normalise_shard(ctx, s) for s in shards]
    stages.reports(ctx)
    for s in shards:
        stages.entities_shard(ctx, s)
    for s in shards:
        stages.assemble_shard(ctx, s)
    stages.retrieval(ctx)
    finalise(ctx)
    return ctx, normalised


def test_normalise_records_the_payload_check_of_every_row(built):
    ctx, normalised = built
    assert sum(r["images"] for r in normalised) > 0
    for r in normalised:
        rec = r["payload_integrity"]
        assert rec["rows"] == rec["verified"] == r["images"] and rec["mismatches"] == []
    assert recorded_integrity(ctx.storage, SHARDS) == {r["shard"]: r["payload_integrity"] for r in normalised}


def test_quality_task_never_reads_payloads_and_corruption_is_caught_where_written(built, monkeypatch):
    from quality.gate import quality_stage

    ctx, _ = built
    st = ctx.storage
    files = [f for f in st.list_files("curated/images") if f.endswith(".parquet")]
    assert files
    # corrupt one payload on disk after the recorded check: a valid Parquet file, the same metadata, other bytes
    victim = files[0]
    t = pq.read_table(io.BytesIO(st.read_bytes(victim)))
    payloads = t.column("payload").to_pylist()
    payloads[0] = payloads[0][:-8] + b"CORRUPT!"
    t = t.set_column(t.schema.get_field_index("payload"), "payload", pa.array(payloads, pa.binary()))
    st.write_table(victim, t, row_group_size=64)
    corrupted_key = t.column("image_key")[0].as_py()

    requested: list[tuple[str, list[str] | None]] = []
    whole: list[str] = []
    read_table, read_bytes = Storage.read_table, Storage.read_bytes

    def spy_table(self, rel, schema=None, columns=None):
        requested.append((rel, columns))
        return read_table(self, rel, schema=schema, columns=columns)

    def spy_bytes(self, rel):
        whole.append(rel)
        return read_bytes(self, rel)

    monkeypatch.setattr(Storage, "read_table", spy_table)
    monkeypatch.setattr(Storage, "read_bytes", spy_bytes)
    out = quality_stage(ctx)  # passes: the payload check is the one recorded where the payloads were written
    monkeypatch.undo()
    assert out["critical_failures"] == 0
    images_reads = [(rel, cols) for rel, cols in requested if rel.startswith("curated/images")]
    assert images_reads, "the quality task reads the images metadata"
    assert all(cols is not None and "payload" not in cols for _, cols in images_reads), images_reads
    assert not [p for p in whole if p.startswith("curated/images")], "an images file was read whole"
    doc = json.loads(st.read_text(f"reports/quality/{ctx.run_id}.json"))
    (check,) = [r for r in doc["results"] if r["check"] == "payload_sha256"]
    assert check["passed"] and check["observed"]["rows_without_record"] == 0
    assert check["observed"]["verified_at_write"] == check["observed"]["rows"] > 0
    # the normalise-side check reads the payloads back and names the corrupted row
    res = verify_image_files(st, [victim])
    assert res.mismatches == [corrupted_key] and res.verified == res.rows - 1


def test_recorded_check_fails_closed():
    images = pa.table({"shard": pa.array([0, 0, 1], pa.int32())})
    ok = {0: {"rows": 2, "verified": 2, "mismatches": []}, 1: {"rows": 1, "verified": 1, "mismatches": []}}
    assert check_recorded_payload_integrity(images, ok).passed
    missing = check_recorded_payload_integrity(images, {0: ok[0]})
    assert not missing.passed and missing.observed["rows_without_record"] == 1
    bad = check_recorded_payload_integrity(images, {**ok, 1: {"rows": 1, "verified": 0, "mismatches": ["k"]}})
    assert not bad.passed and bad.observed["mismatches"] == 1
    stale = check_recorded_payload_integrity(images, {**ok, 0: {"rows": 1, "verified": 1, "mismatches": []}})
    assert not stale.passed and stale.observed["rows_not_verified"] == 1
    assert check_recorded_payload_integrity(images.slice(0, 0), {}).passed
