"""Digest of every output of the report pipeline, to show that a change (a speed-up, a refactor) changes none.

Writes one JSONL file per set to OUTDIR and prints its sha256: run it on the code without and with the change and
compare the digests (``diff`` the files to see what changed). Sets: the 2,696 Open-i reports
(``../shared/data/openi``), the notes of the shared PhysioNet half (``../shared/data/text-deid``), the MEDDOCAN
train and dev reports (``../shared/data/text-deid-es``; as Spanish, the first 100 also with a German prior), and
generated notes (:func:`entity_extraction.languages.synth.generate`, 150 each in de/fr/es, seed 7;
:func:`entity_extraction.deid.synthetic.generate_notes`, 200 held-out and 200 dev templates, seed 5). Per text:
the language decision (with the set's prior and with none), :func:`entity_extraction.languages.route.
deidentify_report` three ways (date shift -17; no shift; known header values, shift 23, day first), sections and
every entity field of the shifted text, and for English the scrubber called directly with known values. The Open-i
set is also run through ``extract_many`` as the bench runs it.

Usage: ``PYTHONPATH=$PWD:$PWD/reader/src python benchmarks/report_outputs_digest.py OUTDIR [--quick N]`` (N texts
per set). The files hold de-identified text only, but keep them out of the repository.
"""

from __future__ import annotations

import hashlib
import json
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
KNOWN = ["DOE^JOHN", "Walker, Matilda R.", "MRN 1234567", "A-99812"]


def main(argv: list[str]) -> int:
    warnings.filterwarnings("ignore")
    from bench_reports import openi_texts

    from entity_extraction.deid.synthetic import generate_notes
    from entity_extraction.languages.annotate import ExtractorPool
    from entity_extraction.languages.detect import detect_language
    from entity_extraction.languages.route import UnsupportedLanguageError, deidentify_report, section_rules_path
    from entity_extraction.languages.synth import generate
    from entity_extraction.sections import split_sections
    from entity_extraction.text_deid import deidentify_text

    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    quick = int(argv[argv.index("--quick") + 1]) if "--quick" in argv else None
    pool = ExtractorPool()

    def dec(d) -> list:
        return [d.language, d.confidence, d.method, d.foreign_script]

    def one(rid: str, text: str, prior: str) -> dict:
        rec: dict = {"id": rid, "lang": dec(detect_language(text, prior)), "lang_none": dec(detect_language(text))}
        decision = None
        for tag, known, shift, day_first in (("s", [], -17, False), ("n", [], None, False), ("k", KNOWN, 23, True)):
            try:
                decision, t, c = deidentify_report(
                    text, prior=prior, known_phi=known, date_shift_days=shift, day_first=day_first
                )
                rec[tag] = [t, c]
            except UnsupportedLanguageError as err:
                rec[tag] = ["WITHHELD", err.reason, err.detail]
                decision = None
        if decision is not None:
            t = rec["s"][0]
            rec["sections"] = split_sections(t, section_rules_path(decision.language))
            rec["entities"] = pool.get(decision.language).extract(t, "2D-CXR")
        if prior == "en":
            rec["en_direct"] = list(deidentify_text(text, known_phi=KNOWN, date_shift_days=-5, day_first=False))
        return rec

    def write(name: str, lines) -> None:
        path = out / f"{name}.jsonl"
        with path.open("w", encoding="utf-8") as f:
            for line in lines:
                f.write(json.dumps(line, ensure_ascii=False, sort_keys=True, default=str) + "\n")
        print(name, hashlib.sha256(path.read_bytes()).hexdigest(), flush=True)

    def dump(name: str, items: list[tuple[str, str, str]]) -> None:
        write(name, (one(*item) for item in items[:quick]))

    openi = [(f"openi-{i}", t, "en") for i, t in enumerate(openi_texts())][:quick]
    shifted = [deidentify_report(t, prior="en", known_phi=[], date_shift_days=-17)[1] for _, t, _ in openi]
    write("openi_many", (m for ms in pool.get("en").extract_many(shifted, "2D-CXR") for m in ms))
    dump("openi", openi)
    notes = SHARED / "text-deid" / "physionet-deid-dev" / "notes.jsonl"
    gold = [json.loads(line) for line in notes.read_text(encoding="utf-8").splitlines()]
    dump("textdeid", [(n["id"], n["text"], "en") for n in gold])
    med = []
    for name in ("meddocan_train.jsonl", "meddocan_dev.jsonl"):
        med += [json.loads(line) for line in (SHARED / "text-deid-es" / name).read_text(encoding="utf-8").splitlines()]
    dump("meddocan", [(n["id"], n["text"], "es") for n in med] + [(n["id"] + "-p", n["text"], "de") for n in med[:100]])
    synth = [(d["id"], d["text"], d["language"]) for lang in ("de", "fr", "es") for d in generate(lang, 150, seed=7)]
    synth += [
        (f"en-{split}-{i}", n.text, "en")
        for split in ("held_out", "dev")
        for i, n in enumerate(generate_notes(200, seed=5, split=split))
    ]
    dump("synth", synth + [(rid + "-en", text, "en") for rid, text, _ in synth[:60]])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
