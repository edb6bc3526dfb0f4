"""Reports in the consortium's languages (issue 34): language identification and its edges, fail-closed routing,
the German/French/Spanish de-identification packs and entity packs, ``medreco reports annotate`` on the issue's
three reports."""

from __future__ import annotations

import json

import pytest

from entity_extraction.languages.detect import confidence_needed, detect_language, function_word_votes
from entity_extraction.languages.local_deid import available_languages, deidentify_local
from entity_extraction.languages.route import UnsupportedLanguageError, deidentify_report, supported_languages

GERMAN = (
    "Röntgen Thorax vom 12. März 2023\nPatient: Hans Müller, geb. 04.07.1951\nKlinikum Großhadern München\n"
    "Befund: Kein Pleuraerguss. Herz nicht vergrößert. V.a. beginnende Pneumonie rechts basal.\n"
    "Beurteilung: Kein Pneumothorax.\nDr. med. Schäfer"
)
FRENCH = (
    "Patiente: Mme Élodie Lefèvre, née le 4 juillet 1951, CHU de Bordeaux.\n"
    "Résultats : pas d'épanchement pleural. Cardiomégalie modérée.\nConclusion : pas de foyer de condensation."
)
CHINESE = "患者：王小明，2023年3月12日，北京协和医院。胸部X线：双肺未见明显异常，心影不大。"
SPANISH = (
    "Paciente: Sra. Carmen Ruiz Gómez, nacida el 12 de marzo de 1950. Hospital Universitario La Paz, Madrid.\n"
    "NHC: 368503. Domicilio: Calle Miguel Benitez 90, 28016 Madrid. Tel.: 913 908 121\n"
    "Hallazgos: no se observa derrame pleural. Posible neumonía en lóbulo inferior derecho."
)
ITALIAN = (
    "Torace: non si osservano versamenti pleurici. Cuore nei limiti della norma. "
    "Paziente Mario Rossi, nato il 3 maggio 1950."
)
DUTCH = (
    "Thorax: geen pleuravocht. Hart van normale grootte. "
    "Patiënt Jan de Vries, geboren op 3 mei 1950, ziekenhuis Utrecht."
)


@pytest.mark.parametrize(
    "text, prior, expected",
    [
        (GERMAN, "en", "de"),
        (FRENCH, "en", "fr"),
        (SPANISH, "en", "es"),
        (CHINESE, "en", "zh"),
        (ITALIAN, "en", "it"),
        (DUTCH, "en", "nl"),
        # the configured language is a prior, not a fact: a French report from an English site is French
        (FRENCH, "de", "fr"),
        # an English report quoting foreign names and a foreign hospital stays English
        (
            "Referred by Dr. François Lefèvre-Dubois, CHU de Bordeaux. The lungs are clear and there is no effusion.",
            "en",
            "en",
        ),
        (
            "Patient Hans Müller from Klinikum Großhadern München. No pleural effusion. The heart size is normal.",
            "de",
            "en",
        ),
        # too short to tell: the prior decides, whatever lingua guesses
        ("Normal.", "en", "en"),
        ("Normal.", "de", "de"),
        ("Sin hallazgos.", "en", "en"),
    ],
)
def test_detect_language(text, prior, expected):
    assert detect_language(text, prior).language == expected


def test_detection_methods_and_confidence():
    d = detect_language(GERMAN, "en")
    assert (d.method, d.foreign_script) == ("function_words", False) and d.confidence >= 0.75
    z = detect_language(CHINESE, "en")
    assert z.method == "lingua" and z.confidence > 0.9
    # medical English that lingua alone reads as French (0.97) is decided by its function words
    text = (
        "FINDINGS: The cardiomediastinal silhouette is normal. No focal airspace consolidation.\n"
        "IMPRESSION: Normal chest"
    )
    assert detect_language(text, "de").language == "en"
    assert detect_language("Normal.", "fr").method == "prior"
    # a word listed for two languages ("la": French and Spanish) counts for neither
    assert function_word_votes("la la la") == {}
    assert confidence_needed(10) > 1 and confidence_needed(50) > confidence_needed(500)


def test_foreign_script_in_latin_report_is_withheld():
    d = detect_language("Patient 王小明. The lungs are clear and there is no effusion.", "en")
    assert d.language == "en" and d.foreign_script
    with pytest.raises(UnsupportedLanguageError) as err:
        deidentify_report(
            "Patient 王小明. The lungs are clear and there is no effusion.",
            prior="en",
            known_phi=[],
            date_shift_days=None,
        )
    assert err.value.reason == "unsupported_language" and "王" not in str(err.value)


