"""Score text de-identification against a gold standard of annotated PHI spans (``medreco eval deid``).

Gold layout (``../shared/data/text-deid/PROVENANCE.md``): one JSON object per line,
``{"id": str, "text": str, "phi": [{"start": int, "end": int, "type": str}, ...]}`` with character offsets
into ``text``. The scoring rule is the one stated there (and in issue 18):

* a PHI span counts as **removed** only when none of its letters or digits survive in place: the input is
  aligned with the de-identified output character by character (:class:`difflib.SequenceMatcher` without
  its junk heuristic, on words first and then on the characters of each changed stretch; replacement tokens
  such as ``[NAME]`` or ``90+`` first collapsed to one character that matches nothing), and a character of
  the input survives when it lies in a matching block;
* **strict recall** = removed spans / all spans (overall and per PHI type);
* **non-PHI tokens lost** = share of the letters-or-digits tokens (maximal runs of letters and digits) that
  overlap no PHI span and lose at least one character.

Text is de-identified the way ``medreco reports annotate`` does it (no header values, no date offset:
every date becomes ``[DATE]``), unless another function is passed.

**Folds.** A rule written while looking at a note's misses is fitted to that note. The notes are split into
:data:`DEFAULT_FOLDS` folds by patient (:func:`fold_of`: a hash of the id before its last ``-``, so every note of
one patient, whose names recur, lies in one fold; deterministic, no random state). Rules are written looking at
the misses of the development folds only (:data:`DEFAULT_HELD_OUT` are the others, never looked at); the
held-out figure is the judge, the development ("tuned") figure beside it shows the fit.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from pathlib import Path

from schemas.errors import ReasonCodedError

#: replacement tokens of :func:`entity_extraction.deid.deidentify_text`: ``[NAME]``, ``[DATE]``, ...,
#: and ``90+`` (an age over 89). Each is collapsed to :data:`_PLACEHOLDER` before the alignment.
REPLACEMENT_TOKENS = re.compile(r"\[[A-Z][A-Z_]*\]|(?<!\d)90\+")
_PLACEHOLDER = "\ue000"  # a private-use character: never in the input, matches nothing
_TOKEN = re.compile(r"[^\W_]+")
_CHUNK = re.compile(r"[^\W_]+|\s+|.", re.DOTALL)


#: folds of ``medreco eval deid`` and the folds whose misses are never looked at while rules are written
DEFAULT_FOLDS = 5
DEFAULT_HELD_OUT = (3, 4)


class GoldFormatError(ReasonCodedError, ValueError):
    """A gold file that does not follow the layout (reason names the line, never its text)."""

    default_reason = "gold_format_invalid"
    message_format = "{message}"


@dataclass(frozen=True)
class GoldNote:
    """One annotated note: ``phi`` is a tuple of ``(start, end, type)``."""

    id: str
    text: str
    phi: tuple[tuple[int, int, str], ...]


@dataclass
class DeidScore:
    """Counts of one scoring run.

    Attributes
    ----------
    per_type : dict of str to [int, int]
        ``{type: [removed, total]}`` over all notes.
    non_phi_tokens, non_phi_lost : int
        Letters-or-digits tokens outside every PHI span, and how many of them lost a character.
    notes : int
        Notes scored.
    missed : list of (note id, type, text)
        Every PHI span that was not removed, in file order (for development; never printed by the CLI).
    """

    per_type: dict[str, list[int]] = field(default_factory=dict)
    non_phi_tokens: int = 0
    non_phi_lost: int = 0
    notes: int = 0
    missed: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def removed(self) -> int:
        """PHI spans removed, all types."""
        return sum(r for r, _ in self.per_type.values())

    @property
    def total(self) -> int:
        """PHI spans, all types."""
        return sum(t for _, t in self.per_type.values())

    @property
    def recall(self) -> float:
        """Strict recall over all PHI spans (1.0 for a gold without PHI)."""
        return self.removed / self.total if self.total else 1.0

    @property
    def non_phi_lost_share(self) -> float:
        """Share of non-PHI tokens that lost a character (0.0 when there are none)."""
        return self.non_phi_lost / self.non_phi_tokens if self.non_phi_tokens else 0.0

    def add(self, other: DeidScore) -> None:
        """Add the counts of ``other`` (another fold) to this score."""
        for kind, (removed, total) in other.per_type.items():
            counts = self.per_type.setdefault(kind, [0, 0])
            counts[0] += removed
            counts[1] += total
        self.non_phi_tokens += other.non_phi_tokens
        self.non_phi_lost += other.non_phi_lost
        self.notes += other.notes
        self.missed.extend(other.missed)

    def type_recall(self, kind: str) -> float:
        """Strict recall of one PHI type.

        Raises
        ------
        KeyError
            If the gold has no span of that type.
        """
        removed, total = self.per_type[kind]
        return removed / total if total else 1.0


def load_gold(path: str | Path) -> list[GoldNote]:
    """Read a gold file in the layout of the module docstring.

    Returns
    -------
    list of GoldNote
        In file order; blank lines are skipped.

    Raises
    ------
    GoldFormatError
        If a line is not a JSON object with a string ``text`` and a list ``phi`` of spans whose ``start``/``end``
        are integers with ``0 <= start < end <= len(text)`` and whose ``type`` is a string.
    OSError
        If the file cannot be read.
    """
    notes: list[GoldNote] = []
    with Path(path).open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise GoldFormatError(f"line {lineno}: not valid JSON ({exc.msg})") from None
            if (
                not isinstance(obj, dict)
                or not isinstance(obj.get("text"), str)
                or not isinstance(obj.get("phi"), list)
            ):
                raise GoldFormatError(f"line {lineno}: needs an object with a string 'text' and a list 'phi'")
            text = obj["text"]
            spans = []
            for span in obj["phi"]:
                ok = isinstance(span, dict) and all(
                    isinstance(span.get(k), int) and not isinstance(span.get(k), bool) for k in ("start", "end")
                )
                if not ok or not isinstance(span.get("type"), str) or not 0 <= span["start"] < span["end"] <= len(text):
                    raise GoldFormatError(
                        f"line {lineno}: a 'phi' span needs integer start < end within the text and a string type"
                    )
                spans.append((span["start"], span["end"], span["type"]))
            notes.append(GoldNote(str(obj.get("id", lineno)), text, tuple(spans)))
    return notes


def surviving_characters(original: str, deidentified: str) -> bytearray:
    """Which characters of ``original`` survive in place in ``deidentified``.

    Parameters
    ----------
    original, deidentified : str
        The input text and the de-identifier's output for it.

    Returns
    -------
    bytearray
        One byte per character of ``original``: 1 where the character lies in a block that matches the
        output (replacement tokens, :data:`REPLACEMENT_TOKENS`, match nothing), 0 where it was removed
        or replaced.
    """
    masked = REPLACEMENT_TOKENS.sub(_PLACEHOLDER, deidentified)
    keep = bytearray(len(original))
    # words first (fast), then characters inside each changed stretch (exact: "Kamińska" -> "[NAME]ńska")
    a_chunks = [m.span() for m in _CHUNK.finditer(original)]
    b_chunks = [m.span() for m in _CHUNK.finditer(masked)]
    a_words = [original[i:j] for i, j in a_chunks]
    b_words = [masked[i:j] for i, j in b_chunks]
    words = SequenceMatcher(None, a_words, b_words, autojunk=False)
    for op, a1, a2, b1, b2 in words.get_opcodes():
        if a1 == a2:
            continue
        start, end = a_chunks[a1][0], a_chunks[a2 - 1][1]
        if op == "equal":
            keep[start:end] = b"\x01" * (end - start)
        elif op == "replace":
            sub_b = masked[b_chunks[b1][0] : b_chunks[b2 - 1][1]]
            chars = SequenceMatcher(None, original[start:end], sub_b, autojunk=False)
            for a, _b, size in chars.get_matching_blocks():
                keep[start + a : start + a + size] = b"\x01" * size
    return keep


def score_note(note: GoldNote, deidentified: str, score: DeidScore) -> None:
    """Add one note's counts to ``score`` (see the module docstring for the rule)."""
    keep = surviving_characters(note.text, deidentified)
    in_phi = bytearray(len(note.text))
    for start, end, kind in note.phi:
        in_phi[start:end] = b"\x01" * (end - start)
        counts = score.per_type.setdefault(kind, [0, 0])
        counts[1] += 1
        survived = any(keep[i] and note.text[i].isalnum() for i in range(start, end))
        if survived:
            score.missed.append((note.id, kind, note.text[start:end]))
        else:
            counts[0] += 1
    for m in _TOKEN.finditer(note.text):
        if any(in_phi[m.start() : m.end()]):
            continue
        score.non_phi_tokens += 1
        score.non_phi_lost += not all(keep[m.start() : m.end()])
    score.notes += 1


