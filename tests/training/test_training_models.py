"""Both models train on a small published snapshot: loss falls, checkpoints/metrics/lineage written,
resume continues the step count, evaluation on the right splits; metric functions against hand values."""

from __future__ import annotations

import json
import math

import pytest
import torch
import yaml
from test_training_data import build_training_snapshot

from schemas.config import PROJECT_ROOT

pytestmark = pytest.mark.slow  # trains the encoder and the VLM on CPU


@pytest.fixture(scope="module")
def snap(tmp_path_factory):
    return build_training_snapshot(tmp_path_factory.mktemp("models") / "root")


def job_file(tmp_path, kind: str, **optim) -> str:
    data = yaml.safe_load((PROJECT_ROOT / "config" / "training" / f"{kind}-tiny-cpu.yaml").read_text())
    data["optim"].update(optim)
    path = tmp_path / f"{kind}-{optim.get('max_steps')}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _mean(xs):
    return sum(xs) / len(xs)


def test_encoder_trains_evaluates_and_resumes(snap, tmp_path):
    from training.jobs import run_job

    out = str(tmp_path / "models")
    rec = run_job(
        "encoder",
        None,
        job_file(
            tmp_path, "encoder", max_steps=24, checkpoint_every=8, eval_every=12, best_metric="val.cells_mean.NDCG@10"
        ),
        root=snap.root,
        output=out,
    )
    m = rec["metrics"]
    assert (m["start_step"], m["step"], len(m["losses"])) == (0, 24, 24)
    assert _mean(m["losses"][-6:]) < 0.8 * _mean(m["losses"][:6])
    run_dir = tmp_path / "models" / "encoder" / "0.1.0" / "encoder-tiny-cpu"
    # evaluated at step 12 and at the end; best.pt holds the step with the highest val NDCG@10
    hist = [(h["step"], h["eval"]["val"]["cells_mean"]["NDCG@10"]) for h in m["eval_history"]]
    assert [s for s, _ in hist] == [12, 24]
    best_step, best_value = max(hist, key=lambda x: (x[1], -x[0]))
    assert (m["best"]["step"], m["best"]["value"]) == (best_step, best_value)
    assert torch.load(run_dir / "checkpoints" / "best.pt", weights_only=False)["step"] == best_step
    cells = m["eval"]["val"]["cells"]
    assert {k for k, c in cells.items() if c["n_queries"]} == {"2D-CXR|finding"}  # F001-F003 are findings
    assert len(cells) == 12 and cells["2D-CXR|finding"]["gallery"] == 8 and cells["3D-CT|finding"]["gallery"] == 1
    assert json.loads((run_dir / "metrics.json").read_text())["step"] == 24
    ckpt = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=False)
    assert ckpt["step"] == 24 and ckpt["task"]["entity_ids"] == ["F001", "F002", "F003"]
    assert ckpt["task"]["families"] == ["2D-CXR", "3D-CT"]
    # evaluation: queries are exactly the retrieval targets of that split's studies
    from training.data import open_snapshot

    targets = open_snapshot(snap).table("retrieval_targets")
    for split in ("val", "test"):
        ev = m["eval"][split]
        queries = {(r["query_study_key"], r["entity_id"]) for r in targets.to_pylist() if r["split"] == split}
        assert ev["n_queries"] == len(queries) > 0
        assert ev["gallery"] == 8 + (1 if split == "val" else 0)  # 4 patients x 2 radiographs (+ p18's CT in val)
        r = ev["micro"]
        assert 0 <= r["R@1"] <= r["R@3"] <= r["R@5"] <= r["R@10"] <= 1
    assert m["eval"]["positives_source"] == "retrieval_targets"
    # lineage: from the weights back to the release
    lin = json.loads(snap.read_text("reports/training/0.1.0/encoder-encoder-tiny-cpu.json"))
    assert lin["snapshot_version"] == "0.1.0" and lin["content_hash"] == open_snapshot(snap).content_hash
    assert lin["checkpoint"] == str(run_dir / "checkpoints" / "last.pt") and lin["code_version"]
    assert lin["config"]["model"]["backbone"]["kind"] == "vit" and lin["metrics"]["step"] == 24
    # resume: the step count continues
    again = run_job(
        "encoder", "0.1.0", job_file(tmp_path, "encoder", max_steps=30, checkpoint_every=8), root=snap.root, output=out
    )["metrics"]
    assert (again["start_step"], again["step"], len(again["losses"])) == (24, 30, 6)
    assert torch.load(run_dir / "checkpoints" / "last.pt", weights_only=False)["step"] == 30


def test_vlm_trains_evaluates_and_resumes(snap, tmp_path):
    from training.data import open_snapshot
    from training.jobs import run_job
    from training.vlm import load_tokenizer

    out = str(tmp_path / "models")
    rec = run_job("vlm", None, job_file(tmp_path, "vlm", max_steps=24, checkpoint_every=12), root=snap.root, output=out)
    m = rec["metrics"]
    assert (m["start_step"], m["step"], len(m["losses"])) == (0, 24, 24)
    assert _mean(m["losses"][-6:]) < 0.7 * _mean(m["losses"][:6])
    run_dir = tmp_path / "models" / "vlm" / "0.1.0" / "vlm-tiny-cpu"
    tok = load_tokenizer(run_dir / "tokenizer")
    assert tok.tokenize("In both studies") == ["in", "both", "studies"] and tok.eos_token == "[EOS]"
    vqa = open_snapshot(snap).table("vqa").to_pylist()
    for split in ("val", "test"):
        ev = m["eval"][split]
        assert ev["n_items"] == sum(1 for r in vqa if r["split"] == split) == 28
        assert set(ev["by_question_type"]) == {"presence", "comparison_presence"}
        assert ev["by_question_type"]["presence"]["n_items"] == 24
        for k in ("mc_accuracy", "open_exact_match", "bleu1"):
            assert 0.0 <= ev[k] <= 1.0
    assert "train" not in m["eval"]
    again = run_job(
        "vlm", "0.1.0", job_file(tmp_path, "vlm", max_steps=28, checkpoint_every=12), root=snap.root, output=out
    )["metrics"]
    assert (again["start_step"], again["step"], len(again["losses"])) == (24, 28, 4)


