"""Tests for ``medreco reports annotate`` (medreco.cli.reports) and entity_extraction.annotate, field cases end to
end."""

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from entity_extraction.annotate import (
    ENTITY_FIELDS,
    NO_HEADER_NOTE,
    OUTPUT_FIELDS,
    AnnotateInputError,
    parse_line,
    record_family,
)
from medreco.cli.reports import app, errors_path
from schemas.config import PROJECT_ROOT
from schemas.ontology import FAMILIES, load_ontology

DATA = PROJECT_ROOT.parent / "shared" / "data"
FIELD_CASES = DATA / "field-cases" / "report_cases.jsonl"
SECTION_KEYS = {"indication", "technique", "comparison", "findings", "impression"}
runner = CliRunner()


def _write(path: Path, lines: list) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines), encoding="utf-8")
    return path


def _run(*args: str):
    return runner.invoke(app, ["annotate", *args])


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_annotate_contract_deid_sections_entities(tmp_path):
    src = _write(
        tmp_path / "in.jsonl",
        [
            {
                "id": "r1",
                "input": "INDICATION: Cough.\nFINDINGS: Small left pleural effusion. No pneumothorax.\n"
                "IMPRESSION: Effusion, new since 03/14/2019. Dictated by Dr. John Smith.",
            },
            "",
            {"id": 7, "input": "IMPRESSION: No acute intracranial hemorrhage.", "family": "3D-Brain-MRI"},
            {"id": "ct-abd", "input": "IMPRESSION: Small pleural effusion.", "modality": "CT", "body_part": "ABDOMEN"},
            {"id": "ct-chest", "input": "IMPRESSION: Small pleural effusion.", "modality": "CT", "body_part": "CHEST"},
        ],
    )
    out = tmp_path / "out.jsonl"
    res = _run(str(src), str(out))
    assert res.exit_code == 0, res.output
    assert f"annotated 4 report(s) -> {out}" in res.output
    rows = _read(out)
    assert [r["id"] for r in rows] == ["r1", 7, "ct-abd", "ct-chest"]
    r1 = rows[0]
    assert list(r1) == list(OUTPUT_FIELDS)
    assert r1["deidentified_text"] == (
        "INDICATION: Cough.\nFINDINGS: Small left pleural effusion. No pneumothorax.\n"
        "IMPRESSION: Effusion, new since [DATE]. Dictated by Dr. [NAME]."
    )
    assert r1["deidentification"] == {"header_values": NO_HEADER_NOTE, "redactions": {"DATE": 1, "NAME": 1}}
    assert set(r1["sections"]) == SECTION_KEYS and r1["sections"]["indication"] == "Cough."
    assert r1["sections"]["findings"] == "Small left pleural effusion. No pneumothorax."
    assert r1["family"] == "2D-CXR"
    assert all(list(e) == list(ENTITY_FIELDS) for r in rows for e in r["entities"])
    assert [
        (
            e["text"],
            e["entity_id"],
            e["section"],
            e["assertion"],
            e["change"],
            e["laterality"],
            e["severity"],
            e["anatomy_id"],
        )
        for e in r1["entities"]
    ] == [
        ("pleural effusion", "F029", "findings", "present", "none", "left", "small", "A009"),
        ("Effusion", "F029", "impression", "present", "new", None, None, "A009"),
    ]
    mri = rows[1]
    assert mri["family"] == "3D-Brain-MRI"
    assert [(e["entity_id"], e["category"], e["assertion"]) for e in mri["entities"]] == [
        ("C023", "condition", "absent")
    ]
    assert rows[2]["family"] is None and rows[2]["entities"] == []  # CT abdomen: no family labels
    assert rows[3]["family"] == "3D-CT" and rows[3]["entities"][0]["entity_id"] == "F037"


