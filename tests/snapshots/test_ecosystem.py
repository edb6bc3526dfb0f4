"""A release read by the field's tools, without the project: Hugging Face ``datasets``, DuckDB, polars,
``mlcroissant``, MONAI; the pair/VQA image views; fixed-shape torch batches with the default collate.

Fast: two releases of hand-built tables (test_snapshots.write_institution: real PNG payloads) whose CT volumes
are real NIfTI objects (``externalise_volume``, as the normalise task writes them), so every route is checked
against known rows after a second release exists.
"""

from __future__ import annotations

import json
import re
import zlib

import duckdb
import numpy as np
import polars as pl
import pytest
import torch
from test_snapshots import do_publish, npy_payload, png_payload, write_institution

from etl.pixels.volume_objects import externalise_volume
from etl.snapshots import load_snapshot, verify
from etl.storage import Storage
from medreco_reader.torch_data import (
    ImageDataset,
    PairDataset,
    TensorShape,
    VQADataset,
    fit_image,
    fit_volume,
)

SMALL = TensorShape(channels=3, image_size=(20, 20), volume_shape=(4, 6, 10))


def _write(st: Storage, inst: str, shard: int) -> None:
    """One institution's rows, its CT volume moved to a NIfTI object (images schema 2.0)."""
    write_institution(st, inst, shard)
    rel = f"curated/images/shard={shard:05d}/part-0.parquet"
    t = st.read_table(rel)
    rows = [externalise_volume(st, r) for r in t.to_pylist()]
    st.write_table(rel, type(t).from_pylist(rows, schema=t.schema))


@pytest.fixture(scope="module")
def two_releases(tmp_path_factory):
    """0.1.0 (us-a, gb-b) and 0.2.0 (+ ie-c); volumes as NIfTI objects."""
    st = Storage.open(str(tmp_path_factory.mktemp("eco") / "root"))
    _write(st, "us-a", 0)
    _write(st, "gb-b", 1)
    first = do_publish(st)
    _write(st, "ie-c", 2)
    second = do_publish(st)
    assert (first.version, second.version) == ("0.1.0", "0.2.0")
    return st


def _folder(st: Storage, version: str) -> str:
    return st.path(f"snapshots/{version}")


def _files(folder: str, table: str) -> list[str]:
    """The one-liner list of docs/snapshots.md: ``files/<table>.txt`` relative to the release folder."""
    return [f"{folder}/{p}" for p in open(f"{folder}/files/{table}.txt").read().split()]


# ---- Hugging Face, DuckDB, polars: the pinned rows, not every release's ---------------------------------------


def test_hf_datasets_duckdb_and_polars_read_the_pinned_release(two_releases):
    import datasets

    st = two_releases
    old, new = load_snapshot(st, "0.1.0"), load_snapshot(st, "0.2.0")
    R = _folder(st, "0.1.0")
    for t in ("pairs", "studies", "vqa", "images"):
        rows = old.manifest["tables"][t]["rows"]
        assert rows < new.manifest["tables"][t]["rows"], t
        assert datasets.load_dataset(R, t, split="full").num_rows == rows, t
        assert duckdb.read_parquet(_files(R, t)).count("*").fetchall()[0][0] == rows, t
        assert pl.scan_parquet(_files(R, t)).select(pl.len()).collect().item() == rows, t
    # the glob the issue reported reads both releases' files: the file lists exist for this reason
    glob = st.path("snapshots/tables/pairs/*.parquet")
    assert duckdb.sql(f"SELECT count(*) FROM read_parquet('{glob}')").fetchall()[0][0] == 6
    assert old.manifest["tables"]["pairs"]["rows"] == 4
    # the images config decodes the PNG column as an Image feature (the stored pixels); volume rows: None
    images = datasets.load_dataset(R, "images", split="full")
    assert isinstance(images.features["payload"], datasets.Image)
    by_key = {r["image_key"]: r for r in images}
    _, expected = png_payload(zlib.crc32(b"us-a/1/0"))
    assert np.array_equal(np.asarray(by_key["us-a-p1-s0-i"]["payload"]), expected)
    assert by_key["gb-b-ct-v"]["payload"] is None and by_key["gb-b-ct-v"]["payload_format"] == "nifti"
    # views are configs too
    pairs_view = datasets.load_dataset(R, "pair_images", split="full")
    assert sorted(pairs_view["pair_id"]) == sorted(old.view("pair_images")["pair_id"].to_pylist())


