"""SentenceScopedConText gives every target the same ConText modifiers as medspaCy's own ConText, on real reports.

Texts: every Open-i report (2D-CXR rules) and the shared CT set (3D-CT rules), plus constructed cases for the
fall-back paths (a modifier phrase across a sentence boundary, a target across sentences).
"""

import json

import pytest
from medspacy.context import ConText

from entity_extraction.extract import EntityExtractor, _set_ents, _unwrap
from entity_extraction.sentence_context import SentenceScopedConText
from schemas.config import PROJECT_ROOT

SHARED = PROJECT_ROOT.parent / "shared" / "data"
OPENI = SHARED / "openi" / "indiana_reports.csv"
CT = SHARED / "ct-report-extractions" / "ct_reports_with_findings.jsonl"


@pytest.fixture(scope="module")
def ex():
    return EntityExtractor()


def _modifiers(ex, text: str, family: str, stock: bool, inside: bool = False) -> list:
    """Per target: (target span, label, its modifiers as (category, modifier span, scope span, rule literal)).

    ``inside``: run ours with ``ignore_modifiers_in_targets`` as the extractor does; by default it is off, the
    configuration whose result must equal medspaCy's."""
    doc = ex._nlp(_unwrap(text))
    _set_ents(doc, ex._family(family).matcher(doc))
    assert ex._context.ignore_modifiers_in_targets  # the extractor's setting
    ex._context.ignore_modifiers_in_targets = inside
    try:
        doc = ConText.__call__(ex._context, doc) if stock else ex._context(doc)
    finally:
        ex._context.ignore_modifiers_in_targets = True
    return [
        (
            (e.start, e.end, e.label_),
            [(m.category, m.modifier_span, m.scope_span, m.rule.literal) for m in e._.modifiers],
        )
        for e in doc.ents
    ]


def _openi_texts() -> list[str]:
    import sys

    sys.path.insert(0, str(PROJECT_ROOT / "benchmarks"))
    from bench_reports import openi_texts

    return openi_texts(OPENI)


def test_the_extractor_uses_the_sentence_scoped_context(ex):
    assert isinstance(ex._context, SentenceScopedConText)


@pytest.mark.slow
def test_same_modifiers_as_medspacy_on_every_openi_and_ct_report(ex, shared_data):
    texts = [(t, "2D-CXR") for t in _openi_texts()]
    texts += [(json.loads(line)["report_text"], "3D-CT") for line in CT.read_text(encoding="utf-8").splitlines()]
    assert len(texts) > 2700
    modified = 0
    for text, family in texts:
        ours, theirs = _modifiers(ex, text, family, stock=False), _modifiers(ex, text, family, stock=True)
        assert ours == theirs, text
        modified += sum(bool(mods) for _, mods in ours)
    assert modified > 5000  # the comparison is not vacuous: thousands of targets carry modifiers


@pytest.mark.parametrize(
    "text",
    [
        # "no" ends one sentence and the next starts with "evidence of": phrase matches may cross the boundary
        "Heart size is normal and there is no\n\nIMPRESSION: evidence of pleural effusion.",
        "No pneumothorax. Left pleural effusion, increased. Right lung clear, no consolidation.",
        "Stable cardiomegaly. No new consolidation; no pleural effusion or pneumothorax.",
        "FINDINGS:\nNo\nIMPRESSION: pleural effusion",
    ],
)
def test_same_modifiers_on_boundary_cases(ex, text):
    assert _modifiers(ex, text, "2D-CXR", stock=False) == _modifiers(ex, text, "2D-CXR", stock=True)


def _categories(ex, text: str, family: str = "2D-CXR") -> dict[str, list[str]]:
    return {target[2]: [m[0] for m in mods] for target, mods in _modifiers(ex, text, family, False, True)}


@pytest.mark.parametrize(
    ("text", "label"),
    [
        # "old" (HISTORICAL) inside the target "old fracture" would end the scope of "No" (HISTORICAL ends
        # NEGATED_EXISTENCE) and make the effusion historical
        ("No old fracture or pleural effusion.", "F029"),
        ("No pleural effusion or old rib fracture.", "F010"),
    ],
)
def test_a_modifier_inside_a_target_neither_ends_a_scope_nor_modifies(ex, text, label):
    ours = _categories(ex, text)[label]
    assert "NEGATED_EXISTENCE" in ours and "HISTORICAL" not in ours, ours
    # medspaCy's way, for contrast: the inside modifier ends the negation's scope or modifies the other target
    stock = {t[2]: [m[0] for m in mods] for t, mods in _modifiers(ex, text, "2D-CXR", stock=True)}[label]
    assert "NEGATED_EXISTENCE" not in stock or "HISTORICAL" in stock, stock


def test_a_modifier_only_partly_inside_a_target_is_kept(ex):
    from entity_extraction.sentence_context import _outside_targets

    doc = ex._nlp("no old rib fracture seen")
    spans = [doc.char_span(3, 19, label="F010")]  # "old rib fracture", tokens 1-3
    doc.ents = spans
    matches = [(1, 0, 1), (2, 1, 2), (3, 3, 5), (4, 1, 4), (5, 4, 5)]  # no | old | fracture seen | old..fracture | seen
    assert _outside_targets(matches, doc.ents) == [(1, 0, 1), (3, 3, 5), (5, 4, 5)]


def test_the_option_refuses_configurations_it_does_not_cover(ex):
    ctx = SentenceScopedConText(
        ex._nlp, name="probe_ctx", rules=None, span_attrs=None, max_scope=5, ignore_modifiers_in_targets=True
    )
    doc = ex._nlp("No effusion.")
    with pytest.raises(ValueError, match="ignore_modifiers_in_targets"):
        ctx(doc)


def test_the_whole_document_path_drops_modifiers_inside_targets_too(ex, monkeypatch):
    """A modifier phrase across a sentence boundary sends the document down medspaCy's whole-document path
    (``ConTextGraph.update_scopes``); the option holds there as well."""
    from medspacy.context.context_graph import ConTextGraph

    text = "No evidence of pneumonia. No old fracture or pleural effusion."
    calls = []
    real = ConTextGraph.update_scopes
    monkeypatch.setattr(ConTextGraph, "update_scopes", lambda self: (calls.append(1), real(self))[1])

    def run(inside: bool) -> dict:
        doc = ex._nlp(text)
        doc[2].is_sent_start = True  # "No | evidence of ...": the phrase "No evidence of" now crosses a boundary
        _set_ents(doc, ex._family("2D-CXR").matcher(doc))
        ex._context.ignore_modifiers_in_targets = inside
        try:
            doc = ex._context(doc)
        finally:
            ex._context.ignore_modifiers_in_targets = True
        return {e.label_: [m.category for m in e._.modifiers] for e in doc.ents}

    ours = run(True)
    assert calls, "the whole-document path did not run"
    assert "NEGATED_EXISTENCE" in ours["F029"] and "HISTORICAL" not in ours["F029"], ours
    stock = run(False)
    assert "NEGATED_EXISTENCE" not in stock["F029"] or "HISTORICAL" in stock["F029"], stock
