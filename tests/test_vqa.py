"""Tests for etl.vqa: templates, item generation, options, answer letters, caps, splits."""

from __future__ import annotations

import hashlib
from collections import Counter
from datetime import timedelta

import polars as pl
import pytest

from etl.pairs import build_pairs
from etl.vqa import (
    DEFAULT_TEMPLATES,
    LETTERS,
    VQAInputError,
    VQATemplateError,
    build_vqa,
    item_id,
    load_templates,
    validate_templates,
)
from schemas.config import PairingConfig, VQAConfig
from schemas.ontology import load_ontology
from schemas.vqa import SCHEMA

ONTO = load_ontology()
TEMPLATES = load_templates()
CFG = VQAConfig()
from helpers import LABEL_SCHEMA, STUDY_SCHEMA, T0  # noqa: E402


def studies(rows: list[tuple]) -> pl.DataFrame:
    """rows: (study_key, patient_key, family, modality, days after T0)."""
    return pl.DataFrame(
        [(k, p, f, m, T0 + timedelta(days=d), 1) for k, p, f, m, d in rows], schema=STUDY_SCHEMA, orient="row"
    )


def labels(rows: list[tuple]) -> pl.DataFrame:
    """rows: (study_key, entity_id, state, change)."""
    return pl.DataFrame([(*r, 1) for r in rows], schema=LABEL_SCHEMA, orient="row")


def frontal(keys) -> pl.DataFrame:
    return pl.DataFrame({"study_key": list(keys), "view": ["PA"] * len(keys), "kind": ["2d"] * len(keys)})


def splits_for(patient_keys, split="train") -> pl.DataFrame:
    keys = sorted(set(patient_keys))
    return pl.DataFrame({"patient_key": keys, "split": [split] * len(keys)})


def build(st: pl.DataFrame, lab: pl.DataFrame, cfg: VQAConfig = CFG, split_df=None, templates=TEMPLATES):
    pairs = pl.from_arrow(build_pairs(st, lab, frontal(st["study_key"].to_list()), PairingConfig()))
    split_df = split_df if split_df is not None else splits_for(st["patient_key"].to_list())
    return build_vqa(pairs, lab, st, split_df, cfg, templates, ONTO)


def two_studies():
    st = studies([("pr", "p1", "2D-CXR", "DX", 0), ("cu", "p1", "2D-CXR", "DX", 30)])
    lab = labels(
        [
            ("pr", "F029", "present", "none"),
            ("cu", "F029", "present", "increased"),
            ("pr", "C006", "present", "none"),
            ("cu", "C006", "absent", "none"),
            ("cu", "F019", "uncertain", "none"),
            ("cu", "F022", "not_mentioned", "none"),
        ]
    )
    return st, lab


def by(table, **match) -> list[dict]:
    return [r for r in table.to_pylist() if all(r[k] == v for k, v in match.items())]


def assert_well_formed(table, n_options):
    assert table.schema.equals(SCHEMA, check_metadata=True)
    for r in table.to_pylist():
        assert len(r["options"]) == n_options and len(set(r["options"])) == n_options
        assert r["answer"] in LETTERS[:n_options]
        assert r["options"][LETTERS.index(r["answer"])] == r["answer_text"]
        assert (r["pair_id"] is None) != (r["study_key"] is None)
        anchor = r["pair_id"] or r["study_key"]
        assert (
            r["item_id"]
            == hashlib.sha256(f"{anchor}|{r['question_type']}|{r['entity_ids'][0]}".encode()).hexdigest()[:16]
        )
    assert table["item_id"].to_pylist() == sorted(table["item_id"].to_pylist())


def test_change_item_uses_stated_label_and_no_confusable_distractor():
    st, lab = two_studies()
    t = build(st, lab)
    assert_well_formed(t, 4)
    pid = hashlib.sha256(b"pr|cu").hexdigest()[:16]
    (item,) = by(t, question_type="change", entity_ids=["F029"])
    assert item["pair_id"] == pid and item["study_key"] is None
    assert item["answer_text"] == "increased" and "worsened" not in item["options"]
    assert "pleural effusion" in item["question"] and item["question"].endswith("?")
    (res,) = by(t, question_type="change", entity_ids=["C006"])
    assert res["answer_text"] == "resolved" and "pneumonia" in res["question"]


