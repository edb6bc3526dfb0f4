"""Free-text report de-identification: known PHI, dates (shifted, format kept), phones, ids, names.

Identifier classes follow HIPAA Safe Harbor (45 CFR 164.514(b)(2)): names, dates more specific than a
year, telephone numbers, e-mail addresses, URLs, medical record / accession numbers and other ids,
street addresses and postcodes; organisation names (hospitals) are removed too because they locate
the patient. Patterns are data (``phi_patterns.json``).

Dates are shifted by the patient's offset (PS3.15 E.3.6, Retain Longitudinal Temporal Information with
Modified Dates; :meth:`etl.keys.PseudonymKey.date_shift_days`) and written back in their own format.
The process is fail-closed: a date that cannot be parsed or shifted with certainty (no year, invalid
day, no shift given) becomes ``[DATE]``; a name found in one spelling is removed in every spelling.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from entity_extraction.deid.engine import Hit, accept, render, shift_date, year4
from entity_extraction.deid.lexicon import AMBIG, SAFE, load_lexicon, protected_spans
from entity_extraction.deid.name_rules import lexical_hits
from entity_extraction.deid.recognisers import (
    ADDRESS_RECOGNISERS,
    NUMBER_RECOGNISERS,
    ORGANIZATION_RECOGNISERS,
    postcodes_beside,
)
from schemas.errors import ReasonCodedError

PATTERNS_FILE = Path(__file__).with_name("phi_patterns.json")
_ORDINALS = ("st", "nd", "rd", "th")


class PhiPatternsError(ReasonCodedError, ValueError):
    """Raised when ``phi_patterns.json`` is malformed (reason code ``invalid_phi_patterns``)."""

    default_reason = "phi_patterns_invalid"
    message_format = "{message}"

    reason = "invalid_phi_patterns"


@dataclass(frozen=True)
class _Patterns:
    tokens: dict[str, str]
    month_num: dict[str, int]
    month_full: tuple[str, ...]
    month_abbr: dict[int, str]
    regex: dict[str, re.Pattern[str] | list[re.Pattern[str]]]
    stopwords: frozenset[str]
    #: ``(gate, pattern)`` for names after a title, after a label and before a degree; ``gate`` is the title,
    #: label or degree part alone with the same flags: it matches wherever the whole pattern does, so a
    #: text without a gate match skips the (much slower) whole pattern with the same result.
    contextual: tuple[tuple[re.Pattern[str], re.Pattern[str]], ...]


def _compile(data: dict, key: str) -> re.Pattern[str] | list[re.Pattern[str]]:
    flags = 0 if key in data.get("case_sensitive", []) else re.IGNORECASE
    value = data[key]
    if isinstance(value, list):
        return [re.compile(v, flags) for v in value]
    return re.compile(value, flags)


def _address_regex(data: dict) -> re.Pattern[str]:
    """The street address with what may follow it (``address_locality``: city, US state, ZIP or postcode) as one
    pattern, so ``"123 Main Street, Boston MA 02115"`` is one ``[ADDRESS]``; a state code alone is never matched."""
    street = data["address"]
    locality = data.get("address_locality")
    if not locality:
        return _compile(data, "address")
    states = data["us_states"]
    alt = "|".join(re.escape(s) for s in sorted([*states["codes"], *states["names"]], key=len, reverse=True))
    tail = locality.replace("{STATE}", alt).replace("{POSTCODE}", data["postcode"])
    flags = 0 if "address" in data.get("case_sensitive", []) else re.IGNORECASE
    return re.compile(rf"(?:{street})(?:{tail})?", flags)


@lru_cache(maxsize=4)
def _load(path: str | None = None, language: str = "en") -> _Patterns:
    data = json.loads(Path(path or PATTERNS_FILE).read_text(encoding="utf-8"))
    try:
        full = tuple(m.lower() for m in data["months"][language])
        abbr = {k.lower(): int(v) for k, v in data["month_abbreviations"][language].items()}
        keys = (
            "email",
            "url",
            "phone",
            "labelled_id",
            "long_number",
            "organization",
            "address",
            "postcode",
            "title_before_name",
            "label_before_name",
            "degree_after_name",
            "name_word",
            "date_of_birth",
            "age_over_89",
        )
        regex = {k: _compile(data, k) for k in keys}
        regex["address"] = _address_regex(data)
        tokens = dict(data["tokens"])
        stop = frozenset(w.lower() for w in data["name_stopwords"])
    except (KeyError, TypeError, re.error) as exc:
        raise PhiPatternsError(f"phi patterns file is malformed: {exc!r}") from exc
    if len(full) != 12:
        raise PhiPatternsError(f"need 12 month names for language {language!r}")
    month_num = {name: i + 1 for i, name in enumerate(full)} | abbr
    month_abbr: dict[int, str] = {}
    for name, num in sorted(abbr.items(), key=lambda kv: len(kv[0])):
        month_abbr.setdefault(num, name)
    for i, name in enumerate(full):
        month_abbr.setdefault(i + 1, name)  # e.g. "may" has no shorter form
    month_alt = "|".join(sorted(month_num, key=len, reverse=True))
    regex["date_iso"] = re.compile(r"(?<![\d.])(\d{4})([-/.])(\d{1,2})\2(\d{1,2})(?![\d]|\.\d)")
    regex["date_numeric"] = re.compile(r"(?<![\w/.-])(\d{1,2})([/._-])(\d{1,2})\2(\d{4}|\d{2})(?![\d/%]|[.-]\d)")
    regex["date_compact"] = re.compile(r"(?<![\w.])((?:19|20)\d{2})(\d{2})(\d{2})(?![\w]|\.\d)")
    regex["date_dmy"] = re.compile(
        rf"\b(\d{{1,2}})(st|nd|rd|th)?([ -]+|\s+of\s+)({month_alt})(\.?)(,?[ -]+)(\d{{4}})\b", re.IGNORECASE
    )
    regex["date_mdy"] = re.compile(
        rf"\b({month_alt})(\.?)([ -]+)(\d{{1,2}})(st|nd|rd|th)?(,?[ -]+)(\d{{4}})\b", re.IGNORECASE
    )
    regex["date_my"] = re.compile(rf"\b({month_alt})(\.?)(,?[ -]+|\s+of\s+)(\d{{4}})\b", re.IGNORECASE)
    # day and month without a year ("7/22", "10/15-10/16"); not after ventilator settings ("CPAP 10/5")
    regex["date_md"] = re.compile(
        r"(?<![\d/:,_])(?<!(?<![^\W\d_])\.)(?<!(?<![\d/])\d-)(?<!(?<![\d/])\d\d-)(1[0-2]|0?[1-9])/(3[01]|[12]\d|0?[1-9])"
        r"(?![\d/]|\.\d|[ \t]*(?:mg|mcg|ml|cc|%|l\b|ns\b|strength))",
        re.IGNORECASE,
    )
    # month and two-digit year ("4/97", "12/93"): the second number cannot be a day
    regex["date_myy"] = re.compile(r"(?<![\d/.:,_-])(1[0-2]|0?[1-9])/(3[2-9]|[4-9]\d)(?![\d/]|\.\d)")
    # compact and two-digit-year month-name dates: 21Sep2023, 18-DEC-19, 12Mar19, 28 Oct, 88
    regex["date_dmon"] = re.compile(
        rf"(?<![\w])(\d{{1,2}})(st|nd|rd|th)?([ _-]?)({month_alt})(\.?)"
        rf"(,?[ _-]?'?|,[ \t]?)(\d{{4}}|\d{{2}})(?![\w]|\.\d)",
        re.IGNORECASE,
    )
    # a year alone after a cue ("in 1983", "since 2006", "CABG 1957, 1971") and apostrophe years ('88, 62')
    regex["date_year"] = re.compile(data.get("year_alone", r"(?!x)x"), re.IGNORECASE)
    regex["date_md_not_after"] = re.compile(data.get("date_md_not_after", r"(?!x)x"), re.IGNORECASE)
    regex["date_apostrophe_year"] = re.compile(r"(?<![\d'’])['’](\d{2})(?![\w'’])|(?<![\w'’.])(\d{2})['’](?![\w'’])")
    # Day and month without a year cannot be shifted reliably: redacted. Case-sensitive month (not "may").
    cased = "|".join(alt for m in sorted(month_num, key=len, reverse=True) for alt in (m.capitalize(), m.upper()))
    lower = "|".join(m for m in sorted(month_num, key=len, reverse=True) if m != "may")
    regex["date_noyear"] = re.compile(
        rf"\b(?:\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?(?:{cased})\b\.?|(?:{cased})\.?\s+\d{{1,2}}(?:st|nd|rd|th)?\b"
        rf"|(?:{lower})\.?\s+\d{{1,2}}(?:st|nd|rd|th)?\b(?![.:/]\d)|may\s+\d{{1,2}}(?:st|nd|rd|th)?(?=[ \t]*[,'’]))"
    )
    word = regex["name_word"].pattern
    run = rf"(?P<name>{word}(?:(?:,[ \t]*|[ \t]+){word}){{0,3}})"
    title = regex["title_before_name"].pattern
    label = regex["label_before_name"].pattern
    degree = regex["degree_after_name"].pattern
    try:
        contextual = (
            (re.compile(title), re.compile(rf"(?P<title>{title})(?![\w])[ \t]*{run}")),
            (re.compile(rf"(?i:{label})"), re.compile(rf"(?i:{label})[ \t]*{run}")),
            (re.compile(degree), re.compile(rf"(?<![\w'’-]){run}(?:{degree})")),  # a name starts a word
        )
    except re.error as exc:
        raise PhiPatternsError(f"phi patterns file is malformed: {exc!r}") from exc
    return _Patterns(tokens, month_num, full, month_abbr, regex, stop, contextual)


# ---------------------------------------------------------------- dates
def _pad(original: str, value: int, numeric: bool = True) -> str:
    """``value`` in the style of ``original``: numeric dates keep their width (``"03"``, ``"10"`` -> 2 digits);
    dates with a month name are zero-padded only when the original was (``"03 March"``)."""
    width = len(original) >= 2 and (numeric or original.startswith("0"))
    return f"{value:0{len(original)}d}" if width else str(value)


def _same_case(original: str, word: str) -> str:
    if original.isupper():
        return word.upper()
    if original[:1].isupper():
        return word.capitalize()
    return word.lower()


def _month_word(p: _Patterns, original: str, month: int) -> str:
    full = original.lower() in p.month_full
    return _same_case(original, p.month_full[month - 1] if full else p.month_abbr[month])


def _ordinal(day: int) -> str:
    return "th" if 11 <= day % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")


_DIGIT = re.compile(r"\d")
_FOUR_DIGITS = re.compile(r"\d{4}")


def _date_hits(text: str, p: _Patterns, shift: int | None, day_first: bool) -> list[Hit]:
    red = p.tokens["DATE"]
    hits: list[Hit] = []
    # every date pattern needs a digit, and all but date_numeric/date_noyear a run of four (the year):
    # texts without them skip those scans (same result, a fraction of the time)
    if not _DIGIT.search(text):
        return hits
    with_year = _FOUR_DIGITS.search(text) is not None

    def add(m: re.Match[str], new: str | None) -> None:
        hits.append(Hit(m.start(), m.end(), "DATE", new if new is not None else red))

    for m in p.regex["date_iso"].finditer(text) if with_year else ():
        y, sep, mo, d = m.groups()
        s = shift_date(int(y), int(mo), int(d), shift)
        add(m, s and f"{s.year:04d}{sep}{_pad(mo, s.month)}{sep}{_pad(d, s.day)}")
    for m in p.regex["date_compact"].finditer(text) if with_year else ():
        y, mo, d = m.groups()
        s = shift_date(int(y), int(mo), int(d), shift)
        add(m, s and f"{s.year:04d}{s.month:02d}{s.day:02d}")
    for m in p.regex["date_numeric"].finditer(text):
        a, sep, b, y = m.groups()
        first, second = int(a), int(b)
        dmy = first > 12 or (second <= 12 and day_first)
        day, month = (first, second) if dmy else (second, first)
        s = shift_date(year4(y), month, day, shift)
        if s is None:
            add(m, None)
            continue
        yy = f"{s.year:04d}" if len(y) == 4 else f"{s.year % 100:02d}"
        d_txt, m_txt = (a, b) if dmy else (b, a)
        parts = (_pad(d_txt, s.day), _pad(m_txt, s.month)) if dmy else (_pad(m_txt, s.month), _pad(d_txt, s.day))
        add(m, f"{parts[0]}{sep}{parts[1]}{sep}{yy}")
    for m in p.regex["date_dmy"].finditer(text) if with_year else ():
        d, suf, sp1, mon, dot, sp2, y = m.groups()
        s = shift_date(int(y), p.month_num[mon.lower()], int(d), shift)
        new = None
        if s is not None:
            suffix = _same_case(suf, _ordinal(s.day)) if suf else ""
            new = f"{_pad(d, s.day, False)}{suffix}{sp1}{_month_word(p, mon, s.month)}{dot}{sp2}{s.year}"
        add(m, new)
    for m in p.regex["date_mdy"].finditer(text) if with_year else ():
        mon, dot, sp1, d, suf, sp2, y = m.groups()
        s = shift_date(int(y), p.month_num[mon.lower()], int(d), shift)
        new = None
        if s is not None:
            suffix = _same_case(suf, _ordinal(s.day)) if suf else ""
            new = f"{_month_word(p, mon, s.month)}{dot}{sp1}{_pad(d, s.day, False)}{suffix}{sp2}{s.year}"
        add(m, new)
    for m in p.regex["date_my"].finditer(text) if with_year else ():
        mon, dot, sp, y = m.groups()
        if mon.lower() == "may" and not mon[:1].isupper():
            continue  # "may 2023 ..." in lower case is the verb, not a month
        s = shift_date(int(y), p.month_num[mon.lower()], 15, shift)  # month precision: shift the mid-month day
        add(m, s and f"{_month_word(p, mon, s.month)}{dot}{sp}{s.year}")
    for m in p.regex["date_noyear"].finditer(text):
        add(m, None)
    not_after = p.regex["date_md_not_after"]
    for m in p.regex["date_md"].finditer(text) if "/" in text else ():
        mo, d = m.groups()
        if int(mo) <= int(d) <= 4 or not_after.search(text, max(0, m.start() - 30), m.start()):
            continue  # a fraction ("1/2", "3/4") or a setting or score ("CPAP 5/5", "pain 5/10")
        s = shift_date(2000, int(mo), int(d), shift)  # a leap year: 2/29 stays valid
        add(m, s and f"{_pad(mo, s.month)}/{_pad(d, s.day)}")
    for m in p.regex["date_myy"].finditer(text) if "/" in text else ():
        mo, yy = m.groups()
        s = shift_date(year4(yy), int(mo), 15, shift)  # month precision: the mid-month day is shifted
        add(m, s and f"{_pad(mo, s.month)}/{s.year % 100:02d}")
    for m in p.regex["date_dmon"].finditer(text):
        d, suf, sp1, mon, dot, sp2, y = m.groups()
        s = shift_date(year4(y), p.month_num[mon.lower()], int(d), shift)
        new = None
        if s is not None:
            suffix = _same_case(suf, _ordinal(s.day)) if suf else ""
            year = f"{s.year}" if len(y) == 4 else f"{s.year % 100:02d}"
            new = f"{_pad(d, s.day, False)}{suffix}{sp1}{_month_word(p, mon, s.month)}{dot}{sp2}{year}"
        add(m, new)
    # a year alone cannot be shifted by days: removed (fail-closed), like a date without a format
    if with_year:  # a year is four digits: a text without a run of four is not scanned
        hits.extend(Hit(m.start("year"), m.end("year"), "DATE", red) for m in p.regex["date_year"].finditer(text))
    for m in p.regex["date_apostrophe_year"].finditer(text):
        g = 1 if m.group(1) else 2
        hits.append(Hit(m.start(g), m.end(g), "DATE", red))
    return hits


# ---------------------------------------------------------------- names
def _name_components(value: str) -> list[str]:
    """Name parts of 2+ characters; a single character counts in scripts without Latin initials
    (the Chinese surname "王"). Alphabetic and ideographic groups of DICOM PN (``=``) are split too."""
    parts = re.split(r"[\^,=\s]+", value)
    return [c for c in parts if len(c.rstrip(".")) >= 2 or (len(c) == 1 and ord(c) > 0x2E7F)]


def _name_run_regex(components: set[str], case_insensitive: bool) -> re.Pattern[str] | None:
    if not components:
        return None
    alt = "|".join(re.escape(c) for c in sorted(components, key=len, reverse=True))
    word = rf"(?:{alt})"
    sep = r"(?:[ \t]*[,^][ \t]*|[ \t]+)"
    pattern = rf"(?<![\w])(?:[A-Z]\.[ \t]*)?{word}(?:{sep}(?:{word}|[A-Z]\.(?=[ \t])))*(?![\w])"
    return re.compile(pattern, re.IGNORECASE if case_insensitive else 0)


def _contextual_names(text: str, p: _Patterns) -> tuple[list[Hit], set[str]]:
    """Names after titles / signature labels and before degrees; returns hits and learned words."""
    name_tok = p.tokens["NAME"]
    hits: list[Hit] = []
    learned: set[str] = set()
    lex = load_lexicon()

    def safe(word: str) -> bool:
        """A known-safe word (common English or clinical, no name): never part of a name ("DR KNEE", "HAS")."""
        low = word.lower().rstrip(".")
        return len(low) > 1 and lex.word_class(low) == SAFE

    def take(name: str, start: int) -> tuple[int, int] | None:
        words = name.replace(",", " ").split()
        keep: list[str] = []
        for w in words:
            low = w.lower().rstrip(".")
            if (low in p.stopwords or low in p.month_num or safe(w)) and not re.fullmatch(r"[A-Z]\.", w):
                break  # a name ends at a stopword or a month ("Dr. X Y, Sep 30"); "A." is an initial
            keep.append(w)
        if not keep or all(len(w.rstrip(".")) < 2 for w in keep):
            return None
        learned.update(w for w in keep if len(w.rstrip(".")) >= 3)
        # the end on the original text (words may be separated by tabs or several spaces)
        m = re.match(r"(?:,[ \t]*|[ \t]*)".join(re.escape(w) for w in keep), text[start:])
        return (start, start + m.end()) if m else None

    (title_gate, title_re), (label_gate, label_re), (degree_gate, degree_re) = p.contextual
    for m in title_re.finditer(text) if title_gate.search(text) else ():
        span = take(m.group("name"), m.start("name"))
        if span:
            t = m.group("title")
            # the title as written ("DR", "dr."); "Dr" and "Doctor" in mixed case become "Dr."
            is_doctor = t.rstrip(".") in ("Dr", "Doctor")
            repl = f"Dr. {name_tok}" if is_doctor else f"{t} {name_tok}"
            hits.append(Hit(m.start("title"), span[1], "NAME", repl))
    # the label in any case, the name capitalised
    for m in label_re.finditer(text) if label_gate.search(text) else ():
        span = take(m.group("name"), m.start("name"))
        if span:
            hits.append(Hit(span[0], span[1], "NAME", name_tok))
    for m in degree_re.finditer(text) if degree_gate.search(text) else ():
        words = m.group("name").split()
        # keep the words closest to the degree that are not stopwords
        tail: list[str] = []
        for w in reversed(words):
            if w.lower().rstrip(".") in p.stopwords or safe(w):
                break
            tail.insert(0, w)
        if tail and any(len(w.rstrip(".")) >= 2 for w in tail):
            start = m.end("name") - len(" ".join(tail))
            sub = re.search(r"[ \t]*".join(re.escape(w) for w in tail) + r"$", m.group("name"))
            if sub:
                start = m.start("name") + sub.start()
            learned.update(w for w in tail if len(w.rstrip(".")) >= 3)
            hits.append(Hit(start, m.end("name"), "NAME", name_tok))
    return hits, learned


# ---------------------------------------------------------------- phones
_PHONE_GATE = re.compile(r"\d{3}\D{0,3}\d{3}")
_ZIP4 = re.compile(r"\d{5}-\d{4}")
_NUMBER_GATE = re.compile(r"\d[\d .()/-]{3,}\d")
_AGE_GATE = re.compile(r"(?<!\d)(?:9\d|1[0-4]\d)(?!\d)|ninety|hundred", re.IGNORECASE)


def _phone_hits(text: str, regions: tuple[str, ...], token: str) -> list[Hit]:
    """Telephone numbers of the given regions found by ``phonenumbers`` (Google's libphonenumber) with the
    ``VALID`` matcher (a number that is valid for the region: area code and length), whatever the separators
    (``201/324/1423``, ``202 2671093``), with extensions (``x45``). Texts without two groups of three digits
    are skipped (no number can match)."""
    if not _PHONE_GATE.search(text):
        return []
    import phonenumbers

    hits = []
    for region in regions:
        for m in phonenumbers.PhoneNumberMatcher(text, region, leniency=phonenumbers.Leniency.VALID):
            if not _ZIP4.fullmatch(m.raw_string):  # a US ZIP+4 code ("02115-1234") is part of an address
                hits.append(Hit(m.start, m.end, "PHONE", token))
    return hits


# ---------------------------------------------------------------- main
def _regex_hits(text: str, pattern: re.Pattern[str] | list[re.Pattern[str]], kind: str, token: str) -> list[Hit]:
    """Hits of one pattern (or list); a named group ``value`` narrows the replaced span to that group."""
    patterns = pattern if isinstance(pattern, list) else [pattern]
    hits = []
    for pat in patterns:
        group = "value" if "value" in pat.groupindex else 0
        hits.extend(Hit(m.start(group), m.end(group), kind, token) for m in pat.finditer(text))
    return hits


def deidentify_text(
    text: str,
    *,
    known_phi: list[str],
    date_shift_days: int | None,
    day_first: bool = False,
    patterns_path: str | None = None,
    language: str = "en",
    phone_regions: tuple[str, ...] = ("US", "GB", "IE", "AU"),
) -> tuple[str, dict[str, int]]:
    """Remove PHI from report text.

    Parameters
    ----------
    text : str
        Report text (may hold PHI).
    known_phi : list of str
        PHI values known from the DICOM header / source record. Values with a digit are ids (PatientID,
        AccessionNumber: replaced verbatim, case-insensitive, as ``[ID]``); others are person names in
        DICOM PN form (``"DOE^JOHN"``) or free form (``"John Doe"``): every run of their components
        (2+ characters) in any order and case (``"John Doe"``, ``"Doe, John"``, ``"JOHN DOE"``,
        ``"Mr. Doe"``) becomes ``[NAME]``.
    date_shift_days : int or None
        Days to add to every date (the patient's offset, may be negative). Dates keep their format
        (``03/14/2023``, ``14/03/2023``, ``2023-03-14``, ``20230314``, ``14 March 2023``,
        ``March 14, 2023``, ``Mar 14 2023``, ``March 2023``). None: every date becomes ``[DATE]``.
        Dates without a year, or that are not valid calendar dates, always become ``[DATE]``.
    day_first : bool, default False
        How to read an ambiguous numeric date (both numbers <= 12): ``True`` = DD/MM/YYYY (GB, IE, AU),
        ``False`` = MM/DD/YYYY (US). Unambiguous dates (``14/03/2023``) are read either way.
    patterns_path : str, optional
        Alternative ``phi_patterns.json``.
    language : str, default "en"
        Language of month names.

    Returns
    -------
    text : str
        De-identified text. Replacement tokens: ``[NAME]`` (``Dr. [NAME]`` after Dr/Doctor), ``[ID]``
        (labels such as ``MRN:`` are kept), ``[DATE]``, ``[PHONE]``, ``[EMAIL]``, ``[URL]``,
        ``[ORGANIZATION]``, ``[ADDRESS]``; shifted dates in place of the originals.
    counts : dict of str to int
        Number of replacements per PHI type (``NAME``, ``ID``, ``DATE``, ``PHONE``, ``EMAIL``, ``URL``,
        ``ORGANIZATION``, ``ADDRESS``); only types with at least one replacement appear. A shifted date
        counts as a ``DATE`` replacement.

    Raises
    ------
    PhiPatternsError
        If the patterns file is malformed or lacks month names for ``language``.
    """
    p = _load(patterns_path, language)
    tok = p.tokens
    ids = [v.strip() for v in known_phi if v and v.strip() and any(ch.isdigit() for ch in v)]
    names = [v for v in known_phi if v and v.strip() and not any(ch.isdigit() for ch in v)]

    groups: list[list[Hit]] = []
    groups.append(_regex_hits(text, p.regex["email"], "EMAIL", tok["EMAIL"]))
    groups.append(_regex_hits(text, p.regex["url"], "URL", tok["URL"]))
    # IP addresses, IBANs and card numbers (checksums) before dates and phones read their digits
    groups.append(
        [
            Hit(a, b, k, tok[k])
            for rec in NUMBER_RECOGNISERS
            for a, b, k in ((a, b, "ACCOUNT" if k in ("IBAN", "CARD") else k) for a, b, k in rec(text))
        ]
    )
    for v in sorted(ids, key=len, reverse=True):
        known = re.compile(rf"(?<![A-Za-z0-9]){re.escape(v)}(?![A-Za-z0-9])", re.IGNORECASE)
        groups.append(_regex_hits(text, known, "ID", tok["ID"]))
    # a birth date is removed, not shifted; ages over 89 become "90+" (HIPAA Safe Harbor)
    groups.append(_regex_hits(text, p.regex["date_of_birth"], "DATE", tok["DATE"]))
    if _AGE_GATE.search(text):  # every age pattern needs 90-149 or a written-out age
        groups.append(_regex_hits(text, p.regex["age_over_89"], "AGE", tok["AGE"]))
    groups.append(_date_hits(text, p, date_shift_days, day_first))
    groups.append(_regex_hits(text, p.regex["labelled_id"], "ID", tok["ID"]))
    if _NUMBER_GATE.search(text):  # every phone pattern needs a run of 4+ digits and separators
        groups.append(
            _regex_hits(text, p.regex["phone"], "PHONE", tok["PHONE"]) + _phone_hits(text, phone_regions, tok["PHONE"])
        )
    # a street address with its city, state and ZIP is one hit, taken before long numbers (a ZIP+4
    # "02115-1234" would otherwise be an [ID] and leave the street and city behind)
    groups.append(
        _regex_hits(text, p.regex["address"], "ADDRESS", tok["ADDRESS"])
        + [Hit(a, b, k, tok[k]) for rec in ADDRESS_RECOGNISERS for a, b, k in rec(text)]
    )
    groups.append(_regex_hits(text, p.regex["long_number"], "ID", tok["ID"]))
    # organisations by their cue word and by their legal form, longest first ("University Hospital Clarkeville")
    groups.append(
        _regex_hits(text, p.regex["organization"], "ORGANIZATION", tok["ORGANIZATION"])
        + [Hit(a, b, k, tok[k]) for rec in ORGANIZATION_RECOGNISERS for a, b, k in rec(text)]
    )
    groups.append(_regex_hits(text, p.regex["postcode"], "ADDRESS", tok["ADDRESS"]))
    # every name finding competes in one group, longest span first, so "Walker, Matilda R." (known from
    # the header) wins over the shorter "Walker" found after a "PATIENT:" label
    context_hits, learned = _contextual_names(text, p)
    name_hits = list(context_hits)
    known_components = {c for v in names for c in _name_components(v)}
    known_re = _name_run_regex(known_components, case_insensitive=True)
    if known_re is not None:
        name_hits += _regex_hits(text, known_re, "NAME", tok["NAME"])
    learned -= {c for c in learned if c.lower() in {k.lower() for k in known_components}}
    # a learned word that is also a common or clinical word is removed only where it stands as a name
    # (after the title or label it was learned from), never elsewhere ("White matter" after "Dr White")
    lex = load_lexicon()
    learned = {c for c in learned if lex.word_class(c.lower().rstrip(".")) not in (SAFE, AMBIG)}
    # learned words (from "Dr. X", "X, MD", "Signed by X") are matched in Title or UPPER case only
    learned_forms = {f for w in learned for f in (w, w.upper(), w.capitalize())}
    learned_re = _name_run_regex(learned_forms, case_insensitive=False)
    if learned_re is not None:
        name_hits += _regex_hits(text, learned_re, "NAME", tok["NAME"])
    # fail-closed word lists: names and places outside the known-safe vocabulary (entity_extraction.deid.lexicon),
    # in the same group, so the longest finding wins ("Patient name: Ruby White")
    lex_tokens = {"NAME": tok["NAME"], "LOCATION": tok.get("LOCATION", "[LOCATION]")}
    guarded = protected_spans(text)
    name_hits += [Hit(a, b, k, lex_tokens[k]) for a, b, k in lexical_hits(text, guarded=guarded)]
    # clinical phrases of the lexicon ("DR KNEE", "White matter", "Baker cyst") are never a name
    if guarded:
        name_hits = [h for h in name_hits if not any(a < h.end and h.start < b for a, b in guarded)]
    groups.append(name_hits)

    accepted, taken = accept(groups, len(text))  # earlier groups win; within a group longer spans first
    # a postcode beside a place found above (", Port Alex 2519", "69074 Augsburg"): a bare number only there
    places = [(h.start, h.end) for h in accepted if h.kind in ("ADDRESS", "LOCATION", "ORGANIZATION")]
    for a, b, _k in postcodes_beside(text, places) if places else ():
        if not any(taken[a:b]):
            accepted.append(Hit(a, b, "ADDRESS", tok["ADDRESS"]))
            taken[a:b] = b"\x01" * (b - a)
    return render(text, accepted)
