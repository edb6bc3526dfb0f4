"""Identifiers found by libraries, checksums and written forms (the recognisers of :mod:`.scrubber` beside the
name rules). Each recogniser is one function ``text -> [(start, end, kind)]``; :data:`RECOGNISERS` lists them in
the order the scrubber runs them (an earlier hit wins an overlap).

Sources: IP addresses are validated by :mod:`ipaddress`; IBANs by their ISO 13616 check digits (mod 97 = 1, ISO 7064)
and country length; card numbers by the Luhn checksum (ISO/IEC 7812-1); street addresses by the street types of
``usaddress`` (its ``STREET_NAMES``, from USPS Publication 28) and by the German, French and Spanish street words of
``address_patterns.json``; postcodes by the national formats there (UK, Eircode, AU, DE, FR, ES, US ZIP), taken
only beside an address, a city, a state or a postcode label, since a bare four- or five-digit number is no
postcode on its own.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from schemas.errors import ReasonCodedError

PATTERNS_FILE = Path(__file__).with_name("address_patterns.json")

Hit = tuple[int, int, str]


class AddressPatternsError(ReasonCodedError, ValueError):
    """``address_patterns.json`` is malformed (reason code ``address_patterns_invalid``)."""

    default_reason = "address_patterns_invalid"
    message_format = "{message}"


@dataclass(frozen=True)
class _Compiled:
    street_us: re.Pattern[str]
    street_words: frozenset[str]
    street_eu: tuple[re.Pattern[str], ...]
    street_eu_gate: tuple[str, ...]
    locality: re.Pattern[str]
    postcode_labelled: re.Pattern[str]
    company: re.Pattern[str]
    institution_prefix: re.Pattern[str]
    institution_suffix: re.Pattern[str]
    phones: tuple[re.Pattern[str], ...]
    postcode_after: re.Pattern[str]
    postcode_before: re.Pattern[str]
    iban_lengths: dict[str, int]


@lru_cache(maxsize=2)
def _compiled(path: str | None = None) -> _Compiled:
    try:
        import usaddress

        data = json.loads(Path(path or PATTERNS_FILE).read_text(encoding="utf-8"))
        words = frozenset(w.lower() for w in usaddress.STREET_NAMES) | frozenset(data["extra_street_types"])
        name = data["street_name_word"]
        postcode = "|".join(f"(?:{p})" for p in data["postcodes"].values())
        city = data["city_words"]
        types = "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))
        return _Compiled(
            street_us=re.compile(
                data["street_us"].replace("{NAME}", name).replace("{TYPE}", f"(?=[A-Z][a-z])(?i:{types})")
            ),
            street_words=words,
            street_eu=tuple(re.compile(p.replace("{NAME}", name)) for p in data["street_eu"]),
            street_eu_gate=tuple(w.lower() for w in data["street_eu_words"]),
            locality=re.compile(
                data["locality"]
                .replace("{CITY}", city)
                .replace("{POSTCODE}", postcode)
                .replace("{STATE}", "|".join(data["us_states"]))
            ),
            postcode_labelled=re.compile(data["postcode_labelled"].replace("{POSTCODE}", postcode), re.IGNORECASE),
            company=re.compile(data["company"].replace("{NAME}", name)),
            institution_prefix=re.compile(data["institution_prefix"].replace("{CITY}", city)),
            institution_suffix=re.compile(data["institution_suffix"].replace("{NAME}", name)),
            phones=tuple(re.compile(data[k]) for k in ("phone_international", "phone_extension", "phone_cued")),
            postcode_after=re.compile(rf",?[ \t]+(?P<code>{postcode})"),
            postcode_before=re.compile(rf"(?P<code>{postcode})[ \t]+"),
            iban_lengths={k: int(v) for k, v in data["iban_lengths"].items()},
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError, re.error) as exc:
        raise AddressPatternsError(f"address patterns file is malformed: {exc!r}") from exc


# ---------------------------------------------------------------- network and account numbers
_HOUSE_GATE = re.compile(r"\d[ \t,]+[A-Z][a-z]|\b(?:Flat|Unit|Suite|Studio|Apt|Apartment|Ste)\b")
_IPV4 = re.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?![\w]|\.\d)")
_IPV6 = re.compile(r"(?<![\w:])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![\w:])")
_IBAN = re.compile(r"(?<![A-Za-z0-9])([A-Z]{2}\d{2}(?:[ ]?[A-Z0-9]){11,30})(?![A-Za-z0-9])")
_CARD = re.compile(r"(?<![\d.,-])\d(?:[ -]?\d){12,18}(?![\d]|[.,]\d)")
# gates without look-behinds (a text without a match of the gate has no match of the pattern; much faster scans)
_IPV4_GATE = re.compile(r"\d\.\d{1,3}\.\d{1,3}\.\d")
_IPV6_GATE = re.compile(r"[0-9A-Fa-f]?:[0-9A-Fa-f]{0,4}:")
_IBAN_GATE = re.compile(r"[A-Z]{2}\d\d")
_CARD_GATE = re.compile(r"\d(?:[ -]?\d){12}")


def ip_addresses(text: str) -> list[Hit]:
    """IP: IPv4 and IPv6 addresses that :mod:`ipaddress` accepts. Example: "Workstation 10.2.33.4", "fe80::1"."""
    hits = []
    patterns = [rx for rx, gate in ((_IPV4, _IPV4_GATE), (_IPV6, _IPV6_GATE)) if gate.search(text)]
    for rx in patterns:
        for m in rx.finditer(text):
            if rx is _IPV6 and m.group().count(":") < 2:
                continue
            try:
                ipaddress.ip_address(m.group())
            except ValueError:
                continue
            hits.append((m.start(), m.end(), "IP"))
    return hits


def iban_valid(candidate: str, lengths: dict[str, int] | None = None) -> bool:
    """ISO 13616 check: the country's length (when known) and the ISO 7064 mod-97 remainder 1 of the number with
    its first four characters moved to the end and letters as 10-35. Example: ``GB82WEST12345698765432`` is valid."""
    iban = candidate.replace(" ", "").upper()
    if lengths is not None and iban[:2] in lengths and len(iban) != lengths[iban[:2]]:
        return False
    digits = "".join(str(int(ch, 36)) for ch in iban[4:] + iban[:4])
    return int(digits) % 97 == 1


def ibans(text: str) -> list[Hit]:
    """IBAN: international bank account numbers with valid check digits. Example: "IBAN GB82 WEST 1234 5698 7654
    32"."""
    if not _IBAN_GATE.search(text):
        return []
    lengths = _compiled().iban_lengths
    hits = []
    for m in _IBAN.finditer(text):
        value = m.group(1).rstrip()
        if iban_valid(value, lengths):
            hits.append((m.start(1), m.start(1) + len(value), "IBAN"))
    return hits


