"""The fail-closed name and place rules of report text, one rule per function, run in a listed order.

Design (Philter, Norgeot et al., npj Digit Med 2020;3:57; the PhysioNet deid package, Neamatullah et al., BMC Med
Inform Decis Mak 2008;8:32): what is not known to be safe and looks like a name or a place is removed. Word
classes and cue lists are those of :mod:`entity_extraction.deid.lexicon`.

:func:`lexical_hits` tokenises the text into words (:class:`Scan`), then runs for every word, left to right, the
rules of :data:`WORD_RULES` in their order (a word of plain known-safe English that is no cue only those of
:data:`PLAIN_WORD_RULES`); a word marked by an earlier rule keeps its mark. Then the passes of :data:`TEXT_RULES`
run once over the whole text, and adjacent marked words become one span.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable
from dataclasses import dataclass

from entity_extraction.deid.lexicon import (
    AMBIG,
    FIRST,
    LAST,
    PLACE,
    PROPER,
    SAFE,
    UNKNOWN,
    WORD,
    Lexicon,
    load_lexicon,
    protected_spans,
)

_UPPER = re.compile(r"[^\W\d_a-zß-öø-ÿ]")
_LOWER = re.compile(r"[a-zß-öø-ÿ]")
#: deletion tables: in ASCII text ``_UPPER`` matches A-Z and ``_LOWER`` a-z
_DROP_ASCII_UPPER = str.maketrans("", "", string.ascii_uppercase)
_DROP_ASCII_LOWER = str.maketrans("", "", string.ascii_lowercase)
_NAME_GAP = re.compile(r"[ \t]{0,3}(?:\.[ \t]{0,3})?|-|'[ \t]?")
_CUE_GAP = re.compile(r"[ \t]*(?:[:,(\"'/-][ \t]*)?|[ \t]*(?:\.|,)[ \t]*|[ \t]*\([ \t]*")
_STRONG_ROLES = frozenset({"np", "ho", "nurse", "resident", "intern", "fellow", "rabbi", "attending"})
#: cue words after which an initial and a rare ambiguous surname are a name ("per d ross", "paged J Spears")
_NAME_VERBS = frozenset(
    {
        "per",
        "by",
        "called",
        "paged",
        "notified",
        "informed",
        "contacted",
        "spoke",
        "told",
        "asked",
        "cc",
        "attn",
        "signed",
        "dictated",
    }
)
#: verbs that follow a person's name ("J SMITH ORDERED", "grace dudak aware")
_AFTER_NAME_VERBS = frozenset(
    {
        "aware",
        "ordered",
        "notified",
        "paged",
        "called",
        "said",
        "states",
        "stated",
        "saw",
        "examined",
        "evaluated",
        "requested",
        "recommends",
        "recommended",
        "agrees",
        "agreed",
        "spoke",
        "updated",
        "informed",
        "reviewed",
        "consulted",
        "discussed",
    }
)
#: verbs whose object is a place without a preposition ("NEED TO LEAVE GH"); only upper-case acronyms follow
_DIRECT_PLACE_VERBS = frozenset({"leave", "leaving", "reach", "reached", "enter", "entered", "entering"})
#: a ward or floor number after a building name: one digit, maybe a letter, no dose or decimal ("QUARTERMAIN 6;")
_WARD = re.compile(
    r"[ \t]?\d[A-Za-z]?(?![\w,/%]|\.\d|[ \t]*(?:mg|mcg|ml|cc|units?|u|g|meq|mmol|mm|cm|kg|mcq|l)\b)", re.IGNORECASE
)
#: gaps between words, compiled once (the rules test them for every word)
_GAP_COMMA_SLASH_PAREN = re.compile(r"[ \t]*,?[ \t]*|/|[ \t]*\([ \t]*")
_GAP_SPACE_AT = re.compile(r"[ \t]{1,3}|[ \t]*@[ \t]*")
_GAP_PAREN = re.compile(r"[ \t]*\([ \t]*")
_GAP_COMMA_SLASH = re.compile(r"[ \t]*,?[ \t]*|/")
_GAP_DOT = re.compile(r"\.[ \t]{0,2}")
_GAP_DOT_SPACE = re.compile(r"\.?[ \t]")
_GAP_COMMA = re.compile(r",[ \t]*")
_GAP_PAIR = re.compile(r"[ \t]{1,3}|\.[ \t]?|'|['’]s[ \t]{1,2}")
_GAP_POSSESSIVE = re.compile(r"(?:['’]s)?[ \t]+")
_GAP_SPACES3 = re.compile(r"[ \t]{1,3}")
_GAP_SPACES2 = re.compile(r"[ \t]{1,2}")
_GAP_SPACE_DASH_AT = re.compile(r"[ \t]{1,3}|[ \t]*-[ \t]*|[ \t]*@[ \t]*")
_PLACEHOLDER = re.compile(r"x+")
_DIGIT_AFTER = re.compile(r"[ \t]?\d")
_NAMEISH = (FIRST, LAST, UNKNOWN, PLACE, PROPER)
_SAINTS = ("of", "st", "saint", "mt", "mount")


@dataclass(slots=True)
class _Tok:
    start: int
    end: int
    text: str
    low: str
    cls: int
    protected: bool


def _tokens(text: str, lex: Lexicon, guarded: list[tuple[int, int]]) -> list[_Tok]:
    guard = bytearray(len(text))
    for a, b in guarded:
        guard[a:b] = b"\x01" * (b - a)
    toks: list[_Tok] = []
    append, class_of = toks.append, lex.classes.get
    for m in WORD.finditer(text):
        word = m.group()
        start, end = m.span()
        if len(word) > 2 and word[-2] in "'’" and word[-1] in "sS":
            end -= 2
            word = word[:-2]
        low = word.lower()
        cls = class_of(low)
        if cls is None:
            cls = UNKNOWN if len(low) > 1 else SAFE
        append(_Tok(start, end, word, low, cls, guard[start] == 1))
    return toks


def _titled(word: str) -> bool:
    """Capitalised and not all upper case ("Kernan", not "KERNAN")."""
    return word[:1].isupper() and not word.isupper()


def _sentence_start(text: str, pos: int) -> bool:
    j = pos - 1
    while j >= 0 and text[j] in " \t":
        j -= 1
    return j < 0 or text[j] in '.!?:;\n*-"()[]#>=+/0123456789'


def _nameish(t: _Tok, allow_ambiguous: bool = True) -> bool:
    if t.protected:
        return False
    return t.cls in _NAMEISH or (allow_ambiguous and t.cls == AMBIG)


def _same_case(a: _Tok, b: _Tok) -> bool:
    """Both words in the same case style (Mary Hulse, grace dudak, HO SCHWARZ)."""
    return (
        (a.text.isupper() and b.text.isupper())
        or (a.text.islower() and b.text.islower())
        or (_titled(a.text) and _titled(b.text))
    )


class Scan:
    """One text being scanned: its words, their marks (``"NAME"``, ``"LOCATION"`` or None) and the helpers the
    rules share. ``mixed``: the text is in mixed case (under 60 % of its letters upper case), so capitals
    carry meaning."""

    def __init__(self, text: str, lex: Lexicon, guarded: list[tuple[int, int]]) -> None:
        self.text = text
        self.lex = lex
        self.toks = _tokens(text, lex, guarded)
        self.n = len(self.toks)
        self.kind: list[str | None] = [None] * self.n
        if text.isascii():  # the same counts as the patterns below, without a list of every letter
            upper = len(text) - len(text.translate(_DROP_ASCII_UPPER))
            lower = len(text) - len(text.translate(_DROP_ASCII_LOWER))
            self.mixed = upper < 0.6 * (upper + lower) and lower > 0
        else:
            upper = len(_UPPER.findall(text))
            self.mixed = upper < 0.6 * (upper + len(_LOWER.findall(text))) and _LOWER.search(text) is not None

    def gap(self, a: int, b: int) -> str:
        """Text between word a and word b."""
        return self.text[self.toks[a].end : self.toks[b].start]

    def mark(self, i: int, k: str) -> None:
        """Mark word i as ``k`` unless it is protected or already marked."""
        if not self.toks[i].protected and self.kind[i] is None:
            self.kind[i] = k

    def mark_all(self, idx, k: str) -> None:
        for j in idx:
            self.mark(j, k)

    def is_initial(self, i: int) -> bool:
        """A one-letter word followed by a period or by a name-like word (``B. KARGAS``, ``J SMITH``, ``B Muse``)."""
        t, text = self.toks[i], self.text
        if len(t.text) != 1:
            return False
        if text[t.end : t.end + 1] == ".":
            return True
        if i + 1 >= self.n or text[t.end : self.toks[i + 1].start] != " ":
            return False
        nxt = self.toks[i + 1]
        return nxt.cls in (FIRST, LAST) or (nxt.low in self.lex.rare_names and nxt.text[:1].isupper())

    def run_after(self, i: int, allow_ambiguous: bool = True, limit: int = 3) -> list[int]:
        """Name-like words right after word i (initials and particles inside)."""
        toks, out, j = self.toks, [], i + 1
        while j < self.n and len(out) < limit:
            gap = self.gap(j - 1, j)
            if out and "." in gap and len(toks[j - 1].text) > 1:
                break  # a period after a whole word ends the sentence, not the name ("Quenneville. Heart")
            if not _NAME_GAP.fullmatch(gap if out else gap.strip(" \t.:,(\"'") or gap.strip()):
                if out or not _CUE_GAP.fullmatch(gap):
                    break
            t = toks[j]
            if out and self.mixed and t.text.islower() and not toks[out[-1]].text.islower() and gap != "-":
                break  # "Mr. Boone works": a lower-case word does not continue a capitalised name in mixed text
            if (
                self.is_initial(j)
                or (out and t.low in self.lex.particles and j + 1 < self.n)
                or _nameish(t, allow_ambiguous)
            ):
                out.append(j)
            else:
                break
            j += 1
        while out and (len(toks[out[-1]].text) == 1 or toks[out[-1]].low in self.lex.particles):
            out.pop()
        return out

    def run_before(self, i: int, limit: int = 3) -> list[int]:
        """Name-like words right before word i (initials inside, no credential)."""
        toks, out, j = self.toks, [], i - 1
        while j >= 0 and len(out) < limit:
            gap = self.gap(j, j + 1)
            if "." in gap and len(toks[j].text) > 1:
                break  # a period after a whole word ends the sentence, not the name
            if not (_NAME_GAP.fullmatch(gap) or (not out and _GAP_COMMA_SLASH_PAREN.fullmatch(gap))):
                break
            t = toks[j]
            one_letter = len(t.text) == 1 and t.text.isalpha() and self.text[t.end : t.end + 1] in ". "
            if one_letter or (_nameish(t) and t.low not in self.lex.credentials):
                out.append(j)
            else:
                break
            j -= 1
        return out[::-1]

    def strong(self, idx: list[int]) -> bool:
        """Some word of idx is a name, city or unknown word (not only ambiguous ones)."""
        return any(self.toks[j].cls in _NAMEISH for j in idx)

    def place_word(self, t: _Tok) -> bool:
        """A word that may be part of a place name in a place context: no function word, cue or clinical word
        (an ambiguous clinical word such as "Heart" only capitalised in mixed-case text)."""
        lex = self.lex
        if (
            t.protected
            or t.low in lex.not_place
            or t.low in lex.cues
            and t.low not in lex.prefixes
            or t.low in lex.movement_verbs
            or t.low in lex.suffixes
        ):
            return False
        if t.low in lex.name_words:
            return True
        if t.cls == SAFE:
            return False
        return t.low not in lex.clinical or (self.mixed and _titled(t.text))

    def word_before(self, k: int) -> str:
        """Word k, with a one-letter word and slash before it (c/o, d/c, f/u)."""
        t, text = self.toks[k], self.text
        if t.start >= 2 and text[t.start - 1] == "/" and text[t.start - 2].isalpha():
            return text[t.start - 2 : t.end].lower()
        return t.low

    def verb_before(self, i: int) -> bool:
        """A movement verb before word i, directly or with an adverb between (transferred back to)."""
        verbs = self.lex.movement_verbs
        if i > 0 and self.word_before(i - 1) in verbs:
            return True
        return i > 1 and self.toks[i - 1].low in self.lex.adverbs and self.word_before(i - 2) in verbs

    def employer_for(self, i: int) -> bool:
        """Word i is "for" after an employment verb ("works for")."""
        return self.toks[i].low == "for" and i > 0 and self.toks[i - 1].low in self.lex.employment

    def place_cue_before(self, i: int) -> bool:
        """A place cue right before word i (to, from, at, in, for after works)."""
        if i == 0 or not _GAP_SPACE_AT.fullmatch(self.gap(i - 1, i)):
            return False
        k = i - 2 if self.toks[i - 1].low == "the" and i > 1 else i - 1
        return self.toks[k].low in self.lex.movement or self.employer_for(k)


# ---------------------------------------------------------------- rules for one word
def institution_names(s: Scan, i: int) -> None:
    """ORGANIZATION (marked LOCATION): a frequent institution name of common words, capitalised or after a place
    cue. Example: "transferred to Holy Cross", "Good Sam Hosp"."""
    lex, toks = s.lex, s.toks
    if toks[i].low not in lex.institutions_first or s.kind[i] is not None or lex.institutions is None:
        return
    m = lex.institutions.match(s.text, toks[i].start)
    if not m:
        return
    idx = [k for k in range(i, s.n) if toks[k].end <= m.end()]
    words = [k for k in idx if toks[k].low != "the"]
    if not words:
        return
    last = idx[-1]
    written = all(toks[k].text.isupper() or _titled(toks[k].text) for k in words) and (s.mixed or len(words) > 1)
    cue = s.place_cue_before(i) or (last + 1 < s.n and toks[last + 1].low in lex.suffixes)
    if written or cue:
        s.mark_all(words, "LOCATION")


def multi_word_city(s: Scan, i: int) -> None:
    """LOCATION: a city of several words, capitalised or after a place cue. Example: "Middle River", "to new haven"."""
    toks = s.toks
    if toks[i].low not in s.lex.cities or s.kind[i] is not None or i + 1 >= s.n:
        return
    # only the cities whose second word is the next word can match (same order as ``cities``: the first match wins)
    for words in s.lex.city_runs.get((toks[i].low, toks[i + 1].low), ()):
        if i + len(words) <= s.n and all(toks[i + k].low == w for k, w in enumerate(words)):
            cue = i > 0 and toks[i - 1].low in s.lex.movement
            if cue or all(toks[i + k].text[:1].isupper() for k in range(len(words))):
                s.mark_all(range(i, i + len(words)), "LOCATION")
            break


def titles(s: Scan, i: int) -> None:
    """NAME after a title. Example: "Dr. Quenneville", "MRS B. KARGAS", "Dr Will Cole" (a first name that is also
    a common word, then a name-like word)."""
    t, toks, lex = s.toks[i], s.toks, s.lex
    if t.low not in lex.titles or (t.low == "sister" and s.text[t.end : t.end + 1] not in ". "):
        return
    run = s.run_after(i)
    if run and any(len(toks[j].text) > 1 for j in run):
        s.mark_all(run, "NAME")
    elif (
        not run
        and i + 2 < s.n
        and _titled(toks[i + 1].text)
        and toks[i + 1].low in lex.first_names
        and _titled(toks[i + 2].text)
        and _nameish(toks[i + 2])
        and _NAME_GAP.fullmatch(s.gap(i + 1, i + 2))
    ):
        s.mark_all((i + 1, i + 2), "NAME")


def relations(s: Scan, i: int) -> None:
    """RELATIVE / PROXY NAME after a relation word, or before it in parentheses. Example: "daughter Anne",
    "his wife Mary", "URSLA MORETTI (DAUGHTER)", "CHARLIE (SIGNIFICANT OTHER)"."""
    t, toks, lex = s.toks[i], s.toks, s.lex
    if t.low not in lex.relations:
        return
    run = s.run_after(i)
    if run and (s.strong(run) or toks[run[0]].low in lex.first_names):
        s.mark_all(run, "NAME")
    k = i - 1 if t.low != "other" or i == 0 else i - 2
    if k >= 0 and s.text[toks[k + 1].end : toks[k + 1].end + 1] != ")":
        k = -1
    if k >= 0 and _GAP_PAREN.fullmatch(s.gap(k, k + 1)):
        before = s.run_before(k + 1)
        if before and (s.strong(before) or len(before) >= 2 and any(toks[j].low in lex.first_names for j in before)):
            s.mark_all(before, "NAME")


def role_in_parentheses(s: Scan, i: int) -> None:
    """NAME (clinician) before a role in parentheses. Example: "DICK CUCCHIARA (RESIDENT)"."""
    t = s.toks[i]
    if (
        t.low not in s.lex.roles
        or not i
        or not _GAP_PAREN.fullmatch(s.gap(i - 1, i))
        or s.text[t.end : t.end + 1] != ")"
    ):
        return
    before = s.run_before(i)
    if before and s.strong(before):
        s.mark_all(before, "NAME")


def roles(s: Scan, i: int) -> None:
    """NAME (clinician) after a role word. Example: "NP Grace Dudak", "resident KAPLAN", "HO Spears" (a rare
    ambiguous surname after a strong role)."""
    t, toks, lex = s.toks[i], s.toks, s.lex
    if t.low not in lex.roles:
        return
    run = s.run_after(i)
    if not run:
        return
    ok = any(toks[j].cls in (FIRST, LAST) or toks[j].low in lex.first_names for j in run) or any(
        toks[j].cls == UNKNOWN and (_titled(toks[j].text) or t.low in _STRONG_ROLES and toks[j].text.isupper())
        for j in run
    )
    first = toks[run[0]]
    rare = (
        first.low in lex.rare_names
        and _same_case(t, first)
        and t.low in ("ho", "np", "md")
        and not first.text.islower()
    )
    lone_ambiguous = first.cls == AMBIG and t.low in ("pt", "md", "pa", "rt", "ot") and len(run) == 1
    if rare or ok and not lone_ambiguous:
        s.mark_all(run, "NAME")


def credentials(s: Scan, i: int) -> None:
    """NAME (clinician) before a credential. Example: "Mary Hulse RN", "j smith, msw"."""
    t, toks, lex, text = s.toks[i], s.toks, s.lex, s.text
    if t.low not in lex.credentials or not t.start or text[t.start - 1 : t.start] not in (" ", ",", "/", "\t"):
        return
    if not (t.text.islower() or t.text.isupper()):
        return
    before = s.run_before(i)
    if before and not _GAP_COMMA_SLASH.fullmatch(s.gap(before[-1], i)):
        before = []
    if t.text.isupper() and any(toks[j].text.islower() for j in before):
        before = []  # "surgical planning. PA": an upper-case credential after lower-case words
    while before and toks[before[0]].cls == AMBIG and toks[before[0]].low in lex.weak_cues:
        before = before[1:]
    if before and (s.strong(before) or len(before) >= 2 and any(toks[j].low in lex.first_names for j in before)):
        s.mark_all(before, "NAME")


def initial_before_verb(s: Scan, i: int) -> None:
    """NAME: an upper-case initial and an ambiguous surname before a verb that follows a person. Example:
    "J SMITH ORDERED"."""
    t, toks = s.toks[i], s.toks
    if len(t.text) != 1 or not t.text.isalpha() or i + 2 >= s.n:
        return
    nxt = toks[i + 1]
    if (
        s.gap(i, i + 1) == " "
        and t.text.isupper()
        and nxt.text.isupper()
        and nxt.cls == AMBIG
        and nxt.low in s.lex.names
        and nxt.low not in s.lex.clinical
        and t.low not in ("a", "i", "x")
        and toks[i + 2].low in _AFTER_NAME_VERBS
        and not nxt.protected
    ):
        s.mark_all((i, i + 1), "NAME")


def initials(s: Scan, i: int) -> None:
    """NAME: an initial and a name word anywhere. Example: "N. GRANDONE", "J Smith", "per d ross" (a rare
    ambiguous surname after a name verb)."""
    t, toks, lex, text = s.toks[i], s.toks, s.lex, s.text
    if len(t.text) != 1 or not t.text.isalpha() or i + 1 >= s.n:
        return
    nxt = toks[i + 1]
    gap = s.gap(i, i + 1)
    dotted = gap.startswith(".") and _GAP_DOT.fullmatch(gap)
    after_cue = i > 0 and toks[i - 1].low in lex.weak_cues and gap in (" ", ". ")
    rare = nxt.low in lex.rare_names and t.low not in ("a", "i", "x") and i > 0 and toks[i - 1].low in _NAME_VERBS
    cued = (
        (dotted and (t.text.isupper() or after_cue))
        or (gap == " " and t.text.isupper() and nxt.cls in (FIRST, LAST))
        or (after_cue and (nxt.cls in (FIRST, LAST) or rare))
    )
    if not cued or (t.start > 0 and (text[t.start - 1].isdigit() or text[t.start - 1] in "'’")):
        return
    titled = nxt.text[:1].isupper() and not nxt.text.isupper()
    cased = titled or (nxt.text.isupper() and t.text.isupper())
    if (
        nxt.cls in (FIRST, LAST)
        or (nxt.cls in (UNKNOWN, PROPER) and (titled or dotted))
        or (nxt.cls == AMBIG and nxt.low in lex.names and cased and (dotted or after_cue))
        or (rare and after_cue)
    ):
        s.mark_all((i, i + 1), "NAME")


def first_names(s: Scan, i: int) -> None:
    """NAME: a first name (not known-safe) wherever it stands, with the name-like word after it. Example:
    "Carol Buckley", "spoke with sharon"."""
    t, toks, lex = s.toks[i], s.toks, s.lex
    if t.cls != FIRST or len(t.low) < 3:
        return
    s.mark(i, "NAME")
    if i + 1 >= s.n:
        return
    nxt = toks[i + 1]
    if (
        _NAME_GAP.fullmatch(s.gap(i, i + 1))
        and _nameish(nxt)
        and (
            nxt.cls != AMBIG
            or nxt.text[:1].isupper()
            or nxt.low in lex.rare_names
            and _same_case(t, nxt)
            and nxt.low not in lex.dictionary
        )
    ):
        s.mark(i + 1, "NAME")


def surnames(s: Scan, i: int) -> None:
    """NAME: a surname after a first name, or capitalised within a sentence of mixed-case text. Example:
    "Mary Hulse", "called Kernan back"."""
    t, toks, lex = s.toks[i], s.toks, s.lex
    if t.cls != LAST or len(t.low) < 3:
        return
    prev = toks[i - 1] if i else None
    pair = (
        prev is not None
        and _NAME_GAP.fullmatch(s.gap(i - 1, i))
        and (
            prev.cls == FIRST
            or (prev.cls == UNKNOWN and s.mixed and _titled(prev.text) and _titled(t.text))
            or (
                prev.cls == AMBIG
                and prev.low in lex.first_names
                and prev.low not in lex.clinical
                and not prev.protected
                and _same_case(prev, t)
            )
        )
    )
    if pair:
        s.mark_all((i - 1, i), "NAME")
    elif s.mixed and _titled(t.text) and not _sentence_start(s.text, t.start):
        s.mark(i, "NAME")


def cities(s: Scan, i: int) -> None:
    """LOCATION: a city of 15,000+ inhabitants (GeoNames) that is not known-safe. Example: "Baltimore",
    "lives in towson"."""
    t, low = s.toks[i], s.toks[i].low
    if (
        t.cls == PLACE
        and len(low) >= 4
        and not t.text.islower()
        or t.cls == PLACE
        and low in s.lex.cities
        and len(low) >= 6
    ):
        s.mark(i, "LOCATION")


def toponyms(s: Scan, i: int) -> None:
    """LOCATION: a capitalised word with a place-name ending (``toponym_suffixes``: -ville, -burgh, -haven, -mouth,
    -furt, -hausen ...) that is no common word (no known-safe or ambiguous word: not "Comfort"). Example:
    "Williehaven", "North Robertmouth", "Laurachester"."""
    t = s.toks[i]
    if t.cls in (SAFE, AMBIG) or len(t.low) < 6 or not _titled(t.text) or not t.low.endswith(s.lex.toponym_suffixes):
        return
    s.mark(i, "LOCATION")


def place_prefixes(s: Scan, i: int) -> None:
    """LOCATION: a place prefix or suffix word (``place_prefixes``: Port, East, Lake, Saint ...; ``place_suffix_words``:
    Ville, City, Town ...) beside a capitalised word that is no plain English word. Example: "Port Alex", "East
    Tony", "St. Gina", "Conall Ville"; not "North American"."""
    t, toks, lex = s.toks[i], s.toks, s.lex
    if not _titled(t.text) and not (t.text.isupper() and t.low in ("st", "mt")):
        return
    if t.low in lex.place_prefixes and i + 1 < s.n:
        nxt = toks[i + 1]
        if _GAP_DOT_SPACE.fullmatch(s.gap(i, i + 1)) and _titled(nxt.text) and _place_name_word(s, nxt):
            s.mark_all((i, i + 1), "LOCATION")
    elif t.low in lex.place_suffix_words and i:
        prev = toks[i - 1]
        if s.gap(i - 1, i) == " " and _titled(prev.text) and _place_name_word(s, prev):
            s.mark_all((i - 1, i), "LOCATION")


