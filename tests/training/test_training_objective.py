"""The paper's objective and cells against hand values: graded multi-positive loss, NDCG@k, retrieval cells with
same-patient exclusion, VQA cells, CT windowing and slice resampling, the best-metric lookup."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
import yaml

from schemas.config import PROJECT_ROOT


def _unit(rows):
    return torch.nn.functional.normalize(torch.tensor(rows, dtype=torch.float32), dim=1)


def test_graded_loss_equals_infonce_with_one_positive_and_weights_two_positives_by_relevance():
    from training.encoder import graded_contrastive, info_nce

    a, p = _unit([[1.0, 0.0], [0.6, 0.8]]), _unit([[0.8, 0.6], [0.0, 1.0]])
    tau = torch.tensor([0.5, 0.5])
    eye = torch.eye(2)
    assert float(graded_contrastive(a, p, a, p, tau, tau, eye, eye)) == pytest.approx(
        float(info_nce(a, p, tau, tau)), rel=1e-6
    )
    # row 0 of a->p: positives 0 (relevance 1.0) and 1 (relevance 0.5): q = (2/3, 1/3)
    rel = torch.tensor([[1.0, 0.5], [0.0, 1.0]])
    s = (a @ p.T) / 0.5
    logp = torch.log_softmax(s, 1)
    a2p = -((2 / 3) * logp[0, 0] + (1 / 3) * logp[0, 1]) - logp[1, 1]
    sp = (p @ a.T) / 0.5
    p2a = -torch.log_softmax(sp, 1).diagonal().sum()
    expect = 0.5 * (a2p / 2 + p2a / 2)
    assert float(graded_contrastive(a, p, a, p, tau, tau, rel, eye)) == pytest.approx(float(expect), rel=1e-6)
    # an ignored column (the query patient's other study) leaves the softmax: row 1 then has only its own pair
    ign = torch.tensor([[False, False], [True, False]])
    got = graded_contrastive(a, p, a, p, tau, tau, eye, eye, ign, torch.zeros(2, 2, dtype=torch.bool))
    a2p_ign = -torch.log_softmax(s, 1)[0, 0] + 0.0
    assert float(got) == pytest.approx(float(0.5 * (a2p_ign / 2 + p2a / 2)), rel=1e-6)
    with pytest.raises(ValueError, match="no relevant column"):
        graded_contrastive(a, p, a, p, tau, tau, torch.zeros(2, 2), eye)


def test_ndcg_hand_values():
    from training.encoder import ndcg_at_k

    sim = torch.tensor([[0.9, 0.8, 0.7, 0.1], [0.1, 0.2, 0.3, 0.4]])
    gain = torch.tensor([[0.0, 1.0, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0]])
    got = ndcg_at_k(sim, gain, 3)
    dcg = 1.0 / math.log2(3) + 0.5 / math.log2(4)
    idcg = 1.0 / math.log2(2) + 0.5 / math.log2(3)
    assert float(got[0]) == pytest.approx(dcg / idcg, rel=1e-6) and math.isnan(float(got[1]))
    excl = torch.tensor([[True, False, False, False], [False] * 4])  # excluding rank 1 moves the relevant up
    assert float(ndcg_at_k(sim, gain, 3, excl)[0]) == pytest.approx(1.0)


def test_retrieval_cells_split_by_family_and_category_and_exclude_the_patient():
    from training.evaluation import retrieval_cells

    gallery = ["a1", "a2", "b1", "c1", "ct1", "ct2"]
    patient = {"a1": "A", "a2": "A", "b1": "B", "c1": "C", "ct1": "A", "ct2": "B"}
    family = {s: ("3D-CT" if s.startswith("ct") else "2D-CXR") for s in gallery}
    # one entity, 1-D embeddings: a1 is closest to a2 (same patient: never ranked), then b1, then c1
    emb = torch.tensor([[[1.0, 0.0]], [[1.0, 0.0]], [[0.8, 0.6]], [[0.0, 1.0]], [[1.0, 0.0]], [[0.0, 1.0]]])
    rel = {("a1", "F001"): {"c1": 1.0, "a2": 1.0}, ("ct1", "F001"): {"ct2": 0.5}}
    out = retrieval_cells(
        emb,
        gallery,
        ["F001"],
        family,
        patient,
        [("a1", "F001"), ("ct1", "F001")],
        lambda s, e: rel.get((s, e), {}),
        [1, 5],
        10,
        {"F001": "finding"},
    )
    cxr = out["cells"]["2D-CXR|finding"]
    assert (cxr["n_queries"], cxr["gallery"], cxr["R@1"], cxr["R@5"]) == (1, 4, 0.0, 1.0)  # c1 at rank 2 (a2 skipped)
    assert cxr["NDCG@10"] == pytest.approx(1 / math.log2(3))
    ct = out["cells"]["3D-CT|finding"]
    assert (ct["n_queries"], ct["R@1"], ct["NDCG@10"]) == (1, 1.0, 1.0)
    assert len(out["cells"]) == 12 and out["cells"]["3D-Brain-MRI|condition"]["gallery"] == 0  # the paper's 12
    assert out["cells"]["2D-CXR|anatomy"] == {"n_queries": 0, "gallery": 4, "R@1": None, "R@5": None, "NDCG@10": None}
    assert out["cells_mean"]["R@1"] == 0.5 and out["n_queries"] == 2


def test_vqa_cells_per_family_type_and_longitudinal_change():
    from training.evaluation import metric_at, vqa_cells

    rows = [
        {"question_type": "change", "family": "2D-CXR", "mc_correct": True},
        {"question_type": "change", "family": "2D-CXR", "mc_correct": False},
        {"question_type": "presence", "family": "3D-CT", "mc_correct": True},
        {"question_type": "open_location", "family": "3D-CT", "mc_correct": None},
    ]
    c = vqa_cells(rows)
    assert c["by_family"] == {"2D-CXR": {"n_mc": 2, "mc_accuracy": 0.5}, "3D-CT": {"n_mc": 1, "mc_accuracy": 1.0}}
    assert c["longitudinal_change"]["2D-CXR"]["mc_accuracy"] == 0.5
    assert c["longitudinal_change"]["3D-CT"] == {"n_mc": 0, "mc_accuracy": None}
    assert c["by_family_and_type"]["3D-CT|presence"]["mc_accuracy"] == 1.0
    assert metric_at({"val": {"cells_mean": {"NDCG@10": 0.25}}}, "val.cells_mean.NDCG@10") == 0.25
    assert metric_at({"val": {}}, "val.mc_accuracy") is None


def test_ct_window_and_slice_resampling():
    from training.data import resample_slices, window_volume

    hu = torch.tensor([-1000.0, -160.0, 40.0, 240.0, 3000.0])
    assert window_volume(hu, "CT", {"CT": (40.0, 400.0)}).tolist() == pytest.approx([0.0, 0.0, 0.5, 1.0, 1.0])
    assert window_volume(torch.tensor([2.0, 4.0]), "MR", {"CT": (40.0, 400.0)}).tolist() == [0.0, 1.0]
    v = torch.arange(5, dtype=torch.float32)[:, None, None].expand(5, 2, 2)  # 5 slices, 2.5 mm apart
    r = resample_slices(v, 2.5, 1.25)
    assert r.shape == (9, 2, 2) and r[:, 0, 0].tolist() == pytest.approx([0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5, 4])
    assert resample_slices(v, None, 1.0) is v and resample_slices(v, 2.5, 2.5) is v


def test_vlm_vision_tower_starts_from_an_encoder_checkpoint(tmp_path):
    from training.config import EncoderModelConfig
    from training.encoder import EntityAwareEncoder
    from training.tasks import load_vision_init

    cfg = EncoderModelConfig()
    enc = EntityAwareEncoder(cfg, n_entities=3, n_families=2)
    torch.save({"model": enc.state_dict(), "task": {"entity_ids": ["F001", "F002", "F003"]}}, tmp_path / "last.pt")
    vision = EntityAwareEncoder(cfg, n_entities=2, n_families=1, with_heads=False)
    got = load_vision_init(vision, tmp_path / "last.pt", ["F003", "F009"])
    assert got["entities"] == 1 and not hasattr(vision, "head_w")
    for k, v in vision.tokens.state_dict().items():
        assert torch.equal(v, enc.tokens.state_dict()[k])
    assert torch.equal(vision.pool.queries.weight[0], enc.pool.queries.weight[2])  # F003 by id
    assert not torch.equal(vision.pool.queries.weight[1], enc.pool.queries.weight[1])
    with pytest.raises(FileNotFoundError):
        load_vision_init(vision, tmp_path / "none.pt", [])


def test_training_page_shows_the_cells_escaped():
    from training.report import render_training_page

    cells = {
        "2D-CXR|finding": {"n_queries": 3, "gallery": 8, "R@1": 0.5, "NDCG@10": 0.75},
        "2D-CXR|anatomy": {"n_queries": 0, "gallery": 8, "R@1": None, "NDCG@10": None},
    }
    enc = {
        "status": "succeeded",
        "launcher": "local",
        "lineage_record": {
            "metrics": {
                "step": 10,
                "images_per_s": 12.5,
                "best": {"metric": "val.cells_mean.NDCG@10", "value": 0.75, "step": 10},
                "eval": {
                    "val": {
                        "n_queries": 3,
                        "gallery": 8,
                        "cells": cells,
                        "cells_mean": {"NDCG@10": 0.75, "R@1": 0.5, "R@10": 1.0, "R@5": 1.0},  # as stored: sorted
                    }
                },
            }
        },
    }
    vqa = {
        "n_mc": 2,
        "mc_accuracy": 0.5,
        "by_question_type": {"change": {"n_mc": 2, "mc_accuracy": 0.5}},
        "by_family": {"2D-CXR": {"n_mc": 2, "mc_accuracy": 0.5}},
        "by_family_and_type": {"2D-CXR|change": {"n_mc": 2, "mc_accuracy": 0.5}},
        "longitudinal_change": {"2D-CXR": {"n_mc": 2, "mc_accuracy": 0.5}},
    }
    page = render_training_page(
        {
            "snapshot_version": "1.0.0<x>",
            "content_hash": "abc",
            "jobs": {
                "encoder": enc,
                "vlm": {
                    "status": "succeeded",
                    "launcher": "local",
                    "lineage_record": {"metrics": {"step": 4, "eval": {"test": vqa}}},
                },
            },
        }
    )
    assert "1.0.0&lt;x&gt;" in page and "<x>" not in page
    assert "<td>2D-CXR|finding</td>" in page and "val.cells_mean.NDCG@10 = 0.7500 at step 10" in page
    assert "<td>longitudinal change</td>" in page and "<h3>test</h3>" in page
    assert (
        '<th class="num">R@1</th><th class="num">R@5</th><th class="num">R@10</th><th class="num">NDCG@10</th>' in page
    )


@pytest.mark.slow
def test_gpu_check_runs_green_on_cpu_with_tiny_sizes(tmp_path):
    out = subprocess.run(
        [sys.executable, "training/gpu_check.py", "--size", "tiny", "--device", "cpu", "--out", str(tmp_path)],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    lines = [x for x in out.stdout.splitlines() if x.startswith("GPUCHECK")]
    assert [x.split()[1] for x in lines] == ["job=encoder", "job=vlm"]
    import json

    res = json.loads((tmp_path / "gpu_check.json").read_text())
    for r in res:
        assert r["loss_last"] < r["loss_first"] and r["images_per_s"] > 0 and 0 <= r["loader_wait_share"] <= 1
        assert r["resumed_to"] == r["resumed_from"] + 2 and r["checkpoint_loads_on"] == ["cpu"]


def test_vision_init_is_refused_beside_a_qwen_vl_folder(tmp_path):
    from training.config import TrainingConfigError, load_job_config

    cfg = tmp_path / "vlm.yaml"
    cfg.write_text(yaml.safe_dump({"job": "vlm", "name": "q", "model": {"path": "/m/qwen", "vision_init": "encoder"}}))
    with pytest.raises(TrainingConfigError, match="a Qwen-VL model.path has its own"):
        load_job_config(cfg)
