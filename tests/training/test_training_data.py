"""Training datasets over a published snapshot: refusal of tampered releases, images, positives, VQA items.

``build_training_snapshot`` publishes a small synthetic release (hand-made tables through
``etl.snapshots.publish``) that the other ``test_training_*`` modules share: 24 patients (16 train, 4 val,
4 test), two chest radiographs each (one pair), plus CT volumes for 4 patients; three findings whose
``present`` state paints a bright square at a finding-specific place, so the encoder can learn them.
"""

from __future__ import annotations

import hashlib
import io
import os
import random

import numpy as np
import pytest
from PIL import Image

from etl.storage import Storage
from schemas.base import table_from_rows
from schemas.tables import SCHEMAS

ENTITIES = ("F001", "F002", "F003")
#: top-left corner (row, col) of each finding's square in a 32 x 32 image
SPOTS = {"F001": (2, 2), "F002": (2, 20), "F003": (20, 10)}
SPLITS = ["train"] * 16 + ["val"] * 4 + ["test"] * 4


def _png(states: dict[str, str], rng: np.random.Generator, size: int = 32) -> bytes:
    img = rng.integers(0, 60, (size, size)).astype(np.uint8)
    for e, st in states.items():
        if st == "present":
            r, c = SPOTS[e]
            img[r : r + 10, c : c + 10] = 230
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG")
    return buf.getvalue()


