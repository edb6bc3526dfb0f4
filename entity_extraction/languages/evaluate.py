"""Per-language evaluation of report de-identification and entity labelling.

* :func:`load_gold_with_ignore` reads a gold file in the layout of ``../shared/data/text-deid-es/PROVENANCE.md``
  (``phi`` and ``ignore`` spans); ``ignore`` spans count neither as PHI nor as non-PHI tokens.
* :func:`score_deid` scores a de-identifier with the strict rule of :mod:`entity_extraction.deid.evaluation` (a span is
  removed only when none of its letters or digits survive in place; non-PHI tokens lost = share of letters-or-
  digits tokens outside PHI and ignore spans that lose a character).
* :func:`kfold` splits documents into k folds by a stable hash of their id.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from entity_extraction.deid.evaluation import _TOKEN, surviving_characters


@dataclass(frozen=True)
class GoldDoc:
    """One annotated document: ``phi`` and ``ignore`` are tuples of ``(start, end, type)``."""

    id: str
    text: str
    phi: tuple[tuple[int, int, str], ...]
    ignore: tuple[tuple[int, int, str], ...] = ()


@dataclass
class Score:
    """``per_type``: ``{type: [removed, total]}``; non-PHI token counts; ``missed``: (doc id, type, text) for
    development only (never printed by a command)."""

    per_type: dict[str, list[int]] = field(default_factory=dict)
    non_phi_tokens: int = 0
    non_phi_lost: int = 0
    docs: int = 0
    missed: list[tuple[str, str, str]] = field(default_factory=list)
    lost: list[tuple[str, str]] = field(default_factory=list)

    @property
    def recall(self) -> float:
        """Strict recall over all PHI spans."""
        total = sum(t for _, t in self.per_type.values())
        return sum(r for r, _ in self.per_type.values()) / total if total else 1.0

    @property
    def non_phi_lost_share(self) -> float:
        """Share of non-PHI tokens that lost a character."""
        return self.non_phi_lost / self.non_phi_tokens if self.non_phi_tokens else 0.0

    def to_dict(self) -> dict:
        """Figures only (no text): ``recall``, ``non_phi_lost``, ``per_type`` {type: [removed, total, recall]}."""
        return {
            "docs": self.docs,
            "recall": round(self.recall, 4),
            "non_phi_lost": round(self.non_phi_lost_share, 4),
            "spans": sum(t for _, t in self.per_type.values()),
            "per_type": {k: [r, t, round(r / t, 4) if t else 1.0] for k, (r, t) in sorted(self.per_type.items())},
        }


def load_gold_with_ignore(path: str | Path) -> list[GoldDoc]:
    """Documents of a JSONL gold file (``{"id", "text", "phi": [...], "ignore": [...]}``; ``ignore`` optional).

    Raises
    ------
    ValueError
        A line that is not such an object, or a span outside its text (the message names the line only).
    """
    docs = []
    for lineno, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        obj = json.loads(line)
        text = obj.get("text")
        if not isinstance(text, str) or not isinstance(obj.get("phi"), list):
            raise ValueError(f"line {lineno}: needs a string 'text' and a list 'phi'")
        spans = {}
        for key in ("phi", "ignore"):
            spans[key] = tuple((s["start"], s["end"], s["type"]) for s in obj.get(key, ()))
            if any(not 0 <= a < b <= len(text) for a, b, _ in spans[key]):
                raise ValueError(f"line {lineno}: a '{key}' span lies outside the text")
        docs.append(GoldDoc(str(obj.get("id", lineno)), text, spans["phi"], spans["ignore"]))
    return docs


def score_doc(doc: GoldDoc, deidentified: str, score: Score) -> None:
    """Add one document's counts to ``score``."""
    keep = surviving_characters(doc.text, deidentified)
    covered = bytearray(len(doc.text))
    for a, b, _ in doc.ignore:
        covered[a:b] = b"\x01" * (b - a)
    for a, b, kind in doc.phi:
        covered[a:b] = b"\x01" * (b - a)
        counts = score.per_type.setdefault(kind, [0, 0])
        counts[1] += 1
        if any(keep[i] and doc.text[i].isalnum() for i in range(a, b)):
            score.missed.append((doc.id, kind, doc.text[a:b]))
        else:
            counts[0] += 1
    for m in _TOKEN.finditer(doc.text):
        if any(covered[m.start() : m.end()]):
            continue
        score.non_phi_tokens += 1
        if not all(keep[m.start() : m.end()]):
            score.non_phi_lost += 1
            score.lost.append((doc.id, m.group()))
    score.docs += 1