def _place_name_word(s: Scan, t: _Tok) -> bool:
    """A word that may name a place beside a place prefix: a first name, city or word of no list; an ambiguous word
    only when it is a first name ("Port Alex", "East Tony"; not "North American", a surname too)."""
    return not t.protected and (
        t.cls in (FIRST, PLACE, UNKNOWN, PROPER) or t.cls == AMBIG and t.low in s.lex.first_names
    )


def hyphenated_places(s: Scan, i: int) -> None:
    """LOCATION: a French compound place name joined by hyphens around a particle. Example: "Carre-sur-Hoareau",
    "Gros-la-Forêt", "Blanc-sur-Mer"."""
    toks = s.toks
    if toks[i].low not in ("sur", "la", "le", "les", "lès", "en", "de", "du", "aux") or not 0 < i < s.n - 1:
        return
    if (
        s.gap(i - 1, i) == "-"
        and s.gap(i, i + 1) == "-"
        and toks[i - 1].text[:1].isupper()
        and toks[i + 1].text[:1].isupper()
        and not toks[i - 1].protected
    ):
        s.mark_all((i - 1, i, i + 1), "LOCATION")


def ambiguous_first_names(s: Scan, i: int) -> None:
    """NAME: a first name that is also a common word, capitalised within a sentence of mixed-case text. Example:
    "reach Rob", "with Mary"."""
    t, lex = s.toks[i], s.lex
    if (
        t.cls == AMBIG
        and s.mixed
        and _titled(t.text)
        and t.low in lex.first_names
        and t.low not in lex.clinical
        and not _sentence_start(s.text, t.start)
    ):
        s.mark(i, "NAME")


