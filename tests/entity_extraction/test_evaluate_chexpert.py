"""CheXpert labelled-report evaluation on the labeler's own sample (../shared/data/chexpert-labeler)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from entity_extraction.evaluate import EvaluationDataError
from entity_extraction.evaluate_chexpert import evaluate_chexpert, load_chexpert_labelled, render_chexpert
from medreco.cli.eval import app

LABELLED = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "chexpert-labeler" / "labeled_reports.csv"
pytestmark = pytest.mark.skipif(not LABELLED.is_file(), reason="shared CheXpert labeler data not present")


def test_load_and_score():
    reports = load_chexpert_labelled(LABELLED)
    assert len(reports) == 4
    assert reports[0].gold["Cardiomegaly"] == "negative" and reports[0].gold["No Finding"] == "positive"
    assert reports[2].gold["Atelectasis"] == "uncertain" and reports[2].gold["Fracture"] == "blank"
    result = evaluate_chexpert(reports)
    assert result.pairs == 4 * 8  # 8 observations mapped to 2D-CXR concepts
    # report 1: "Heart size normal ... No edema or pneumonia. No effusion" -> cardiomegaly, pneumonia, effusion negative
    wrong = {(i, obs) for i, obs, _, _ in result.wrong}
    assert not {(0, "Cardiomegaly"), (0, "Pneumonia"), (0, "Pleural Effusion")} & wrong
    # report 3: "... may reflect atelectasis or consolidation": atelectasis uncertain
    assert (2, "Atelectasis") not in wrong
    assert result.scores["mention"].prf[2] == 1.0
    text = render_chexpert(result)
    assert "mention F1: TP=9 FP=0 FN=0" in text and "Pneumothorax" in text


def test_bad_file(tmp_path):
    bad = tmp_path / "x.csv"
    bad.write_text("Reports,Cardiomegaly\nCardiomegaly.,yes\n")
    with pytest.raises(EvaluationDataError) as err:
        load_chexpert_labelled(bad)
    assert err.value.reason == "missing_columns"
    with pytest.raises(EvaluationDataError):
        load_chexpert_labelled(tmp_path / "missing.csv")


def test_cli_chexpert():
    out = CliRunner().invoke(app, ["entities", "--chexpert", str(LABELLED)])
    assert out.exit_code == 0, out.output
    assert "CheXpert labelled reports labeled_reports.csv: 32 (report, observation) pairs" in out.output
    assert "k-fold chexpert: uncertain F1: tuned" in out.output