def score_deid(docs: Iterable[GoldDoc], deidentify: Callable[[str], str]) -> Score:
    """Score ``deidentify`` (text -> de-identified text) on gold documents."""
    score = Score()
    for doc in docs:
        score_doc(doc, deidentify(doc.text), score)
    return score


def fold_of(doc_id: str, k: int) -> int:
    """Stable fold number in ``range(k)`` of a document id (SHA-256 of the id)."""
    return int(hashlib.sha256(doc_id.encode()).hexdigest()[:8], 16) % k


def kfold(docs: list[GoldDoc], k: int) -> list[tuple[list[GoldDoc], list[GoldDoc]]]:
    """``k`` (development, held-out) pairs: every document is held out exactly once."""
    return [([d for d in docs if fold_of(d.id, k) != i], [d for d in docs if fold_of(d.id, k) == i]) for i in range(k)]


def held_out_names(locale: str, k: int, fold: int) -> tuple[list[str], list[str]]:
    """First and last names of Faker's ``locale`` lists that fall in ``fold`` of ``k`` (by :func:`fold_of`)."""
    from entity_extraction.languages.gazetteer import person_names

    first, last = person_names(locale)
    return (sorted(n for n in first if fold_of(n, k) == fold), sorted(n for n in last if fold_of(n, k) == fold))


def synthetic_deid(lang: str, k: int = 5, per_fold: int = 40, seed: int = 34) -> Score:
    """PHI recall on synthetic reports (:mod:`entity_extraction.languages.synth`), k-fold over person names: fold
    ``i``'s reports use only fold ``i``'s names, which are removed from the gazetteer while they are scored."""
    from entity_extraction.languages.local_deid import deidentify_local
    from entity_extraction.languages.synth import _LOCALES, generate

    score = Score()
    for i in range(k):
        first, last = held_out_names(_LOCALES[lang], k, i)
        exclude = frozenset(first) | frozenset(last)
        for d in generate(lang, per_fold, seed=seed * 100 + i, names=(first, last)):
            doc = GoldDoc(d["id"], d["text"], tuple((p["start"], p["end"], p["type"]) for p in d["phi"]))
            score_doc(
                doc,
                deidentify_local(d["text"], lang, known_phi=[], date_shift_days=None, exclude_names=exclude)[0],
                score,
            )
    return score


def entity_figures(lang: str, docs: list[dict], extractor=None, family: str = "2D-CXR") -> dict:
    """Entity recall and assertion accuracy on labelled sentences.

    A gold entity ``{"start", "end", "entity_id", "assertion"}`` is found when a mention of the same concept
    overlaps its span; assertion accuracy is over the found ones. Returns ``{"entities", "found", "recall",
    "assertion_correct", "assertion_accuracy"}``.
    """
    from entity_extraction.extract import EntityExtractor

    extractor = extractor or EntityExtractor(language=lang)
    total = found = correct = 0
    for d in docs:
        mentions = extractor.extract(d["text"], family)
        for g in d["entities"]:
            total += 1
            hit = [
                m
                for m in mentions
                if m["entity_id"] == g["entity_id"] and m["span_start"] < g["end"] and g["start"] < m["span_end"]
            ]
            if hit:
                found += 1
                correct += hit[0]["assertion"] == g["assertion"]
    return {
        "entities": total,
        "found": found,
        "recall": round(found / total, 4) if total else 1.0,
        "assertion_correct": correct,
        "assertion_accuracy": round(correct / found, 4) if found else 1.0,
    }


def main() -> None:
    """Print every per-language figure (``python -m entity_extraction.languages.evaluate [MEDDOCAN folder]``)."""
    import sys

    from entity_extraction.languages.local_deid import deidentify_local
    from entity_extraction.languages.synth import generate

    folder = (
        Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[3] / "shared/data/text-deid-es"
    )
    out = {}
    for split in ("train", "dev"):
        path = folder / f"meddocan_{split}.jsonl"
        if path.is_file():
            s = score_deid(
                load_gold_with_ignore(path), lambda t: deidentify_local(t, "es", known_phi=[], date_shift_days=None)[0]
            )
            out[f"meddocan_{split}"] = s.to_dict()
    for lang in ("de", "fr", "es"):
        out[f"synthetic_deid_{lang}"] = synthetic_deid(lang).to_dict()
        out[f"synthetic_entities_{lang}"] = entity_figures(lang, generate(lang, 200, seed=3434))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
