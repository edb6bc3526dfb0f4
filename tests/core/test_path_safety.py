"""Issue 19, items 1 and 7: no value that becomes a path component can write outside its root or zone, and the
restricted zones are owner-only on local disk."""

from __future__ import annotations

import os
import stat

import pyarrow as pa
import pytest

from etl import zones
from etl.storage import Storage
from etl.zones import UnsafePathError

TRAVERSALS = [
    "/../../../../sources/us-bos-general/PWNED",
    "/../../../../../ESCAPED_ROOT",
    "..",
    ".",
    "a/../../b",
    "CT\x00",
    "../x",
]


def _all_files(base) -> set[str]:
    return {str(p.relative_to(base)) for p in base.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    "rel",
    [
        "curated/../../ESCAPED_ROOT",
        "../ESCAPED_ROOT",
        "ledger/./x",
        "curated/a\x00b",
        "curated/images/modality=/../../../../sources/x/PWNED/shard=00000.parquet",
    ],
)
def test_storage_refuses_paths_that_leave_the_root(tmp_path, rel):
    st = Storage.open(str(tmp_path / "root"))
    for op in (
        lambda: st.write_bytes(rel, b"x"),
        lambda: st.path(rel),
        lambda: st.delete(rel),
        lambda: st.read_bytes(rel),
        lambda: st.exists(rel),
    ):
        with pytest.raises(UnsafePathError) as err:
            op()
        assert err.value.reason == "unsafe_path"
        assert "ESCAPED" not in str(err.value) and "PWNED" not in str(err.value)  # the value is never quoted
    assert _all_files(tmp_path) == set()


def test_storage_refuses_a_write_through_a_link_out_of_the_root(tmp_path):
    st = Storage.open(str(tmp_path / "root"))
    (tmp_path / "outside").mkdir()
    os.symlink(tmp_path / "outside", tmp_path / "root" / "reports")
    with pytest.raises(UnsafePathError):
        st.write_bytes("reports/x.txt", b"x")
    with pytest.raises(UnsafePathError):
        st.delete("reports/x.txt")
    assert not list((tmp_path / "outside").iterdir())


def test_deleting_the_root_is_refused(tmp_path):
    st = Storage.open(str(tmp_path / "root"))
    st.write_text("reports/a.txt", "a")
    for rel in ("", "/", "//"):
        with pytest.raises(UnsafePathError):
            st.delete(rel)
    assert st.is_file("reports/a.txt")


@pytest.mark.parametrize("value", TRAVERSALS + ["", " ", "C T", "ÜS", "x" * 200])
def test_partition_values_are_encoded_into_one_component(value):
    enc = zones.partition_value(value)
    assert "/" not in enc and enc not in (".", "..", "") and "\x00" not in enc
    assert enc.startswith("_h") and len(enc) == 22
    assert zones.partition_value(value) == enc  # deterministic


def test_safe_partition_values_stay_readable():
    assert zones.partition_value("CT") == "CT" and zones.partition_value("us-bos-general") == "us-bos-general"
    assert zones.curated_modality_partition("images", "us-bos-general", "DX", 3) == (
        "curated/images/institution=us-bos-general/modality=DX/shard=00003.parquet"
    )


@pytest.mark.parametrize(
    "fn",
    [
        zones.run_dir,
        zones.ledger_file,
        zones.quarantine_dir,
        zones.delivery_state,
        zones.release_dir,
        zones.training_record,
        zones.run_summary,
        zones.quality_report,
    ],
)
@pytest.mark.parametrize("value", ["../../x", "a/b", "..", "", ".hidden", "x\x00"])
def test_identifiers_in_zone_paths_are_validated(fn, value):
    with pytest.raises(UnsafePathError) as err:
        fn(value)
    assert err.value.reason == "unsafe_path_component"


def test_check_in_zone():
    assert zones.check_in_zone("curated/images/x.parquet", zones.CURATED)
    for rel in ("sources/x", "curated/../sources/x", "curated//x", "ledger"):
        with pytest.raises(UnsafePathError):
            zones.check_in_zone(rel, zones.CURATED)


def test_header_modality_cannot_write_outside_curated(tmp_path, key):
    """The attack of issue 19 item 1: the images partition of a row whose Modality climbs out of curated/."""
    from types import SimpleNamespace

    from etl.pipeline.stages import write_partition
    from schemas import images as images_schema

    root = tmp_path / "root"
    (root / "sources" / "us-bos-general").mkdir(parents=True)
    st = Storage.open(str(root))
    ctx = SimpleNamespace(storage=st, table_path=lambda t, s: zones.curated_partition(t, s))
    schema = images_schema.SCHEMA
    rows = []
    for i, modality in enumerate(["/../../../../sources/us-bos-general/PWNED", "/../../../../../ESCAPED_ROOT", "CT"]):
        row = {f.name: None for f in schema}
        row.update({n: f"k{i}" for n in ("image_key", "series_key", "study_key", "patient_key")})
        row.update(
            institution="us-bos-general",
            modality=modality,
            kind="2d",
            rows=1,
            cols=1,
            n_slices=1,
            payload_format="png",
            payload=b"",
            payload_sha256="0" * 64,
            recipe="{}",
            transfer_syntax="1.2",
            shard=0,
        )
        rows.append(row)
    table = pa.Table.from_pylist(rows, schema=schema)
    write_partition(ctx, "images", schema, 0, table)
    files = _all_files(tmp_path)
    assert all(f.startswith("root/curated/images/institution=us-bos-general/modality=") for f in files), files
    assert not (root / "sources" / "us-bos-general" / "PWNED").exists() and not (tmp_path / "ESCAPED_ROOT").exists()
    assert len(files) == 3
    back = st.read_table("curated/images", schema=schema)
    assert sorted(back["modality"].to_pylist()) == sorted(r["modality"] for r in rows)  # values kept in the rows


def _mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def test_restricted_zones_are_owner_only_on_local_disk(tmp_path):
    from etl.storage import put_if_absent

    root = tmp_path / "root"
    (root / "sources" / "inst").mkdir(parents=True)
    os.chmod(root / "sources", 0o755)
    old = os.umask(0o022)
    try:
        st = Storage.open(str(root))
        assert _mode(root / "sources") == 0o700  # tightened on open
        st.write_text("ledger/runs/r1/plan.json", "{}")
        st.write_text("quarantine/r1/abc.json", "{}")
        put_if_absent(st, "ledger/build.lock", b"{}")
        st.write_table("ledger/run_id=r1/ledger.parquet", pa.table({"a": [1]}))
        st.write_text("reports/dashboard/index.html", "<html>")
    finally:
        os.umask(old)
    for d in ("ledger", "ledger/runs", "ledger/runs/r1", "quarantine", "quarantine/r1", "ledger/run_id=r1"):
        assert _mode(root / d) == 0o700, d
    for f in (
        "ledger/runs/r1/plan.json",
        "quarantine/r1/abc.json",
        "ledger/build.lock",
        "ledger/run_id=r1/ledger.parquet",
    ):
        assert _mode(root / f) == 0o600, f
    assert _mode(root / "reports" / "dashboard" / "index.html") == 0o644  # de-identified zones as the umask says
