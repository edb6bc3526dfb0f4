"""The field's trigger lexicons under our ConText layer, the assertion convention, the NegEx trigger probe, k-fold
plans."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import yaml

from entity_extraction.extract import CONTEXT_RULES_FILE, EntityExtractor
from entity_extraction.folds import FoldPlan, FoldsError, fold_of, load_fold_plans, render_fold_line
from entity_extraction.trigger_lexicons import (
    ASSERTING,
    LexiconError,
    expand_pattern,
    load_field_lexicons,
    merge_rules,
)
from entity_extraction.trigger_probe import build_probe, read_negex_triggers, render_probe, score_probe

RULES = json.loads(CONTEXT_RULES_FILE.read_text(encoding="utf-8"))
MANIFEST = CONTEXT_RULES_FILE.parent / RULES["field_lexicons"]


@pytest.fixture(scope="module")
def ex():
    return EntityExtractor()


@pytest.fixture(scope="module")
def field():
    return load_field_lexicons(MANIFEST)


def assertion_of(ex, text: str, target: str) -> str:
    at = text.lower().index(target.lower())
    return ex.assert_target(text, at, at + len(target))["assertion"]


# ------------------------------------------------------------------ sources as published
def test_negex_list_is_the_full_published_list():
    triggers = read_negex_triggers()
    assert len(triggers) == 272
    assert Counter(tag for _, tag in triggers) == {
        "PREN": 125,
        "CONJ": 89,
        "PREP": 21,
        "PSEU": 16,
        "POSP": 14,
        "POST": 7,
    }


def test_every_source_is_read_and_named(field):
    rules, excluded = field
    by_source = Counter(r.source for r in rules)
    assert set(by_source) == {"negex", "medspacy", "pycontext", "chexpert"}
    # medspaCy's 102 rules, token patterns written out as phrases; FAMILY (experiencer) not taken
    assert by_source["medspacy"] > 102
    assert not any(r.tag.startswith("FAMILY") for r in rules)
    manifest = yaml.safe_load(MANIFEST.read_text())
    for source in manifest["sources"]:
        head = (MANIFEST.parent / source["file"]).read_text(encoding="utf-8")[:600]
        assert "License" in head or "license" in head, source["file"]  # each file names its origin and license
    assert {": no", "free", "is not enlarged"} <= set(excluded)
    assert not any(r.literal in excluded for r in rules)


def test_expand_pattern():
    pattern = [{"LOWER": {"IN": ["may", "might"]}, "OP": "?"}, {"LOWER": "be"}, {"LOWER": "ruled"}, {"LOWER": "out"}]
    assert expand_pattern(pattern) == ["may be ruled out", "might be ruled out", "be ruled out"]
    with pytest.raises(LexiconError):
        expand_pattern([{"LEMMA": "rule"}])
    with pytest.raises(LexiconError):
        expand_pattern([{"LOWER": "no", "OP": "*"}])


def test_merge_precedence_and_carried_assertions(field):
    merged = merge_rules(RULES["rules"], field[0])
    by_literal: dict[str, list[dict]] = {}
    for r in merged:
        by_literal.setdefault(r["literal"].lower(), []).append(r)
    own = {r["literal"].lower() for r in RULES["rules"]}
    added = Counter(r["literal"] for r in merged if r.get("source"))
    assert all(v == 1 for v in added.values()) and not own & set(added), "one rule per literal"
    # our layer wins on a shared literal: NegEx reads "no" as pre-negation too, ours has max_scope 20
    assert by_literal["no"][0].get("source") is None and by_literal["no"][0]["max_scope"] == 20
    # NegEx "rule out" (pre-possible) is hypothetical in our layer and keeps its uncertainty
    assert (
        by_literal["rule out"][0]["category"] == "HYPOTHETICAL"
        and by_literal["rule out"][0]["assertion"] == "uncertain"
    )
    # NegEx "evaluate for" (pre-negation) is hypothetical in ConText: the negation is not carried
    assert "assertion" not in by_literal["evaluate for"][0]
    # a field trigger our layer lacks comes in with its source named
    assert by_literal["fails to reveal"][0]["category"] == "NEGATED_EXISTENCE"
    assert by_literal["trigger event for"][0] == {
        "literal": "trigger event for",
        "category": "CLAUSE_BREAK",
        "direction": "PSEUDO",
        "source": "negex",
        "max_scope": 1,
    }


def test_bad_manifest_is_a_config_error(tmp_path):
    bad = tmp_path / "field.yaml"
    bad.write_text("sources:\n  - {name: x, file: missing.tsv, format: negex, tags: {}}\n")
    with pytest.raises(LexiconError, match="field.yaml"):
        load_field_lexicons(bad)
    rules = dict(RULES, field_lexicons=str(bad))
    path = tmp_path / "context_rules_en.json"
    path.write_text(json.dumps(rules))
    from entity_extraction.extract import ExtractorConfigError

    with pytest.raises(ExtractorConfigError) as err:
        EntityExtractor(context_rules_path=path)
    assert err.value.reason == "invalid_context_rules"


# ------------------------------------------------------------------ examples: exclusions and our layer
def test_every_exclusion_example_holds(ex, field):
    for literal, spec in field[1].items():
        example = spec["example"]
        assert example, literal
        assert assertion_of(ex, example["text"], example["target"]) == example["assertion"], (literal, example)


_FRAMES = {
    ("NEGATED_EXISTENCE", "FORWARD"): ("{lit} pleural effusion.", "absent"),
    ("NEGATED_EXISTENCE", "BACKWARD"): ("Pleural effusion {lit}.", "absent"),
    ("NEGATED_EXISTENCE", "BIDIRECTIONAL"): ("Pleural effusion {lit}.", "absent"),
    ("POSSIBLE_EXISTENCE", "FORWARD"): ("{lit} pleural effusion.", "uncertain"),
    ("POSSIBLE_EXISTENCE", "BACKWARD"): ("Pleural effusion {lit}.", "uncertain"),
    ("POSSIBLE_EXISTENCE", "BIDIRECTIONAL"): ("{lit} pleural effusion.", "uncertain"),
    ("PROBABLE_EXISTENCE", "FORWARD"): ("{lit} pleural effusion.", "present"),
    ("PROBABLE_EXISTENCE", "BACKWARD"): ("Pleural effusion {lit}.", "present"),
    ("NP_HEDGE", "FORWARD"): ("{lit} pleural effusion.", "uncertain"),
    ("CLAUSE_BREAK", "PSEUDO"): ("No pneumothorax {lit} pleural effusion.", "not_absent"),
    ("PSEUDO", "PSEUDO"): ("{lit} pleural effusion.", "not_absent"),
}


def own_assertion_rules():
    """Our radiology layer's assertion rules (negation, uncertainty, hedges, scope ends, pseudo-negations)."""
    out = []
    for r in RULES["rules"]:
        key = (r["category"], r.get("direction", "BIDIRECTIONAL"))
        if key in _FRAMES and "phrases" not in r:
            out.append(pytest.param(r, id=f"{r['category']}:{r['literal']}"))
    return out


