"""Radiology report sectioning: header detection and character-offset -> section mapping.

Header variants are data (``section_rules_<lang>.json``; English: ``section_rules_en.json``), adapted from medspaCy's
section patterns (``resources/en/section_patterns.json``, MIT) and common radiology templates (ACR practice parameter
for communication of diagnostic imaging findings: indication, technique, comparison, findings,
impression). A header is recognised

* at the start of a line, in any case, when followed by ``:`` (text may follow on the same line), or
  when it stands alone on its line (text follows on the next lines);
* in the middle of a line only in UPPER CASE, followed by ``:``, right after a sentence end
  (``"... normal. IMPRESSION: ..."``).

Plain regular expressions: sectioning a report costs microseconds; the header list of the last few hundred
texts is memoised, since the entity extractor asks for the sections of a report several times.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from schemas.errors import ReasonCodedError

RULES_FILE = Path(__file__).with_name("section_rules_en.json")
#: name of text before the first recognised header (a report without headers is all ``unsectioned``).
UNSECTIONED = "unsectioned"
#: name of recognised non-clinical blocks (signatures, addenda boilerplate); never returned by split_sections.
OTHER = "other"


class SectionRulesError(ReasonCodedError, ValueError):
    """Raised when a section rules file is malformed (reason code ``invalid_section_rules``)."""

    default_reason = "section_rules_invalid"
    message_format = "{message}"

    reason = "invalid_section_rules"


@dataclass(frozen=True)
class _Rules:
    canonical: tuple[str, ...]
    header_to_section: dict[str, str]
    line_start: re.Pattern[str]
    mid_line: re.Pattern[str]
    historical: frozenset[str] = frozenset()


@lru_cache(maxsize=4)
def _load_rules(path: str | None = None) -> _Rules:
    data = json.loads(Path(path or RULES_FILE).read_text(encoding="utf-8"))
    try:
        canonical = tuple(data["canonical_sections"])
        headers: dict[str, list[str]] = data["headers"]
    except (KeyError, TypeError) as exc:
        raise SectionRulesError(f"section rules lack 'canonical_sections'/'headers': {exc}") from exc
    header_to_section: dict[str, str] = {}
    for section, variants in headers.items():
        if section not in canonical and section != OTHER:
            raise SectionRulesError(f"unknown section {section!r} in section rules")
        for v in variants:
            key = " ".join(v.lower().split())
            if key in header_to_section and header_to_section[key] != section:
                raise SectionRulesError(f"header {v!r} maps to two sections")
            header_to_section[key] = section
    # Longest variants first so "clinical history" wins over "history".
    alternation = "|".join(
        r"\s+".join(re.escape(w) for w in h.split()) for h in sorted(header_to_section, key=len, reverse=True)
    )
    line_start = re.compile(
        rf"^[ \t]*(?P<header>{alternation})[ \t]*(?:(?P<colon>:)|(?=[ \t]*$))",
        re.IGNORECASE | re.MULTILINE,
    )
    upper_alternation = "|".join(
        r"\s+".join(re.escape(w.upper()) for w in h.split()) for h in sorted(header_to_section, key=len, reverse=True)
    )
    mid_line = re.compile(rf"(?<=[.;!?])[ \t]+(?P<header>{upper_alternation})[ \t]*:")
    historical = frozenset(" ".join(h.lower().split()) for h in data.get("historical_headers", ()))
    unknown = sorted(historical - header_to_section.keys())
    if unknown:
        raise SectionRulesError(f"historical headers {unknown} are not headers of any section")
    return _Rules(canonical, header_to_section, line_start, mid_line, historical)


def _headers(text: str, rules: _Rules) -> list[tuple[int, int, str, bool]]:
    """Sorted ``(header_start, body_start, section, historical header?)`` for every recognised header."""
    found: dict[int, tuple[int, int, str, bool]] = {}
    for m in rules.line_start.finditer(text):
        header = " ".join(m.group("header").lower().split())
        found[m.start("header")] = (
            m.start("header"),
            m.end(),
            rules.header_to_section[header],
            header in rules.historical,
        )
    for m in rules.mid_line.finditer(text):
        header = " ".join(m.group("header").lower().split())
        found.setdefault(
            m.start("header"), (m.start("header"), m.end(), rules.header_to_section[header], header in rules.historical)
        )
    return [found[k] for k in sorted(found)]


@lru_cache(maxsize=256)
def _cached_headers(text: str, rules_path: str | None) -> tuple[tuple[int, int, str, bool], ...]:
    """:func:`_headers` memoised per (text, rules file): the extractor asks for the sections of one report
    several times (sentence starts, spans, bodies); the tuple is immutable, so sharing it is safe."""
    return tuple(_headers(text, _load_rules(rules_path)))


def historical_spans(text: str, rules_path: str | None = None) -> list[tuple[int, int]]:
    """``(body_start, end)`` of every section under a historical header (``historical_headers`` of the rules,
    e.g. PAST MEDICAL HISTORY): what is named there is the patient's past, not the current study."""
    headers = _cached_headers(text, rules_path) if text else ()
    out = []
    for i, (_, body_start, _, historical) in enumerate(headers):
        if historical:
            out.append((body_start, headers[i + 1][0] if i + 1 < len(headers) else len(text)))
    return out


