"""Report text de-identification: ours against an installable anchor, same texts, same scorer, same run.

Sets (nothing tuned on is judged here):

* the held-out folds (3, 4) of the shared PhysioNet half (``../shared/data/text-deid``, split by patient with
  :func:`entity_extraction.deid.evaluation.fold_of`; its PROVENANCE.md gives the source), and the development
  folds beside them for the fit;
* generated notes: :func:`entity_extraction.deid.synthetic.generate_notes` on the held-out templates (Faker, seven
  locales, seed 1).

Tools:

* ours: :func:`entity_extraction.deid.deidentify_text` as ``medreco reports annotate`` runs it (no header values,
  every date redacted);
* scrubadub 2.0 (LeapBeyond), its default detectors (e-mail, phone, URL, credit card, SSN, credential, Twitter)
  plus ``date_of_birth``; its name detector needs TextBlob/NLTK corpora, which cannot be downloaded here, so it finds
  no names; its ``{{NAME}}`` placeholders are scored as our ``[NAME]``.
* philter-lite is not run: it needs NLTK tagger data that cannot be downloaded here.

Scorer: :mod:`entity_extraction.deid.evaluation` (a span counts as removed when none of its letters or digits
survive in place; over-scrubbing is the share of non-PHI tokens that lose a character). Speed: reports per CPU
second (``time.process_time``), one thread, after a warm-up of 20 notes. Ends with
``BENCH text_deid recall_heldout=... anchor_recall_heldout=... recall_generated=... anchor_recall_generated=...
lost_heldout=... anchor_lost_heldout=... reports_per_s=... anchor_reports_per_s=...``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GOLD = Path(__file__).resolve().parents[2] / "shared" / "data" / "text-deid" / "physionet-deid-dev" / "notes.jsonl"
WARMUP = 20
_PLACEHOLDER = re.compile(r"\{\{([A-Z_]+)(?:-\d+)?\}\}")


def ours() -> Callable[[str], str]:
    from entity_extraction.deid import deidentify_text

    return lambda text: deidentify_text(text, known_phi=[], date_shift_days=None)[0]


def scrubadub_anchor() -> Callable[[str], str]:
    """scrubadub's default scrubber plus its date-of-birth detector; placeholders as ``[TYPE]``."""
    import scrubadub

    warnings.filterwarnings("ignore", module="scrubadub")
    scrubber = scrubadub.Scrubber()
    scrubber.add_detector("date_of_birth")
    return lambda text: _PLACEHOLDER.sub(lambda m: f"[{m.group(1)}]", scrubber.clean(text))


def run(fn: Callable[[str], str], notes) -> tuple[object, float]:
    """Score ``fn`` on ``notes``; returns (DeidScore, reports per CPU second)."""
    from entity_extraction.deid.evaluation import DeidScore, score_note

    for note in notes[:WARMUP]:
        fn(note.text)
    score = DeidScore()
    cpu = 0.0
    for note in notes:
        t0 = time.process_time()
        out = fn(note.text)
        cpu += time.process_time() - t0
        score_note(note, out, score)
    return score, len(notes) / cpu if cpu else float("inf")


def table(name: str, results: dict[str, tuple[object, float]]) -> str:
    """Per PHI type recall of each tool, then overall recall, non-PHI lost and reports/s."""
    tools = list(results)
    kinds = sorted(
        {k for s, _ in results.values() for k in s.per_type},
        key=lambda k: -max(s.per_type.get(k, [0, 0])[1] for s, _ in results.values()),
    )
    lines = [f"{name}", f"{'PHI type':<18} {'spans':>6} " + " ".join(f"{t:>10}" for t in tools)]
    for kind in kinds:
        total = next(s.per_type[kind][1] for s, _ in results.values() if kind in s.per_type)
        cells = " ".join(f"{results[t][0].type_recall(kind):>10.3f}" for t in tools)
        lines.append(f"{kind:<18} {total:>6} {cells}")
    first = results[tools[0]][0]
    lines.append(f"{'all (strict)':<18} {first.total:>6} " + " ".join(f"{results[t][0].recall:>10.3f}" for t in tools))
    lines.append(
        f"{'non-PHI lost %':<18} {first.non_phi_tokens:>6} "
        + " ".join(f"{100 * results[t][0].non_phi_lost_share:>10.2f}" for t in tools)
    )
    lines.append(f"{'reports/s (CPU)':<18} {first.notes:>6} " + " ".join(f"{results[t][1]:>10.0f}" for t in tools))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generated", type=int, default=500, help="generated notes (held-out templates)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    from entity_extraction.deid.evaluation import DEFAULT_HELD_OUT, fold_of, load_gold
    from entity_extraction.deid.synthetic import generate_notes

    if not GOLD.is_file():
        print(f"error: {GOLD} not found (the shared text-deid data is needed)", file=sys.stderr)
        return 1
    gold = load_gold(GOLD)
    held = [n for n in gold if fold_of(n.id) in DEFAULT_HELD_OUT]
    dev = [n for n in gold if fold_of(n.id) not in DEFAULT_HELD_OUT]
    generated = generate_notes(args.generated, seed=args.seed)
    tools = {"ours": ours(), "scrubadub": scrubadub_anchor()}
    sets = {
        "PhysioNet half, held-out folds 3-4": held,
        "PhysioNet half, development folds 0-2": dev,
        f"generated notes (held-out templates, seed {args.seed})": generated,
    }
    figures = {}
    for set_name, notes in sets.items():
        results = {tool: run(fn, notes) for tool, fn in tools.items()}
        figures[set_name] = results
        print(table(f"{set_name}: {len(notes)} notes", results), end="\n\n")
    h, g = (
        figures["PhysioNet half, held-out folds 3-4"],
        figures[f"generated notes (held-out templates, seed {args.seed})"],
    )
    rate = sum(len(n) for n in sets.values()) / sum(len(n) / figures[k]["ours"][1] for k, n in sets.items())
    anchor_rate = sum(len(n) for n in sets.values()) / sum(len(n) / figures[k]["scrubadub"][1] for k, n in sets.items())
    print(
        f"BENCH text_deid recall_heldout={h['ours'][0].recall:.3f} "
        f"anchor_recall_heldout={h['scrubadub'][0].recall:.3f} "
        f"recall_generated={g['ours'][0].recall:.3f} anchor_recall_generated={g['scrubadub'][0].recall:.3f} "
        f"lost_heldout={100 * h['ours'][0].non_phi_lost_share:.2f}% "
        f"anchor_lost_heldout={100 * h['scrubadub'][0].non_phi_lost_share:.2f}% "
        f"lost_generated={100 * g['ours'][0].non_phi_lost_share:.2f}% "
        f"anchor_lost_generated={100 * g['scrubadub'][0].non_phi_lost_share:.2f}% "
        f"reports_per_s={rate:.0f} anchor_reports_per_s={anchor_rate:.0f} "
        f"ratio_speed_vs_anchor={rate / anchor_rate:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