def test_views_resolve_pairs_and_vqa_items_to_their_image_rows(two_releases):
    st = two_releases
    snap = load_snapshot(st)
    view = {r["pair_id"]: r for r in snap.view("pair_images").to_pylist()}
    assert len(view) == snap.manifest["tables"]["pairs"]["rows"] == 6
    assert (view["ie-c-p0-pair"]["prior_image_key"], view["ie-c-p0-pair"]["current_image_key"]) == (
        "ie-c-p0-s0-i",
        "ie-c-p0-s1-i",
    )
    vqa = {r["item_id"]: r for r in snap.view("vqa_images").to_pylist()}
    assert vqa["us-a-p0-q0"]["image_keys"] == ["us-a-p0-s0-i", "us-a-p0-s1-i"]
    assert vqa["gb-b-ct-q"]["image_keys"] == ["gb-b-ct-v"]
    # the torch datasets pick the same images (one rule)
    pairs = PairDataset(snap, fixed_shape=False, kind=None)
    for p, a, b in pairs.items:
        assert (pairs.store.rows[a]["image_key"], pairs.store.rows[b]["image_key"]) == (
            view[p["pair_id"]]["prior_image_key"],
            view[p["pair_id"]]["current_image_key"],
        )
    # one image by key through the API
    array, meta = snap.image("gb-b-ct-v")
    _, vol = npy_payload(zlib.crc32(b"gb-b"))
    assert array.dtype == np.int16 and np.array_equal(array, np.rint(vol).astype(np.int16))
    with pytest.raises(KeyError, match="no image"):
        snap.image("nope")


def test_vectorised_views_follow_the_reader_rule():
    """build_views (polars, at publish) gives what medreco_reader.images.pair_images / vqa_images give (the rule
    the torch datasets use), on studies with mixed kinds, modalities, null views and no images."""
    import random

    import pyarrow as pa

    from etl.snapshots.ecosystem import build_views
    from medreco_reader.images import index_by_study, pair_images, vqa_images

    rng = random.Random(3)
    images = [
        {
            "image_key": f"i{k:03d}",
            "study_key": f"s{rng.randrange(30)}",
            "kind": rng.choice(["2d", "3d"]),
            "modality": rng.choice(["CR", "DX", "CT"]),
            "view": rng.choice(["PA", "AP", None]),
        }
        for k in range(80)
    ]
    pairs = [
        {
            "pair_id": f"p{k:02d}",
            "patient_key": "x",
            "prior_study_key": f"s{rng.randrange(35)}",
            "current_study_key": f"s{rng.randrange(35)}",
            "modality": rng.choice(["CR", "CT"]),
            "view": rng.choice(["PA", "AP", None]),
        }
        for k in range(40)
    ]
    vqa = [
        {
            "item_id": f"q{k:02d}",
            "pair_id": rng.choice([None, *(p["pair_id"] for p in pairs[:10]), "gone"]),
            "study_key": rng.choice([None, "s1", "s33"]),
            "study_keys": rng.choice([None, [], ["s2"], ["s3", "s34"]]),
        }
        for k in range(60)
    ]
    views = build_views(
        {"images": pa.Table.from_pylist(images), "pairs": pa.Table.from_pylist(pairs), "vqa": pa.Table.from_pylist(vqa)}
    )
    by_study = index_by_study(images)
    assert views["pair_images"].to_pylist() == pair_images(by_study, sorted(pairs, key=lambda p: p["pair_id"]))
    assert views["vqa_images"].to_pylist() == vqa_images(
        by_study, {p["pair_id"]: p for p in pairs}, sorted(vqa, key=lambda q: q["item_id"])
    )
    assert any(r["prior_image_key"] is None for r in views["pair_images"].to_pylist())  # a study without images
    empty = build_views({})
    assert empty["pair_images"].num_rows == empty["vqa_images"].num_rows == 0


def test_ecosystem_files_are_pinned_and_verified(two_releases, tmp_path):
    st = two_releases
    m = load_snapshot(st, "0.2.0").manifest
    assert {"README.md", "croissant.json", "files/pairs.txt", "views/pair_images.parquet"} <= set(m["release_files"])
    assert verify(st, "0.2.0") == []
    card = open(f"{_folder(st, '0.2.0')}/README.md").read()
    front = card.split("---\n")[1]
    import yaml

    configs = {c["config_name"]: c for c in yaml.safe_load(front)["configs"]}
    assert configs["pairs"]["data_files"][0]["path"] == open(f"{_folder(st, '0.2.0')}/files/pairs.txt").read().split()
    assert "# MedReCo-DB snapshot 0.2.0" in card and "duckdb.read_parquet" in card
    # a changed file is found (copy the release to keep the module's fixture intact)
    import shutil

    copy = tmp_path / "root"
    shutil.copytree(st.root, copy)
    target = copy / "snapshots/0.2.0/croissant.json"
    target.chmod(0o644)
    target.write_text(target.read_text().replace("MedReCo-DB", "Other"))
    assert verify(Storage.open(str(copy)), "0.2.0") == ["snapshots/0.2.0/croissant.json: sha256 mismatch"]