@pytest.mark.parametrize("rule", own_assertion_rules())
def test_own_rule_sentence(ex, rule):
    """Each rule of our layer in a sentence of its own (generated from its category and direction; a rule may give
    ``example`` [text, target, assertion] where the frame does not read as English)."""
    if "example" in rule:
        text, target, want = rule["example"]
    else:
        frame, want = _FRAMES[(rule["category"], rule.get("direction", "BIDIRECTIONAL"))]
        text = frame.format(lit=rule["literal"])
        text = text[0].upper() + text[1:]
        target = "pleural effusion"
    got = assertion_of(ex, text, target)
    assert (got != "absent") if want == "not_absent" else (got == want), (text, got)


def own_temporality_rules():
    """Our layer's hypothetical and historical rules."""
    return [
        pytest.param(r, id=f"{r['category']}:{r['literal']}")
        for r in RULES["rules"]
        if r["category"] in ("HYPOTHETICAL", "HISTORICAL") and "phrases" not in r
    ]


@pytest.mark.parametrize("rule", own_temporality_rules())
def test_own_temporality_rule_sentence(ex, rule):
    """Each hypothetical/historical rule of our layer in a generated sentence: the target takes its temporality."""
    backward = rule.get("direction") == "BACKWARD"
    text = f"Pleural effusion {rule['literal']}." if backward else f"{rule['literal']} pleural effusion."
    text = text[0].upper() + text[1:]
    at = text.lower().index("pleural effusion")
    assert ex.assert_target(text, at, at + 16)["temporality"] == rule["category"].lower(), text


