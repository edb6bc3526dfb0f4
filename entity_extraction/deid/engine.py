"""The parts of report de-identification that every language shares: a finding (:class:`Hit`), the resolution of
competing findings (:func:`accept`: earlier groups win, within a group the longer span), the rewrite of the text
with the accepted replacements (:func:`render`), and the date arithmetic of shifted dates (:func:`shift_date`,
:func:`year4`).

The English scrubber (:func:`entity_extraction.deid.scrubber.deidentify_text`) and the German/French/Spanish packs
(:func:`entity_extraction.languages.local_deid.deidentify_local`) find their hits with their own rules and data,
then resolve and render them here.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Hit:
    """One finding: characters ``start:end`` of the text (end exclusive) are ``kind`` PHI (``NAME``, ``DATE``,
    ``ID`` ...) and are replaced by ``replacement`` (a token such as ``[NAME]`` or a shifted date)."""

    start: int
    end: int
    kind: str
    replacement: str


def accept(groups: Iterable[list[Hit]], length: int) -> tuple[list[Hit], bytearray]:
    """The hits that stand: groups in priority order (an earlier group wins), within a group the longer span first
    (then the earlier start); a hit overlapping an accepted one, or empty, is dropped.

    Returns
    -------
    (list of Hit, bytearray)
        The accepted hits in acceptance order, and a mask of ``length`` bytes (1 where a character is taken), so a
        caller can add hits of a later pass that may not overlap.
    """
    accepted: list[Hit] = []
    taken = bytearray(length)
    for group in groups:
        for h in sorted(group, key=lambda h: (h.start - h.end, h.start)):
            if h.end > h.start and not any(taken[h.start : h.end]):
                accepted.append(h)
                taken[h.start : h.end] = b"\x01" * (h.end - h.start)
    return accepted, taken


def render(text: str, accepted: list[Hit]) -> tuple[str, dict[str, int]]:
    """``text`` with every accepted hit replaced, and the number of replacements per kind (sorted by kind; only kinds
    with at least one). ``accepted`` must not overlap (:func:`accept`); it is sorted in place by start."""
    accepted.sort(key=lambda h: h.start)
    out: list[str] = []
    pos = 0
    for h in accepted:
        out.append(text[pos : h.start])
        out.append(h.replacement)
        pos = h.end
    out.append(text[pos:])
    return "".join(out), dict(sorted(Counter(h.kind for h in accepted).items()))


def shift_date(year: int, month: int, day: int, days: int | None) -> dt.date | None:
    """The date ``days`` later (earlier when negative), or None when there is no shift, the year is outside
    1800-2199 or the date is not a calendar date (the caller then redacts it)."""
    if days is None or not 1800 <= year <= 2199:
        return None
    try:
        return dt.date(year, month, day) + dt.timedelta(days=days)
    except (ValueError, OverflowError):
        return None


def year4(yy: str) -> int:
    """A year of two or four digits as four: two digits up to next year's are this century, the rest the last
    ("24" -> 2024, "97" -> 1997 when read in 2026)."""
    if len(yy) == 4:
        return int(yy)
    pivot = (dt.date.today().year + 1) % 100
    return 2000 + int(yy) if int(yy) <= pivot else 1900 + int(yy)