def test_mlcroissant_validates_and_reads_the_croissant_file(two_releases):
    import mlcroissant as mlc

    st = two_releases
    path = f"{_folder(st, '0.1.0')}/croissant.json"
    ds = mlc.Dataset(path)  # raises a ValidationError on any error
    assert ds.metadata.ctx.issues.errors == set()
    doc = json.load(open(path))
    assert {r["name"] for r in doc["recordSet"]} >= {"pairs", "images", "vqa", "pair_images", "vqa_images"}
    objects = [d for d in doc["distribution"] if d["@type"] == "cr:FileObject"]
    m = load_snapshot(st, "0.1.0").manifest
    assert sorted(o["sha256"] for o in objects if o["@id"].startswith("pairs/")) == sorted(
        f["sha256"] for f in m["tables"]["pairs"]["files"]
    )
    # mlcroissant reads a single-file record set through its FileObject (and checks its sha256)
    records = list(ds.records("pair_images"))
    assert sorted(r["pair_images/pair_id"].decode() for r in records) == sorted(
        load_snapshot(st, "0.1.0").view("pair_images")["pair_id"].to_pylist()
    )


# ---- batches that just work ------------------------------------------------------------------------------------


def test_fit_image_and_volume_shapes_and_values():
    grey = torch.rand(1, 24, 32)
    out = fit_image(grey, (20, 20), 3)
    assert out.shape == (3, 20, 20) and torch.equal(out[0], out[2])
    assert out[:, :2].abs().sum() == 0 and out[:, 3:17].min() >= 0  # 24 x 32 -> 15 x 20, padded top and bottom
    same = torch.rand(3, 20, 20)
    assert torch.equal(fit_image(same, (20, 20), 3), same)
    assert fit_image(same, (20, 20), 1).shape == (1, 20, 20)
    vol = torch.arange(3 * 8 * 12, dtype=torch.float32).reshape(3, 8, 12)
    fitted, valid = fit_volume(vol, (4, 6, 10), -1000.0)
    assert fitted.shape == (1, 4, 6, 10) and valid.tolist() == [[0, 3], [0, 6], [0, 10]]
    assert torch.equal(fitted[0, :3], vol[:, 1:7, 1:11]) and (fitted[0, 3] == -1000).all()


def test_tensor_shapes_come_from_the_config():
    import yaml
    from pydantic import ValidationError

    from schemas.config import PROJECT_ROOT, BatchConfig, PipelineConfig

    data = yaml.safe_load((PROJECT_ROOT / "config" / "demo.yaml").read_text())
    data["normalisation"] = {**data.get("normalisation", {}), "image_size": [256, 320]}
    data["batches"] = {"channels": 3, "volume_shape": [64, 128, 128]}
    cfg = PipelineConfig.model_validate(data)
    assert TensorShape.from_config(cfg) == TensorShape(3, (256, 320), (64, 128, 128))
    assert TensorShape.from_config(None) == TensorShape(1, (480, 480), (240, 480, 480))  # MedReCo's
    assert TensorShape.from_config(BatchConfig(image_size=(64, 64))).image_size == (64, 64)
    with pytest.raises(ValidationError, match="volume_shape"):
        BatchConfig(volume_shape=(0, 8, 8))


