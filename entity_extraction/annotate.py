"""Annotate one report for curators: de-identified text, sections and ontology entities with their modifiers.

The per-line logic of ``medreco reports annotate IN.jsonl OUT.jsonl`` (docs/command-line.md): an input
record ``{"id", "input"}`` (optionally ``"family"``, or ``"modality"`` and ``"body_part"``; other keys are
ignored) becomes ``{"id", "deidentified_text", "sections", "entities": [...]}`` plus ``"family"`` (the
vocabulary used) and ``"deidentification"`` (what text de-identification could use and how much it
replaced). The steps are those of the build (``etl.pipeline.stages.reports`` and the entity stage):

1. :func:`entity_extraction.text_deid.deidentify_text` with the pattern rules only: a line of a JSONL file
   has no linked DICOM header, so no known names or ids, and no patient date offset, so every date becomes
   ``[DATE]`` (fail-closed) instead of being shifted;
2. :func:`entity_extraction.sections.split_sections` on the de-identified text;
3. :meth:`entity_extraction.extract.EntityExtractor.extract` on the de-identified text with the family's
   ontology concepts.

Errors in a record raise :class:`AnnotateInputError` with a reason that never quotes the record's values.
"""

from __future__ import annotations

import json

from entity_extraction.extract import EntityExtractor
from entity_extraction.sections import split_sections
from entity_extraction.text_deid import deidentify_text
from schemas.errors import ReasonCodedError
from schemas.ontology import FAMILIES, modality_family

#: keys of one output entity, in output order (docs/command-line.md, ``medreco reports annotate``).
ENTITY_FIELDS = (
    "text",
    "entity_id",
    "category",
    "section",
    "assertion",
    "hedges",
    "temporality",
    "change",
    "laterality",
    "severity",
    "anatomy_id",
)
#: keys of one output line, in output order (``language``: the report's identified language,
#: :mod:`entity_extraction.languages.annotate`; a withheld report's line adds ``withheld``).
OUTPUT_FIELDS = ("id", "deidentified_text", "sections", "entities", "family", "deidentification", "language")
DEFAULT_FAMILY = "2D-CXR"
#: ``deidentification.header_values`` of every output line: no DICOM header is linked to a JSONL line.
NO_HEADER_NOTE = (
    "none available: pattern rules only (no known names or ids); dates redacted, not shifted (no patient date offset)"
)


class AnnotateInputError(ReasonCodedError, ValueError):
    """An input line that cannot be annotated.

    Attributes
    ----------
    reason : str
        One-line reason naming the problem, never a value of the line (``"not valid JSON (Expecting value,
        column 1)"``, ``"missing or empty 'input'"``, ``"unknown family (not one of 2D-CXR, ...)"``).
    """

    message_format = "{reason}"


def parse_line(line: str) -> dict | None:
    """Parse one JSONL input line into a dict (``None`` for a blank line).

    Raises
    ------
    AnnotateInputError
        If the line is not a JSON object, or ``id``/``input`` are missing, empty or of the wrong type
        (``id``: non-empty string or integer; ``input``: non-empty string).
    """
    if not line.strip():
        return None
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise AnnotateInputError(f"not valid JSON ({exc.msg}, column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise AnnotateInputError("not a JSON object")
    rid = obj.get("id")
    if isinstance(rid, bool) or not isinstance(rid, (str, int)) or (isinstance(rid, str) and not rid.strip()):
        raise AnnotateInputError("missing or empty 'id' (a string or an integer)")
    text = obj.get("input")
    if not isinstance(text, str) or not text.strip():
        raise AnnotateInputError("missing or empty 'input' (the report text, a string)")
    return obj


def record_family(record: dict, default_family: str) -> str | None:
    """Modality family of a record.

    ``family`` when given (must be one of :data:`schemas.ontology.FAMILIES`); else, when ``modality`` or
    ``body_part`` is given, :func:`schemas.ontology.modality_family` (``None``: a study without family
    labels, e.g. CT of the abdomen); else ``default_family``.

    Raises
    ------
    AnnotateInputError
        If ``family``, ``modality`` or ``body_part`` is present but not a string, or ``family`` is unknown.
    """
    for key in ("family", "modality", "body_part"):
        if record.get(key) is not None and not isinstance(record[key], str):
            raise AnnotateInputError(f"'{key}' must be a string")
    if record.get("family") is not None:
        if record["family"] not in FAMILIES:
            raise AnnotateInputError(f"unknown 'family' (not one of {', '.join(FAMILIES)})")
        return record["family"]
    if record.get("modality") or record.get("body_part"):
        return modality_family(record.get("modality"), record.get("body_part"))
    return default_family


def annotate_record(record: dict, extractor: EntityExtractor, default_family: str = DEFAULT_FAMILY) -> dict:
    """Annotate one parsed input record.

    Parameters
    ----------
    record : dict
        ``{"id", "input"}`` as returned by :func:`parse_line`, optionally ``family`` or ``modality``/``body_part``.
    extractor : EntityExtractor
        Built once and shared over all records (building one takes about a second).
    default_family : str, default "2D-CXR"
        Family of records that name neither a family nor a modality/body part.

    Returns
    -------
    dict
        Keys :data:`OUTPUT_FIELDS` but ``language``: ``id`` (as given), ``deidentified_text`` (str), ``sections``
        (``indication``, ``technique``, ``comparison``, ``findings``, ``impression``: de-identified bodies, ``""`` when
        absent), ``entities`` (list of dicts with keys :data:`ENTITY_FIELDS`, in text order; spans refer to
        ``deidentified_text``; empty when the family is ``None``), ``family`` (str or ``None``: no family
        labels for this modality/body part), ``deidentification`` (``{"header_values": NO_HEADER_NOTE,
        "redactions": {kind: count}}``, never a removed value).

    Raises
    ------
    AnnotateInputError
        From :func:`record_family`.
    """
    family = record_family(record, default_family)
    text, counts = deidentify_text(record["input"], known_phi=[], date_shift_days=None)
    mentions = extractor.extract(text, family) if family is not None else []
    return {
        "id": record["id"],
        "deidentified_text": text,
        "sections": split_sections(text),
        "entities": [{k: m[k] for k in ENTITY_FIELDS} for m in mentions],
        "family": family,
        "deidentification": {"header_values": NO_HEADER_NOTE, "redactions": counts},
    }


def annotate_line(line: str, extractor: EntityExtractor, default_family: str = DEFAULT_FAMILY) -> dict | None:
    """:func:`parse_line` then :func:`annotate_record`; ``None`` for a blank line.

    Raises
    ------
    AnnotateInputError
        For a line that is not a valid record (see :func:`parse_line`, :func:`record_family`).
    """
    record = parse_line(line)
    return None if record is None else annotate_record(record, extractor, default_family)