def ambiguous_first_name_pairs(s: Scan, i: int) -> None:
    """NAME: a first name that is also a common word, capitalised, before a capitalised name, surname (a census
    surname that is a common word too, if no clinical word), city or unknown word in mixed-case text, also at the
    start of a sentence. Example: "Alan Torres", "Will Ferrante", "Irene Cooper"."""
    t, toks, lex = s.toks[i], s.toks, s.lex
    if (
        t.cls != AMBIG
        or not s.mixed
        or not _titled(t.text)
        or t.low not in lex.first_names
        or t.low in lex.clinical
        or i + 1 >= s.n
    ):
        return
    nxt = toks[i + 1]
    surname = nxt.cls in _NAMEISH or nxt.cls == AMBIG and nxt.low in lex.names and nxt.low not in lex.clinical
    if s.gap(i, i + 1) == " " and _titled(nxt.text) and surname and len(nxt.low) >= 3 and not nxt.protected:
        s.mark_all((i, i + 1), "NAME")


def _name_word(s: Scan, t: _Tok) -> bool:
    """A capitalised word that may be a surname: a name or unknown word, an ambiguous word only when it is a name."""
    return (
        _titled(t.text)
        and not t.protected
        and (t.cls in (FIRST, LAST, UNKNOWN, PROPER) or t.cls == AMBIG and t.low in s.lex.names)
    )


