"""Tests for entity_extraction.sections (header variants, same/next-line bodies, offset mapping)."""

import csv

import pytest

from entity_extraction.sections import section_at, section_spans, split_sections
from schemas.config import PROJECT_ROOT

DATA = PROJECT_ROOT.parent / "shared" / "data"
KEYS = {"indication", "technique", "comparison", "findings", "impression"}


def test_canonical_headers_same_line():
    text = (
        "INDICATION: cough\nTECHNIQUE: PA and lateral\nCOMPARISON: 01/01/2020\n"
        "FINDINGS: Clear lungs.\nIMPRESSION: Normal."
    )
    s = split_sections(text)
    assert s == {
        "indication": "cough",
        "technique": "PA and lateral",
        "comparison": "01/01/2020",
        "findings": "Clear lungs.",
        "impression": "Normal.",
    }


@pytest.mark.parametrize(
    ("header", "section"),
    [
        ("HISTORY", "indication"),
        ("CLINICAL HISTORY", "indication"),
        ("Reason for exam", "indication"),
        ("INDICATION", "indication"),
        ("CONCLUSION", "impression"),
        ("Summary", "impression"),
        ("Comparison", "comparison"),
        ("Findings", "findings"),
    ],
)
def test_header_variants(header, section):
    s = split_sections(f"{header}: body text here")
    assert s[section] == "body text here"
    assert all(v == "" for k, v in s.items() if k != section)


def test_header_on_own_line_body_on_next_lines():
    text = "FINDINGS\nThe lungs are clear.\nNo effusion.\n\nIMPRESSION:\n1. Normal chest.\n2. No change."
    s = split_sections(text)
    assert s["findings"] == "The lungs are clear.\nNo effusion."
    assert s["impression"] == "1. Normal chest.\n2. No change."


def test_empty_sections_and_no_headers():
    s = split_sections("COMPARISON:\nFINDINGS: Normal heart size.")
    assert s["comparison"] == "" and s["findings"] == "Normal heart size."
    assert split_sections("The lungs are clear.") == dict.fromkeys(KEYS, "")
    assert section_spans("The lungs are clear.") == [("unsectioned", 0, 20)]
    assert section_spans("") == []


def test_repeated_section_joined_and_mid_line_uppercase_header():
    text = "HISTORY: fever\nINDICATION: cough\nFINDINGS: Clear lungs. IMPRESSION: Normal."
    s = split_sections(text)
    assert s["indication"] == "fever\ncough"
    assert s["findings"] == "Clear lungs."
    assert s["impression"] == "Normal."


def test_words_inside_sentences_are_not_headers():
    text = "FINDINGS: Compared with the history, the impression is of clear lungs."
    s = split_sections(text)
    assert s["findings"] == "Compared with the history, the impression is of clear lungs."
    assert s["impression"] == "" and s["indication"] == ""


def test_spans_cover_text_and_map_offsets():
    text = "EXAM: CXR\nFINDINGS: No pleural effusion.\nIMPRESSION: Normal.\nDICTATED BY: someone"
    spans = section_spans(text)
    assert [n for n, _, _ in spans] == ["technique", "findings", "impression", "other"]
    assert spans[0][1] == 0 and spans[-1][2] == len(text)
    assert all(a[2] == b[1] for a, b in zip(spans, spans[1:]))
    assert section_at(spans, text.index("effusion")) == "findings"
    assert section_at(spans, text.index("FINDINGS")) == "findings"
    assert section_at(spans, text.index("Normal")) == "impression"
    assert section_at(spans, len(text)) is None
    assert "other" not in split_sections(text)


@pytest.mark.skipif(not (DATA / "openi" / "indiana_reports.csv").exists(), reason="shared Open-i data absent")
def test_openi_layout_round_trip():
    rows = list(csv.DictReader((DATA / "openi" / "indiana_reports.csv").open(encoding="utf-8")))[:300]
    for row in rows:
        parts = [
            f"{h.upper()}: {row[h].strip()}"
            for h in ("indication", "comparison", "findings", "impression")
            if row[h].strip()
        ]
        s = split_sections("\n".join(parts))
        for h in ("findings", "impression"):
            assert s[h] == row[h].strip(), (row["uid"], h)
