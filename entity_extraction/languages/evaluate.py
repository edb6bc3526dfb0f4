"""Per-language evaluation of report de-identification and entity labelling.

* :func:`load_gold_with_ignore` reads a gold file in the layout of ``../shared/data/text-deid-es/PROVENANCE.md``
  (``phi`` and ``ignore`` spans); ``ignore`` spans count neither as PHI nor as non-PHI tokens.
* :func:`score_deid` scores a de-identifier with the strict rule of :mod:`entity_extraction.deid_eval` (a span is
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

from entity_extraction.deid_eval import _TOKEN, surviving_characters


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
        return {"docs": self.docs, "recall": round(self.recall, 4), "non_phi_lost": round(self.non_phi_lost_share, 4),
                "spans": sum(t for _, t in self.per_type.values()),
                "per_type": {k: [r, t, round(r / t, 4) if t else 1.0] for k, (r, t) in sorted(self.per_type.items())}}


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
        if any(covered[m.start():m.end()]):
            continue
        score.non_phi_tokens += 1
        if not all(keep[m.start():m.end()]):
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