def test_comparison_presence_from_two_states():
    st, lab = two_studies()
    t = build(st, lab)
    answers = {r["entity_ids"][0]: r["answer_text"] for r in by(t, question_type="comparison_presence")}
    assert answers == {"F029": "in both studies", "C006": "in the prior study only"}


def test_presence_items_skip_not_mentioned_and_keep_uncertain():
    st, lab = two_studies()
    t = build(st, lab)
    cur = {r["entity_ids"][0]: r["answer_text"] for r in by(t, question_type="presence", study_key="cu")}
    assert cur == {"F029": "present", "C006": "absent", "F019": "uncertain"}
    q = by(t, question_type="presence", study_key="cu", entity_ids=["F019"])[0]["question"]
    assert q in ("Is there atelectasis in this image?", "Is there evidence of atelectasis in this image?")


def test_location_item_answer_is_findings_anatomy():
    st, lab = two_studies()
    t = build(st, lab)
    locs = by(t, question_type="location")
    # F029 pleural effusion is present in both studies; C006 is a condition (no anatomy); F019 is uncertain
    assert sorted(r["study_key"] for r in locs) == ["cu", "pr"]
    for r in locs:
        assert r["entity_ids"] == ["F029", "A009"] and r["answer_text"] == "pleura"
    cxr_anatomy = {ONTO.concepts[a].preferred_name.lower() for a in ONTO.families["2D-CXR"]["anatomy"]}
    assert all(set(r["options"]) <= cxr_anatomy for r in locs)


def test_brain_mri_location_falls_back_to_other_anatomy():
    st = studies([("m1", "p9", "3D-Brain-MRI", "MR", 0)])
    lab = labels([("m1", "F048", "present", "none")])
    (loc,) = by(build(st, lab), question_type="location")
    assert loc["answer_text"] == "brain parenchyma" and "ventricles and cisterns" in loc["options"]
    assert len(set(loc["options"])) == 4


def test_shared_names_are_qualified_and_get_no_location():
    st = studies([("s1", "p1", "2D-CXR", "DX", 0)])
    lab = labels([("s1", "F002", "present", "none"), ("s1", "F011", "absent", "none")])
    t = build(st, lab)
    qs = {r["entity_ids"][0]: r["question"] for r in by(t, question_type="presence")}
    assert (
        "bone deformity in the ribs" in qs["F002"]
        and "bone deformity in the thoracic vertebrae" in qs["F011"]
    )
    assert by(t, question_type="location") == []


def test_split_and_shard_come_from_inputs():
    st, lab = two_studies()
    t = build(st, lab, split_df=splits_for(["p1"], "external_test"))
    assert set(t["split"].to_pylist()) == {"external_test"} and set(t["shard"].to_pylist()) == {1}
    with pytest.raises(VQAInputError) as err:
        build(st, lab, split_df=pl.DataFrame({"patient_key": ["other"], "split": ["train"]}))
    assert err.value.reason == "patient_without_split"


def _many(n_patients: int):
    entities = ["F029", "F007", "F019", "C006", "F005", "F016"]
    rows, lab = [], []
    for p in range(n_patients):
        for i in range(2):
            key = f"p{p}s{i}"
            rows.append((key, f"p{p}", "2D-CXR", "DX", 20 * i))
            for j, e in enumerate(entities):
                lab.append((key, e, ["present", "absent", "uncertain"][(p + i + j) % 3], "none"))
    return studies(rows), labels(lab)


def test_answer_letters_balanced_and_all_well_formed():
    st, lab = _many(40)
    t = build(st, lab)
    assert_well_formed(t, 4)
    assert t.num_rows >= 400
    counts = Counter(t["answer"].to_pylist())
    expected = t.num_rows / 4
    assert set(counts) == set("ABCD")
    assert all(0.8 * expected <= c <= 1.2 * expected for c in counts.values()), counts


def test_cap_per_pair_and_study_round_robin():
    st, lab = _many(3)
    t = build(st, lab, cfg=VQAConfig(max_items_per_pair=3))
    per_anchor = Counter(r["pair_id"] or r["study_key"] for r in t.to_pylist())
    assert max(per_anchor.values()) == 3
    for pid in set(t["pair_id"].drop_null().to_pylist()):
        types = {r["question_type"] for r in by(t, pair_id=pid)}
        assert types == {"change", "comparison_presence"}


