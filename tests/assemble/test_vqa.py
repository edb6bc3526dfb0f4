"""Tests for etl.assemble.vqa: templates, item generation, options, answer letters, caps, splits."""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from datetime import timedelta

import polars as pl
import pyarrow.compute as pc
import pytest

from etl.assemble.pairs import build_pairs
from etl.assemble.vqa import (
    DEFAULT_TEMPLATES,
    LETTERS,
    VQAInputError,
    VQATemplateError,
    balance_yes_no,
    build_case_comparison_vqa,
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
        if r["answer_format"] == "open_ended":
            assert r["question_type"].startswith("open_") and r["options"] == [] and r["answer"] is None
            assert r["answer_text"] and not re.search(r"(?i)\b" + re.escape(r["answer_text"]) + r"\b", r["question"])
            continue
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
    lab = pl.concat([lab, labels([("cu", "F007", "present", "none")])])
    t = build(st, lab)
    locs = by(t, question_type="location")
    # F007 lung consolidation lies in the pulmonary parenchyma; F029 pleural effusion is present in both studies
    # but its question would give "pleura" away (word stem), so it gets none (nor does F016 "solitary pulmonary
    # nodule" -> "pulmonary parenchyma"); C006 is a condition (no anatomy); F019 is uncertain
    assert [(r["study_key"], r["entity_ids"], r["answer_text"]) for r in locs] == [
        ("cu", ["F007", "A001"], "pulmonary parenchyma")
    ]
    cxr_anatomy = {ONTO.concepts[a].preferred_name.lower() for a in ONTO.families["2D-CXR"]["anatomy"]}
    assert all(set(r["options"]) <= cxr_anatomy for r in locs)


def test_no_question_shares_a_word_stem_with_its_anatomy_answer():
    from etl.assemble.vqa import _shares_stem

    assert _shares_stem("Where in the image is the pleural effusion located?", "pleura")
    assert _shares_stem("Where is the decreased hepatic parenchymal density?", "hepatic parenchyma")
    assert _shares_stem("Where are the nodules in the lungs?", "lung")
    assert _shares_stem("Where is the solitary pulmonary nodule located?", "pulmonary parenchyma")
    assert not _shares_stem("Where is the lung consolidation located?", "pulmonary parenchyma")
    assert not _shares_stem("Where is the cardiomegaly?", "heart")
    st, lab = two_studies()
    for r in by(build(st, lab), question_type="location"):
        assert not _shares_stem(r["question"], r["answer_text"])


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
    assert "bone deformity in the ribs" in qs["F002"] and "bone deformity in the thoracic vertebrae" in qs["F011"]
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
    t = t.filter(pc.equal(t["answer_format"], "multiple_choice"))
    assert t.num_rows >= 400
    counts = Counter(t["answer"].to_pylist())
    # chi-square goodness of fit to uniform letters, 3 degrees of freedom: below the 1% critical value 11.34
    chi2 = sum((c - t.num_rows / 4) ** 2 / (t.num_rows / 4) for c in counts.values())
    assert chi2 < 11.34, (chi2, counts)
    expected = t.num_rows / 4
    assert set(counts) == set("ABCD")
    assert all(0.8 * expected <= c <= 1.2 * expected for c in counts.values()), counts


def test_cap_per_pair_and_study_round_robin():
    st, lab = _many(3)
    t = build(st, lab, cfg=VQAConfig(max_items_per_pair=3))
    per_anchor = Counter((r["pair_id"] or r["study_key"], r["answer_format"]) for r in t.to_pylist())
    assert max(per_anchor.values()) == 3  # multiple-choice and open-ended items capped separately
    for pid in set(t["pair_id"].drop_null().to_pylist()):
        types = {r["question_type"] for r in by(t, pair_id=pid)}
        assert types == {"change", "comparison_presence", "open_difference"}


def test_two_and_six_options():
    st, lab = two_studies()
    assert_well_formed(build(st, lab, cfg=VQAConfig(n_options=2)), 2)
    with pytest.raises(VQATemplateError) as err:
        build(st, lab, cfg=VQAConfig(n_options=6))
    assert err.value.reason == "too_few_options"
    lab = pl.concat([lab, labels([("cu", "F007", "present", "none")])])  # lung consolidation: locatable
    keep = ("change", "location")
    chosen = {"question_types": {k: v for k, v in TEMPLATES["question_types"].items() if k in keep}}
    t5 = build(st, lab, cfg=VQAConfig(n_options=5), templates=chosen)
    assert_well_formed(t5, 5)
    assert set(t5["question_type"].to_pylist()) == {"change", "location"}
    (res,) = by(t5, question_type="change", entity_ids=["C006"])
    assert res["answer_text"] == "resolved" and not {"improved", "decreased"} & set(res["options"])
    with pytest.raises(VQATemplateError):  # change: 7 options minus resolved/improved/decreased = 4 distractors
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
    assert list(TEMPLATES["question_types"]) == [
        "change",
        "comparison_presence",
        "presence",
        "location",
        "case_severity",
        "case_laterality",
        "case_presence",
    ]
    assert list(TEMPLATES["open_ended"]) == [
        "abnormality",
        "presence",
        "view",
        "location",
        "level",
        "type",
        "difference",
    ]


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


# ---- open-ended (Medical-Diff-VQA style), yes/no balance, two-case comparison ---------------------------------

MENTION_SCHEMA = {
    "mention_id": pl.Utf8,
    "study_key": pl.Utf8,
    "entity_id": pl.Utf8,
    "assertion": pl.Utf8,
    "temporality": pl.Utf8,
    "section": pl.Utf8,
    "laterality": pl.Utf8,
    "severity": pl.Utf8,
    "anatomy_id": pl.Utf8,
    "span_start": pl.Int32,
    "text": pl.Utf8,
}


def mentions(rows: list[tuple]) -> pl.DataFrame:
    """rows: (mention_id, study_key, entity_id, assertion, laterality, severity, text); impression, current."""
    return pl.DataFrame(
        [
            (m, s, e, a, "current", "impression", lat, sev, None, 10 * i, txt)
            for i, (m, s, e, a, lat, sev, txt) in enumerate(rows)
        ],
        schema=MENTION_SCHEMA,
        orient="row",
    )


def open_items(table) -> dict:
    return {
        (r["question_type"], r["study_key"] or r["pair_id"], tuple(r["entity_ids"]), r["question"]): r["answer_text"]
        for r in table.to_pylist()
        if r["answer_format"] == "open_ended"
    }


def test_open_ended_answers_from_structured_state():
    st, lab = two_studies()
    men = mentions(
        [
            ("m1", "cu", "F029", "present", "left", "moderate", "moderate left layering pleural effusion"),
            ("m2", "pr", "F029", "present", None, None, "pleural effusion"),
            ("m3", "cu", "C006", "absent", None, None, "pneumonia"),
        ]
    )
    views = pl.DataFrame({"study_key": ["pr", "cu", "cu"], "view": ["PA", "AP", None]})
    pairs = pl.from_arrow(build_pairs(st, lab, frontal(["pr", "cu"]), PairingConfig()))
    cfg = VQAConfig(max_items_per_pair=20)  # every candidate item kept: the cap is tested elsewhere
    t = build_vqa(pairs, lab, st, splits_for(["p1"]), cfg, TEMPLATES, ONTO, entity_mentions=men, images=views)
    assert_well_formed(t, 4)
    got = {(q, a, e): ans for (q, a, e, _), ans in open_items(t).items()}
    pid = hashlib.sha256(b"pr|cu").hexdigest()[:16]
    assert got[("open_level", "cu", ("F029",))] == "moderate"
    assert got[("open_type", "cu", ("F029",))] == "layering"
    # "Where is the pleural effusion?" would give "(left) pleura" away by its word stem: no location item
    assert not [k for k in got if k[0] == "open_location"]
    assert got[("open_abnormality", "pr", ("F029", "C006"))] == "pleural effusion, pneumonia"
    assert got[("open_abnormality", "cu", ("F029",))] == "pleural effusion"
    assert got[("open_difference", pid, ("F029", "C006"))] == "increased pleural effusion; resolved pneumonia"
    views_got = sorted((a, question, ans) for (q, a, _, question), ans in open_items(t).items() if q == "open_view")
    # "Which view" gives PA / AP; "Is this PA/AP view?" yes/no: 2 yes and 2 no, all kept by the balance
    assert views_got == [
        ("cu", "Is this AP view?", "yes"),
        ("cu", "Is this PA view?", "no"),
        ("cu", "Which view is this image taken?", "AP"),
        ("pr", "Is this AP view?", "no"),
        ("pr", "Is this PA view?", "yes"),
        ("pr", "Which view is this image taken?", "PA"),
    ]
    # any-abnormality: "yes" in both studies and no "no": balanced away
    assert not [k for k in got if k[0] == "open_abnormality" and got[k] in ("yes", "no")]
    (m1,) = [r for r in t.to_pylist() if r["question_type"] == "open_level"]
    assert m1["question"] == "What level is the pleural effusion?" and m1["mention_ids"] == ["m1"]
    assert m1["item_id"] == item_id("cu", "open_level", "F029|severity")


def test_open_location_answer_is_laterality_and_anatomy():
    st = studies([("s1", "p1", "2D-CXR", "DX", 0)])
    lab = labels([("s1", "F007", "present", "none")])
    men = mentions([("m1", "s1", "F007", "present", "right", None, "right lung consolidation")])
    t = build_vqa(
        pl.DataFrame(),
        lab,
        st,
        splits_for(["p1"]),
        VQAConfig(max_items_per_pair=20),
        TEMPLATES,
        ONTO,
        entity_mentions=men,
    )
    got = {(q, a, e): ans for (q, a, e, _), ans in open_items(t).items()}
    assert got[("open_location", "s1", ("F007", "A001"))] == "right pulmonary parenchyma"
    (mc,) = by(t, question_type="location")
    assert mc["answer_text"] == "pulmonary parenchyma" and mc["entity_ids"] == ["F007", "A001"]


def test_open_presence_yes_no_balanced_per_split_and_type():
    st, lab = _many(40)
    sp = pl.DataFrame({"patient_key": [f"p{p}" for p in range(40)], "split": ["train", "test"] * 20})
    t = build(st, lab, split_df=sp)
    for split in ("train", "test"):
        for qtype in ("open_presence",):
            answers = Counter(
                r["answer_text"] for r in t.to_pylist() if r["split"] == split and r["question_type"] == qtype
            )
            assert answers["yes"] == answers["no"] > 0, (split, qtype, answers)


def test_balance_yes_no_keeps_smallest_item_ids_of_the_majority():
    df = pl.DataFrame(
        {
            "item_id": ["05", "01", "03", "02", "04", "09"],
            "shard": [1] * 6,
            "split": ["train"] * 6,
            "question_type": ["open_presence"] * 5 + ["open_level"],
            "answer_text": ["yes", "yes", "yes", "no", "no", "mild"],
            "yes_no": [True] * 5 + [False],
        }
    )
    out = balance_yes_no(df)
    assert out["item_id"].to_list() == ["01", "03", "02", "04", "09"]


def test_case_comparison_items_from_retrieval_targets():
    st_lab = pl.DataFrame(
        [
            ("q", "p1", "2D-CXR", "F029", "present", "none", 0),
            ("r", "p2", "2D-CXR", "F029", "present", "none", 3),
            ("q", "p1", "2D-CXR", "C006", "present", "none", 0),
            ("r", "p2", "2D-CXR", "C006", "absent", "none", 3),
            ("q", "p1", "2D-CXR", "F019", "uncertain", "none", 0),
            ("r", "p2", "2D-CXR", "F019", "absent", "none", 3),
        ],
        schema={
            "study_key": pl.Utf8,
            "patient_key": pl.Utf8,
            "family": pl.Utf8,
            "entity_id": pl.Utf8,
            "state": pl.Utf8,
            "change": pl.Utf8,
            "shard": pl.Int32,
        },
        orient="row",
    )
    men = mentions(
        [
            ("mq", "q", "F029", "present", "left", "moderate", "moderate left pleural effusion"),
            ("mr", "r", "F029", "present", "left", "mild", "mild left pleural effusion"),
            ("mc", "q", "C006", "present", None, None, "pneumonia"),
        ]
    )
    rt = pl.DataFrame(
        [
            ("q", "F029", "r", 1, 0.7, "2D-CXR", "present", "p1", "p2", "val", 0),
            ("q", "F029", "x", 2, 0.6, "2D-CXR", "present", "p1", "p3", "val", 0),
        ],
        schema={
            "query_study_key": pl.Utf8,
            "entity_id": pl.Utf8,
            "candidate_study_key": pl.Utf8,
            "rank": pl.Int32,
            "relevance": pl.Float32,
            "family": pl.Utf8,
            "state": pl.Utf8,
            "query_patient_key": pl.Utf8,
            "candidate_patient_key": pl.Utf8,
            "split": pl.Utf8,
            "shard": pl.Int32,
        },
        orient="row",
    )
    grades = {"trace": 0, "mild": 1, "small": 1, "moderate": 2, "severe": 3, "large": 3}
    t = build_case_comparison_vqa(rt, st_lab, men, CFG, TEMPLATES, ONTO, grades)
    assert t.schema.equals(SCHEMA, check_metadata=True)
    rows = {r["question_type"]: r for r in t.to_pylist()}
    assert set(rows) == {"case_severity", "case_laterality", "case_presence"}  # F019 uncertain: no item
    sev, lat, pres = rows["case_severity"], rows["case_laterality"], rows["case_presence"]
    assert sev["answer_text"] == "more severe than in the reference case"
    assert lat["answer_text"] == "on the same side as in the reference case"
    assert pres["answer_text"] == "the query case only" and pres["entity_ids"] == ["C006", "F029"]
    assert (
        sev["reason"] == "Query report: moderate left pleural effusion. Reference report: mild left pleural effusion."
    )
    assert pres["reason"] == "Query report: pneumonia. Reference report: no pneumonia."
    for r in rows.values():
        assert (r["study_key"], r["reference_study_key"], r["study_keys"]) == ("q", "r", ["r", "q"])
        assert (r["patient_key"], r["split"], r["shard"], r["pair_id"]) == ("p1", "val", 0, None)
        assert r["options"][LETTERS.index(r["answer"])] == r["answer_text"] and len(set(r["options"])) == 4
        assert r["item_id"] == item_id("q|r", r["question_type"], r["entity_ids"][0])
    assert sev["mention_ids"] == ["mq", "mr"] and pres["mention_ids"] == ["mc"]
    assert "not present in the query image" in sev["options"]


def test_case_comparison_letters_uniform_over_many_queries():
    n = 300
    rows, rt, sev_of = [], [], {}
    for i in range(n):
        for s, sev in ((f"q{i}", ["mild", "moderate", "severe"][i % 3]), (f"r{i}", "moderate")):
            rows.append((s, f"p{s}", "2D-CXR", "F029", "present", "none", 0))
            sev_of[s] = sev
        rt.append((f"q{i}", "F029", f"r{i}", 1, 0.8, "2D-CXR", "present", f"pq{i}", f"pr{i}", "train", 0))
    st_lab = pl.DataFrame(
        rows,
        schema={
            "study_key": pl.Utf8,
            "patient_key": pl.Utf8,
            "family": pl.Utf8,
            "entity_id": pl.Utf8,
            "state": pl.Utf8,
            "change": pl.Utf8,
            "shard": pl.Int32,
        },
        orient="row",
    )
    men = mentions([(f"m{s}", s, "F029", "present", None, sev_of[s], "pleural effusion") for s, *_ in rows])
    rtf = pl.DataFrame(
        rt,
        schema={
            "query_study_key": pl.Utf8,
            "entity_id": pl.Utf8,
            "candidate_study_key": pl.Utf8,
            "rank": pl.Int32,
            "relevance": pl.Float32,
            "family": pl.Utf8,
            "state": pl.Utf8,
            "query_patient_key": pl.Utf8,
            "candidate_patient_key": pl.Utf8,
            "split": pl.Utf8,
            "shard": pl.Int32,
        },
        orient="row",
    )
    t = build_case_comparison_vqa(rtf, st_lab, men, CFG, TEMPLATES, ONTO, {"mild": 1, "moderate": 2, "severe": 3})
    assert t.num_rows == n
    assert Counter(t["answer_text"].to_pylist()) == {
        "less severe than in the reference case": 100,
        "of similar severity in both cases": 100,
        "more severe than in the reference case": 100,
    }
    counts = Counter(t["answer"].to_pylist())
    chi2 = sum((counts[k] - n / 4) ** 2 / (n / 4) for k in "ABCD")
    assert chi2 < 11.34, counts  # 1% critical value of chi-square with 3 degrees of freedom


@pytest.mark.slow
def test_demo_build_has_every_question_type(demo_build):
    from etl.assemble.retrieval import entity_states

    storage = demo_build["storage"]
    vqa = storage.read_table("curated/vqa", schema=SCHEMA)
    types = Counter(vqa["question_type"].to_pylist())
    expected = {
        "change",
        "comparison_presence",
        "presence",
        "location",
        "case_laterality",
        "case_presence",
        *(f"open_{t}" for t in ("abnormality", "presence", "view", "location", "level", "type", "difference")),
    }
    assert expected <= set(types), expected - set(types)
    # case_severity needs a rank-1 reference link whose two studies both report a severity: the demo's 16
    # patients have none at the default threshold (only identical states are linked), so it is absent exactly then
    rt = pl.from_arrow(storage.read_table("curated/retrieval_targets")).filter(pl.col("rank") == 1)
    sev = (
        entity_states(
            pl.from_arrow(storage.read_table("curated/study_labels")),
            pl.from_arrow(storage.read_table("curated/entity_mentions")),
            ["present"],
        )
        .filter(pl.col("severity").is_not_null())
        .select("study_key", "entity_id")
    )
    linked = rt.join(sev, left_on=["query_study_key", "entity_id"], right_on=["study_key", "entity_id"]).join(
        sev, left_on=["candidate_study_key", "entity_id"], right_on=["study_key", "entity_id"]
    )
    assert ("case_severity" in types) == (linked.height > 0)
    rows = vqa.to_pylist()
    for r in rows:
        if r["answer_format"] == "open_ended":
            assert r["options"] == [] and r["answer"] is None
        else:
            assert r["options"][LETTERS.index(r["answer"])] == r["answer_text"]
        assert not re.search(r"(?i)\b" + re.escape(r["answer_text"]) + r"\b", r["question"])
    for split in set(vqa["split"].to_pylist()):
        for qtype in ("open_presence", "open_abnormality", "open_view"):
            yn = Counter(
                r["answer_text"]
                for r in rows
                if r["split"] == split and r["question_type"] == qtype and r["answer_text"] in ("yes", "no")
            )
            assert yn["yes"] == yn["no"], (split, qtype, yn)
    case = [r for r in rows if r["reference_study_key"]]
    assert case and all(r["reason"] and r["study_keys"] == [r["reference_study_key"], r["study_key"]] for r in case)
