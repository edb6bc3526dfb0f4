"""Tests for the k-fold split and the generated notes of ``medreco eval deid`` (entity_extraction.deid)."""

from __future__ import annotations

import json

import pytest

from entity_extraction.deid.evaluation import (
    DeidScore,
    GoldNote,
    evaluate_folds,
    fold_of,
    render_fold_table,
)
from entity_extraction.deid.synthetic import SLOTS, generate_notes, load_templates


def test_fold_of_groups_a_patients_notes_and_is_deterministic():
    assert fold_of("17-3") == fold_of("17-9") == fold_of("17-3")
    folds = {fold_of(f"{p}-1") for p in range(200)}
    assert folds == {0, 1, 2, 3, 4}
    with pytest.raises(ValueError, match="at least 2"):
        fold_of("1-1", 1)


def test_evaluate_folds_scores_each_fold_and_combines_held_out():
    # one patient per fold: notes "p-1" land in fold_of("p-1")
    notes = [GoldNote(f"{p}-1", "seen by Dr Smith.", ((11, 16, "HCPName"),)) for p in range(40)]
    result = evaluate_folds(notes, 5, (3, 4), deidentify=lambda t: t)  # removes nothing
    assert sum(s.notes for s in result.folds) == 40
    assert [s.notes for s in result.folds] == [sum(fold_of(n.id) == f for n in notes) for f in range(5)]
    held, dev = result.combined(True), result.combined(False)
    assert held.notes + dev.notes == 40 and held.recall == dev.recall == 0.0
    table = render_fold_table(result)
    assert "3 (held out)" in table and "0 (dev)" in table and "held-out minus tuned strict recall: +0.000" in table
    with pytest.raises(ValueError, match="development"):
        evaluate_folds(notes, 2, (0, 1))


def test_score_add_sums_counts():
    a = DeidScore(per_type={"Date": [1, 2]}, non_phi_tokens=10, non_phi_lost=1, notes=1)
    a.add(DeidScore(per_type={"Date": [2, 2], "Age": [0, 1]}, non_phi_tokens=5, notes=2))
    assert a.per_type == {"Date": [3, 4], "Age": [0, 1]} and (a.non_phi_tokens, a.non_phi_lost, a.notes) == (15, 1, 3)


def test_generated_notes_are_deterministic_with_exact_answer_keys():
    notes = generate_notes(40, seed=7)
    assert notes == generate_notes(40, seed=7)
    assert notes != generate_notes(40, seed=8)
    kinds = set()
    for note in notes:
        for start, end, kind in note.phi:
            value = note.text[start:end]
            assert value == value.strip() and value, (note.id, kind)
            kinds.add(kind)
    assert {"NAME", "HCP", "DATE", "ADDRESS", "ORGANIZATION"} <= kinds
    assert kinds <= {kind for kind, _ in SLOTS.values()}


def test_generated_splits_use_disjoint_templates():
    phi, _clinical = load_templates()
    dev_templates, held_templates = set(phi[0::2]), set(phi[1::2])
    assert dev_templates and held_templates and not dev_templates & held_templates
    with pytest.raises(ValueError, match="split"):
        generate_notes(1, split="train")


def test_cli_eval_deid_folds_and_synthetic(tmp_path):
    from typer.testing import CliRunner

    from medreco.cli import app

    gold = tmp_path / "gold.jsonl"
    lines = [
        json.dumps(
            {
                "id": f"{p}-1",
                "text": "daughter sarah called on 7/22.",
                "phi": [{"start": 9, "end": 14, "type": "RelativeProxyName"}],
            }
        )
        for p in range(20)
    ]
    gold.write_text("\n".join(lines) + "\n")
    result = CliRunner().invoke(app, ["eval", "deid", "--gold", str(gold), "--folds", "5", "--synthetic", "5"])
    assert result.exit_code == 0, result.output
    assert "held out" in result.output and "generated notes (seed 1" in result.output
    bad = CliRunner().invoke(app, ["eval", "deid", "--gold", str(gold), "--folds", "5", "--held-out", "7"])
    assert bad.exit_code == 1
