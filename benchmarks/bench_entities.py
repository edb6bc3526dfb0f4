"""Entity extraction throughput on Open-i reports against medspaCy's stock pipeline, in the same process.

Ours: ``EntityExtractor`` (rule-based sentence splitting, TargetMatcher from the ontology, our ConText
rules, section assignment, laterality/severity). Baseline: ``medspacy.load()`` with its default
components (PyRuSH sentences, ConText default rules) run on the same texts with no targets, i.e. the
cost of the stock tokenise + sentence + context pipeline alone. Prints reports/s and the ratio.
"""

from __future__ import annotations

import csv
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

OPENI = Path(__file__).resolve().parents[2] / "shared" / "data" / "openi" / "indiana_reports.csv"
N = 500


def texts() -> list[str]:
    if not OPENI.is_file():
        return ["FINDINGS: No pleural effusion. Mild cardiomegaly, unchanged. IMPRESSION: Stable."] * N
    with OPENI.open(newline="") as f:
        rows = list(csv.DictReader(f))[:N]
    return [f"FINDINGS: {r['findings']}\nIMPRESSION: {r['impression']}" for r in rows]


def main() -> None:
    from loguru import logger

    logger.disable("PyRuSH")
    import medspacy

    from entity_extraction.extract import EntityExtractor

    docs = texts()
    ours = EntityExtractor()
    ours.extract(docs[0], "2D-CXR")
    t0 = time.perf_counter()
    n_mentions = sum(len(ours.extract(t, "2D-CXR")) for t in docs)
    t_ours = time.perf_counter() - t0

    stock = medspacy.load()
    list(stock.pipe(docs[:5]))
    t0 = time.perf_counter()
    for _ in stock.pipe(docs):
        pass
    t_stock = time.perf_counter() - t0
    print(f"{len(docs)} reports; ours {len(docs) / t_ours:.0f}/s ({n_mentions} mentions), "
          f"medspaCy stock {len(docs) / t_stock:.0f}/s")
    print(f"BENCH entities reports={len(docs)} reports_per_s={len(docs) / t_ours:.1f} "
          f"baseline_medspacy_stock_reports_per_s={len(docs) / t_stock:.1f} speedup_vs_medspacy_stock={t_stock / t_ours:.2f} "
          f"mentions={n_mentions}")


if __name__ == "__main__":
    main()
