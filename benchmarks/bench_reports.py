"""Report throughput per core: text de-identification + sectioning + entity extraction on all Open-i reports.

Texts: the 2,696 rows of ``../shared/data/openi/indiana_reports.csv`` (Demner-Fushman et al., JAMIA
2016;23(2):304-310), each built as the report reader builds it (``INDICATION: ...\\nCOMPARISON: ...
\\nFINDINGS: ...\\nIMPRESSION: ...``, empty sections left out; 16 rows have no text at all and stay empty).

Three pipelines on the same texts, in the same process, one after the other:

* ours (end to end, as the build runs it per report): language identification and English text
  de-identification (:func:`entity_extraction.languages.route.deidentify_report`: pattern rules plus a date shift),
  :func:`entity_extraction.sections.split_sections`, and :meth:`entity_extraction.extract.EntityExtractor.extract_many`
  on the de-identified text, 2D-CXR family (every rule of the family's ontology concepts loaded);
* the floor: ``spacy.blank("en")`` tokenisation alone;
* the peer: stock ``medspacy.load()`` (PyRuSH sentences, TargetMatcher, ConText with its default rules) with
  the same target phrases as ours (ontology synonyms plus plural variants) added to its TargetMatcher.

Per core: every figure is reports per CPU second of this single-threaded process (``time.process_time``),
with BLAS/OpenMP thread pools pinned to one thread. Each pipeline is warmed up on 20 reports first.
Ends with ``BENCH reports reports_per_s=... floor_reports_per_s=... peer_reports_per_s=...
ratio_vs_peer=... ratio_vs_floor=... ratio_vs_floor_without_language_id=... language_id_reports_per_s=...`` (ratios:
ours / baseline; the pipeline is also timed without language identification in the same run). ``--profile`` also prints
the top cProfile entries of our pipeline (cumulative time).
"""

from __future__ import annotations

import csv
import os
import sys
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

OPENI = Path(__file__).resolve().parents[2] / "shared" / "data" / "openi" / "indiana_reports.csv"
FAMILY = "2D-CXR"
DATE_SHIFT_DAYS = -17
WARMUP = 20


def openi_texts(path: Path = OPENI) -> list[str]:
    """One report text per row of the Open-i CSV, with section headers (see the module docstring)."""
    from etl.sources.reports import OPENI_SECTIONS

    with path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return [
        "\n".join(f"{header}: {row[col].strip()}" for col, header in OPENI_SECTIONS if (row.get(col) or "").strip())
        for row in rows
    ]


def ours(texts: list[str], extractor, language_id: bool = True) -> tuple[int, dict[str, float]]:
    """Run our pipeline; returns (mentions, CPU seconds per stage). ``language_id``: each report's language is
    identified first (:func:`entity_extraction.languages.route.deidentify_report`, as the build runs it; the Open-i
    reports are all English), else :func:`entity_extraction.text_deid.deidentify_text` is called directly."""
    from entity_extraction.languages.route import deidentify_report
    from entity_extraction.sections import split_sections
    from entity_extraction.text_deid import deidentify_text

    t0 = time.process_time()
    if language_id:
        deid = [deidentify_report(t, prior="en", known_phi=[], date_shift_days=DATE_SHIFT_DAYS)[1] for t in texts]
    else:
        deid = [deidentify_text(t, known_phi=[], date_shift_days=DATE_SHIFT_DAYS)[0] for t in texts]
    t1 = time.process_time()
    sections = [split_sections(t) for t in deid]
    t2 = time.process_time()
    mentions = extractor.extract_many(deid, FAMILY)
    t3 = time.process_time()
    assert len(sections) == len(mentions) == len(texts)
    return sum(map(len, mentions)), {"deid": t1 - t0, "sections": t2 - t1, "extract": t3 - t2}