def test_run_refuses_a_tampered_snapshot(tmp_path):
    import os

    from training.data import SnapshotRefusedError
    from training.jobs import run_job

    st = build_training_snapshot(tmp_path / "root")
    card = st.path("snapshots/0.1.0/DATASET_CARD.md")
    os.chmod(card, 0o644)
    with open(card, "a") as f:
        f.write("edited\n")
    with pytest.raises(SnapshotRefusedError, match="failed verification"):
        run_job(
            "encoder",
            "0.1.0",
            PROJECT_ROOT / "config/training/encoder-tiny-cpu.yaml",
            root=st.root,
            output=str(tmp_path / "m"),
        )
    assert not (tmp_path / "m").exists()


def test_info_nce_against_hand_computation():
    from training.encoder import info_nce

    a = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0], [0.6, 0.8]]), dim=1)
    p = torch.nn.functional.normalize(torch.tensor([[0.8, 0.6], [0.0, 1.0]]), dim=1)
    tau = torch.tensor([0.5, 0.5])
    s = a @ p.T  # [[0.8, 0], [0.96, 0.8]]
    row = [-math.log(math.exp(s[i, i] / 0.5) / sum(math.exp(s[i, j] / 0.5) for j in range(2))) for i in range(2)]
    col = [-math.log(math.exp(s[i, i] / 0.5) / sum(math.exp(s[j, i] / 0.5) for j in range(2))) for i in range(2)]
    assert float(info_nce(a, p, tau, tau)) == pytest.approx((sum(row) / 2 + sum(col) / 2) / 2, rel=1e-5)
    # a masked false negative leaves only the diagonal in that row: its term is 0
    fn = torch.tensor([[False, False], [True, False]])
    row2 = [row[0], 0.0]
    col2 = [0.0 if True else None, col[1]]  # column 0 loses entry (1, 0) as well
    assert float(info_nce(a, p, tau, tau, fn)) == pytest.approx((sum(row2) / 2 + sum(col2) / 2) / 2, rel=1e-5)


def test_recall_at_k_hand_values():
    from training.encoder import recall_at_k

    sim = torch.tensor([[0.9, 0.8, 0.1, 0.5], [0.2, 0.3, 0.4, 0.1]])
    rel = torch.tensor([[False, False, True, False], [False, True, False, False]])
    excl = torch.tensor([[True, False, False, False], [False, False, False, False]])
    # query 0: ranking without the excluded item 0 -> 1, 3, 2: relevant at rank 3; query 1: 2, 1 -> rank 2
    assert recall_at_k(sim, rel, [1, 2, 3, 10], exclude=excl) == {"R@1": 0.0, "R@2": 0.5, "R@3": 1.0, "R@10": 1.0}


def test_bleu_matches_nltk_and_hand_values():
    from nltk.translate.bleu_score import corpus_bleu as nltk_bleu

    from training.vlm import corpus_bleu

    refs = [["in", "the", "prior", "study", "only"], ["present"], ["in", "both", "studies"]]
    hyps = [["in", "the", "prior", "study"], ["absent"], ["in", "both", "studies"]]
    bp = math.exp(1 - 9 / 8)  # hypotheses 8 words, references 9
    # BLEU-1: 7 of 8 unigrams match; same as nltk
    assert corpus_bleu(refs, hyps, 1) == pytest.approx(7 / 8 * bp)
    assert corpus_bleu(refs, hyps, 1) == pytest.approx(nltk_bleu([[r] for r in refs], hyps, weights=(1.0,)), abs=1e-12)
    # BLEU-2: 5 of 5 bigrams (a one-word hypothesis has none; nltk counts it as 1, sacrebleu and Papineni do not)
    assert corpus_bleu(refs, hyps, 2) == pytest.approx(bp * math.sqrt(7 / 8 * 5 / 5))
    long_refs, long_hyps = [r + ["x", "y"] for r in refs], [h + ["x", "y"] for h in hyps]  # every hypothesis >= 3 words
    assert corpus_bleu(long_refs, long_hyps, 2) == pytest.approx(
        nltk_bleu([[r] for r in long_refs], long_hyps, weights=(0.5, 0.5)), abs=1e-12
    )
    assert corpus_bleu([["a"]], [["b"]], 1) == 0.0


def test_answer_metrics_leave_open_ended_items_out_of_mc_accuracy():
    from training.vlm import answer_metrics

    rows = [
        {"question_type": "presence", "mc_correct": True, "ref_words": ["yes"], "hyp_words": ["yes"]},
        {"question_type": "presence", "mc_correct": False, "ref_words": ["no"], "hyp_words": ["yes"]},
        {"question_type": "open_location", "mc_correct": None, "ref_words": ["left"], "hyp_words": ["left"]},
    ]
    m = answer_metrics(rows)
    assert (m["n_items"], m["n_mc"], m["mc_accuracy"]) == (3, 2, 0.5)
    assert m["open_exact_match"] == 2 / 3
    assert m["by_question_type"]["open_location"]["mc_accuracy"] is None