def test_copular_post_negations(ex, field):
    """Every backward negation "not X" (ours or a field lexicon's) also negates after "is", "are", "was": no forward
    trigger ending in "not" (medspaCy's "is not", excluded) may win the overlap ("Pleural effusion is not
    identified")."""
    merged = merge_rules(RULES["rules"], field[0])
    literals = {r["literal"].lower() for r in merged}
    wrong = []
    for r in merged:
        lit = r["literal"].lower()
        if r["category"] != "NEGATED_EXISTENCE" or r.get("direction") not in ("BACKWARD", "BIDIRECTIONAL"):
            continue
        if not lit.startswith("not "):
            continue
        for copula in ("is", "are", "was"):
            if f"{copula} {lit}" in literals:
                continue  # its own rule
            text = f"Pleural effusion {copula} {lit}."
            if assertion_of(ex, text, "Pleural effusion") != "absent":
                wrong.append(text)
    assert not wrong, wrong


def test_own_phrase_rules(ex):
    assert assertion_of(ex, "Pleural effusion: none.", "Pleural effusion") == "absent"
    assert assertion_of(ex, "The pleural effusion has resolved.", "pleural effusion") == "absent"
    assert assertion_of(ex, "PLEURA: No pleural effusion.", "pleural effusion") == "absent"


# ------------------------------------------------------------------ the assertion convention (docs/reports.md)
@pytest.mark.parametrize(
    "text, target, want",
    [
        ("Atelectasis versus pneumonia.", "Atelectasis", "uncertain"),
        ("Atelectasis versus pneumonia.", "pneumonia", "uncertain"),
        ("Small pleural effusions and right infrahilar infiltrate versus crowding.", "pleural effusions", "present"),
        ("Small pleural effusions and right infrahilar infiltrate versus crowding.", "infiltrate", "uncertain"),
        ("Scarring and/or atelectasis.", "Scarring", "uncertain"),
        ("Scarring and/or atelectasis.", "atelectasis", "uncertain"),
        ("Cannot exclude pneumonia.", "pneumonia", "uncertain"),
        ("Possible pneumonia.", "pneumonia", "uncertain"),
        ("Probable pneumonia.", "pneumonia", "uncertain"),
        ("Opacity may represent pneumonia.", "pneumonia", "uncertain"),
        ("Borderline cardiomegaly.", "cardiomegaly", "uncertain"),
        ("Opacity suggestive of pneumonia.", "pneumonia", "present"),
        ("Opacity concerning for pneumonia.", "pneumonia", "present"),
        ("Likely pneumonia.", "pneumonia", "present"),
        ("No pneumothorax. Possible small pleural effusion.", "pleural effusion", "uncertain"),
        ("No new suspicious nodules or consolidation.", "consolidation", "absent"),
        (
            "No focal consolidation, suspicious pulmonary opacity, pleural effusion, or pneumothorax.",
            "pleural effusion",
            "absent",
        ),
        ("Suspicious pulmonary nodule.", "pulmonary nodule", "uncertain"),
        ("Rule out pneumonia.", "pneumonia", "uncertain"),
        ("Evaluate for pneumonia.", "pneumonia", "present"),
        ("Pneumonia is not excluded.", "Pneumonia", "uncertain"),
        ("There may be a small pleural effusion.", "pleural effusion", "uncertain"),
        ("Pneumonia is difficult to exclude.", "Pneumonia", "uncertain"),
        ("Pneumonia should be considered.", "Pneumonia", "uncertain"),
        ("Pleural effusion is not identified.", "Pleural effusion", "absent"),
        ("Questionable nodule.", "nodule", "uncertain"),
        ("Opacity may be secondary to atelectasis.", "atelectasis", "uncertain"),
        ("Right basilar opacity, ? pneumonia.", "pneumonia", "uncertain"),
        ("Right basilar atelectasis or pneumonia.", "atelectasis", "uncertain"),
        ("Right basilar atelectasis or pneumonia.", "pneumonia", "uncertain"),
        ("No pneumothorax or pleural effusion.", "pleural effusion", "absent"),
        ("One or more pulmonary nodules.", "pulmonary nodules", "present"),
        ("Small or moderate pleural effusion.", "pleural effusion", "present"),
        ("Consolidation has not resolved.", "Consolidation", "present"),
        ("No interval improvement in the pneumonia.", "pneumonia", "present"),
        ("Pneumonia has not improved.", "Pneumonia", "present"),
        ("No old rib fracture.", "old rib fracture", "absent"),
        ("No pleural effusion or old rib fracture.", "old rib fracture", "absent"),
    ],
)
def test_convention(ex, text, target, want):
    assert assertion_of(ex, text, target) == want