def name_verbs(s: Scan, i: int) -> None:
    """NAME: two or three capitalised name-like words after a verb or preposition that introduces a person in
    mixed-case text. Example: "review by Bethan Williams", "discussed with Cristian Vega", "paged Mijo Roht"."""
    t, toks = s.toks[i], s.toks
    if not s.mixed or (t.low not in _NAME_VERBS and t.low != "with") or i + 2 >= s.n:
        return
    run = s.run_after(i, limit=3)
    if len(run) >= 2 and all(_titled(toks[j].text) for j in run) and s.strong(run):
        s.mark_all(run, "NAME")


def capitalised_pairs(s: Scan, i: int) -> None:
    """NAME: two capitalised words of no dictionary side by side in mixed-case text (first name and surname of
    other languages, anywhere in a sentence), neither clinical nor ambiguous. Example: "Guiomar Beltrán", "Eoin
    Cloone", "Constanze Täsche"."""
    toks = s.toks
    if not s.mixed or i + 1 >= s.n or s.gap(i, i + 1) != " ":
        return
    a, b = toks[i], toks[i + 1]
    pair = (a, b)
    if all(
        w.text[:1].isupper()
        and w.text[1:].islower()
        and w.cls in (FIRST, LAST, UNKNOWN, PROPER)
        and w.low not in s.lex.clinical
        and not w.protected
        and len(w.low) >= 3
        for w in pair
    ):
        s.mark_all((i, i + 1), "NAME")


