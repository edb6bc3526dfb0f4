"""Loading releases: the Python API, DuckDB and polars on the pinned files, and the torch datasets.

The fast tests use hand-built curated tables (test_snapshots.write_institution: real PNG and npy payloads
whose pixels are known); the slow ones build the demo corpus twice through the Airflow DAG, the second
time with one more institution, and read the real releases.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pyarrow.compute as pc
import pytest
import torch
import yaml
from test_snapshots import do_publish, npy_payload, png_payload, write_institution

from etl.snapshots import SnapshotError, load_snapshot
from etl.storage import Storage
from medreco_reader.torch_data import ImageDataset, PairDataset, VQADataset, collate
from schemas.config import PROJECT_ROOT


@pytest.fixture()
def released(tmp_path):
    """Two releases: 0.1.0 (us-a, gb-b) and 0.2.0 (+ ie-c)."""
    st = Storage.open(str(tmp_path / "root"))
    write_institution(st, "us-a", 0)
    write_institution(st, "gb-b", 1)
    do_publish(st)
    added = write_institution(st, "ie-c", 2)
    do_publish(st)
    return st, added


def _duckdb_keys(files: list[str], key: list[str]) -> list[tuple]:
    cols = ", ".join(key)
    return duckdb.sql(f"SELECT {cols} FROM read_parquet({files!r}) ORDER BY {cols}").fetchall()


# ---- API, DuckDB, polars ------------------------------------------------------------------------------------


def test_load_snapshot_latest_and_pinned_versions(released, tmp_path):
    st, added = released
    latest = load_snapshot(st.root)  # a plain path works as well as a Storage
    assert (latest.version, latest.manifest["version"], latest.content_hash) == (
        "0.2.0",
        "0.2.0",
        latest.manifest["content_hash"],
    )
    old = load_snapshot(st, version="0.1.0")
    # Delta time travel: 0.1.0 still reads its own rows after 0.2.0 committed new ones
    assert old.table("studies").select(pl.len()).collect().item() == 10
    assert latest.table("studies").select(pl.len()).collect().item() == 15
    new_keys = set(latest.table("studies").collect()["study_key"]) - set(old.table("studies").collect()["study_key"])
    assert sorted((k,) for k in new_keys) == added["studies"]
    assert old.delta_version("studies") == 1 and latest.delta_version("studies") == 2
    assert latest.verify() == []
    with pytest.raises(SnapshotError, match="no table 'nope'"):
        latest.table("nope")
    with pytest.raises(SnapshotError, match=r"no snapshot 3\.0\.0 .*published: 0\.1\.0, 0\.2\.0"):
        load_snapshot(st, version="3.0.0")
    with pytest.raises(SnapshotError, match="no storage root"):
        load_snapshot(str(tmp_path / "nowhere"))
    assert not (tmp_path / "nowhere").exists()  # looking does not create a root


def test_a_release_folder_opens_its_release_and_other_folders_say_to_pass_the_root(released, tmp_path):
    """Issue 40, a new user's trial: ``load_snapshot(<root>/snapshots/0.1.0)`` gave "no published snapshot under
    .../0.1.0/snapshots". A release folder inside its root opens that release (its manifest pins root-relative
    files); the ``snapshots`` folder opens the root; a copied release folder, an export or an empty folder say to
    pass the storage root and name it."""
    import shutil

    import medreco_reader

    st, _ = released
    root = Path(st.root)
    light = medreco_reader.load_snapshot(str(root / "snapshots" / "0.1.0"))  # the reader alone, as the project's
    assert (light.version, Path(light.storage.root)) == ("0.1.0", root)
    snap = load_snapshot(str(root / "snapshots" / "0.1.0"))
    assert (snap.version, Path(snap.storage.root)) == ("0.1.0", root)  # that release, not the latest
    assert snap.table("studies").select(pl.len()).collect().item() == 10 and snap.verify() == []
    assert load_snapshot(str(root / "snapshots" / "0.2.0") + "/", version="0.2.0").version == "0.2.0"
    assert load_snapshot(str(root / "snapshots")).version == "0.2.0"
    with pytest.raises(SnapshotError, match=rf"release folder of 0\.1\.0, not 0\.2\.0: pass the storage root {root}"):
        load_snapshot(str(root / "snapshots" / "0.1.0"), version="0.2.0")
    copy = tmp_path / "handed_over" / "0.1.0"
    shutil.copytree(root / "snapshots" / "0.1.0", copy)
    with pytest.raises(
        SnapshotError, match=r"release folder \(0\.1\.0\) outside its storage root.*medreco snapshot export"
    ):
        load_snapshot(str(copy))
    (copy / "export.json").write_text("{}")
    with pytest.raises(SnapshotError, match=r"exported release.*datasets\.load_dataset"):
        load_snapshot(str(copy))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SnapshotError, match=r"no published snapshot under .*empty/snapshots: pass the storage root"):
        load_snapshot(str(empty))


def test_every_table_reads_the_same_through_api_duckdb_and_polars(released):
    """DuckDB reads the pinned Parquet files by path (its delta_scan needs an extension download, impossible
    offline); polars reads the Delta table at the pinned version and the files directly."""
    st, _ = released
    snap = load_snapshot(st, "latest")
    for t in snap.tables:
        key = snap.key_columns(t)
        rows = snap.manifest["tables"][t]["rows"]
        api = snap.table(t).select(key).collect()
        assert api.height == rows, t
        api_keys = sorted(api.iter_rows())
        assert _duckdb_keys(snap.files(t), key) == api_keys, t
        assert duckdb.sql(f"SELECT count(*) FROM read_parquet({snap.files(t)!r})").fetchall()[0][0] == rows
        delta = pl.read_delta(snap.table_uri(t), version=snap.delta_version(t)).select(key)
        assert sorted(delta.iter_rows()) == api_keys, t
        assert sorted(pl.scan_parquet(snap.files(t)).select(key).collect().iter_rows()) == api_keys, t
        assert snap.dataset(t).count_rows() == rows
    # the files keep the table's schema metadata (version, key)
    assert snap.dataset("pairs").schema.metadata[b"medreco.key"] == b"pair_id"
    # one data file per curated partition, in partition order: the partition file's bytes, rows as the build
    # wrote them (key order within each partition; this fixture writes its partitions unsorted)
    studies = snap.manifest["tables"]["studies"]["files"]
    assert [f["partition"] for f in studies] == sorted(f["partition"] for f in studies)
    for f, path in zip(studies, snap.files("studies"), strict=True):
        assert Path(path).read_bytes() == Path(st.path(f"curated/studies/{f['partition']}")).read_bytes()


# ---- torch datasets -----------------------------------------------------------------------------------------


def test_image_dataset_decodes_png_and_volume_rows(released):
    import zlib

    st, _ = released
    snap = load_snapshot(st, "0.1.0")
    ds = ImageDataset(snap, kind=None, fixed_shape=False)  # stored sizes (fixed shapes: test_ecosystem)
    assert len(ds) == 10
    by_key = {ds[i]["image_key"]: ds[i] for i in range(len(ds))}
    png = by_key["us-a-p1-s0-i"]
    _, arr = png_payload(zlib.crc32(b"us-a/1/0"))
    assert png["image"].shape == (1, 24, 32) and png["image"].dtype == torch.float32
    assert torch.equal(png["image"][0], torch.from_numpy(arr.astype(np.float32) / 255.0))
    assert (png["split"], png["modality"], png["kind"]) == ("test", "CR", "2d")
    vol = by_key["gb-b-ct-v"]
    _, expected = npy_payload(zlib.crc32(b"gb-b"))
    assert vol["image"].shape == (3, 8, 8) and torch.equal(vol["image"], torch.from_numpy(expected))
    assert len(ImageDataset(snap, split="train", kind="3d")) == 2 and len(ImageDataset(snap, split="train")) == 4
    assert len(ImageDataset(snap, modality="CT", kind="3d")) == 2 and len(ImageDataset(snap, modality="CT")) == 0
    assert len(ImageDataset(snap, split=["train", "test"], modality=("CR",))) == 8


def test_pair_and_vqa_datasets(released):
    st, _ = released
    snap = load_snapshot(st)
    pairs = PairDataset(snap, kind=None, fixed_shape=False)
    assert len(pairs) == 6 and pairs.excluded == []
    item = next(pairs[i] for i in range(len(pairs)) if pairs[i]["pair_id"] == "ie-c-p0-pair")
    assert item["prior"].shape == item["current"].shape == (1, 24, 32)
    assert (item["prior_image_key"], item["current_image_key"]) == ("ie-c-p0-s0-i", "ie-c-p0-s1-i")
    assert item["gap_days"] == 365 and item["change_labels"][0]["change"] == "new"
    assert not torch.equal(item["prior"], item["current"])
    assert len(PairDataset(snap, split="test")) == 3

    vqa = VQADataset(snap, store=pairs.store, kind=None, fixed_shape=False)  # one image index shared between datasets
    assert len(vqa) == 9 and vqa.excluded == []
    by_id = {vqa[i]["item_id"]: vqa[i] for i in range(len(vqa))}
    assert [t.shape for t in by_id["us-a-p0-q0"]["images"]] == [(1, 24, 32), (1, 24, 32)]
    assert by_id["us-a-p0-q0"]["image_keys"] == ["us-a-p0-s0-i", "us-a-p0-s1-i"]
    assert [t.shape for t in by_id["gb-b-ct-q"]["images"]] == [(3, 8, 8)] and by_id["gb-b-ct-q"]["answer"] == "B"
    assert len(VQADataset(snap, question_type="presence", kind="3d")) == 3


def test_items_without_images_are_excluded_and_named(released):
    st, _ = released
    rows = st.read_table("curated/images/shard=00002/part-0.parquet")
    st.write_table(
        "curated/images/shard=00002/part-0.parquet", rows.filter(pc.not_equal(rows["study_key"], "ie-c-p1-s1"))
    )
    do_publish(st)
    snap = load_snapshot(st)
    assert snap.version == "0.3.0"
    assert PairDataset(snap).excluded == ["ie-c-p1-pair"]
    assert VQADataset(snap, kind=None, fixed_shape=False).excluded == ["ie-c-p1-q0"]


def test_dataloader_batches_and_workers(released):
    st, _ = released
    ds = PairDataset(load_snapshot(st), split="train", fixed_shape=False)
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=3, collate_fn=collate)))
    assert batch["prior"].shape == (3, 1, 24, 32) and len(batch["change_labels"]) == 3
    # datasets pickle without open files and work in worker processes
    clone = pickle.loads(pickle.dumps(ds))
    assert torch.equal(clone[0]["current"], ds[0]["current"])
    loader = torch.utils.data.DataLoader(
        ImageDataset(load_snapshot(st), modality="CT", kind="3d", fixed_shape=False), batch_size=None, num_workers=2
    )
    assert sorted(tuple(item["image"].shape) for item in loader) == [(3, 8, 8)] * 3
    with pytest.raises(ValueError, match="empty batch"):
        collate([])


# ---- on a real build: the demo corpus through the DAG, then one more institution ---------------------------

NEW_INSTITUTION = "ie-cork-mercy"


#: release times of the two builds (SOURCE_DATE_EPOCH): 2026-01-01 and a day later
FIRST_EPOCH, SECOND_EPOCH = 1767225600, 1767312000


def _build_config(base: Path, root: Path, with_new_institution: bool) -> Path:
    data = yaml.safe_load((PROJECT_ROOT / "config" / "demo.yaml").read_text())
    data["storage"]["root"] = str(root)
    if not with_new_institution:
        data["institutions"] = [i for i in data["institutions"] if i["id"] != NEW_INSTITUTION]
    cfg = base / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(data))
    return cfg


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory, airflow_home):
    from etl.demo.corpus import generate_corpus
    from medreco.cli.embedded import run_build

    base = tmp_path_factory.mktemp("snapbuild")
    root = base / "root"
    generate_corpus(root, seed=5, n_patients=8)
    old = os.environ.get("SOURCE_DATE_EPOCH")
    try:
        os.environ["SOURCE_DATE_EPOCH"] = str(FIRST_EPOCH)
        first = run_build(_build_config(base, root, with_new_institution=False))
        os.environ["SOURCE_DATE_EPOCH"] = str(SECOND_EPOCH)
        cfg = _build_config(base, root, with_new_institution=True)  # the new institution's delivery arrives
        second = run_build(cfg)
    finally:
        os.environ.pop("SOURCE_DATE_EPOCH", None) if old is None else os.environ.__setitem__("SOURCE_DATE_EPOCH", old)
    return {"first": first, "second": second, "storage": Storage.open(str(root)), "config": cfg}


def _release_files(st: Storage, version: str) -> dict[str, bytes]:
    """The bytes of everything release ``version`` pins: its folder (publish log aside), data files and the
    Delta commit files up to the versions it pins."""
    from etl.snapshots import PUBLISH_LOG, read_manifest

    m = read_manifest(st, version)
    paths = [f for f in st.list_files(f"snapshots/{version}") if not f.endswith(PUBLISH_LOG)]
    for v in m["tables"].values():
        paths += [f"{v['uri']}/{f['path']}" for f in v["files"]]
        paths += [f"{v['uri']}/_delta_log/{n:020d}.json" for n in range(v["delta_version"] + 1)]
    return {p: st.read_bytes(p) for p in paths}


@pytest.mark.slow
def test_clean_rebuild_of_the_same_inputs_config_and_key_is_byte_identical(two_builds, tmp_path, monkeypatch):
    """The first build again, in a fresh root from a fresh copy of the corpus, at the same SOURCE_DATE_EPOCH:
    the same release 0.1.0, byte for byte (manifest.sha256, card, data files, Delta commits)."""
    from etl.demo.corpus import generate_corpus
    from etl.snapshots import read_publish_log
    from medreco.cli.embedded import run_build

    root = tmp_path / "root"
    generate_corpus(root, seed=5, n_patients=8)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", str(FIRST_EPOCH))
    again = run_build(_build_config(tmp_path, root, with_new_institution=False))
    first, st, rebuilt = two_builds["first"], two_builds["storage"], Storage.open(str(root))
    assert (again["version"], again["created"], again["created_at"]) == ("0.1.0", True, "2026-01-01T00:00:00+00:00")
    assert again["run_id"] != first["run_id"]
    assert (again["content_hash"], again["manifest_sha256"]) == (first["content_hash"], first["manifest_sha256"])
    original, copy = _release_files(st, "0.1.0"), _release_files(rebuilt, "0.1.0")
    assert sorted(original) == sorted(copy) and any("_delta_log" in p for p in original)
    assert [p for p in original if original[p] != copy[p]] == []
    # what differs is kept beside, unhashed: the runs
    assert read_publish_log(rebuilt, "0.1.0")["publish_run_id"] == again["run_id"]
    assert read_publish_log(st, "0.1.0")["publish_run_id"] == first["run_id"]


@pytest.mark.slow
def test_new_institution_delivery_gives_a_minor_release_whose_diff_is_its_rows(two_builds):
    from etl.snapshots import diff, verify

    first, second, st = two_builds["first"], two_builds["second"], two_builds["storage"]
    assert (first["version"], first["created"]) == ("0.1.0", True)
    assert (second["version"], second["created"], second["parent"], second["change"]) == (
        "0.2.0",
        True,
        "0.1.0",
        "minor",
    )
    assert verify(st, "0.1.0") == [] and verify(st, "0.2.0") == []
    new = load_snapshot(st, "0.2.0")
    patients = set(new.table("splits").filter(pl.col("institution") == NEW_INSTITUTION).collect()["patient_key"])
    studies = set(new.table("studies").filter(pl.col("institution") == NEW_INSTITUTION).collect()["study_key"])
    assert patients and studies
    d = diff(st, "0.1.0", "0.2.0")
    old = load_snapshot(st, "0.1.0")
    # two-case VQA items compare a query with another patient's reference case (from the retrieval targets),
    # so a new institution's studies may change them for every patient; all other items are one patient's
    case_items = {
        k
        for snap in (old, new)
        for k in snap.table("vqa")
        .filter(pl.col("reference_study_key").is_not_null())
        .select(new.key_columns("vqa"))
        .collect()
        .iter_rows()
    }
    # (this 8-patient corpus may link no two cases: then no item is exempt and the check below is strictest; the
    # demo build's two-case items are checked in tests/assemble/test_vqa.py)
    # open-ended yes/no answers are balanced per (shard, split, question_type) (vqa.balance_yes_no: the majority's
    # smallest item_ids kept), so where the new institution's items join such a group, the group's kept majority
    # items may change for the other patients of that shard too; every other group must not move
    yes_no = pl.col("answer_text").is_in(["yes", "no"]) & (pl.col("answer_format") == "open_ended")
    grp = ["shard", "split", "question_type"]
    touched = new.table("vqa").filter(yes_no & pl.col("patient_key").is_in(list(patients))).select(grp).unique()
    balanced_items = {
        k
        for snap in (old, new)
        for k in snap.table("vqa")
        .filter(yes_no)
        .join(touched, on=grp)
        .select(new.key_columns("vqa"))
        .collect()
        .iter_rows()
    }
    # per-patient tables: exactly the new institution's rows are added, nothing else moves
    for t, column, members in (
        ("studies", "study_key", studies),
        ("series", "study_key", studies),
        ("images", "study_key", studies),
        ("splits", "patient_key", patients),
        ("study_labels", "study_key", studies),
        ("pairs", "patient_key", patients),
        ("vqa", "patient_key", patients),
        ("reports", "patient_key", patients),
        ("entity_mentions", "patient_key", patients),
    ):
        key = new.key_columns(t)
        frame = new.table(t).filter(pl.col(column).is_in(list(members)))
        if t == "vqa":
            frame = frame.filter(pl.col("reference_study_key").is_null())
        expected = sorted(frame.select(key).collect().iter_rows())
        skip = (case_items | (balanced_items - set(expected))) if t == "vqa" else set()
        got = tuple([k for k in keys if tuple(k) not in skip] for keys in (d[t].added, d[t].removed, d[t].changed))
        assert got == (expected, [], []), t
    assert d["studies"].added and d["images"].added


@pytest.mark.slow
def test_real_release_reads_through_every_route_and_decodes(two_builds):
    snap = load_snapshot(two_builds["storage"])
    for t in snap.tables:
        key = snap.key_columns(t)
        api = sorted(snap.table(t).select(key).collect().iter_rows())
        assert len(api) == snap.manifest["tables"][t]["rows"]
        assert _duckdb_keys(snap.files(t), key) == api, t
        assert sorted(pl.read_delta(snap.table_uri(t), version=snap.delta_version(t)).select(key).iter_rows()) == api, t
    images = ImageDataset(snap, kind=None, fixed_shape=False)
    assert len(images) == snap.manifest["tables"]["images"]["rows"] > 0
    kinds = set()
    for i in range(len(images)):
        item = images[i]
        row = images.store.rows[images.indices[i]]
        kinds.add(row["kind"])
        if row["kind"] == "3d":  # float32 (slices, rows, cols)
            assert tuple(item["image"].shape) == (row["n_slices"], row["rows"], row["cols"]), row["image_key"]
        else:  # float32 (channels, rows, cols) in 0..1
            assert item["image"].shape[0] in (1, 3) and tuple(item["image"].shape[1:]) == (row["rows"], row["cols"])
            assert 0.0 <= float(item["image"].min()) <= float(item["image"].max()) <= 1.0
        assert item["image"].dtype == torch.float32
    assert kinds == {"2d", "3d"}
    pairs = PairDataset(snap, store=images.store, kind=None, fixed_shape=False)
    assert len(pairs) > 0
    p = pairs[0]
    assert p["prior"].ndim == p["current"].ndim >= 3 and p["prior_image_key"] != p["current_image_key"]
    vqa = VQADataset(snap, store=images.store, kind=None, fixed_shape=False)
    assert len(vqa) > 0 and all(t.ndim >= 3 for t in vqa[0]["images"])


@pytest.mark.slow
def test_real_releases_read_by_the_fields_tools_and_batch_with_the_default_collate(two_builds):
    """The demo build's releases: Hugging Face and DuckDB get 0.1.0's rows after 0.2.0 exists, mlcroissant
    validates, and fixed-shape datasets over real PNGs and NIfTI volumes batch with the default collate."""
    import datasets
    import mlcroissant as mlc

    from medreco_reader.torch_data import TensorShape

    st = two_builds["storage"]
    old, new = load_snapshot(st, "0.1.0"), load_snapshot(st, "0.2.0")
    folder = st.path("snapshots/0.1.0")
    for t in ("pairs", "vqa", "images"):
        rows = old.manifest["tables"][t]["rows"]
        assert rows < new.manifest["tables"][t]["rows"], t
        assert datasets.load_dataset(folder, t, split="full").num_rows == rows, t
        files = [f"{folder}/{p}" for p in open(f"{folder}/files/{t}.txt").read().split()]
        assert duckdb.read_parquet(files).count("*").fetchall()[0][0] == rows, t
    assert mlc.Dataset(f"{folder}/croissant.json").metadata.ctx.issues.errors == set()
    shape = TensorShape(channels=1, image_size=(64, 64), volume_shape=(16, 32, 32))
    for ds, key, want in (
        (ImageDataset(new, shape=shape), "image", (4, 1, 64, 64)),
        (ImageDataset(new, kind="3d", shape=shape), "image", (4, 1, 16, 32, 32)),
        (PairDataset(new, shape=shape), "prior", (4, 1, 64, 64)),
        (VQADataset(new, shape=shape), "images", (4, 2, 1, 64, 64)),
    ):
        assert len(ds) >= 4, type(ds).__name__
        batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2)))
        assert tuple(batch[key].shape) == want and batch[key].dtype == torch.float32, type(ds).__name__


@pytest.mark.slow
def test_snapshot_asset_event_carries_version_and_content_hash(two_builds):
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    with create_session() as session:  # Airflow stores the URI normalised, with a trailing '/'
        events = (
            session.query(AssetEvent)
            .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .filter(AssetModel.uri.in_(["medreco://snapshot", "medreco://snapshot/"]))
            .order_by(AssetEvent.id)
            .all()
        )
        extras = [e.extra for e in events]
    second = two_builds["second"]
    assert {"version": second["version"], "content_hash": second["content_hash"], "uri": second["uri"]} in extras