def test_family_option_and_errors(tmp_path):
    src = _write(tmp_path / "in.jsonl", [{"id": "a", "input": "Pleural effusion."}])
    out = tmp_path / "out.jsonl"
    assert _run(str(src), str(out), "--family", "3D-CT", "--quiet").exit_code == 0
    assert _read(out)[0]["entities"][0]["entity_id"] == "F037" and _read(out)[0]["family"] == "3D-CT"
    res = _run(str(src), str(out), "--family", "X-RAY")
    assert res.exit_code == 2 and "--family" in res.output
    res = _run(str(tmp_path / "missing.jsonl"), str(out))
    assert res.exit_code == 1 and "no such file" in res.output


def test_quiet_prints_nothing(tmp_path):
    src = _write(tmp_path / "in.jsonl", [{"id": i, "input": "No pneumonia."} for i in range(60)])
    res = _run(str(src), str(tmp_path / "o.jsonl"), "--quiet")
    assert res.exit_code == 0 and res.output == ""
    assert len(_read(tmp_path / "o.jsonl")) == 60


BAD_LINES = [
    ('{"id": "x", "input": "Mr SECRETNAME', "not valid JSON"),
    ('["SECRETNAME"]', "not a JSON object"),
    ('{"input": "SECRETNAME has effusion."}', "missing or empty 'id'"),
    ('{"id": "x", "input": "   "}', "missing or empty 'input'"),
    ('{"id": "x", "input": 5}', "missing or empty 'input'"),
    ('{"id": true, "input": "Effusion."}', "missing or empty 'id'"),
    ('{"id": "x", "input": "Effusion.", "family": "SECRETNAME"}', "unknown 'family'"),
    ('{"id": "x", "input": "Effusion.", "modality": 3}', "'modality' must be a string"),
    ('{"id": "good", "input": "Effusion."}', "duplicate 'id' (first on line 1)"),
]


@pytest.mark.parametrize(("line", "reason"), BAD_LINES)
def test_bad_line_fails_naming_the_line(tmp_path, line, reason):
    src = _write(tmp_path / "in.jsonl", [{"id": "good", "input": "Effusion."}, line])
    out = tmp_path / "out.jsonl"
    res = _run(str(src), str(out))
    assert res.exit_code == 1
    assert res.output.startswith(f"error: {src} line 2: ")
    assert reason in res.output and "SECRETNAME" not in res.output
    assert len(res.output.strip().splitlines()) == 1
    assert not out.exists() and list(tmp_path.iterdir()) == [src]  # nothing half-written