def hyphenated_names(s: Scan, i: int) -> None:
    """NAME: two capitalised name words joined by a hyphen in mixed-case text, one of them a census name that is
    no common word or both census names. Example: "Wood-Mellor", "Patel-Chamberlain" (a double-barrelled surname
    or a firm)."""
    toks = s.toks
    if not s.mixed or i + 1 >= s.n or s.gap(i, i + 1) != "-":
        return
    a, b = toks[i], toks[i + 1]
    names = s.lex.names
    if (
        _name_word(s, a)
        and _name_word(s, b)
        and (a.cls in (FIRST, LAST) or b.cls in (FIRST, LAST) or a.low in names and b.low in names)
    ):
        s.mark_all((i, i + 1), "NAME")


def name_lists(s: Scan, i: int) -> None:
    """NAME: three capitalised surnames listed as "A, B and C" inside a sentence (a firm of partners or a list of
    people), each a census name or a word of no list. Example: "Fisher, Smith and Turner", "Millar, Treanor and
    Nulty"."""
    toks = s.toks
    if not s.mixed or i + 3 >= s.n or not _GAP_COMMA.fullmatch(s.gap(i, i + 1)):
        return
    conj = toks[i + 2]
    if conj.low not in ("and", "und", "et", "y") or s.gap(i + 1, i + 2) != " " or s.gap(i + 2, i + 3) != " ":
        return
    words = (toks[i], toks[i + 1], toks[i + 3])
    if all(_name_word(s, w) for w in words) and not _sentence_start(s.text, toks[i].start):
        s.mark_all((i, i + 1, i + 2, i + 3), "NAME")  # the "and" too: the name is one


