"""Benchmark: the incremental release of one new patient on archives of N and 2N patient groups.

Only the publish part of issue 20's build benchmark (the per-stage build figures are not measured here yet).
Curated tables are written as the build writes them (one key-sorted Parquet file per table and patient-hash
shard), from the row generator of ``tests/snapshots`` (each group: 2 patients, 5 studies, 5 images, reports,
labels, pairs, VQA), every ``images`` row carrying an incompressible payload of ``PAYLOAD_BYTES`` (a
radiograph-sized PNG is 3-5 MB; smaller here so the run takes a minute on 2 cores). The shard count is fixed (8),
so "one new patient" rewrites one shard partition per table, of N/8 groups: the data file added to each Delta
table (a hard link, no bytes copied) grows with N/shard_count; everything else publish does must not. Measured per size: the first publish (every partition hashed once), then one new
group of rows in shard 0 and the publish of it: seconds, data bytes added to the Delta tables (hard links on
local disk) and bytes the publish wrote (commits, manifest, card, hash cache). Ends with one ``BENCH build ...``
line. Usage: ``python benchmarks/bench_build.py [groups]`` (default 32, then twice that).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "snapshots"))

from test_snapshots import _fill, institution_rows  # noqa: E402

from etl.snapshots import publish, read_publish_log  # noqa: E402
from etl.storage import Storage  # noqa: E402
from schemas.tables import SCHEMAS  # noqa: E402

PAYLOAD_BYTES = 512 * 1024
SHARDS = 8


def _rows(group: int, shard: int) -> dict[str, list[dict]]:
    rows = institution_rows(f"g{group:05d}", shard)
    for r in rows["images"]:
        r["payload"] = os.urandom(PAYLOAD_BYTES)
    return rows


def _write_shard(st: Storage, shard: int, groups: list[int]) -> None:
    tables: dict[str, list[dict]] = {}
    for g in groups:
        for t, rows in _rows(g, shard).items():
            tables.setdefault(t, []).extend(rows)
    for t, rows in tables.items():
        schema = SCHEMAS[t]
        keys = schema.metadata[b"medreco.key"].decode().split(",")
        tbl = _fill(schema, rows)
        if tbl.num_rows:
            tbl = tbl.sort_by([(k, "ascending") for k in keys])
        st.write_table(f"curated/{t}/shard={shard:05d}/part-0.parquet", tbl, row_group_size=64)


def _inodes(*roots: str) -> dict[str, tuple[int, int, int]]:
    out = {}
    for root in roots:
        for p in Path(root).rglob("*"):
            if p.is_file():
                s = p.stat()
                out[str(p)] = (s.st_ino, s.st_size, s.st_nlink)
    return out


def _written(before: dict, after: dict) -> int:
    """Bytes of files the publish created or replaced, hard links to curated files (no bytes written) left out."""
    return sum(size for p, (ino, size, links) in after.items() if before.get(p, (None,))[0] != ino and links == 1)


def _publish(st: Storage, run: str):
    return publish(st, config_hash="c" * 64, ontology_version="0.1.0", run_id=run, key_fingerprint="f" * 16)


def measure(groups: int, tmp: str) -> dict:
    st = Storage.open(f"{tmp}/n{groups}")
    shards = SHARDS
    for s in range(shards):
        _write_shard(st, s, [g for g in range(groups) if g % shards == s])
    time.sleep(2.1)  # the partition hash cache trusts files older than itself by 2 s (racy-git rule)
    t = time.perf_counter()
    first = _publish(st, "run-1")
    first_s = time.perf_counter() - t
    _write_shard(st, 0, [g for g in range(groups) if g % shards == 0] + [groups])  # one new group in shard 0
    before = _inodes(st.path("snapshots"), st.path("ledger"))
    t = time.perf_counter()
    rel = _publish(st, "run-2")
    inc_s = time.perf_counter() - t
    written = _written(before, _inodes(st.path("snapshots"), st.path("ledger")))
    images = sum(p.stat().st_size for p in Path(st.path("curated/images")).rglob("*.parquet"))
    return {"groups": groups, "shards": shards, "images_bytes": images, "first_s": first_s,
            "version": (first.version, rel.version), "inc_s": inc_s,
            "data_added": read_publish_log(st, rel.version)["data_bytes_added"], "written": written}


def main(groups: int = 32) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-build-") as tmp:
        a, b = measure(groups, tmp), measure(2 * groups, tmp)
    for m in (a, b):
        print(f"{m['groups']} groups ({m['groups'] * 5} images, {m['images_bytes'] / 2**20:.0f} MiB images, "
              f"{m['shards']} shards): first publish {m['first_s']:.2f} s; one new patient group "
              f"{m['version'][0]} -> {m['version'][1]}: {m['inc_s']:.2f} s, data files added "
              f"{m['data_added'] / 2**20:.2f} MiB (hard links), other bytes written {m['written'] / 1024:.0f} KiB")
    print(f"BENCH build publish_one_patient_s={a['inc_s']:.2f},{b['inc_s']:.2f} "
          f"ratio={b['inc_s'] / a['inc_s']:.2f} data_added_mib={a['data_added'] / 2**20:.2f},"
          f"{b['data_added'] / 2**20:.2f} written_kib={a['written'] / 1024:.0f},{b['written'] / 1024:.0f} "
          f"first_publish_s={a['first_s']:.2f},{b['first_s']:.2f}")


if __name__ == "__main__":
    main(*(int(x) for x in sys.argv[1:2]))
