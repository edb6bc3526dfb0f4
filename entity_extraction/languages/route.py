"""Route one report to the de-identifier of its language, or withhold it (fail closed).

:func:`deidentify_report` is what the build's reports stage and ``medreco reports annotate`` call: identify the
report's language (:func:`entity_extraction.languages.detect.detect_language`, the institution's configured
language as the prior), then de-identify it with the English rules (:func:`entity_extraction.text_deid.
deidentify_text`) or the language's pack (:func:`entity_extraction.languages.local_deid.deidentify_local`).
A report in a language without a pack, or a Latin-script report holding a run of another script's letters, raises
:class:`UnsupportedLanguageError` (reason ``unsupported_language``): the caller withholds it with a quarantine
record that names the detected language and confidence, never the text.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from entity_extraction.languages.detect import LanguageDecision, detect_language
from entity_extraction.languages.local_deid import available_languages, deidentify_local
from schemas.errors import ReasonCodedError


class UnsupportedLanguageError(ReasonCodedError, ValueError):
    """A report in a language that no installed pack covers (``reason``: ``unsupported_language``).

    Attributes
    ----------
    decision : LanguageDecision
        The detected language, its confidence and the method that decided.
    """

    message_format = "{reason}: {message}"

    def __init__(self, decision: LanguageDecision, supported: tuple[str, ...]) -> None:
        what = (
            "a Latin-script report with text in another script"
            if decision.foreign_script
            else f"detected language {decision.language}"
        )
        super().__init__(
            "unsupported_language",
            f"{what} (confidence {decision.confidence:.2f}, by {decision.method}); language packs: "
            + ", ".join(supported),
        )
        self.decision = decision


@lru_cache(maxsize=1)
def supported_languages() -> tuple[str, ...]:
    """Languages whose reports are de-identified: English (built in) and every installed pack."""
    return tuple(sorted({"en", *available_languages()}))


def route_language(text: str, prior: str | None) -> LanguageDecision:
    """The report's language when a pack covers it.

    Raises
    ------
    UnsupportedLanguageError
        When the detected language has no pack, or the text mixes in another script (see the module docstring).
    """
    decision = detect_language(text, prior)
    supported = supported_languages()
    if decision.language not in supported or decision.foreign_script:
        raise UnsupportedLanguageError(decision, supported)
    return decision


def prepare_language(text: str, prior: str | None) -> LanguageDecision:
    """:func:`route_language`, then load the language's pack (gazetteers: seconds, once per process).

    The build calls this before a report's de-identification time limit starts (one-time loading is no
    per-report cost and must not be cut by the per-report alarm).

    Raises
    ------
    UnsupportedLanguageError
        As :func:`route_language`.
    """
    decision = route_language(text, prior)
    if decision.language != "en":
        from entity_extraction.languages.local_deid import load_pack

        load_pack(decision.language)
    return decision


def deidentify_report(
    text: str,
    *,
    prior: str | None,
    known_phi: list[str],
    date_shift_days: int | None,
    day_first: bool = False,
    decision: LanguageDecision | None = None,
) -> tuple[LanguageDecision, str, dict[str, int]]:
    """Identify the report's language and de-identify it with that language's rules.

    Parameters
    ----------
    text : str
        Report text (restricted).
    prior : str or None
        The institution's (or the source record's) configured report language, ISO 639-1.
    known_phi, date_shift_days
        As for :func:`entity_extraction.text_deid.deidentify_text`.
    day_first : bool
        How English numeric dates are read (other languages always read day first).
    decision : LanguageDecision, optional
        The language already decided for this text (:func:`prepare_language`); default: decided here.

    Returns
    -------
    tuple of (LanguageDecision, str, dict of str to int)
        The language decision, the de-identified text and the replacement counts per kind.

    Raises
    ------
    UnsupportedLanguageError
        ``unsupported_language`` (see :func:`route_language`).
    """
    decision = decision or route_language(text, prior)
    if decision.language == "en":
        from entity_extraction.text_deid import deidentify_text

        out, counts = deidentify_text(text, known_phi=known_phi, date_shift_days=date_shift_days, day_first=day_first)
    else:
        out, counts = deidentify_local(text, decision.language, known_phi=known_phi, date_shift_days=date_shift_days)
    return decision, out, counts


def section_rules_path(language: str) -> str | None:
    """``section_rules_<language>.json`` on the language search path, None for English (the default rules)."""
    if language == "en":
        return None
    from schemas.ontology import find_language_file, language_search_path

    # the extractor's packaged rules folder (entity_extraction.extract.RULES_DIR; not imported: spaCy and torch
    # would load inside the caller's per-report time limit)
    path = find_language_file("section_rules", language, language_search_path(packaged=Path(__file__).parents[1]))
    return str(path) if path else None
