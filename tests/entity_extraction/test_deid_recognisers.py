"""Issue 36: the recognisers of report de-identification (checksums, addresses, organisations, places), the named
rule order, protected eponyms, and the complexity bound of the package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from entity_extraction.deid import deidentify_text, name_rules
from entity_extraction.deid.recognisers import (
    card_numbers,
    iban_valid,
    ibans,
    ip_addresses,
    luhn_valid,
    street_addresses,
)

ROOT = Path(__file__).resolve().parents[2]


def deid(text):
    return deidentify_text(text, known_phi=[], date_shift_days=None)[0]


def test_checksums():
    assert iban_valid("GB82WEST12345698765432") and iban_valid("GB82 WEST 1234 5698 7654 32")
    assert not iban_valid("GB83WEST12345698765432")  # one check digit off
    assert not iban_valid("GB82WEST1234569876543", {"GB": 22})  # wrong length for the country
    assert luhn_valid("4111111111111111") and not luhn_valid("4111111111111112")


def test_numbers_found_only_when_valid():
    assert ibans("IBAN GB82WEST12345698765432.") == [(5, 27, "IBAN")]
    assert ibans("IBAN GB83WEST12345698765432.") == []
    assert card_numbers("card 4111 1111 1111 1111 on file") == [(5, 24, "CARD")]
    assert card_numbers("card 4111 1111 1111 1112 on file") == []
    assert ip_addresses("from 10.2.33.4 and fe80::1:2") == [(5, 14, "IP"), (19, 28, "IP")]
    assert ip_addresses("EF 55.3.2.1.0 and 300.1.1.1") == []  # not four octets / an octet over 255


@pytest.mark.parametrize(
    ("text", "street"),
    [
        ("lives at 62 Geraldine Cape, Port Alex 2519 with", "62 Geraldine Cape"),
        ("write to Flat 5 Gray Village, Leeds", "Flat 5 Gray Village"),
        ("address Drubinstraße 47-26, 69074 Augsburg.", "Drubinstraße 47-26"),
        ("au 802, boulevard Gaudin, Paris", "802, boulevard Gaudin"),
        ("en Calle Mayor 5, Madrid", "Calle Mayor 5"),
    ],
)
def test_street_addresses_with_locality(text, street):
    hits = street_addresses(text)
    assert text[hits[0][0] : hits[0][1]] == street
    assert len(hits) == 2  # the locality after the comma is the second hit


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "The patient lives at 62 Geraldine Cape, Port Alex 2519 with his wife Mary.",
            "The patient lives at [ADDRESS], [ADDRESS] with his wife [NAME].",
        ),
        (
            "Billing: IBAN GB82WEST12345698765432; card 4111 1111 1111 1111; host 10.2.33.4.",
            "Billing: IBAN [ACCOUNT]; card [ACCOUNT]; host [IP].",
        ),
        ("Mr. Boone works at Shaw Ltd in Williehaven.", "Mr. [NAME] works at [ORGANIZATION] in [LOCATION]."),
        ("Admitted from University Hospital Clarkeville.", "Admitted from [ORGANIZATION]."),
    ],
)
def test_generated_style_phi_removed(text, expected):
    assert deid(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "The Hartmann pouch is unremarkable. Stable Chiari I malformation.",
        "Fluid in Morison pouch. The circle of Willis is patent. The Sylvian fissures are symmetric.",
        "Patient with Parkinson disease; Boston criteria are not met.",
        "Ejection fraction 55%. Aortic root 3.4 cm. Wearing 70% FiO2 during 3 hours.",
        "WEARING 70% OFT NEB WITH SATS 93-96%, HR 80-103 SR TO ST WITH PVCS.",
        "Plan: A-Care and Comfort. Cleared at the North Pole of the kidney.",
    ],
)
def test_clinical_text_survives(text):
    assert deid(text) == text


def test_rules_are_named_listed_and_documented():
    assert name_rules.WORD_RULES[:3] == (name_rules.institution_names, name_rules.titles, name_rules.relations)
    for rule in (*name_rules.WORD_RULES, *name_rules.TEXT_RULES):
        doc = rule.__doc__ or ""
        assert "Example" in doc and any(k in doc for k in ("NAME", "LOCATION", "ORGANIZATION", "RELATIVE")), rule


def test_rule_gates_change_no_finding(monkeypatch):
    """Offering a word only the rules whose gate it passes (``RULE_GATES``) finds exactly what offering it every rule
    finds, on the shared gold notes and generated notes with every PHI type."""
    import json

    from entity_extraction.deid.lexicon import load_lexicon
    from entity_extraction.deid.synthetic import generate_notes

    notes = ROOT.parent / "shared" / "data" / "text-deid" / "physionet-deid-dev" / "notes.jsonl"
    assert notes.is_file(), "the shared PhysioNet half is needed (../shared/data)"
    texts = [json.loads(line)["text"] for line in notes.read_text(encoding="utf-8").splitlines()[:300]]
    texts += [n.text for n in generate_notes(150, seed=3)]
    texts += ["Transferred to Middle River from Port Alex. Dr Will Cole, Mary Hulse RN; J SMITH ORDERED; Wood-Mellor."]
    assert set(name_rules.WORD_RULES) <= set(name_rules.RULE_GATES)
    gated = [name_rules.lexical_hits(t) for t in texts]
    assert sum(map(len, gated)) > 100  # the texts hold names and places

    def every_rule(t, mixed, lex):
        if t.cls == name_rules.SAFE and t.low not in lex.cues and len(t.low) > 1:
            return name_rules.PLAIN_WORD_RULES if t.low in lex.plain_triggers else ()
        return name_rules.WORD_RULES

    load_lexicon().memo.clear()
    monkeypatch.setattr(name_rules, "_rules_for", every_rule)
    assert [name_rules.lexical_hits(t) for t in texts] == gated


def test_package_complexity_at_most_30():
    ruff = Path(sys.executable).with_name("ruff")
    assert ruff.exists(), "ruff is part of the dev extra (make install)"
    result = subprocess.run(
        [
            str(ruff),
            "check",
            "--isolated",
            "--select",
            "C901",
            "--config",
            "lint.mccabe.max-complexity=30",
            str(ROOT / "entity_extraction" / "deid"),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout
