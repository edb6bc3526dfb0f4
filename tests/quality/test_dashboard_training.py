"""The dashboard's Training page: pending until the release's training is recorded, then the paper's cells (12
retrieval settings with Recall@k and NDCG@10, VQA accuracy per question type and per modality, longitudinal change
separately) and the metric that chose the best checkpoint. The metrics come from the project's own writers
(``training.evaluation.retrieval_cells``, ``vqa_cells``, ``training.vlm.answer_metrics``) on tiny inputs; the DAG
test (tests/training/test_training_dag.py) shows a real tiny training run's record on the page."""

from __future__ import annotations

import json

import torch

from etl import zones
from etl.storage import Storage
from quality.checks import QualityReport
from quality.dashboard import build_dashboard, stamp_release
from quality.training_page import PAGE, stamp_training
from schemas.ontology import CATEGORIES, FAMILIES

HASH = "ab" * 32


def _dashboard(st: Storage, tmp_path) -> None:
    out = build_dashboard({}, QualityReport(), {"run_id": "r1"}, tmp_path / "pages")
    for page in out.parent.glob("*.html"):
        st.write_bytes(f"{zones.DASHBOARD_DIR}/{page.name}", page.read_bytes())


def _encoder_eval() -> dict:
    from training.evaluation import retrieval_cells

    g = torch.Generator().manual_seed(3)
    gallery = ["s1", "s2", "s3", "s4", "s5", "s6", "s7"]
    family = {s: "2D-CXR" for s in gallery[:5]} | {"s6": "3D-CT", "s7": "3D-CT"}
    patient = {s: f"p{i}" for i, s in enumerate(gallery)}
    emb = torch.nn.functional.normalize(torch.randn(7, 2, 8, generator=g), dim=-1)
    rel = {
        ("s1", "F001"): {"s2": 1.0, "s3": 0.5},
        ("s2", "F001"): {"s1": 1.0},
        ("s4", "C001"): {"s5": 1.0},
        ("s6", "F001"): {"s7": 1.0},
    }
    return retrieval_cells(
        emb,
        gallery,
        ["F001", "C001"],
        family,
        patient,
        sorted(rel),
        lambda s, e: rel.get((s, e), {}),
        [1, 5, 10],
        10,
        {"F001": "finding", "C001": "condition"},
    )


def _vqa_eval() -> dict:
    from training.evaluation import vqa_cells
    from training.vlm import answer_metrics

    rows = []
    for fam, qtype, correct in [
        ("2D-CXR", "presence", True),
        ("2D-CXR", "presence", False),
        ("2D-CXR", "change", True),
        ("2D-CXR", "change", True),
        ("2D-CXR", "change", False),
        ("3D-CT", "change", False),
        ("3D-CT", "location", True),
    ]:
        rows.append(
            {"question_type": qtype, "family": fam, "mc_correct": correct, "ref_words": ["a"], "hyp_words": ["a"]}
        )
    return {**answer_metrics(rows), **vqa_cells(rows)}


def _record(version: str, name: str = "encoder-tiny") -> dict:
    best = {"metric": "val.cells_mean.NDCG@10", "value": 0.8125, "step": 4, "checkpoint": "/m/x/checkpoints/best.pt"}
    return {
        "snapshot_version": version,
        "content_hash": HASH,
        "jobs": {
            "encoder": {
                "status": "succeeded",
                "launcher": "local",
                "name": name,
                "lineage_record": {
                    "metrics": {"step": 6, "images_per_s": 12.34, "best": best, "eval": {"val": _encoder_eval()}}
                },
            },
            "vlm": {
                "status": "succeeded",
                "launcher": "local",
                "name": "vlm-tiny",
                "lineage_record": {
                    "metrics": {"step": 6, "images_per_s": 3.0, "best": None, "eval": {"test": _vqa_eval()}}
                },
            },
        },
    }


def _num(v) -> str:
    return f'<td class="num">{"–" if v is None else f"{v:.3f}"}</td>'