@pytest.mark.parametrize("text, code", [(CHINESE, "zh"), (ITALIAN, "it"), (DUTCH, "nl")])
def test_unsupported_language_fails_closed_without_quoting_text(text, code):
    with pytest.raises(UnsupportedLanguageError) as err:
        deidentify_report(text, prior="en", known_phi=[], date_shift_days=10)
    assert err.value.reason == "unsupported_language"
    assert f"detected language {code}" in err.value.detail and "confidence" in err.value.detail
    assert not any(w in err.value.detail for w in ("王", "Rossi", "Vries", "Utrecht"))


def test_supported_languages():
    assert set(available_languages()) == {"de", "fr", "es"}
    assert supported_languages() == ("de", "en", "es", "fr")


def test_german_pack_removes_the_issue_phi_and_keeps_findings():
    out, counts = deidentify_local(GERMAN, "de", known_phi=[], date_shift_days=None)
    for phi in ("12. März 2023", "04.07.1951", "Müller", "Großhadern", "München", "Schäfer", "Hans"):
        assert phi not in out, phi
    for keep in ("Kein Pleuraerguss", "V.a. beginnende Pneumonie rechts basal", "Befund:", "Beurteilung:", "Dr. med."):
        assert keep in out, keep
    assert counts["DATE"] == 2 and counts["NAME"] == 2 and counts["ORGANIZATION"] == 1


def test_dates_are_shifted_in_their_own_form_and_birth_dates_removed():
    text = "Untersuchung vom 12. März 2023, Voraufnahme 01.02.2022, Kontrolle im März 2024. geb. 04.07.1951"
    out, _ = deidentify_local(text, "de", known_phi=[], date_shift_days=-10)
    assert "vom 2. März 2023" in out and "Voraufnahme 22.01.2022" in out and "im März 2024" in out
    assert "geb. [DATE]" in out
    fr, _ = deidentify_local("Examen du 1er mars 2023, née le 4 juillet 1951.", "fr", known_phi=[], date_shift_days=31)
    assert "du 1er avril 2023" in fr and "née le [DATE]" in fr
    es, _ = deidentify_local("Estudio del 3 de enero de 2023 y del 15/02/2023.", "es", known_phi=[], date_shift_days=-3)
    assert "del 31 de diciembre de 2022" in es and "del 12/02/2023" in es
    # no offset: every date is redacted; a date without a year cannot be shifted and is redacted too
    red, _ = deidentify_local("Vom 12. März 2023 und 12.03. sowie am 3. April.", "de", known_phi=[], date_shift_days=5)
    assert red == "Vom 17. März 2023 und [DATE] sowie am [DATE]."


def test_french_pack_removes_the_issue_phi():
    out, _ = deidentify_local(FRENCH, "fr", known_phi=[], date_shift_days=None)
    for phi in ("Élodie", "Lefèvre", "4 juillet 1951", "Bordeaux"):
        assert phi not in out, phi
    assert "pas d'épanchement pleural" in out and "Mme [NAME]" in out
    addr, _ = deidentify_local(
        "Adresse : 12 rue de la Paix, 75002 Paris. Tél. : 01 42 68 53 00", "fr", known_phi=[], date_shift_days=None
    )
    assert "Paix" not in addr and "75002" not in addr and "Paris" not in addr and "42 68" not in addr


def test_spanish_pack_removes_phi_and_keeps_clinical_words():
    out, counts = deidentify_local(SPANISH, "es", known_phi=[], date_shift_days=None)
    for phi in ("Carmen", "Ruiz", "12 de marzo de 1950", "La Paz", "Madrid", "368503", "Benitez", "28016", "908 121"):
        assert phi not in out, phi
    assert "no se observa derrame pleural. Posible neumonía en lóbulo inferior derecho." in out
    assert counts["PHONE"] == 1 and counts["ID"] == 1


def test_known_header_names_are_removed_in_any_case():
    out, _ = deidentify_local(
        "Befund für MUELLER^HANS: kein Erguss. Mueller Hans, Zimmer 3.",
        "de",
        known_phi=["MUELLER^HANS", "PID-778812"],
        date_shift_days=None,
    )
    assert "MUELLER" not in out and "Mueller" not in out and "HANS" not in out and "kein Erguss" in out


def test_clinical_words_and_measurements_stay():
    text = (
        "Befund: Pleuraerguss links 12 mm. Herz normal groß. Klinik für Radiologie. Segment 6. "
        "Aorta 3,5 cm. Kontrolle in 6 Wochen."
    )
    out, counts = deidentify_local(text, "de", known_phi=[], date_shift_days=None)
    assert out == text and counts == {}