def _suffix_word(s: Scan, prev: _Tok, strong_suffix: bool, title_suffix: bool) -> bool:
    """A word before an institution suffix that belongs to the name without a place cue."""
    lex = s.lex
    return (
        prev.low in lex.suffixes
        or prev.low in _SAINTS
        or prev.low in lex.name_words
        or prev.cls in _NAMEISH
        or (prev.cls == AMBIG and strong_suffix)
        or (title_suffix and _titled(prev.text))
    )


def _suffix_run(s: Scan, i: int, strong_suffix: bool, title_suffix: bool) -> tuple[list[int], bool | None, int]:
    """Words before the institution suffix at i: ``(taken, bounded, j)``; ``bounded`` True when a place cue
    bounds the run, None when a loose word was taken (kept only with a cue), ``j`` the word before the run."""
    toks, lex = s.toks, s.lex
    j, taken, bounded = i - 1, [], False
    while j >= 0 and len(taken) < 3:
        prev = toks[j]
        gap = s.gap(j, j + 1)
        if not _GAP_PAIR.fullmatch(gap):
            break
        if prev.low in lex.movement or s.employer_for(j):
            bounded = True  # "transferred from sacred heart hosp", "lives at Carpenter Assisted living"
            break
        if prev.low in lex.suffixes or prev.low in _SAINTS or prev.low in lex.name_words and not prev.protected:
            taken.append(j)
        elif prev.protected or prev.low in lex.not_place:
            break
        elif prev.cls in _NAMEISH or (prev.cls == AMBIG and strong_suffix):
            taken.append(j)
        elif (
            strong_suffix
            and prev.cls == SAFE
            and prev.low not in lex.clinical
            and (prev.text[:1].isupper() or not s.mixed)
        ):
            taken.append(j)
        elif title_suffix and _titled(prev.text) and s.place_word(prev):
            taken.append(j)  # "Chester River Heart Center": capitalised words before a capitalised suffix
        elif (
            (
                s.place_word(prev)
                or prev.cls == AMBIG
                and prev.low not in lex.movement_verbs
                and prev.low not in lex.cues
            )
            and (prev.cls == AMBIG or strong_suffix or prev.low not in lex.clinical)
            and _GAP_POSSESSIVE.fullmatch(gap)
        ):
            taken.append(j)  # kept only when a place cue bounds the run (below)
            bounded = None
        else:
            break
        j -= 1
    return taken, bounded, j


def institution_suffixes(s: Scan, i: int) -> None:
    """ORGANIZATION (marked LOCATION): up to three name words before an institution suffix. Example: "Harbor
    Hosp", "UNION MEMORIAL", "Chester River Heart Center", "transferred from sacred heart hosp"."""
    toks, lex, low = s.toks, s.lex, s.toks[i].low
    if low not in lex.suffixes:
        return
    strong_suffix = low in lex.strong_suffixes or (low == "center" and i and toks[i - 1].low in ("medical", "med"))
    title_suffix = s.mixed and _titled(toks[i].text)
    taken, bounded, j = _suffix_run(s, i, strong_suffix, title_suffix)
    if bounded is None:
        # a loose word was taken: the run stands only with a place cue right before it
        bounded = j >= 0 and (toks[j].low in lex.movement or s.employer_for(j)) and len(taken) < 3
        if not bounded:
            strict = []
            for k in taken:
                if not _suffix_word(s, toks[k], strong_suffix, title_suffix):
                    break
                strict.append(k)
            taken = strict
    while taken and toks[taken[-1]].low == "of":
        taken.pop()
    real = [k for k in taken if toks[k].low not in lex.suffixes and toks[k].low != "of"]
    named = [k for k in taken if toks[k].low in lex.name_words]
    if real or named and (bounded or any(toks[k].text[:1].isupper() for k in named)):
        s.mark_all(taken, "LOCATION")
        if low in lex.name_words:
            s.mark(i, "LOCATION")  # "UNION MEMORIAL": the suffix is part of the name


def institution_prefixes(s: Scan, i: int) -> None:
    """ORGANIZATION (marked LOCATION): an institution prefix, "of" and up to two words. Example: "University of
    Maryland", "U OF MD", "college of Charleston"."""
    toks, lex, t = s.toks, s.lex, s.toks[i]
    if t.low not in lex.prefixes or i + 2 >= s.n or toks[i + 1].low != "of" or (t.low == "u" and t.text != "U"):
        return
    run = []
    for k in range(i + 2, min(i + 4, s.n)):
        w = toks[k]
        if (
            not _GAP_SPACES3.fullmatch(s.gap(k - 1, k))
            or w.low in lex.suffixes
            or w.protected
            or w.low in lex.not_place
            or w.low in lex.weak_cues
            or len(w.low) < 2
        ):
            break
        if not (w.text[:1].isupper() or not s.mixed):
            break
        run.append(k)
    if run:
        s.mark_all((i, i + 1, *run), "LOCATION")


def unit_suffixes(s: Scan, i: int) -> None:
    """LOCATION: a short unknown word before a hospital unit suffix. Example: "GH cath lab", "to amrsh ccu"."""
    toks, lex = s.toks, s.lex
    if toks[i].low not in lex.unit_suffixes or not i:
        return
    prev = toks[i - 1]
    after_cue = i > 1 and toks[i - 2].low in lex.movement and prev.low not in lex.dictionary
    if (
        _GAP_SPACES2.fullmatch(s.gap(i - 1, i))
        and (prev.cls == UNKNOWN or prev.cls == PROPER and after_cue)
        and len(prev.low) <= 5
        and prev.low not in lex.clinical
    ):
        s.mark(i - 1, "LOCATION")


def _place_run_after_verb(s: Scan, j: int) -> None:
    """After a movement verb, two or three place-like words ("WENT TO HOLY CROSS WITH", "transferred from Good
    Sam"): names, cities and unknown words, no clinical word."""
    toks, run, k = s.toks, [], j
    while (
        k < s.n
        and len(run) < 3
        and (s.place_word(toks[k]) or toks[k].cls == AMBIG and not toks[k].protected)
        and toks[k].cls != SAFE
        and not (toks[k].text.islower() and toks[k].low.endswith(("ing", "ed")))
        and (k == j or _GAP_SPACES2.fullmatch(s.gap(k - 1, k)))
    ):
        run.append(k)
        k += 1
    # an ambiguous clinical word ("white") only beside a word outside every dictionary ("amrsh")
    if any(not s.place_word(toks[r]) for r in run) and all(toks[r].cls == AMBIG for r in run):
        return
    if len(run) >= 2 and (
        not s.mixed
        or any(toks[r].cls == UNKNOWN for r in run)
        or all(_titled(toks[r].text) or toks[r].text.isupper() for r in run)
    ):
        s.mark_all(run, "LOCATION")


