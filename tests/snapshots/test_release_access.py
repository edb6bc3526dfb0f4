"""What an ML engineer trips on when reading a release (issue 40, points 1, 3, 6 and 13): an unknown split name, default
tensor shapes that ignore the release, pairs silently dropped for their kind, and snapshot commands that need the
whole pipeline config.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from test_snapshots import do_publish, write_institution

from etl.snapshots import load_snapshot
from etl.storage import Storage
from medreco_reader.torch_data import SPLITS, ImageDataset, PairDataset, TensorShape, VQADataset
from schemas.config import PROJECT_ROOT


@pytest.fixture()
def release(tmp_path):
    """One release (us-a, gb-b: CR images 24 x 32 and one CT volume 3 x 8 x 8)."""
    st = Storage.open(str(tmp_path / "root"))
    write_institution(st, "us-a", 0)
    write_institution(st, "gb-b", 1)
    do_publish(st)
    return st


@pytest.mark.parametrize("name", ["validation", "Train", "tran", ["train", "dev"]])
@pytest.mark.parametrize("dataset", [ImageDataset, PairDataset, VQADataset])
def test_an_unknown_split_is_refused_naming_the_valid_ones(release, dataset, name):
    with pytest.raises(ValueError, match="unknown split .*train, val, test, external_test"):
        dataset(load_snapshot(release), split=name)


def test_every_valid_split_name_is_accepted(release):
    snap = load_snapshot(release)
    sizes = {s: len(ImageDataset(snap, split=s)) for s in SPLITS}
    assert sum(sizes.values()) == len(ImageDataset(snap))  # the splits partition the images


def test_default_shapes_come_from_the_release_not_a_config(release):
    snap = load_snapshot(release)
    ds = ImageDataset(snap)  # no shape given
    assert ds.shape == TensorShape(1, (24, 32), (3, 8, 8))
    assert ds[0]["image"].shape == (1, 24, 32)  # stored size, not 480 x 480
    vol = ImageDataset(snap, kind="3d")[0]
    assert vol["image"].shape == (1, 3, 8, 8)  # not (1, 240, 480, 480): 221 MB a volume
    # an explicit shape still wins
    assert ImageDataset(snap, shape=TensorShape(3, (16, 16), (2, 4, 4)))[0]["image"].shape == (3, 16, 16)


def test_items_left_out_for_their_kind_are_counted_in_a_warning(release):
    snap = load_snapshot(release)
    everything = len(VQADataset(snap, kind=None, fixed_shape=False))
    with pytest.warns(UserWarning, match=r"VQA items with 3d images are left out of this kind='2d' dataset"):
        two_d = VQADataset(snap)
    three_d = VQADataset(snap, kind="3d")
    assert three_d.other_kind == len(two_d) > 0 and two_d.other_kind == len(three_d) > 0
    assert len(two_d) + len(three_d) == everything
    assert len(two_d.excluded) == two_d.other_kind


def _medreco(*args: str, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "medreco.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        cwd=cwd or PROJECT_ROOT,
    )


def test_snapshot_commands_with_root_or_a_storage_only_config(release, tmp_path):
    only = tmp_path / "elsewhere" / "reader.yaml"
    only.parent.mkdir()
    only.write_text(f"storage:\n  root: {release.root}\n")
    by_root = _medreco("snapshot", "list", "--root", release.root, cwd=tmp_path)
    assert by_root.returncode == 0, by_root.stderr
    header, row = by_root.stdout.strip().splitlines()
    assert header.split("\t") == [
        "version",
        "created_at",
        "change",
        "content_hash",
        "studies",
        "images",
        "pairs",
        "vqa",
    ]
    manifest = load_snapshot(release).manifest
    assert row.split("\t")[0] == "0.1.0" and row.split("\t")[5] == str(manifest["tables"]["images"]["rows"])
    by_env = _medreco("snapshot", "list", env={"MEDRECO_CONFIG": str(only)}, cwd=tmp_path)
    assert by_env.returncode == 0, by_env.stderr
    assert by_env.stdout == by_root.stdout
    verify = _medreco("snapshot", "verify", "latest", "-c", str(only), cwd=tmp_path)
    assert verify.returncode == 0 and "all files match" in verify.stdout, verify.stderr
    show = _medreco("snapshot", "show", "0.1.0", "--root", release.root, cwd=tmp_path)
    assert show.returncode == 0 and '"content_hash"' in show.stdout


def test_a_config_without_storage_is_refused_in_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("institutions: []\n")
    out = _medreco("snapshot", "list", "-c", str(bad), cwd=tmp_path)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        f"error: configuration file {bad} has no storage: section (storage: {{root: FOLDER or s3://...}})"
    ]


def test_no_release_under_a_root_says_so(tmp_path):
    out = _medreco("snapshot", "list", "--root", str(tmp_path / "empty"), cwd=tmp_path)
    assert out.returncode == 1 and "no release under" in out.stderr
    dash = _medreco("dashboard", "--root", str(tmp_path / "empty"), cwd=tmp_path)  # the root alone is enough
    assert dash.returncode == 1 and "no dashboard yet" in dash.stderr


def test_tensor_shape_from_release_without_images_keeps_the_defaults():
    assert TensorShape.from_release([]) == TensorShape()
    assert torch.zeros(1).shape == (1,)


def test_an_exported_release_is_self_contained_and_has_hugging_face_splits(release, tmp_path):
    import shutil

    import datasets

    manifest = load_snapshot(release).manifest
    splits = {r["patient_key"]: r["split"] for r in load_snapshot(release).read("splits").to_pylist()}
    pairs_by_split: dict[str, set] = {}
    for p in load_snapshot(release).read("pairs").to_pylist():
        pairs_by_split.setdefault(splits[p["patient_key"]], set()).add(p["pair_id"])
    out = _medreco("snapshot", "export", "latest", str(tmp_path / "export"), "--root", release.root, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    front = json.loads((tmp_path / "export" / "README.md").read_text().split("---\n")[1])
    card_splits = [sp for info in front["dataset_info"] for sp in info["splits"]]  # read by `datasets`, no warning
    assert card_splits and all(sp["num_bytes"] > 0 and sp["num_examples"] > 0 and sp["name"] for sp in card_splits)
    moved = tmp_path / "handed-over"
    shutil.copytree(tmp_path / "export", moved)
    shutil.rmtree(release.root)  # nothing of the store is left: the copy must stand alone
    for split, want in pairs_by_split.items():
        ds = datasets.load_dataset(str(moved), "pairs", split=split, cache_dir=str(tmp_path / "hf-cache"))
        assert set(ds["pair_id"]) == want and set(ds["split"]) == {split}
        assert {splits[k] for k in ds["patient_key"]} == {split}  # patient sets match the splits table
    images = datasets.load_dataset(str(moved), "images", cache_dir=str(tmp_path / "hf-cache"))
    assert sum(len(images[s]) for s in images) == manifest["tables"]["images"]["rows"]
    vqa = datasets.load_dataset(str(moved), "vqa_images", cache_dir=str(tmp_path / "hf-cache"))
    assert sum(len(vqa[s]) for s in vqa) == manifest["views"]["vqa_images"]["rows"]
    again = _medreco("snapshot", "export", "latest", str(moved), "--root", str(tmp_path / "none"), cwd=tmp_path)
    assert again.returncode == 1  # an existing, non-empty destination is refused


HF_SCRIPT = r"""
import json, sys
import datasets
folder, splits = sys.argv[1], sys.argv[2].split(",")
out = {"datasets": datasets.__version__, "splits": {}}
for split in splits:
    ds = datasets.load_dataset(folder, "pairs", split=split, cache_dir=sys.argv[3])
    out["splits"][split] = {"patients": sorted(set(ds["patient_key"])), "pairs": sorted(ds["pair_id"]),
                            "split_column": sorted(set(ds["split"]))}