@pytest.mark.parametrize(
    "lang, text, expected",
    [
        (
            "de",
            "Befund: Kein Pleuraerguss. V.a. Pneumonie im rechten Unterlappen. Z.n. Rippenfraktur rechts.",
            [("F029", "absent"), ("C006", "uncertain"), ("F006", "present")],
        ),
        (
            "fr",
            "Résultats : Pas d'épanchement pleural. Opacité évoquant une pneumopathie droite. Cardiomégalie.",
            [("F029", "absent"), ("C006", "uncertain"), ("F018", "present")],
        ),
        (
            "es",
            "Hallazgos: No se observa derrame pleural. Posible neumonía en lóbulo inferior derecho. Cardiomegalia.",
            [("F029", "absent"), ("C006", "uncertain"), ("F018", "present")],
        ),
    ],
)
def test_entity_packs(lang, text, expected):
    from entity_extraction.extract import EntityExtractor

    mentions = EntityExtractor(language=lang).extract(text, "2D-CXR")
    got = [(m["entity_id"], m["assertion"]) for m in mentions if m["category"] != "anatomy"]
    assert got == expected
    assert all(m["section"] == "findings" for m in mentions)


def test_synthetic_generator_is_seeded_and_its_key_matches_the_text():
    from entity_extraction.languages.synth import generate

    a, b = generate("de", 3, seed=7), generate("de", 3, seed=7)
    assert a == b and a != generate("de", 3, seed=8)
    for doc in a:
        assert {p["type"] for p in doc["phi"]} >= {"NAME", "DATE", "ID", "ORGANIZATION"}
        assert all(doc["text"][p["start"] : p["end"]] == p["value"] for p in doc["phi"])
        assert len(doc["entities"]) == 5


def test_annotate_cli_on_the_issue_reports(tmp_path):
    from typer.testing import CliRunner

    from medreco.cli import app

    src = tmp_path / "in.jsonl"
    src.write_text(
        "".join(
            json.dumps({"id": i, "input": t}, ensure_ascii=False) + "\n"
            for i, t in (("de", GERMAN), ("fr", FRENCH), ("zh", CHINESE))
        ),
        encoding="utf-8",
    )
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(app, ["reports", "annotate", str(src), str(out)])
    assert result.exit_code == 0, result.output
    assert "annotated 2 report(s)" in result.output and "1 withheld (unsupported_language=1)" in result.output
    lines = {d["id"]: d for d in map(json.loads, out.read_text(encoding="utf-8").splitlines())}
    de, fr, zh = lines["de"], lines["fr"], lines["zh"]
    for phi in ("März 2023", "1951", "Müller", "Großhadern", "München", "Schäfer"):
        assert phi not in de["deidentified_text"], phi
    for phi in ("Élodie", "Lefèvre", "juillet", "Bordeaux"):
        assert phi not in fr["deidentified_text"], phi
    assert de["language"]["code"] == "de" and fr["language"]["code"] == "fr"
    assert {(e["entity_id"], e["assertion"]) for e in de["entities"]} >= {("F029", "absent"), ("C006", "uncertain")}
    assert de["sections"]["findings"].startswith("Kein Pleuraerguss") and de["sections"]["impression"]
    assert {(e["entity_id"], e["assertion"]) for e in fr["entities"]} >= {("F029", "absent"), ("F018", "present")}
    assert (
        zh["deidentified_text"] is None and zh["entities"] == [] and zh["withheld"]["reason"] == "unsupported_language"
    )
    assert "王" not in json.dumps(zh, ensure_ascii=False) and zh["language"]["code"] == "zh"


def test_eval_deid_language_option(tmp_path):
    from typer.testing import CliRunner

    from medreco.cli import app

    text = "Paciente: Juan Pérez. Sexo: H. Derrame pleural."
    gold = tmp_path / "g.jsonl"
    gold.write_text(
        json.dumps(
            {
                "id": "1",
                "text": text,
                "phi": [{"start": 10, "end": 20, "type": "NOMBRE"}],
                "ignore": [{"start": 28, "end": 29, "type": "SEXO"}],
            }
        )
        + "\n",
        encoding="utf-8",
    )
    result = CliRunner().invoke(app, ["eval", "deid", "--gold", str(gold), "--language", "es"])
    assert result.exit_code == 0, result.output
    assert "NOMBRE" in result.output and "1.000" in result.output
    assert "non-PHI tokens lost: 0 of 4" in result.output  # Paciente, Sexo, Derrame, pleural; "H" is ignored
    bad = CliRunner().invoke(app, ["eval", "deid", "--gold", str(gold), "--language", "it"])
    assert bad.exit_code == 1 and "no language pack" in bad.output