def movement_places(s: Scan, i: int) -> None:
    """LOCATION after a movement or ward cue: an acronym, a long unknown word, a city or a run of place words.
    Example: "transferred to quartermain", "TO GH", "at VAMC", "ON QUARTERMAIN 6", "works for Acme"."""
    toks, lex = s.toks, s.lex
    cue_word = toks[i].low in lex.movement or s.employer_for(i)
    if not (cue_word or toks[i].low in lex.ward_cues) or i + 1 >= s.n:
        return
    j = i + 1
    if toks[j].low == "the" and j + 1 < s.n and cue_word and s.verb_before(i):
        j += 1  # "transferred to the Mater"; never "in the RPA"
    nxt = toks[j]
    verb = s.verb_before(i) or toks[i].low == "for"
    if not _GAP_SPACE_DASH_AT.fullmatch(s.gap(j - 1, j)) or nxt.low in lex.not_place or nxt.protected:
        return
    long_unknown = nxt.cls in (UNKNOWN, PROPER) and len(nxt.low) >= 4
    if not cue_word:
        if (
            long_unknown
            and nxt.low not in lex.clinical
            and nxt.low not in lex.dictionary
            and _WARD.match(s.text, nxt.end)
        ):
            s.mark(j, "LOCATION")  # "ON QUARTERMAIN 6"
        return
    # "TO GH", "at VAMC": an upper-case acronym that is no clinical abbreviation, no dictionary word and no
    # placeholder of already de-identified text ("XXXX")
    short_caps = (
        nxt.text.isupper()
        and 2 <= len(nxt.text) <= 5
        and nxt.low not in lex.clinical
        and nxt.low not in lex.dictionary
        and not _PLACEHOLDER.fullmatch(nxt.low)
        and (s.mixed or nxt.cls == UNKNOWN or verb)
    )
    # a long unknown word is a place after a movement verb ("transfer to quartermain") or before a ward number
    # ("QUARTERMAIN 2"), a capitalised one in mixed-case text after the preposition alone
    ward = _DIGIT_AFTER.match(s.text[nxt.end : nxt.end + 2]) is not None
    titled = s.mixed and nxt.text[:1].isupper() and not nxt.text.isupper()
    if (
        nxt.cls == PLACE
        or short_caps
        or (long_unknown and (verb or ward or titled))
        or (nxt.cls in (FIRST, LAST) and len(nxt.low) >= 4 and (_WARD.match(s.text, nxt.end) or titled))
    ):
        s.mark(j, "LOCATION")
    elif verb:
        _place_run_after_verb(s, j)


# ---------------------------------------------------------------- rules for the whole text
def places_after_verbs_and_conjunctions(s: Scan) -> None:
    """LOCATION: an acronym after a verb whose object is a place, a place word after "and"/"or" after a place.
    Example: "NEED TO LEAVE GH", "BALTIMORE REHAB AND KIMBROUGH"."""
    toks, kind, lex = s.toks, s.kind, s.lex
    for i in range(1, s.n - 1):
        t = toks[i]
        if t.low not in _DIRECT_PLACE_VERBS and t.low not in ("and", "or"):
            continue  # most words are neither: the cheap test first
        nxt = toks[i + 1]
        if kind[i + 1] is not None or nxt.protected or not _GAP_SPACES3.fullmatch(s.gap(i, i + 1)):
            continue
        if (
            t.low in _DIRECT_PLACE_VERBS
            and nxt.text.isupper()
            and 2 <= len(nxt.text) <= 5
            and nxt.low not in lex.clinical
            and nxt.low not in lex.dictionary
        ):
            kind[i + 1] = "LOCATION"
        elif (
            t.low in ("and", "or")
            and nxt.cls in (LAST, UNKNOWN, PLACE)
            and nxt.low not in lex.clinical
            and len(nxt.low) >= 4
            and (kind[i - 1] == "LOCATION" or toks[i - 1].low in lex.suffixes and i > 1 and kind[i - 2] == "LOCATION")
        ):
            kind[i + 1] = "LOCATION"


def repeated_places(s: Scan) -> None:
    """LOCATION: other occurrences of a place found by a cue. Example: "GH" after "TRANSFERRED TO GH"."""
    toks, kind = s.toks, s.kind
    places = {
        toks[i].text
        for i in range(s.n)
        if kind[i] == "LOCATION" and toks[i].cls in _NAMEISH and toks[i].low not in s.lex.clinical
    }
    if not places:
        return
    for i, t in enumerate(toks):
        if (
            kind[i] is None
            and not t.protected
            and (
                t.text in places
                or len(t.low) >= 5
                and (t.text.upper() in places or t.text.capitalize() in places or t.low in places)
            )
        ):
            kind[i] = "LOCATION"


def repeated_names(s: Scan) -> None:
    """NAME: other occurrences of a word learned as a name from a cue (never a known-safe word). Example:
    "Kernan" anywhere after "Dr. Kernan"."""
    toks, kind = s.toks, s.kind
    learned = {
        toks[i].low
        for i in range(s.n)
        if kind[i] == "NAME" and toks[i].cls in (FIRST, LAST, UNKNOWN, PROPER) and len(toks[i].low) >= 3
    }
    for i, t in enumerate(toks):
        if kind[i] is None and t.low in learned and not t.protected:
            kind[i] = "NAME"


Rule = Callable[[Scan, int], None]
#: the rules for a word, in the order they run (an earlier rule's mark stands)
WORD_RULES: tuple[Rule, ...] = (
    institution_names,
    titles,
    relations,
    role_in_parentheses,
    roles,
    credentials,
    initial_before_verb,
    initials,
    first_names,
    surnames,
    cities,
    multi_word_city,
    toponyms,
    place_prefixes,
    hyphenated_places,
    ambiguous_first_names,
    ambiguous_first_name_pairs,
    name_verbs,
    capitalised_pairs,
    hyphenated_names,
    name_lists,
    institution_suffixes,
    institution_prefixes,
    unit_suffixes,
    movement_places,
)
#: the rules for a word of plain known-safe English that is no cue (every other rule needs a cue or a name class);
#: they run only for the first word of an institution name or a city and for place prefixes and suffix words
#: (``Lexicon.plain_triggers``)
PLAIN_WORD_RULES: tuple[Rule, ...] = (institution_names, multi_word_city, place_prefixes)
#: the passes over the whole text after the word rules, in order
TEXT_RULES: tuple[Callable[[Scan], None], ...] = (places_after_verbs_and_conjunctions, repeated_places, repeated_names)


