"""Report language identification: which language pack (if any) de-identifies and labels a report.

Two passes, the cheap one first:

1. **Function words** (:data:`FUNCTION_WORDS_FILE`): every word that belongs to exactly one language's list is a
   vote for it. A text with at least :data:`MIN_VOTES` votes, of which the leading language holds at least
   :data:`MIN_SHARE`, is decided here (radiology English is full of "the", "with", "no", "of": the English reports
   of Open-i are all decided here, at a few microseconds each). Foreign words inside an English report (a
   patient's name, a hospital) are not function words and do not move the vote: "an English report quoting a
   foreign name" stays English.
2. **lingua** (``lingua-language-detector``, Stahl P., n-gram models compiled into its wheel, no download):
   :func:`lingua.LanguageDetector.compute_language_confidence_values` over :data:`DETECTOR_LANGUAGES` only (a
   restricted set is faster and more accurate). Its answer is taken when its confidence reaches the threshold
   of the text's length (:func:`confidence_needed`): short texts need near certainty. Otherwise the
   institution's configured language (the *prior*) is used: a prior is a default for texts that do not say
   otherwise, never a fact that outweighs clear evidence.

Texts with letters of a non-Latin script (Han, Kana, Hangul, Cyrillic, Arabic, ...) beyond
:data:`FOREIGN_SCRIPT_SHARE` of their letters are identified by lingua alone (scripts tell those languages apart
reliably). A Latin-script report with a run of such letters is flagged ``foreign_script``: a pack for a
Latin-script language cannot de-identify a Chinese name, so the caller withholds it (fail closed).
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

FUNCTION_WORDS_FILE = Path(__file__).with_name("function_words.yaml")
#: lingua's candidate set (ISO 639-1): the consortium's languages, their neighbours that could be confused with
#: them, and the large non-Latin-script languages a site may receive.
DETECTOR_LANGUAGES = ("en", "de", "fr", "es", "it", "nl", "pt", "pl", "sv", "da", "tr", "zh", "ja", "ko", "ru", "ar")
#: function-word votes needed to decide without lingua
MIN_VOTES = 3
#: share of the votes the leading language needs to decide without lingua
MIN_SHARE = 0.75
#: a text whose letters are at least this share non-Latin is identified by lingua alone
FOREIGN_SCRIPT_SHARE = 0.2
#: undetermined language (BCP 47 ``und``)
UNDETERMINED = "und"
_WORD = re.compile(r"[^\W\d_]+")
_NON_LATIN_RUN = re.compile(r"[^\W\d_a-zA-Z\u00AA\u00B5\u00BA\u00C0-\u024F\u1E00-\u1EFF]{2,}")


@dataclass(frozen=True)
class LanguageDecision:
    """One report's language.

    Attributes
    ----------
    language : str
        ISO 639-1 code (``en``, ``de``, ``zh``), or ``und`` when neither the text nor the prior says.
    confidence : float
        In [0, 1]: the leading language's share of function-word votes, lingua's confidence value, or 0.0 when
        the prior decided.
    method : str
        ``function_words``, ``lingua`` or ``prior``.
    foreign_script : bool
        A Latin-script decision for a text that also holds a run of two or more letters of another script.
    """

    language: str
    confidence: float
    method: str
    foreign_script: bool = False


@lru_cache(maxsize=1)
def _function_words(path: str | None = None) -> dict[str, str]:
    """word -> the one language whose list holds it (words of several lists are dropped)."""
    data = yaml.safe_load(Path(path or FUNCTION_WORDS_FILE).read_text(encoding="utf-8"))
    owner: dict[str, str] = {}
    shared: set[str] = set()
    for lang, words in data.items():
        for w in {str(w).lower() for w in words}:
            if w in owner and owner[w] != lang:
                shared.add(w)
            owner.setdefault(w, lang)
    return {w: lang for w, lang in owner.items() if w not in shared}


@lru_cache(maxsize=1)
def _detector():
    """lingua detector over :data:`DETECTOR_LANGUAGES` (models loaded lazily, about 0.3 ms per report after)."""
    from lingua import IsoCode639_1, Language, LanguageDetectorBuilder

    langs = [Language.from_iso_code_639_1(getattr(IsoCode639_1, code.upper())) for code in DETECTOR_LANGUAGES]
    return LanguageDetectorBuilder.from_languages(*langs).build()


def confidence_needed(letters: int) -> float:
    """lingua confidence needed to overrule the prior, by the text's number of letters.

    >= 200 letters: 0.6; >= 60: 0.8; >= 20: 0.95; fewer than 20 letters: never (the prior decides). Chosen on
    Open-i (English radiology: lingua gives French up to 0.97 on a 160-letter report of Latin-derived medical
    words, so lingua alone is not trusted on short texts) and on the synthetic German/French/Spanish reports.
    """
    if letters >= 200:
        return 0.6
    if letters >= 60:
        return 0.8
    if letters >= 20:
        return 0.95
    return 1.01


def function_word_votes(text: str) -> dict[str, int]:
    """Votes per language: words of ``text`` (lower-cased) that belong to one language's list only."""
    owner = _function_words()
    votes: dict[str, int] = {}
    for w in _WORD.findall(text.lower()):
        lang = owner.get(w)
        if lang is not None:
            votes[lang] = votes.get(lang, 0) + 1
    return votes


_LETTER = re.compile(r"[^\W\d_]")
_DROP_ASCII_LETTERS = str.maketrans("", "", string.ascii_letters)
_FOREIGN_LETTER = re.compile(r"[^\W\d_a-zA-Z\u00AA\u00B5\u00BA\u00C0-\u024F\u1E00-\u1EFF]")


def _script_counts(text: str) -> tuple[int, int]:
    """(letters, letters outside the Latin script: Latin-1, Latin Extended-A/B and Additional)."""
    if text.isascii():  # ASCII letters are A-Z and a-z, and none is foreign
        return len(text) - len(text.translate(_DROP_ASCII_LETTERS)), 0
    return len(_LETTER.findall(text)), len(_FOREIGN_LETTER.findall(text))


def _lingua(text: str) -> tuple[str, float]:
    values = _detector().compute_language_confidence_values(text)
    if not values:
        return UNDETERMINED, 0.0
    best = values[0]
    return best.language.iso_code_639_1.name.lower(), float(best.value)


def detect_language(text: str, prior: str | None = None) -> LanguageDecision:
    """The language of one report text.

    Parameters
    ----------
    text : str
        Report text (restricted: never logged or returned).
    prior : str, optional
        ISO 639-1 code of the institution's configured report language (or the source record's), used when the
        text does not decide (short or ambiguous texts).

    Returns
    -------
    LanguageDecision
        See the module docstring for the rule.
    """
    letters, foreign = _script_counts(text)
    if letters and foreign / letters >= FOREIGN_SCRIPT_SHARE:
        lang, conf = _lingua(text)
        return LanguageDecision(lang, round(conf, 3), "lingua")
    mixed = foreign > 0 and _NON_LATIN_RUN.search(text) is not None
    votes = function_word_votes(text)
    total = sum(votes.values())
    if total >= MIN_VOTES:
        lang, n = max(votes.items(), key=lambda kv: (kv[1], kv[0] == prior))
        if n / total >= MIN_SHARE:
            return LanguageDecision(lang, round(n / total, 3), "function_words", mixed)
    if letters >= 20:
        lang, conf = _lingua(text)
        if lang == prior or conf >= confidence_needed(letters):
            return LanguageDecision(lang, round(conf, 3), "lingua", mixed)
    return LanguageDecision(prior or UNDETERMINED, 0.0, "prior", mixed)