@pytest.mark.parametrize(
    "text, target, hedge",
    [
        (
            "The blunted costophrenic angle could be secondary to a small pleural effusion.",
            "pleural effusion",
            "could be secondary to",
        ),
        ("The density might be secondary to a small pleural effusion.", "pleural effusion", "might be secondary to"),
        ("Basilar opacity, possibly secondary to atelectasis.", "atelectasis", "possibly secondary to"),
    ],
)
def test_chexpert_secondary_to_with_a_modal(ex, text, target, hedge):
    """CheXpert's "maybe secondary to XXX" (nmod:to secondary) with the modals its due-to/related-to patterns take:
    uncertain, and the cue is the phrase, not the scope end "secondary to" (NegEx [CONJ]) that would cut "could be"."""
    assert assertion_of(ex, text, target) == "uncertain"
    mention = next(m for m in ex.extract(text, "2D-CXR") if m["text"].lower() == target)
    assert mention["assertion"] == "uncertain" and mention["hedges"] == [hedge]


def test_modal_secondary_to_before_versus_is_not_coded_by_nlm_reading(ex):
    """The effusion of "could be secondary to a small effusion versus scarring" carries the modal cue as
    well as "versus", so NLM's reading of hedges (which codes "versus" alone) keeps it uncertain."""
    text = "Blunting of the costophrenic sulcus could be secondary to a small effusion versus scarring."
    effusion = next(m for m in ex.extract(text, "2D-CXR") if m["text"] == "effusion")
    assert effusion["assertion"] == "uncertain" and "could be secondary to" in effusion["hedges"]


@pytest.mark.parametrize(
    "text, target, want",
    [
        # "other than" ends a negation's scope, as NegEx's [CONJ] "except", "aside from", "apart from" do
        ("No acute infiltrate other than left basilar atelectasis.", "atelectasis", "present"),
        ("No acute infiltrate other than left basilar atelectasis.", "infiltrate", "absent"),
        # "with residual" / "with persistent" end the scope of a resolution ("resolution of", "clearing of")
        ("Resolution of the pleural effusion with residual atelectasis.", "atelectasis", "present"),
        ("Resolution of the pleural effusion with residual atelectasis.", "pleural effusion", "absent"),
        ("Clearing of the pneumonia with persistent atelectasis.", "atelectasis", "present"),
        ("No residual pneumothorax.", "pneumothorax", "absent"),
        # a high-likelihood hedge ends an uncertainty cue's scope, as it ends a negation's
        ("Possible atelectasis, likely pneumonia.", "pneumonia", "present"),
        ("Possible atelectasis, likely pneumonia.", "atelectasis", "uncertain"),
    ],
)
def test_scope_ends(ex, text, target, want):
    assert assertion_of(ex, text, target) == want


