"""Issue 34 through the build: reports in German and French are de-identified with their packs and labelled, reports
in Chinese and Italian are withheld ``unsupported_language`` with a PHI-free record, and the ledger and report counts
balance."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pydicom
import pytest
from conftest import config_for
from test_incremental import build

pytestmark = pytest.mark.slow
INST = "ie-cork-mercy"
TEXTS = {
    "LANG-DE": (
        "Röntgen Thorax vom 12. März 2023. Patient: Hans Müller, geb. 04.07.1951, Klinikum Großhadern München.\n"
        "Befund: Kein Pleuraerguss. V.a. Pneumonie im rechten Unterlappen.\nBeurteilung: Pneumonie rechts.\n"
        "Dr. med. Schäfer"
    ),
    "LANG-FR": (
        "Patiente: Mme Élodie Lefèvre, née le 4 juillet 1951, CHU de Bordeaux.\n"
        "Résultats : pas d'épanchement pleural. Cardiomégalie modérée.\nConclusion : cardiomégalie."
    ),
    "LANG-ZH": "患者：王小明，2023年3月12日，北京协和医院。胸部X线：双肺未见明显异常，心影不大。",
    "LANG-IT": (
        "Torace: non si osservano versamenti pleurici. Cuore nei limiti della norma. "
        "Paziente Mario Rossi, nato il 3 maggio 1950, Ospedale San Raffaele."
    ),
}


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    from helpers import demo_sources

    return demo_sources(tmp_path_factory.mktemp("languages"))


def test_build_with_reports_in_four_languages(template):
    from helpers import fresh_root

    root = fresh_root(template, "langs")
    reports = root / "sources" / INST / "reports" / "reports.jsonl"
    lines = reports.read_text(encoding="utf-8").splitlines()
    # a delivered record whose study is among the institution's DICOM chest studies: the added reports link to it
    chest = set()
    for path in (root / "sources" / INST / "dicom").rglob("*.dcm"):
        ds = pydicom.dcmread(path, stop_before_pixels=True)
        if ds.get("Modality") in ("CR", "DX") or "CHEST" in str(ds.get("BodyPartExamined", "")).upper():
            chest.add(str(ds.StudyInstanceUID))
    first = next(r for r in map(json.loads, lines) if r.get("study_instance_uid") in chest)
    for rid, text in TEXTS.items():
        lines.append(json.dumps({**first, "report_id": rid, "text": text}, ensure_ascii=False))
    reports.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = build(config_for(root, shard_count=2), "langs")
    ctx = out["ctx"]
    assert out["ledger"]["balanced"]
    withheld = json.loads((root / "ledger" / "runs" / "langs" / "withheld_reports.json").read_text())
    reasons = {w["record"]: (w["reason"], w["detail"]) for w in withheld}
    assert reasons["LANG-ZH"][0] == reasons["LANG-IT"][0] == "unsupported_language"
    assert "detected language zh" in reasons["LANG-ZH"][1] and "detected language it" in reasons["LANG-IT"][1]
    assert "LANG-DE" not in reasons and "LANG-FR" not in reasons
    blob = json.dumps(withheld, ensure_ascii=False)
    assert "王" not in blob and "Rossi" not in blob
    # the demo corpus's own outside reports (Italian, Dutch, Chinese; its answer key) are withheld too
    key = template / "template" / "answer_key" / "withheld_reports.jsonl"
    outside = [json.loads(line) for line in key.read_text(encoding="utf-8").splitlines()]
    assert {w["report_id"] for w in outside} <= set(reasons) and outside
    assert out["summary"]["withheld_reports_by_reason"].get("unsupported_language") == 2 + len(outside)
    assert out["ledger"]["withheld_report_records"] == len(withheld)
    rows = ctx.storage.read_table("curated/reports").to_pylist()
    # every record delivered by the institution is a reports row or a withheld record: the report counts balance
    mine = 2 + sum(w["institution"] == INST for w in outside)
    assert sum(r["institution"] == INST for r in rows) + mine == len(lines)
    by_lang = {}
    for r in (r for r in rows if r["institution"] == INST):
        by_lang.setdefault(r["language"], []).append(r)
    assert set(by_lang) == {"en", "de", "fr"} and len(by_lang["de"]) == len(by_lang["fr"]) == 1
    de, fr = by_lang["de"][0], by_lang["fr"][0]
    for phi in ("Müller", "Großhadern", "München", "Schäfer", "04.07.1951"):
        assert phi not in de["text"], phi
    for phi in ("Élodie", "Lefèvre", "Bordeaux", "juillet 1951"):
        assert phi not in fr["text"], phi
    assert de["findings"].startswith("Kein Pleuraerguss") and fr["impression"] == "cardiomégalie."
    # the exam date is shifted by the patient's offset and written in its own form; the birth date is removed
    assert "12. März 2023" not in de["text"] and re.search(r"Thorax vom \d{1,2}\. [A-ZÄ][a-zä]+ 20\d\d\.", de["text"])
    assert "geb. [DATE]" in de["text"]
    # labelled with the family of the study they are linked to (the first delivered record's study)
    family = {s["study_key"]: s["family"] for s in ctx.storage.read_table("curated/studies").to_pylist()}[
        de["study_key"]
    ]
    effusion, pneumonia = {"2D-CXR": ("F029", "C006"), "3D-CT": ("F037", "C010")}[family]
    mentions = ctx.storage.read_table("curated/entity_mentions").to_pylist()
    de_m = {(m["entity_id"], m["assertion"]) for m in mentions if m["report_id"] == de["report_id"]}
    assert (effusion, "absent") in de_m and (pneumonia, "uncertain") in de_m
    fr_m = {(m["entity_id"], m["assertion"]) for m in mentions if m["report_id"] == fr["report_id"]}
    assert (effusion, "absent") in fr_m