for name in ("etl", "medreco", "medreco_reader", "schemas", "quality", "torch"):
    try:
        __import__(name)
        out.setdefault("importable", []).append(name)
    except ImportError:
        pass
print(json.dumps(out))
"""


@pytest.mark.slow
def test_a_copied_export_loads_per_split_in_a_venv_with_datasets_alone(release, tmp_path, datasets_venv):
    """Issue 40, done-when: a copied export loads with ``datasets.load_dataset(copy, "pairs", split=...)`` in a
    venv holding only ``datasets`` (no project, no reader), every split's patient set equal to ``splits``."""
    import shutil

    snap = load_snapshot(release)
    splits = {r["patient_key"]: r["split"] for r in snap.read("splits").to_pylist()}
    want: dict[str, dict[str, set]] = {}
    for p in snap.read("pairs").to_pylist():
        w = want.setdefault(splits[p["patient_key"]], {"patients": set(), "pairs": set()})
        w["patients"].add(p["patient_key"])
        w["pairs"].add(p["pair_id"])
    assert {"train", "test"} <= set(want)  # the fixture gives pairs to two splits (none to val)
    out = _medreco("snapshot", "export", "latest", str(tmp_path / "export"), "--root", release.root, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    copy = tmp_path / "copy"
    shutil.copytree(tmp_path / "export", copy)
    shutil.rmtree(tmp_path / "export")
    shutil.rmtree(release.root)  # the store is gone: the copy stands alone
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    run = subprocess.run(
        [str(datasets_venv), "-c", HF_SCRIPT, str(copy), ",".join(sorted(want)), str(tmp_path / "hf-cache")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout)
    assert "importable" not in got, got["importable"]  # nothing of the project, not even the reader
    for split, w in want.items():
        g = got["splits"][split]
        assert set(g["patients"]) == w["patients"] and set(g["pairs"]) == w["pairs"], split
        assert g["split_column"] == [split]
    all_patients = [p for g in got["splits"].values() for p in g["patients"]]
    assert len(all_patients) == len(set(all_patients))  # no patient in two splits