@pytest.mark.parametrize(
    "text, target, want",
    [
        # "there may be" was a clause break only, which hid the CheXpert cue "may be" ("May/might/would/could be XXX")
        ("There may be a small left pleural effusion.", "pleural effusion", "uncertain"),
        ("There might be a small left pleural effusion.", "pleural effusion", "uncertain"),
        ("There could be a small left pleural effusion.", "pleural effusion", "uncertain"),
        ("No pneumothorax, there may be a small pleural effusion.", "pneumothorax", "absent"),  # still ends the "no"
        # "difficult to exclude" reads both ways, as "not excluded" does
        ("Difficult to exclude pneumonia.", "pneumonia", "uncertain"),
        ("Pneumonia is difficult to exclude.", "Pneumonia", "uncertain"),
        ("Pneumonia would be difficult to exclude.", "Pneumonia", "uncertain"),
        # the passive of CheXpert's "consider XXX" and a stated possibility
        ("Pneumonia should be considered.", "Pneumonia", "uncertain"),
        ("A pulmonary nodule is a possibility.", "pulmonary nodule", "uncertain"),
        ("A pulmonary nodule is also a possibility.", "pulmonary nodule", "uncertain"),
        ("Pneumonia remains a possibility.", "Pneumonia", "uncertain"),
        ("Early pneumonia is a consideration.", "pneumonia", "uncertain"),
    ],
)
def test_uncertainty_phrasings(ex, text, target, want):
    assert assertion_of(ex, text, target) == want


def test_normal_statement_stays_absent(ex):
    mentions = ex.extract("Heart size is normal. The cardiac silhouette is not enlarged.", "2D-CXR")
    f018 = [m for m in mentions if m["entity_id"] == "F018"]
    assert f018 and all(m["assertion"] == "absent" for m in f018)


# ------------------------------------------------------------------ NegEx trigger probe
def test_probe_frames():
    frames = build_probe()
    assert len(frames) == 2 * 125 + 89 + 21 + 16 + 14 + 7  # 397 frames of 272 triggers
    first = frames[0]
    assert first.text[first.start : first.end] in ("pleural effusion", "Pleural effusion")
    by = Counter(f.expected for f in frames)
    assert by == {"absent": 257, "not_absent": 105, "uncertain": 35}


def test_probe_accuracy(ex):
    result = score_probe(build_probe(), ex)
    assert result.accuracy >= 0.95, render_probe(result)  # measured 0.987 (392 of 397)
    assert render_probe(result).startswith("NegEx trigger probe: accuracy ")


# ------------------------------------------------------------------ k-fold plans
def test_fold_of_is_stable():
    assert fold_of("openi", "1", 5) == fold_of("openi", "1", 5)
    counts = Counter(fold_of("openi", str(i), 5) for i in range(5000))
    assert set(counts) == set(range(5)) and min(counts.values()) > 900
    with pytest.raises(ValueError):
        fold_of("openi", "1", 1)