def test_two_and_six_options():
    st, lab = two_studies()
    assert_well_formed(build(st, lab, cfg=VQAConfig(n_options=2)), 2)
    with pytest.raises(VQATemplateError) as err:
        build(st, lab, cfg=VQAConfig(n_options=6))
    assert err.value.reason == "too_few_options"
    keep = ("change", "location")
    chosen = {"question_types": {k: v for k, v in TEMPLATES["question_types"].items() if k in keep}}
    t5 = build(st, lab, cfg=VQAConfig(n_options=5), templates=chosen)
    assert_well_formed(t5, 5)
    assert set(t5["question_type"].to_pylist()) == {"change", "location"}
    (res,) = by(t5, question_type="change", entity_ids=["C006"])
    assert res["answer_text"] == "resolved" and not {"improved", "decreased"} & set(res["options"])
    with pytest.raises(
        VQATemplateError
    ):  # change: 7 options minus resolved/improved/decreased = 4 distractors
        build(st, lab, cfg=VQAConfig(n_options=6), templates=chosen)
    only_location = {"question_types": {"location": TEMPLATES["question_types"]["location"]}}
    assert_well_formed(build(st, lab, cfg=VQAConfig(n_options=6), templates=only_location), 6)


def test_deterministic_and_order_independent():
    st, lab = _many(5)
    a = build(st, lab)
    b = build(st.sample(fraction=1.0, shuffle=True, seed=3), lab.sample(fraction=1.0, shuffle=True, seed=4))
    assert a.num_rows > 0 and a.equals(b)


def test_empty_inputs_give_empty_table():
    t = build_vqa(pl.DataFrame(), pl.DataFrame(), pl.DataFrame(), pl.DataFrame(), CFG, TEMPLATES, ONTO)
    assert t.num_rows == 0 and t.schema.equals(SCHEMA, check_metadata=True)
    st = studies([("s1", "p1", "2D-CXR", "DX", 0)])
    assert build(st, labels([])).num_rows == 0  # a study without labels gives no items


def test_unknown_entity_and_unknown_study_raise():
    st = studies([("s1", "p1", "2D-CXR", "DX", 0)])
    with pytest.raises(VQAInputError) as err:
        build(st, labels([("s1", "Z999", "present", "none")]))
    assert err.value.reason == "unknown_entity"
    with pytest.raises(VQAInputError) as err:
        build(st, labels([("s1", "F048", "present", "none")]))  # brain MRI finding on a chest film
    assert err.value.reason == "entity_not_in_family"
    with pytest.raises(VQAInputError) as err:
        build(st, labels([("ghost", "F029", "present", "none")]))
    assert err.value.reason == "unknown_study"


def test_item_id_helper():
    assert item_id("abc", "presence", "F029") == hashlib.sha256(b"abc|presence|F029").hexdigest()[:16]


def test_template_file_has_required_types():
    assert DEFAULT_TEMPLATES.is_file()
    assert list(TEMPLATES["question_types"]) == ["change", "comparison_presence", "presence", "location"]


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        ({"question_types": {"colour": {"questions": ["{entity}?"]}}}, "unknown_question_type"),
        ({"question_types": {"location": {"questions": ["Where is {finding}?"]}}}, "bad_placeholder"),
        ({"question_types": {"location": {"questions": ["Where is it?"]}}}, "bad_placeholder"),
        (
            {"question_types": {"presence": {"questions": ["Is {entity}?"], "options": {"present": "y"}}}},
            "missing_answer_option",
        ),
        ({"question_types": {}}, "bad_structure"),
        (
            {
                "question_types": {
                    "presence": {
                        "questions": ["Is {entity}?"],
                        "options": {"present": "x", "absent": "x", "uncertain": "u"},
                    }
                }
            },
            "duplicate_option",
        ),
    ],
)
def test_bad_templates_rejected(data, reason):
    with pytest.raises(VQATemplateError) as err:
        validate_templates(data)
    assert err.value.reason == reason


def test_load_templates_missing_file(tmp_path):
    with pytest.raises(VQATemplateError) as err:
        load_templates(tmp_path / "nope.yaml")
    assert err.value.reason == "missing_file"
    bad = tmp_path / "bad.yaml"
    bad.write_text("question_types: [unclosed")
    with pytest.raises(VQATemplateError) as err:
        load_templates(bad)
    assert err.value.reason == "invalid_yaml"