def luhn_valid(number: str) -> bool:
    """Luhn checksum (ISO/IEC 7812-1) of a digit string. Example: ``4111111111111111`` is valid."""
    total = 0
    for i, ch in enumerate(reversed(number)):
        d = int(ch)
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def card_numbers(text: str) -> list[Hit]:
    """CARD: payment card numbers of 13-19 digits (spaces or dashes between) that pass the Luhn check. Example:
    "card 4111 1111 1111 1111"."""
    hits = []
    for m in _CARD.finditer(text) if _CARD_GATE.search(text) else ():
        digits = re.sub(r"\D", "", m.group())
        if 13 <= len(digits) <= 19 and luhn_valid(digits):
            hits.append((m.start(), m.end(), "CARD"))
    return hits


# ---------------------------------------------------------------- places and organisations
_PHONE_SHAPE_GATE = re.compile(r"\d[\d ()./-]{5,}\d")


def phone_shapes(text: str) -> list[Hit]:
    """PHONE: a telephone number by its form (an international prefix "+33 (0)6 23 40 71 70", "0049 ...", an
    extension "(286)855-8650x8639") or after a telephone word ("phone (01073) 717865", "call at 555 0142"), 7 to
    15 digits, whether or not ``phonenumbers`` finds it valid for a region."""
    if not _PHONE_SHAPE_GATE.search(text):
        return []
    hits = []
    for rx in _compiled().phones:
        group = "num" if "num" in rx.groupindex else 0
        for m in rx.finditer(text):
            if 7 <= sum(ch.isdigit() for ch in m.group(group)) <= 18:
                hits.append((m.start(group), m.end(group), "PHONE"))
    return hits


def _with_locality(text: str, start: int, end: int, c: _Compiled) -> list[Hit]:
    """The street hit and what follows it: a city, a state, a postcode (", Port Alex 2519", ", 69074 Augsburg")."""
    hits = [(start, end, "ADDRESS")]
    m = c.locality.match(text, end)
    if m:
        hits.append((m.start("place"), m.end("place"), "ADDRESS"))
    return hits


def street_addresses(text: str) -> list[Hit]:
    """ADDRESS: a street address with its locality. English form: house number, capitalised name words and a
    street type of ``usaddress`` (USPS Publication 28: Street, Cape, Crossroad ...), maybe a flat or suite first;
    German, French and Spanish forms: street word and number ("Drubinstraße 47", "802, boulevard Gaudin", "Calle
    Mayor 5"). Example: "lives at 62 Geraldine Cape, Port Alex 2519"."""
    c = _compiled()
    hits: list[Hit] = []
    if _HOUSE_GATE.search(text):  # a number before a capitalised word, or a flat/suite word: else no match
        for m in c.street_us.finditer(text):
            hits += _with_locality(text, m.start(), m.end(), c)
    low = text.lower()
    if any(w in low for w in c.street_eu_gate):  # every form names its street word
        for rx in c.street_eu:
            for m in rx.finditer(text):
                if _outside_safe(text, m.start(), m.end(), strict=True):  # "During 3", "Wearing 70" are no street
                    hits += _with_locality(text, m.start(), m.end(), c)
    return hits


def labelled_postcodes(text: str) -> list[Hit]:
    """POSTCODE after its label. Example: "ZIP 02115", "postcode SW1A 1AA", "PLZ 69074"."""
    low = text.lower()
    if not any(w in low for w in ("zip", "post", "plz", "code")):
        return []
    return [(m.start("code"), m.end("code"), "ADDRESS") for m in _compiled().postcode_labelled.finditer(text)]