def test_fold_seed_draws_another_assignment():
    ids = [str(i) for i in range(2000)]
    default = [fold_of("openi", i, 5) for i in ids]
    seeded = [fold_of("openi", i, 5, seed=38) for i in ids]
    assert seeded == [fold_of("openi", i, 5, seed=38) for i in ids]  # deterministic
    same = sum(a == b for a, b in zip(default, seeded)) / len(ids)
    assert 0.15 < same < 0.25  # independent of the default assignment: about 1 in 5 records keep their fold
    plan = FoldPlan("openi", 5, frozenset({0, 1, 2}))
    other = plan.reseeded(38)
    assert other.seed == 38 and plan.reseeded(None) == plan
    assert [other.part(i) for i in ids] == ["tuned" if f < 3 else "held-out" for f in seeded]
    line = render_fold_line(other, "F1", {"tuned": 0.9, "held-out": 0.9}, {"tuned": 3, "held-out": 2})
    assert line.startswith("k-fold openi (seed 38): F1: tuned")


def test_fold_plans(tmp_path):
    plans = load_fold_plans()
    assert {"openi", "ct-extractions", "negex-kit", "negex-probe"} <= set(plans)
    plan = plans["openi"]
    assert plan.part("1") in ("tuned", "held-out")
    bad = tmp_path / "folds.yaml"
    bad.write_text("sets:\n  x: {k: 3, tuned: [0, 1, 2]}\n")
    with pytest.raises(FoldsError, match="proper subset"):
        load_fold_plans(bad)
    line = render_fold_line(
        FoldPlan("x", 5, frozenset({0, 1, 2})), "F1", {"tuned": 0.9, "held-out": 0.88}, {"tuned": 30, "held-out": 20}
    )
    assert line == ("k-fold x: F1: tuned (folds 0,1,2; n=30) 0.900 | held-out (folds 3,4; n=20) 0.880 | gap -0.020")
    undefined = render_fold_line(
        FoldPlan("x", 5, frozenset({0, 1, 2})), "F1", {"tuned": 0.9, "held-out": None}, {"tuned": 3, "held-out": 1}
    )
    assert undefined.endswith("held-out (folds 3,4; n=1) n/a | gap n/a")


def test_asserting_categories():
    assert ASSERTING == {"NEGATED_EXISTENCE": "absent", "POSSIBLE_EXISTENCE": "uncertain"}


# ------------------------------------------------------------------ brain MRI and ultrasound vocabulary (RadLex review)
VARIANTS = json.loads((CONTEXT_RULES_FILE.parent / "lexical_variants_en.json").read_text(encoding="utf-8"))


def _family_of(onto, concept_id: str) -> str:
    return next(f for f in onto.families if any(c.id == concept_id for c in onto.family_concepts(f)))


@pytest.mark.parametrize("concept_id", sorted(VARIANTS["concepts"]))
def test_variant_example_names_its_concept(ex, concept_id):
    entry = VARIANTS["concepts"][concept_id]
    family = _family_of(ex.ontology, concept_id)
    ids = {m["entity_id"] for m in ex.extract(entry["example"], family)}
    assert concept_id in ids, (entry["example"], ids)


def test_variants_never_name_another_concept(ex):
    synonyms = {
        s.lower(): c.id
        for f in {*VARIANTS["families"], *(_family_of(ex.ontology, cid) for cid in VARIANTS["concepts"])}
        for c in ex.ontology.family_concepts(f)
        for s in c.synonyms.get("en", ())
    }
    for cid, entry in VARIANTS["concepts"].items():
        for v in entry["variants"]:
            assert synonyms.get(v.lower(), cid) == cid, (v, cid, synonyms[v.lower()])


@pytest.mark.parametrize(
    "text, family, concept_id",
    [
        ("Small intraventricular haemorrhage.", "3D-Brain-MRI", "F044"),
        ("Chronic ischaemic changes.", "3D-Brain-MRI", "F049"),
        ("Mild small-vessel disease.", "3D-Brain-MRI", "C024"),
        ("The gall-bladder is normal.", "2D-Ultrasound", "A030"),
        ("Subdural haematoma.", "3D-Brain-MRI", "C023"),
    ],
)
def test_spelling_and_hyphenation_variants(ex, text, family, concept_id):
    assert concept_id in {m["entity_id"] for m in ex.extract(text, family)}