def test_default_collate_batches_images_pairs_and_vqa_with_two_workers(two_releases):
    snap = load_snapshot(two_releases)
    loader = lambda ds, n: torch.utils.data.DataLoader(ds, batch_size=n, num_workers=2)  # noqa: E731
    images = ImageDataset(snap, shape=SMALL)
    assert len(images) == 12
    batch = next(iter(loader(images, 5)))
    assert batch["image"].shape == (5, 3, 20, 20) and batch["spacing_mm"].shape == (5, 2)
    assert len(batch["image_key"]) == 5 and all(isinstance(k, str) for k in batch["view"])
    pairs = PairDataset(snap, shape=SMALL, store=images.store)
    seen = [b for b in loader(pairs, 4)]
    assert [b["prior"].shape for b in seen] == [(4, 3, 20, 20), (2, 3, 20, 20)]
    labels = json.loads(seen[0]["change_labels"][0])
    assert labels[0]["change"] == "new" and seen[0]["gap_days"].tolist() == [365] * 4
    vqa = VQADataset(snap, shape=SMALL, store=images.store)
    assert len(vqa) == 6 and sorted(vqa.excluded) == ["gb-b-ct-q", "ie-c-ct-q", "us-a-ct-q"]  # the CT items: 3D
    b = next(iter(loader(vqa, 6)))
    assert b["images"].shape == (6, 2, 3, 20, 20) and b["image_mask"].all()
    assert b["answer_index"].tolist() == [0] * 6 and json.loads(b["options"][0]) == ["yes", "no"]
    # volumes: one kind per dataset, cropped / padded to the configured shape
    vols = ImageDataset(snap, kind="3d", shape=SMALL)
    vb = next(iter(loader(vols, 3)))
    assert vb["image"].shape == (3, 1, 4, 6, 10) and vb["valid"][0].tolist() == [[0, 3], [0, 6], [1, 9]]
    item = vols[0]
    raw = ImageDataset(snap, kind="3d", fixed_shape=False)[0]["image"]
    assert torch.equal(item["image"][0, :3, :, 1:9], raw[:, 1:7, :]) and (item["image"][0, 3] == -1000).all()
    cq = next(iter(loader(VQADataset(snap, kind="3d", shape=SMALL), 3)))
    assert cq["images"].shape == (3, 2, 1, 4, 6, 10) and cq["image_mask"].tolist() == [[True, False]] * 3
    with pytest.raises(ValueError, match="needs one kind"):
        ImageDataset(snap, kind=None)


def test_docs_training_loop_runs_on_a_release(two_releases):
    """The ten-line loop over pairs and VQA items of docs/snapshots.md, as printed, on a release (default collate,
    2 workers)."""
    from schemas.config import PROJECT_ROOT

    page = (PROJECT_ROOT / "docs" / "snapshots.md").read_text()
    code = page.split("<!-- training-loop -->\n```python\n", 1)[1].split("```", 1)[0]
    assert len(code.strip().splitlines()) <= 20 and ".demo/root" in code
    scope: dict = {}
    exec(compile(code.replace(".demo/root", two_releases.root), "docs/snapshots.md", "exec"), scope)  # noqa: S102
    assert scope["loss"].ndim == 0 and torch.isfinite(scope["loss"])
    assert scope["b"]["images"].shape[1:3] == (2, 1)  # the last VQA batch: two slots, one channel


def test_monai_loads_the_release_volumes(two_releases):
    from monai.data import Dataset as MonaiDataset
    from monai.transforms import LoadImage, LoadImaged

    st = two_releases
    snap = load_snapshot(st)
    records = snap.volumes()  # MONAI-style records: {"image": <.nii.gz path>, "image_key": ...}
    assert len(records) == 3 and records[0]["image"] == st.full_uri(
        snap.image_row(records[0]["image_key"])["payload_uri"]
    )
    volumes = ImageDataset(snap, kind="3d", fixed_shape=False)
    raw = {volumes[i]["image_key"]: volumes[i]["image"] for i in range(len(volumes))}
    img = LoadImage(image_only=True)(records[0]["image"])  # NIfTI (x, y, z) = (col, row, slice)
    assert tuple(img.shape) == (8, 8, 3)
    assert np.array_equal(np.asarray(img).transpose(2, 1, 0), raw[records[0]["image_key"]].numpy())
    ds = MonaiDataset(records, transform=LoadImaged(keys="image", image_only=True))
    assert [tuple(ds[i]["image"].shape) for i in range(len(ds))] == [(8, 8, 3)] * 3
    assert np.allclose(np.asarray(ds[0]["image"].affine)[:3, :3].diagonal(), [-0.7, -0.7, 1.5])  # RAS, mm


@pytest.mark.parametrize("page", ["README.md", "docs/snapshots.md", "docs/pixels.md"])
def test_docs_release_examples_run_on_a_release(two_releases, page):
    """Every ``<!-- release-example -->`` block of the README and docs, as printed, on a release (``image_key``: the
    first images row's, for blocks that take one)."""
    from medreco_reader import Snapshot as ReaderSnapshot
    from schemas.config import PROJECT_ROOT

    text = (PROJECT_ROOT / page).read_text(encoding="utf-8")
    blocks = re.findall(r"<!-- release-example -->\n```python\n(.*?)```", text, flags=re.DOTALL)
    assert blocks, page
    snap = load_snapshot(two_releases)
    for code in blocks:
        assert ".demo/root" in code
        scope: dict = {"image_key": snap.read("images", ["image_key"])["image_key"][0].as_py()}
        exec(compile(code.replace(".demo/root", two_releases.root), page, "exec"), scope)  # noqa: S102
        assert isinstance(scope["snap"], ReaderSnapshot) and scope["snap"].version == "0.2.0"
        assert scope["array"].size > 0
