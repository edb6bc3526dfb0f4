"""Issue 20 item 1 in a release: volumes are NIfTI objects the release pins by hash; verify re-hashes them; the
torch datasets and the training data read them through the release's storage.

A demo corpus (8 patients, 4 shards; CT and MR series among them) built stage by stage in this process and
published once.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from conftest import config_for

from etl.snapshots.volume_pins import volume_pins

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    from etl.demo.corpus import generate_corpus
    from etl.pipeline import stages
    from etl.pipeline.context import BuildContext
    from etl.pipeline.ledger import finalise
    from etl.pipeline.publish_stage import publish_stage

    root = tmp_path_factory.mktemp("pins") / "root"
    generate_corpus(root, seed=7, n_patients=8)
    ctx = BuildContext.from_config_file(config_for(root, shard_count=4, max_map_length=2), run_id="run-1")
    ctx.check_key()
    for inst in ctx.cfg.institutions:
        stages.discover(ctx, inst.id)
    shards = [s for batch in stages.plan(ctx) for s in batch]
    for stage in (stages.deidentify_shard, stages.normalise_shard):
        for s in shards:
            stage(ctx, s)
    stages.reports(ctx)
    for stage in (stages.entities_shard, stages.assemble_shard):
        for s in shards:
            stage(ctx, s)
    stages.retrieval(ctx)
    finalise(ctx)
    summary = publish_stage(ctx)
    return ctx, summary["version"]


def test_release_pins_every_volume_object_and_copies_none(release):
    from etl.snapshots.manifest import read_snapshot_table

    ctx, version = release
    st = ctx.storage
    images = read_snapshot_table(
        st,
        version,
        "images",
        columns=["kind", "payload_format", "payload_uri", "payload_sha256", "payload_bytes", "dtype", "modality"],
    ).to_pylist()
    vols = [r for r in images if r["kind"] == "3d"]
    assert vols, "the demo corpus has CT/MR series"
    assert all(r["payload_format"] == "nifti" and r["payload_uri"].startswith("curated/volumes/") for r in vols)
    assert {r["dtype"] for r in vols if r["modality"] == "CT"} <= {"int16"}
    assert {r["dtype"] for r in vols if r["modality"] == "MR"} <= {"float32"}
    assert all(r["payload_uri"] is None and r["payload_format"] == "png" for r in images if r["kind"] == "2d")
    pins = volume_pins(st, version)
    assert pins == sorted({(r["payload_uri"], r["payload_sha256"]) for r in vols})
    assert not [f for f in st.list_files("snapshots") if f.endswith(".nii.gz")], "volumes are never copied"
    assert all(st.is_file(u) for u, _ in pins)


def test_verify_checks_the_volume_objects(release, tmp_path):
    from etl.snapshots.verify import verify
    from etl.storage import Storage

    ctx, version = release
    assert verify(ctx.storage, version) == []
    copy = tmp_path / "root"
    shutil.copytree(ctx.storage.root, copy)
    st = Storage.open(str(copy))
    (uri, _), *_ = volume_pins(st, version)
    data = bytearray(st.read_bytes(uri))
    data[len(data) // 2] ^= 0xFF
    st.write_bytes(uri, bytes(data))
    assert verify(st, version) == [f"images: sha256 mismatch in volume object {uri}"]
    st.delete(uri)
    assert verify(st, version) == [f"images: missing volume object {uri}"]


def test_torch_datasets_and_training_data_read_volume_objects(release):
    from etl.snapshots import load_snapshot
    from medreco_reader.torch_data import ImageStore
    from training.data import image_tensor, load_study_index, open_snapshot

    ctx, version = release
    snap = load_snapshot(ctx.storage.uri, version=version)
    store = ImageStore(snap)
    i = next(k for k, r in enumerate(store.rows) if r["kind"] == "3d")
    t = store.tensor(i)
    assert tuple(t.shape) == tuple(store.rows[i]["shape"]) and t.dtype.is_floating_point
    ref = open_snapshot(ctx.storage, version)
    index = load_study_index(ref)  # metadata in memory; a payload (or volume object) read on demand
    study = next(k for k, i in index.image_row.items() if index.store.rows[i]["kind"] == "3d")
    row = index.image_record(study)
    x = image_tensor(row, 32, 1, 4, index.storage)
    assert x.shape[1:] == (1, 32, 32) and 1 <= x.shape[0] <= 4
    assert np.isfinite(x.numpy()).all()