def _annotate_deid(text: str) -> str:
    from entity_extraction.deid.scrubber import deidentify_text

    return deidentify_text(text, known_phi=[], date_shift_days=None)[0]


def evaluate_deid(notes: Iterable[GoldNote], deidentify: Callable[[str], str] | None = None) -> DeidScore:
    """Score a de-identifier on gold notes.

    Parameters
    ----------
    notes : iterable of GoldNote
        From :func:`load_gold`.
    deidentify : callable, optional
        ``text -> de-identified text``; default: :func:`entity_extraction.deid.deidentify_text` as
        ``medreco reports annotate`` runs it (no header values, ``date_shift_days=None``).

    Returns
    -------
    DeidScore
    """
    fn = deidentify or _annotate_deid
    score = DeidScore()
    for note in notes:
        score_note(note, fn(note.text), score)
    return score


def render_deid_table(score: DeidScore) -> str:
    """The table ``medreco eval deid`` prints: one row per PHI type (most frequent first), then the overall
    strict recall and the non-PHI tokens lost. Never quotes PHI."""
    rows = sorted(score.per_type.items(), key=lambda kv: (-kv[1][1], kv[0]))
    width = max([len("PHI type"), *(len(k) for k, _ in rows), len("all (strict)")])
    lines = [f"{'PHI type':<{width}}  {'spans':>6}  {'removed':>7}  {'recall':>6}"]
    for kind, (removed, total) in rows:
        lines.append(f"{kind:<{width}}  {total:>6}  {removed:>7}  {removed / total:>6.3f}")
    lines.append(f"{'all (strict)':<{width}}  {score.total:>6}  {score.removed:>7}  {score.recall:>6.3f}")
    lines.append(
        f"non-PHI tokens lost: {score.non_phi_lost} of {score.non_phi_tokens} "
        f"({100 * score.non_phi_lost_share:.2f}%) in {score.notes} notes"
    )
    return "\n".join(lines)


