"""``medreco reports annotate`` for reports in any language: the language is identified per report, a report in a
language without a pack is withheld (``unsupported_language``), the others are de-identified, sectioned and
labelled with their language's rules (:mod:`entity_extraction.annotate` describes the output of one line).
"""

from __future__ import annotations

from entity_extraction.annotate import ENTITY_FIELDS, NO_HEADER_NOTE, record_family
from entity_extraction.languages.route import UnsupportedLanguageError, deidentify_report, section_rules_path
from entity_extraction.sections import split_sections


class ExtractorPool:
    """One :class:`entity_extraction.extract.EntityExtractor` per language, built on first use (about a second
    each) and reused."""

    def __init__(self) -> None:
        self._by_language: dict = {}

    def get(self, language: str):
        """The extractor of ``language``.

        Raises
        ------
        entity_extraction.extract.ExtractorConfigError
            ``unsupported_language`` when the language has no synonyms or ConText rules.
        """
        if language not in self._by_language:
            from entity_extraction.extract import EntityExtractor

            self._by_language[language] = EntityExtractor(language=language)
        return self._by_language[language]


def annotate_any(record: dict, extractors: ExtractorPool, default_family: str, prior_language: str = "en") -> dict:
    """Annotate one parsed input record in whatever language it is written.

    Parameters
    ----------
    record : dict
        ``{"id", "input"}`` (optionally ``family``, ``modality``/``body_part``, ``language``: a prior for this
        record) as returned by :func:`entity_extraction.annotate.parse_line`.
    extractors : ExtractorPool
    default_family : str
    prior_language : str, default "en"
        The site's configured report language: a default for texts too short or mixed to say, never a fact.

    Returns
    -------
    dict
        The keys of :func:`entity_extraction.annotate.annotate_record` plus ``language`` (``{"code",
        "confidence", "method"}``). A withheld report has ``deidentified_text`` None, empty ``sections`` and
        ``entities``, and ``withheld`` ``{"reason": "unsupported_language", "detail"}`` (the detail names the
        detected language and confidence, never text).

    Raises
    ------
    entity_extraction.annotate.AnnotateInputError
        From :func:`entity_extraction.annotate.record_family`.
    """
    family = record_family(record, default_family)
    prior = record.get("language") if isinstance(record.get("language"), str) else prior_language
    try:
        decision, text, counts = deidentify_report(
            record["input"], prior=prior, known_phi=[], date_shift_days=None, day_first=False
        )
    except UnsupportedLanguageError as err:
        d = err.decision
        return {
            "id": record["id"],
            "deidentified_text": None,
            "sections": {},
            "entities": [],
            "family": family,
            "deidentification": {"header_values": NO_HEADER_NOTE, "redactions": {}},
            "language": {"code": d.language, "confidence": d.confidence, "method": d.method},
            "withheld": {"reason": err.reason, "detail": err.detail},
        }
    mentions = extractors.get(decision.language).extract(text, family) if family is not None else []
    return {
        "id": record["id"],
        "deidentified_text": text,
        "sections": split_sections(text, section_rules_path(decision.language)),
        "entities": [{k: m[k] for k in ENTITY_FIELDS} for m in mentions],
        "family": family,
        "deidentification": {"header_values": NO_HEADER_NOTE, "redactions": counts},
        "language": {"code": decision.language, "confidence": decision.confidence, "method": decision.method},
    }