def test_training_page_shows_the_cells_of_its_release(tmp_path):
    st = Storage.open(str(tmp_path / "root"))
    _dashboard(st, tmp_path)
    page_rel = f"{zones.DASHBOARD_DIR}/{PAGE}"
    assert 'id="training-pending"' in st.read_text(page_rel)
    record = _record("0.2.0")
    st.write_text(zones.training_record("0.2.0"), json.dumps(record, sort_keys=True))  # as record_runs
    assert stamp_training(st, "0.2.0") is False  # the dashboard names no release yet
    stamp_release(st, "0.2.0", HASH)  # the build's snapshot task: stamps the header, fills the recorded training
    html = st.read_text(page_rel)
    assert 'id="training-pending"' not in html and "Training on release 0.2.0" in html

    ev = record["jobs"]["encoder"]["lineage_record"]["metrics"]["eval"]["val"]
    assert len(ev["cells"]) == 12
    heads = "".join(f'<th class="num">{n}</th>' for n in ("R@1", "R@5", "R@10", "NDCG@10"))
    assert heads in html  # Recall@k by k, then NDCG (the stored record has its keys sorted)
    order = [html.index(f"<td>{fam}</td><td>{cat}</td>") for fam in FAMILIES for cat in CATEGORIES]
    assert order == sorted(order)  # the paper's order: families, then anatomy, finding, condition
    for key, c in ev["cells"].items():  # every one of the 12 settings, its numbers in its row
        fam, cat = key.split("|")
        row = (
            f'<tr><td>{fam}</td><td>{cat}</td><td class="num">{c["n_queries"]}</td><td class="num">{c["gallery"]}</td>'
        )
        assert row + "".join(_num(c[n]) for n in ("R@1", "R@5", "R@10", "NDCG@10")) + "</tr>" in html, key
    filled = {k: c for k, c in ev["cells"].items() if c["n_queries"]}
    assert set(filled) == {"2D-CXR|finding", "2D-CXR|condition", "3D-CT|finding"}
    assert 0 < filled["2D-CXR|finding"]["NDCG@10"] < 1  # graded: a non-trivial value reaches the page
    mean = ev["cells_mean"]
    assert (
        "<td>mean of cells</td><td></td>"
        + f'<td class="num">{ev["n_queries"]}</td><td class="num">7</td>'
        + "".join(_num(mean[n]) for n in ("R@1", "R@5", "R@10", "NDCG@10"))
        in html
    )
    # the best checkpoint's metric is named
    assert (
        '<span class="mono">val.cells_mean.NDCG@10</span> = 0.812 at step 4 (<span class="mono">best.pt</span>)' in html
    )
    assert "no best metric set" in html  # the VLM kept none

    vqa = record["jobs"]["vlm"]["lineage_record"]["metrics"]["eval"]["test"]
    assert vqa["by_question_type"]["change"]["mc_accuracy"] == 0.5
    for qtype, acc in [("presence", 0.5), ("change", 0.5), ("location", 1.0)]:
        n = vqa["by_question_type"][qtype]["n_mc"]
        assert f'<tr><td>{qtype}</td><td class="num">{n}</td>{_num(acc)}</tr>' in html
    assert f'<tr><td>all</td><td class="num">7</td>{_num(4 / 7)}</tr>' in html
    assert f'<tr><td>2D-CXR</td><td class="num">5</td>{_num(3 / 5)}</tr>' in html  # per modality
    assert f'<tr><td>3D-CT</td><td class="num">2</td>{_num(0.5)}</tr>' in html
    assert f'<tr><td>2D-CXR</td><td>change</td><td class="num">3</td>{_num(2 / 3)}</tr>' in html
    # longitudinal change separately: chest radiograph 2 of 3, CT 0 of 1
    i = html.index("longitudinal change items")
    assert f'<tr><td>2D-CXR</td><td class="num">3</td>{_num(2 / 3)}</tr>' in html[i:]
    assert f'<tr><td>3D-CT</td><td class="num">1</td>{_num(0.0)}</tr>' in html[i:]


def test_training_page_is_left_alone_for_another_release_and_escapes_values(tmp_path):
    st = Storage.open(str(tmp_path / "root"))
    _dashboard(st, tmp_path)
    stamp_release(st, "0.3.0", HASH)
    page_rel = f"{zones.DASHBOARD_DIR}/{PAGE}"
    assert stamp_training(st, "0.3.0") is False  # no record yet
    st.write_text(zones.training_record("0.2.0"), json.dumps(_record("0.2.0")))
    assert stamp_training(st, "0.2.0") is False  # the dashboard shows 0.3.0
    assert 'id="training-pending"' in st.read_text(page_rel)
    st.write_text(zones.training_record("0.3.0"), json.dumps(_record("0.3.0", name="<b>x</b>")))
    assert stamp_training(st, "0.3.0") is True
    html = st.read_text(page_rel)
    assert "&lt;b&gt;x&lt;/b&gt;" in html and "<b>x</b>" not in html
    assert stamp_training(st, "0.3.0") is True and st.read_text(page_rel) == html  # filled again: same page