def fold_of(note_id: str, folds: int = DEFAULT_FOLDS) -> int:
    """The fold (``0 .. folds-1``) of a note: SHA-256 of its group (the id before its last ``-``, the patient of
    ``"<patient>-<note>"``; the whole id when it has no ``-``), first 8 bytes as an integer, modulo ``folds``.

    Raises
    ------
    ValueError
        If ``folds`` < 2.
    """
    if folds < 2:
        raise ValueError(f"need at least 2 folds, got {folds}")
    group = note_id.rsplit("-", 1)[0] if "-" in note_id else note_id
    return int.from_bytes(hashlib.sha256(group.encode("utf-8")).digest()[:8], "big") % folds


@dataclass
class FoldScores:
    """Scores of one k-fold run: ``folds[i]`` is fold i's score; ``held_out`` the folds never looked at."""

    folds: list[DeidScore]
    held_out: tuple[int, ...]

    def combined(self, held_out: bool) -> DeidScore:
        """The held-out folds together (``held_out=True``) or the development ("tuned") folds together."""
        total = DeidScore()
        for i, score in enumerate(self.folds):
            if (i in self.held_out) == held_out:
                total.add(score)
        return total


def evaluate_folds(
    notes: Iterable[GoldNote],
    folds: int = DEFAULT_FOLDS,
    held_out: tuple[int, ...] = DEFAULT_HELD_OUT,
    deidentify: Callable[[str], str] | None = None,
) -> FoldScores:
    """Score a de-identifier fold by fold (:func:`fold_of`); every note is de-identified once.

    Raises
    ------
    ValueError
        If ``folds`` < 2 or a held-out fold is outside ``0 .. folds-1``, or every fold is held out.
    """
    if folds < 2 or any(not 0 <= f < folds for f in held_out) or len(set(held_out)) >= folds:
        raise ValueError(f"held-out folds {held_out} do not fit {folds} folds (some fold must be for development)")
    fn = deidentify or _annotate_deid
    scores = [DeidScore() for _ in range(folds)]
    for note in notes:
        score_note(note, fn(note.text), scores[fold_of(note.id, folds)])
    return FoldScores(scores, tuple(sorted(set(held_out))))


def render_fold_table(result: FoldScores) -> str:
    """Per-fold strict recall and non-PHI tokens lost, then the development (tuned) and held-out figures and their
    difference, then the held-out figures per PHI type. Never quotes PHI."""
    lines = [f"{'fold':<14}  {'notes':>5}  {'spans':>5}  {'recall':>6}  {'non-PHI lost':>12}"]
    for i, s in enumerate(result.folds):
        name = f"{i} (held out)" if i in result.held_out else f"{i} (dev)"
        lines.append(f"{name:<14}  {s.notes:>5}  {s.total:>5}  {s.recall:>6.3f}  {100 * s.non_phi_lost_share:>11.2f}%")
    dev, held = result.combined(False), result.combined(True)
    lines.append(
        f"{'dev (tuned)':<14}  {dev.notes:>5}  {dev.total:>5}  {dev.recall:>6.3f}  "
        f"{100 * dev.non_phi_lost_share:>11.2f}%"
    )
    lines.append(
        f"{'held out':<14}  {held.notes:>5}  {held.total:>5}  {held.recall:>6.3f}  "
        f"{100 * held.non_phi_lost_share:>11.2f}%"
    )
    lines.append(f"held-out minus tuned strict recall: {held.recall - dev.recall:+.3f}")
    return "\n".join(lines) + "\n\nheld-out folds by PHI type:\n" + render_deid_table(held)