def _npy(states: dict[str, str], rng: np.random.Generator) -> bytes:
    vol = rng.normal(-800, 50, (5, 16, 16)).astype(np.float32)
    for e, st in states.items():
        if st == "present":
            r, c = SPOTS[e]
            vol[1:4, r // 2 : r // 2 + 5, c // 2 : c // 2 + 5] = 200.0
    buf = io.BytesIO()
    np.save(buf, vol)
    return buf.getvalue()


def _targets(t: dict[str, list[dict]], top_k: int = 5) -> list[dict]:
    """Retrieval targets as the build defines them: same split and family, other patients, same state
    (``present``), top ``top_k`` by study key."""
    split = {r["patient_key"]: r["split"] for r in t["splits"]}
    fam = {r["study_key"]: r["family"] for r in t["studies"]}
    present = [r for r in t["study_labels"] if r["state"] == "present"]
    out = []
    for q in present:
        cands = sorted(
            c["study_key"]
            for c in present
            if c["entity_id"] == q["entity_id"]
            and c["patient_key"] != q["patient_key"]
            and split[c["patient_key"]] == split[q["patient_key"]]
            and fam[c["study_key"]] == fam[q["study_key"]]
        )[:top_k]
        out += [
            {
                "query_study_key": q["study_key"],
                "entity_id": q["entity_id"],
                "candidate_study_key": c,
                "rank": i + 1,
                "relevance": 1.0,
                "family": fam[c],
                "state": "present",
                "query_patient_key": q["patient_key"],
                "candidate_patient_key": c.split("-")[0],
                "split": split[q["patient_key"]],
                "shard": 0,
            }
            for i, c in enumerate(cands)
        ]
    return out


def _rows(seed: int = 3, targets: bool = True) -> dict[str, list[dict]]:
    rng = np.random.default_rng(seed)
    pick = random.Random(seed)
    t: dict[str, list[dict]] = {k: [] for k in SCHEMAS if k != "ledger"}
    for p, split in enumerate(SPLITS):
        pk = f"p{p:02d}"
        t["splits"].append({"patient_key": pk, "institution": "inst-a", "split": split, "shard": 0})
        keys = []
        for s in range(2):
            sk = f"{pk}-s{s}"
            keys.append(sk)
            states = {e: pick.choice(["present", "absent"]) for e in ENTITIES}
            t["studies"].append(
                {
                    "study_key": sk,
                    "patient_key": pk,
                    "institution": "inst-a",
                    "country": "US",
                    "modality": "CR",
                    "family": "2D-CXR",
                    "n_series": 1,
                    "n_images": 1,
                    "shard": 0,
                }
            )
            payload = _png(states, rng)
            t["images"].append(
                {
                    "image_key": f"{sk}-i0",
                    "series_key": f"{sk}-se",
                    "study_key": sk,
                    "patient_key": pk,
                    "institution": "inst-a",
                    "modality": "CR",
                    "view": "PA",
                    "kind": "2d",
                    "rows": 32,
                    "cols": 32,
                    "n_slices": 1,
                    "payload_format": "png",
                    "payload": payload,
                    "payload_sha256": hashlib.sha256(payload).hexdigest(),
                    "recipe": "[]",
                    "transfer_syntax": "1.2.840.10008.1.2.1",
                    "shard": 0,
                }
            )
            for e, st in states.items():
                t["study_labels"].append(
                    {
                        "study_key": sk,
                        "patient_key": pk,
                        "family": "2D-CXR",
                        "entity_id": e,
                        "state": st,
                        "change": "none",
                        "shard": 0,
                    }
                )
                ans = "A" if st == "present" else "B"
                t["vqa"].append(
                    {
                        "item_id": f"{sk}-{e}-presence",
                        "study_key": sk,
                        "patient_key": pk,
                        "question_type": "presence",
                        "question": f"Is there {e.lower()} in this image?",
                        "options": ["present", "absent", "uncertain", "not assessable"],
                        "answer": ans,
                        "answer_text": "present" if ans == "A" else "absent",
                        "entity_ids": [e],
                        "split": split,
                        "shard": 0,
                    }
                )
        prior = {r["entity_id"]: r["state"] for r in t["study_labels"] if r["study_key"] == keys[0]}
        cur = {r["entity_id"]: r["state"] for r in t["study_labels"] if r["study_key"] == keys[1]}
        pid = f"{pk}-pair"
        t["pairs"].append(
            {
                "pair_id": pid,
                "patient_key": pk,
                "prior_study_key": keys[0],
                "current_study_key": keys[1],
                "family": "2D-CXR",
                "modality": "CR",
                "view": "PA",
                "gap_days": 30,
                "change_labels": [],
                "n_conflicts": 0,
                "shard": 0,
            }
        )
        e = ENTITIES[p % 3]
        opts = ["in the prior study only", "in the current study only", "in both studies", "in neither study"]
        key = {("present", "absent"): 0, ("absent", "present"): 1, ("present", "present"): 2, ("absent", "absent"): 3}[
            (prior[e], cur[e])
        ]
        t["vqa"].append(
            {
                "item_id": f"{pid}-{e}-cmp",
                "pair_id": pid,
                "patient_key": pk,
                "question_type": "comparison_presence",
                "question": f"In which of the two studies is there {e.lower()}?",
                "options": opts,
                "answer": "ABCD"[key],
                "answer_text": opts[key],
                "entity_ids": [e],
                "split": split,
                "shard": 0,
            }
        )
        if p % 6 == 0:  # a CT volume study for 4 patients (3D path)
            sk = f"{pk}-ct"
            states = {e: pick.choice(["present", "absent"]) for e in ENTITIES}
            t["studies"].append(
                {
                    "study_key": sk,
                    "patient_key": pk,
                    "institution": "inst-a",
                    "country": "US",
                    "modality": "CT",
                    "family": "3D-CT",
                    "n_series": 1,
                    "n_images": 5,
                    "shard": 0,
                }
            )
            payload = _npy(states, rng)
            t["images"].append(
                {
                    "image_key": f"{sk}-v",
                    "series_key": f"{sk}-se",
                    "study_key": sk,
                    "patient_key": pk,
                    "institution": "inst-a",
                    "modality": "CT",
                    "view": "AXIAL",
                    "kind": "3d",
                    "rows": 16,
                    "cols": 16,
                    "n_slices": 5,
                    "payload_format": "npy",
                    "payload": payload,
                    "payload_sha256": hashlib.sha256(payload).hexdigest(),
                    "recipe": "[]",
                    "transfer_syntax": "1.2.840.10008.1.2.1",
                    "shard": 0,
                }
            )
            for e, st in states.items():
                t["study_labels"].append(
                    {
                        "study_key": sk,
                        "patient_key": pk,
                        "family": "3D-CT",
                        "entity_id": e,
                        "state": st,
                        "change": "none",
                        "shard": 0,
                    }
                )
    if "retrieval_targets" in t and targets:
        t["retrieval_targets"] = _targets(t)
    return t


def build_training_snapshot(root, targets: bool = True) -> Storage:
    """Publish the synthetic release under ``root`` (version 0.1.0) and return its storage; ``targets``
    False leaves ``retrieval_targets`` empty."""
    from etl.snapshots import publish

    st = Storage.open(str(root))
    for name, rows in _rows(targets=targets).items():
        st.write_table(f"curated/{name}/shard=00000/part-0.parquet", table_from_rows(rows, SCHEMAS[name]))
    st.write_table("curated/ledger/shard=00000/part-0.parquet", table_from_rows([], SCHEMAS["ledger"]))
    publish(st, config_hash="synthetic", ontology_version="test", run_id="r1", key_fingerprint="fp")
    return st


@pytest.fixture(scope="module")
def snap(tmp_path_factory):
    return build_training_snapshot(tmp_path_factory.mktemp("train") / "root")


def test_open_snapshot_verifies_and_refuses_a_tampered_release(tmp_path):
    from training.data import SnapshotRefusedError, open_snapshot

    st = build_training_snapshot(tmp_path / "root")
    ref = open_snapshot(st)
    assert ref.version == "0.1.0" and len(ref.content_hash) == 64
    with pytest.raises(SnapshotRefusedError, match="no snapshot 9.9.9"):
        open_snapshot(st, "9.9.9")
    path = st.path("snapshots/0.1.0/manifest.json")
    os.chmod(path, 0o644)
    with open(path, "a") as f:
        f.write("\n")
    with pytest.raises(SnapshotRefusedError, match="snapshot 0.1.0 failed verification.*manifest"):
        open_snapshot(st, "0.1.0")


def test_no_snapshot_is_refused(tmp_path):
    from training.data import SnapshotRefusedError, open_snapshot

    with pytest.raises(SnapshotRefusedError, match="no published snapshot"):
        open_snapshot(Storage.open(str(tmp_path)))


def test_image_tensors_2d_and_3d(snap):
    from training.data import image_tensor, load_study_index, open_snapshot, pad_slices

    idx = load_study_index(open_snapshot(snap))
    assert len(idx.image_row) == 48 + 4 and idx.split["p00-s0"] == "train" and idx.split["p20-s1"] == "test"
    x = image_tensor(idx.image_record("p00-s0"), 16, 1, 8)
    assert x.shape == (1, 1, 16, 16) and x.dtype.__str__() == "torch.float32"
    assert 0.0 <= float(x.min()) and float(x.max()) <= 1.0
    v = image_tensor(idx.image_record("p00-ct"), 16, 3, 3)
    assert v.shape == (3, 3, 16, 16)  # 3 of 5 slices (0, 2, 4), grey repeated to 3 channels
    assert float(v.min()) == 0.0 and float(v.max()) == pytest.approx(1.0)  # per-volume min-max
    batch, mask = pad_slices([x, image_tensor(idx.image_record("p00-ct"), 16, 1, 3)])
    assert batch.shape == (2, 3, 1, 16, 16) and mask.tolist() == [[True, False, False], [True, True, True]]


def test_positives_from_retrieval_targets(snap):
    from training.data import load_positives, load_study_index, open_snapshot

    ref = open_snapshot(snap)
    idx = load_study_index(ref)
    pos = load_positives(ref, idx, ["present"])
    assert pos.source == "retrieval_targets"
    rows = ref.table("retrieval_targets").to_pylist()
    q = rows[0]
    expected = sorted(
        r["candidate_study_key"]
        for r in rows
        if (r["query_study_key"], r["entity_id"]) == (q["query_study_key"], q["entity_id"])
    )
    assert pos.relevant(q["query_study_key"], q["entity_id"], idx) == expected and 1 <= len(expected) <= 5


def test_positives_fall_back_to_study_labels(tmp_path):
    from training.data import load_positives, load_study_index, open_snapshot

    ref = open_snapshot(build_training_snapshot(tmp_path / "root", targets=False))
    idx = load_study_index(ref)
    pos = load_positives(ref, idx, ["present"])
    assert pos.source == "study_labels" and "no retrieval_targets rows" in pos.note
    labels = ref.table("study_labels").to_pylist()
    state = {(r["study_key"], r["entity_id"]): r["state"] for r in labels}
    q = next(s for s in idx.studies("val") if state[(s, "F001")] == "present")
    rel = pos.relevant(q, "F001", idx)
    expected = sorted(
        s
        for s in idx.studies("val")
        if state[(s, "F001")] == "present" and idx.family[s] == idx.family[q] and idx.patient[s] != idx.patient[q]
    )
    assert rel == expected and q not in rel
    assert all(idx.split[s] == "val" for s in rel)


def test_vqa_items_resolve_pair_and_study_images(snap):
    from training.data import load_study_index, load_vqa_items, open_snapshot

    ref = open_snapshot(snap)
    items, skipped = load_vqa_items(ref, load_study_index(ref))
    assert skipped == 0 and len(items) == 24 * 2 * 3 + 24
    pair = next(i for i in items if i.item_id == "p05-pair-F003-cmp")
    assert (pair.prior, pair.current, pair.split) == ("p05-s0", "p05-s1", "train")
    single = next(i for i in items if i.item_id == "p21-s0-F002-presence")
    assert (single.prior, single.current, single.split) == (None, "p21-s0", "test")