def peer_pipeline(extractor):
    """Stock medspaCy with the same target phrases as ``extractor``'s 2D-CXR matcher."""
    from loguru import logger

    logger.disable("PyRuSH")  # PyRuSH logs every token at DEBUG (STACK_NOTES)
    import medspacy
    from medspacy.target_matcher import TargetRule

    from entity_extraction.extract import _plural_variants

    surface: dict[str, str] = {}
    for concept in extractor.ontology.family_concepts(FAMILY):
        for syn in concept.synonyms.get("en", ()):
            for variant in _plural_variants(" ".join(syn.lower().split())):
                surface.setdefault(variant, concept.id)
    nlp = medspacy.load()
    nlp.get_pipe("medspacy_target_matcher").add([TargetRule(literal=t, category=c) for t, c in sorted(surface.items())])
    return nlp, len(surface)


def timed(fn) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def main(argv: list[str]) -> int:
    import warnings

    import spacy

    from entity_extraction.extract import EntityExtractor

    warnings.filterwarnings("ignore", message=r"\[W036\]")
    if not OPENI.is_file():
        print(f"error: {OPENI} not found (the shared Open-i data is needed)", file=sys.stderr)
        return 1
    texts = openi_texts()
    n = len(texts)
    extractor = EntityExtractor()
    from entity_extraction.languages.detect import detect_language

    for text in texts:  # lingua loads a language's models on first use (seconds, once per process): warm all
        detect_language(text, "en")
    ours(texts[:WARMUP], extractor)
    # with and without language identification, alternated, best of two each (the second pass over the same texts
    # finds warm caches: alternating gives both modes the same conditions)
    runs: dict[bool, list] = {True: [], False: []}
    for language_id in (True, False, True, False):
        runs[language_id].append(ours(texts, extractor, language_id=language_id))
    n_mentions, stages = min(runs[True], key=lambda r: sum(r[1].values()))
    t_ours = sum(stages.values())
    t_en = min(sum(r[1].values()) for r in runs[False])
    t_lang = timed(lambda: [detect_language(t, "en") for t in texts])

    floor = spacy.blank("en")
    list(floor.pipe(texts[:WARMUP]))
    t_floor = timed(lambda: list(floor.pipe(texts)))

    peer, n_rules = peer_pipeline(extractor)
    list(peer.pipe(texts[:WARMUP]))
    peer_mentions = [0]

    def run_peer() -> None:
        peer_mentions[0] = sum(len(doc.ents) for doc in peer.pipe(texts))

    t_peer = timed(run_peer)

    if "--profile" in argv:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.runcall(ours, texts, extractor)
        pstats.Stats(prof).sort_stats("cumulative").print_stats(35)

    rate, floor_rate, peer_rate = n / t_ours, n / t_floor, n / t_peer
    print(
        f"{n} Open-i reports, {FAMILY}, {n_rules} target phrases; CPU seconds: "
        + ", ".join(f"{k} {v:.2f}" for k, v in stages.items())
        + f" (ours {t_ours:.2f}), floor {t_floor:.2f}, peer {t_peer:.2f}"
    )
    print(
        "per-stage reports/s: "
        + ", ".join(f"{k} {n / v:.0f}" for k, v in stages.items() if v > 0)
        + f"; mentions: ours {n_mentions}, peer {peer_mentions[0]}"
    )
    print(
        f"language identification alone: {n / t_lang:.0f} reports/s; without it (English rules called directly) "
        f"{n / t_en:.1f} reports/s, ratio to the floor {n / t_en / floor_rate:.3f}"
    )
    print(
        f"BENCH reports reports_per_s={rate:.1f} floor_reports_per_s={floor_rate:.1f} "
        f"peer_reports_per_s={peer_rate:.1f} ratio_vs_peer={rate / peer_rate:.2f} "
        f"ratio_vs_floor={rate / floor_rate:.3f} "
        f"ratio_vs_floor_without_language_id={n / t_en / floor_rate:.3f} language_id_reports_per_s={n / t_lang:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
