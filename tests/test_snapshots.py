"""Snapshots: immutable releases, unchanged content -> no new version, verify catches tampering."""

from __future__ import annotations

import datetime as dt
import json
import os

import pytest

from etl.snapshots import SnapshotError, list_versions, publish, read_manifest, verify
from etl.storage import Storage
from schemas.base import table_from_rows
from schemas.tables import SCHEMAS


def _study(i: int) -> dict:
    return {"study_key": f"s{i}", "patient_key": f"p{i}", "institution": "us-a", "country": "US", "modality": "CR",
            "study_datetime": dt.datetime(2020, 1, i + 1), "n_series": 1, "n_images": 1, "shard": 0}


def _publish(st: Storage):
    return publish(st, config_hash="c" * 64, ontology_version="0.1.0", run_id="r", key_fingerprint="f")


@pytest.fixture()
def store(tmp_path):
    st = Storage.open(str(tmp_path / "root"))
    st.write_table("curated/studies/shard=00000/part-0.parquet", table_from_rows([_study(1), _study(0)], SCHEMAS["studies"]))
    return st


def _writable(st: Storage, version: str) -> None:
    for f in st.list_files(f"snapshots/{version}"):
        os.chmod(st.path(f), 0o644)


def test_publish_is_idempotent_and_files_are_read_only(store):
    first = _publish(store)
    assert (first.version, first.created, first.manifest["parent"]) == ("0.1.0", True, None)
    assert first.manifest["tables"]["studies"]["rows"] == 2 and first.manifest["tables"]["pairs"]["rows"] == 0
    again = _publish(store)
    assert (again.version, again.created, again.manifest["content_hash"]) == ("0.1.0", False, first.manifest["content_hash"])
    assert verify(store, "0.1.0") == []
    assert oct(os.stat(store.path("snapshots/0.1.0/manifest.json")).st_mode & 0o777) == "0o444"


def test_new_content_bumps_minor_version(store):
    _publish(store)
    store.write_table("curated/studies/shard=00001/part-0.parquet", table_from_rows([_study(5)], SCHEMAS["studies"]))
    rel = _publish(store)
    assert (rel.version, rel.manifest["parent"], rel.manifest["tables"]["studies"]["rows"]) == ("0.2.0", "0.1.0", 3)
    assert list_versions(store) == ["0.1.0", "0.2.0"]


@pytest.mark.parametrize(
    ("tamper", "expected"),
    [
        (lambda p: open(p + "/tables/pairs.parquet", "ab").write(b"x"), "pairs: sha256 mismatch"),
        (lambda p: os.remove(p + "/tables/vqa.parquet"), "vqa: missing file"),
        (lambda p: open(p + "/DATASET_CARD.md", "a").write("edited"), "DATASET_CARD.md: sha256 mismatch"),
        (lambda p: open(p + "/tables/extra.parquet", "wb").write(b"x"), "unlisted file tables/extra.parquet"),
    ],
)
def test_verify_names_the_tampered_file(store, tamper, expected):
    _publish(store)
    _writable(store, "0.1.0")
    tamper(store.path("snapshots/0.1.0"))
    problems = verify(store, "0.1.0")
    assert any(expected in p for p in problems), problems
    with pytest.raises(SnapshotError, match="failed verification, refusing to publish"):
        _publish(store)


def test_verify_catches_an_edited_manifest(store):
    _publish(store)
    _writable(store, "0.1.0")
    path = store.path("snapshots/0.1.0/manifest.json")
    m = read_manifest(store, "0.1.0")
    m["tables"]["studies"]["rows"] = 999
    with open(path, "w") as f:
        json.dump(m, f, indent=1, sort_keys=True)
    problems = verify(store, "0.1.0")
    assert "manifest.json does not match manifest.sha256 (manifest edited)" in problems
    assert "studies: 2 rows in tables/studies.parquet, manifest says 999" in problems
