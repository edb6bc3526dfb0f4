"""Report text de-identification against the demo corpus answer key, with no help from DICOM headers
(the orphan-report case): every planted name part, ID, phone number and birth date must go, in English, German and
Spanish reports (each routed to its language's rules as the build does); the outside reports in languages without a
pack are withheld instead."""

from __future__ import annotations

import json
import re
from collections import defaultdict

import pytest

from entity_extraction.languages.route import UnsupportedLanguageError, deidentify_report


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from etl.demo.corpus import generate_corpus

    root = tmp_path_factory.mktemp("demo48") / "root"
    generate_corpus(root, seed=0, n_patients=48)
    return root


def test_no_planted_report_phi_survives_without_header_names(corpus):
    answer = [json.loads(x) for x in (corpus / "answer_key" / "phi.jsonl").read_text().splitlines()]
    planted = defaultdict(set)
    for a in answer:
        if a["location"] == "report" and a["phi_type"] in ("name", "id", "phone"):
            planted[a["file"]].add((a["phi_type"], str(a["value"])))
    withheld = {
        json.loads(x)["report_id"] for x in (corpus / "answer_key" / "withheld_reports.jsonl").read_text().splitlines()
    }
    leaks, refused, languages = [], set(), defaultdict(int)
    for f, values in planted.items():
        for line in (corpus / f).read_text().splitlines():
            rec = json.loads(line)
            try:
                decision, out, _ = deidentify_report(
                    rec["text"], prior=rec["language"], known_phi=[rec["patient_id"]], date_shift_days=5
                )
            except UnsupportedLanguageError:
                refused.add(rec["report_id"])
                continue
            languages[decision.language] += 1
            for kind, v in values:
                parts = re.split(r"[\^,.\s]+", v) if kind == "name" else [v]
                for part in (
                    p for p in parts if len(p) >= 3 and not p.islower()
                ):  # particles (von, de) alone name no one
                    if part in rec["text"] and re.search(rf"(?<![\w]){re.escape(part)}(?![\w])", out):
                        leaks.append((kind, part))
    assert not leaks, f"{len(leaks)} planted values survived, e.g. {sorted(set(leaks))[:5]}"
    assert refused == withheld and len(withheld) == 3
    assert set(languages) == {"en", "de", "es"} and min(languages.values()) >= 9