#: a part of every legal form of ``company`` and of every cue of ``institution_prefix`` (texts without one skip them)
_LEGAL_FORM_GATE = (
    "Ltd",
    "Limited",
    "LLC",
    "L.L.C.",
    "Inc",
    "PLC",
    "plc",
    "LLP",
    "Corp",
    "GmbH",
    "AG",
    "KG",
    "OHG",
    "SARL",
    "S.A",
    "SAS",
    "S.L",
    "S.Coop",
    "Group",
    "Holdings",
    "Sons",
    "Brothers",
    "Bros",
)
_INSTITUTION_GATE = (
    "Hospital",
    "Klinikum",
    "Krankenhaus",
    "Hôpital",
    "Hopital",
    "Clinique",
    "Centre",
    "Clínica",
    "University",
    "Universitätsklinikum",
    "Policl",
    "Center",
    "Clinic",
    "Infirmary",
    "Home",
    "Hospice",
    "School",
    "College",
    "Academy",
)
_WORD = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)*")


def _outside_safe(text: str, start: int, end: int, strict: bool = False) -> list[re.Match[str]]:
    """The words of ``text[start:end]`` outside plain known-safe English (:mod:`.lexicon`); ``strict``: outside the
    ambiguous words too (common words that are also names: "Wearing")."""
    from entity_extraction.deid.lexicon import AMBIG, SAFE, load_lexicon

    lex = load_lexicon()
    safe = (SAFE, AMBIG) if strict else (SAFE,)
    return [w for w in _WORD.finditer(text, start, end) if lex.word_class(w.group().lower()) not in safe]


_SAINT_BEFORE = re.compile(r"(?:St\.?|Saint|Mount|Mt\.?|San|Santa)[ \t]+$")


def _named(text: str, hits: list[Hit]) -> list[Hit]:
    """Hits that hold a word outside plain known-safe English, cut to start at the first such word ("At Shaw
    Ltd" -> "Shaw Ltd"; "Study Group" is dropped)."""
    out = []
    for start, end, kind in hits:
        named = _outside_safe(text, start, end)
        if named:
            head = _SAINT_BEFORE.search(text, start, named[0].start())
            out.append((head.start() if head else named[0].start(), end, kind))
    return out


def postcodes_beside(text: str, places: list[tuple[int, int]]) -> list[Hit]:
    """POSTCODE right after a place or address found by another rule (", Port Alex 2519"), or right before it
    ("69074 Augsburg"): any postcode form of ``address_patterns.json``, a bare number only there.

    Parameters
    ----------
    places : list of (start, end)
        Spans of places, addresses and organisations already found.
    """
    c = _compiled()
    hits = []
    for start, end in places:
        m = c.postcode_after.match(text, end)
        if m:
            hits.append((m.start("code"), m.end("code"), "ADDRESS"))
        m = c.postcode_before.search(text, max(0, start - 12), start)
        if m and m.end() == start:
            hits.append((m.start("code"), m.end("code"), "ADDRESS"))
    return hits


def companies(text: str) -> list[Hit]:
    """ORGANIZATION: one to four capitalised words before a legal form (Ltd, LLC, Inc, PLC, GmbH, AG, SARL, S.L.,
    and Sons). Example: "works at Shaw Ltd", "Fischer, Rose and Wright LLP", "Meyer GmbH & Co. KG"."""
    if not any(w in text for w in _LEGAL_FORM_GATE):
        return []
    return _named(text, [(m.start(), m.end(), "ORGANIZATION") for m in _compiled().company.finditer(text)])


def institution_prefixes(text: str) -> list[Hit]:
    """ORGANIZATION: a hospital or university word followed by a place name ("University Hospital Clarkeville",
    "Klinikum Augsburg", "Hôpital Saint-Louis", "Hospital Universitario La Paz"), or name words before a hospital,
    clinic or school word ("Altötting General Hospital", "St. Elías Medical Center", "Kerry High School")."""
    if not any(w in text for w in _INSTITUTION_GATE):
        return []
    c = _compiled()
    hits = [
        (m.start(), m.end(), "ORGANIZATION")
        for m in c.institution_prefix.finditer(text)
        if _outside_safe(text, m.end("cue"), m.end())
    ]
    return hits + _named(text, [(m.start(), m.end(), "ORGANIZATION") for m in c.institution_suffix.finditer(text)])


#: recognisers of numbers, run before the dates and phone numbers (in this order)
NUMBER_RECOGNISERS: tuple[Callable[[str], list[Hit]], ...] = (ip_addresses, ibans, card_numbers, phone_shapes)
#: recognisers of addresses, run before the long numbers (a ZIP code is no id)
ADDRESS_RECOGNISERS: tuple[Callable[[str], list[Hit]], ...] = (street_addresses, labelled_postcodes)
#: recognisers of organisations, run with the organisation pattern (the longest finding wins)
ORGANIZATION_RECOGNISERS: tuple[Callable[[str], list[Hit]], ...] = (companies, institution_prefixes)