def section_spans(text: str, rules_path: str | None = None) -> list[tuple[str, int, int]]:
    """Cover ``text`` with consecutive, non-overlapping sections.

    Parameters
    ----------
    text : str
        Report text.
    rules_path : str, optional
        Alternative section rules JSON (default: the packaged English ``section_rules_en.json``).

    Returns
    -------
    list of (str, int, int)
        ``(name, start, end)`` character offsets (``text[start:end]``), in text order, together covering
        ``[0, len(text))`` without gaps. ``name`` is a canonical section (``indication``, ``technique``,
        ``comparison``, ``findings``, ``impression``), ``"other"`` (signature/addendum blocks) or
        ``"unsectioned"`` (text before the first header). A span starts at its header, so every character
        offset, including those of the header itself, maps to exactly one section. Empty for empty text.

    Raises
    ------
    SectionRulesError
        If the rules file is malformed.
    """
    if not text:
        return []
    headers = _cached_headers(text, rules_path)
    spans: list[tuple[str, int, int]] = []
    first = headers[0][0] if headers else len(text)
    if first > 0:
        spans.append((UNSECTIONED, 0, first))
    for i, (start, _, name, _) in enumerate(headers):
        end = headers[i + 1][0] if i + 1 < len(headers) else len(text)
        spans.append((name, start, end))
    return spans


def section_body_spans(text: str, rules_path: str | None = None) -> list[tuple[str, int, int]]:
    """Like :func:`section_spans` but each span starts after its header (and colon): ``(name, body_start, end)``.

    The ``unsectioned`` preamble is included as is; a span may be empty (``body_start == end``).
    """
    spans = section_spans(text, rules_path)
    bodies = {start: body for start, body, _, _ in _cached_headers(text, rules_path)}
    return [(name, bodies.get(start, start), end) for name, start, end in spans]


def section_at(spans: list[tuple[str, int, int]], offset: int) -> str | None:
    """Section name containing character ``offset`` (from :func:`section_spans`), or None if outside."""
    starts = [s for _, s, _ in spans]
    i = bisect_right(starts, offset) - 1
    if i < 0:
        return None
    name, start, end = spans[i]
    return name if start <= offset < end else None


def split_sections(text: str, rules_path: str | None = None) -> dict[str, str]:
    """Split a report into its canonical sections.

    Parameters
    ----------
    text : str
        Report text.
    rules_path : str, optional
        Alternative section rules JSON.

    Returns
    -------
    dict of str to str
        Exactly the keys ``indication``, ``technique``, ``comparison``, ``findings``, ``impression``; values
        are the section bodies without their header, stripped of surrounding whitespace; ``""`` when the
        section is absent or empty. Several headers of one section (``HISTORY:`` and ``INDICATION:``) are
        joined with a newline in text order. Text before the first header and ``other`` blocks are not
        returned (use :func:`section_spans` for them).
    """
    rules = _load_rules(rules_path)
    parts: dict[str, list[str]] = {name: [] for name in rules.canonical}
    headers = _cached_headers(text, rules_path)
    for i, (_, body_start, name, _) in enumerate(headers):
        end = headers[i + 1][0] if i + 1 < len(headers) else len(text)
        body = text[body_start:end].strip()
        if name in parts and body:
            parts[name].append(body)
    return {name: "\n".join(bodies) for name, bodies in parts.items()}