Gate = Callable[[_Tok, bool, Lexicon], bool]
#: for a word rule, a test of the word alone (its spelling and class) and of the text's case (``mixed``) that holds
#: whenever the rule can mark anything: the first test each rule makes, so a word failing it is not offered to the
#: rule (same result, fewer calls; most words start no rule). A rule missing here is offered every word.
RULE_GATES: dict[Rule, Gate] = {
    institution_names: lambda t, mixed, lex: t.low in lex.institutions_first,
    titles: lambda t, mixed, lex: t.low in lex.titles,
    relations: lambda t, mixed, lex: t.low in lex.relations,
    role_in_parentheses: lambda t, mixed, lex: t.low in lex.roles,
    roles: lambda t, mixed, lex: t.low in lex.roles,
    credentials: lambda t, mixed, lex: t.low in lex.credentials,
    initial_before_verb: lambda t, mixed, lex: len(t.text) == 1,
    initials: lambda t, mixed, lex: len(t.text) == 1,
    first_names: lambda t, mixed, lex: t.cls == FIRST,
    surnames: lambda t, mixed, lex: t.cls == LAST,
    cities: lambda t, mixed, lex: t.cls == PLACE,
    multi_word_city: lambda t, mixed, lex: t.low in lex.cities,
    toponyms: lambda t, mixed, lex: t.cls not in (SAFE, AMBIG),
    place_prefixes: lambda t, mixed, lex: t.low in lex.place_prefixes or t.low in lex.place_suffix_words,
    hyphenated_places: lambda t, mixed, lex: t.low in ("sur", "la", "le", "les", "lès", "en", "de", "du", "aux"),
    ambiguous_first_names: lambda t, mixed, lex: mixed and t.cls == AMBIG,
    ambiguous_first_name_pairs: lambda t, mixed, lex: mixed and t.cls == AMBIG,
    name_verbs: lambda t, mixed, lex: mixed and (t.low in _NAME_VERBS or t.low == "with"),
    capitalised_pairs: lambda t, mixed, lex: mixed and t.cls in (FIRST, LAST, UNKNOWN, PROPER),
    hyphenated_names: lambda t, mixed, lex: mixed and t.cls in (FIRST, LAST, UNKNOWN, PROPER, AMBIG),
    name_lists: lambda t, mixed, lex: mixed and t.cls in (FIRST, LAST, UNKNOWN, PROPER, AMBIG),
    institution_suffixes: lambda t, mixed, lex: t.low in lex.suffixes,
    institution_prefixes: lambda t, mixed, lex: t.low in lex.prefixes,
    unit_suffixes: lambda t, mixed, lex: t.low in lex.unit_suffixes,
    movement_places: lambda t, mixed, lex: t.low in lex.movement or t.low == "for" or t.low in lex.ward_cues,
}
#: distinct word spellings whose rule lists are kept per lexicon (:attr:`Lexicon.memo`); the memo starts over above
_MEMO_WORDS = 200_000


def _rules_for(t: _Tok, mixed: bool, lex: Lexicon) -> tuple[Rule, ...]:
    """The word rules that may mark something at word ``t`` (:data:`WORD_RULES`, or :data:`PLAIN_WORD_RULES` for a
    plain known-safe word that is no cue; none for a plain word that starts no rule), in their order, kept in
    ``lex.memo``."""
    memo = lex.memo
    key = ("name_rules", t.low, t.cls, len(t.text) == 1, mixed)
    rules = memo.get(key)
    if rules is None:
        if t.cls == SAFE and t.low not in lex.cues and len(t.low) > 1:
            candidates = PLAIN_WORD_RULES if t.low in lex.plain_triggers else ()
        else:
            candidates = WORD_RULES
        rules = tuple(r for r in candidates if r not in RULE_GATES or RULE_GATES[r](t, mixed, lex))
        if len(memo) >= _MEMO_WORDS:
            memo.clear()
        memo[key] = rules
    return rules


def _spans(s: Scan) -> list[tuple[int, int, str]]:
    """Adjacent marked words of one kind as one span; across a period only after an initial ("J. Smith")."""
    hits: list[tuple[int, int, str]] = []
    last_len = 0  # length of the word that ends the last hit
    for i, t in enumerate(s.toks):
        k = s.kind[i]
        if k is None:
            continue
        gap = s.text[hits[-1][1] : t.start] if hits else ""
        if hits and hits[-1][2] == k and _NAME_GAP.fullmatch(gap) and not ("." in gap and last_len > 1):
            hits[-1] = (hits[-1][0], t.end, k)
        else:
            hits.append((t.start, t.end, k))
        last_len = len(t.text)
    return hits


def lexical_hits(
    text: str, lex: Lexicon | None = None, guarded: list[tuple[int, int]] | None = None
) -> list[tuple[int, int, str]]:
    """Names and places found by the word lists and cues (:data:`WORD_RULES`, then :data:`TEXT_RULES`).

    Parameters
    ----------
    text : str
        Report text.
    lex : Lexicon, optional
        Default: :func:`entity_extraction.deid.lexicon.load_lexicon`.
    guarded : list of (start, end), optional
        :func:`entity_extraction.deid.lexicon.protected_spans` of ``text`` when the caller has them already.

    Returns
    -------
    list of (start, end, kind)
        Character spans, ``kind`` ``"NAME"`` or ``"LOCATION"``, in text order, not overlapping; adjacent
        words of one name (``Carol Buckley``, ``B. KARGAS``) are one span.
    """
    lex = lex or load_lexicon()
    s = Scan(text, lex, protected_spans(text, lex) if guarded is None else guarded)
    mixed = s.mixed
    for i, t in enumerate(s.toks):
        if t.protected:
            continue
        # a plain word starts no rule but PLAIN_WORD_RULES, and only some words start any (_rules_for)
        for rule in _rules_for(t, mixed, lex):
            rule(s, i)
    for text_rule in TEXT_RULES:
        text_rule(s)
    return _spans(s)