def test_skip_bad_lists_errors_and_keeps_good_lines(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(
        b'{"id": "a", "input": "No pneumothorax. Effusion."}\n'
        b"not json SECRETNAME\n"
        b'{"id": "b", "input": "Caf\xe9"}\n'
        b'{"id": "a", "input": "again"}\n'
        b"\n"
        b'{"id": "c", "input": "Cardiomegaly."}\n'
    )
    out = tmp_path / "out.jsonl"
    res = _run(str(src), str(out), "--skip-bad")
    assert res.exit_code == 0, res.output
    assert [r["id"] for r in _read(out)] == ["a", "c"]
    errors = _read(errors_path(out))
    assert errors_path(out).name == "out.jsonl.errors.jsonl"
    assert [e["line"] for e in errors] == [2, 3, 4]
    assert errors[0]["reason"].startswith("not valid JSON") and errors[1]["reason"].startswith("not UTF-8")
    assert errors[2]["reason"] == "duplicate 'id' (first on line 1)"
    assert "SECRETNAME" not in errors_path(out).read_text()
    assert "3 bad line(s)" in res.output


def test_parse_line_and_record_family():
    assert parse_line("  \n") is None
    assert parse_line('{"id": 3, "input": "x", "extra": 1}')["extra"] == 1  # other keys are ignored
    with pytest.raises(AnnotateInputError):
        parse_line('{"id": "", "input": "x"}')
    assert record_family({"id": 1, "input": "x"}, "3D-CT") == "3D-CT"
    assert record_family({"family": "2D-Ultrasound"}, "3D-CT") == "2D-Ultrasound"
    assert record_family({"modality": "MR", "body_part": "BRAIN"}, "2D-CXR") == "3D-Brain-MRI"
    assert record_family({"modality": "DX"}, "3D-CT") == "2D-CXR"
    assert record_family({"modality": "MG", "body_part": "BREAST"}, "2D-CXR") is None


# ---------------------------------------------------------------- field cases, end to end
@pytest.fixture(scope="module")
def field_cases(tmp_path_factory):
    """Every field case annotated once per family through the CLI: ({case id: case}, {(case id, family): row})."""
    cases = [json.loads(line) for line in FIELD_CASES.read_text(encoding="utf-8").splitlines() if line.strip()]
    tmp = tmp_path_factory.mktemp("field")
    src = _write(
        tmp / "cases.jsonl", [{**c, "id": f"{c['id']}|{fam}", "family": fam} for c in cases for fam in FAMILIES]
    )
    out = tmp / "out.jsonl"
    res = _run(str(src), str(out), "--quiet")
    assert res.exit_code == 0, res.output
    rows = {tuple(r["id"].split("|")): r for r in _read(out)}
    return {c["id"]: c for c in cases}, rows


def _vocabulary(family: str) -> set[str]:
    return {s.lower() for c in load_ontology().family_concepts(family) for s in c.synonyms.get("en", ())}


def test_field_cases_context_targets(field_cases):
    """Every target the family vocabulary names must be found with the expected assertion/section/history;
    a target found in any family (also as part of a longer term: "intracranial hemorrhage") must be right."""
    cases, rows = field_cases
    checked = set()
    for cid, case in cases.items():
        targets = case["expected"].get("targets", []) + case["expected"].get("downstream_targets", [])
        for target in targets:
            word = re.compile(rf"\b{re.escape(target['text'].lower())}\b")
            for fam in FAMILIES:
                found = [e for e in rows[(cid, fam)]["entities"] if word.search(e["text"].lower())]
                if target["text"].lower() in _vocabulary(fam):
                    assert found, (cid, fam, target["text"])
                want = "absent" if target["is_negated"] else "uncertain" if target["is_uncertain"] else "present"
                for e in found:
                    assert e["assertion"] == want, (cid, fam, target, e)
                    assert (e["temporality"] == "historical") == target["is_historical"], (cid, fam, target, e)
                    if "section" in target:
                        assert e["section"] == target["section"].lower(), (cid, fam, target, e)
                    checked.add((cid, target["text"]))
    # the MedReCo vocabulary has no pneumothorax, mass, adenopathy or free air: 11 of the targets are in it
    assert len(checked) >= 11, sorted(checked)


def test_field_cases_normal_report_affirms_nothing(field_cases):
    cases, rows = field_cases
    normal = {cid: case for cid, case in cases.items() if "must_not_affirm" in case["expected"]}
    assert normal, "the field cases hold no normal report (must_not_affirm): nothing would be checked"
    for cid in normal:
        for fam in FAMILIES:
            affirmed = [
                e for e in rows[(cid, fam)]["entities"] if e["category"] != "anatomy" and e["assertion"] == "present"
            ]
            assert affirmed == [], (cid, fam, affirmed)


def test_field_cases_text_phi(field_cases):
    cases, rows = field_cases
    deid_cases = [c for c in cases.values() if c["expected"]["task"] == "text_deid"]
    assert deid_cases
    for case in deid_cases:
        for fam in FAMILIES:
            row = rows[(case["id"], fam)]
            text = row["deidentified_text"]
            for phi in case["expected"]["must_remove"]:
                assert phi["text"] not in text, (case["id"], phi)
                assert row["deidentification"]["redactions"].get(phi["type"], 0) >= 1
            for keep in case["expected"]["must_keep"]:
                assert keep in text, (case["id"], keep)
