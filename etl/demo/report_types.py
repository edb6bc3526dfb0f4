"""The demo report generator's shared types and phrase book: what :mod:`etl.demo.reports` (English) and
:mod:`etl.demo.reports_local` (German, Spanish) both use, in a module of its own so that neither imports the other
for it."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from schemas.errors import ReasonCodedError
from schemas.ontology import Concept

PHRASES_FILE = Path(__file__).with_name("phrases.yaml")

#: Assertion values of the truth records (entity_mentions.assertion).
ASSERTIONS = ("present", "absent", "uncertain")
#: Change values of the truth records (entity_mentions.change).
CHANGES = ("new", "increased", "decreased", "unchanged", "resolved", "improved", "worsened", "none")


class DemoReportError(ReasonCodedError, ValueError):
    """Raised for an unknown family/sub-type or a phrase file that does not fit the ontology.

    ``reason`` is a short machine-readable code (``unknown_family``, ``unknown_us_subtype``,
    ``no_phrase``, ``bad_phrase_file``).
    """


@lru_cache(maxsize=1)
def load_phrases(path: str | None = None) -> dict[str, Any]:
    """Load the phrase book (``phrases.yaml`` by default).

    Raises
    ------
    DemoReportError
        ``bad_phrase_file`` when a required top-level key is missing.
    """
    data = yaml.safe_load(Path(path or PHRASES_FILE).read_text(encoding="utf-8"))
    required = (
        "sections",
        "header",
        "footer",
        "date_formats",
        "indication",
        "technique",
        "normal",
        "templates",
    )
    missing = [k for k in required if k not in (data or {})]
    if missing:
        raise DemoReportError("bad_phrase_file", f"{path or PHRASES_FILE} lacks keys {missing}")
    return data


def _is_abbreviation(s: str) -> bool:
    return len(s) <= 4 and s.isalpha()


@lru_cache(maxsize=8)
@dataclass(frozen=True)
class EntityState:
    """What a patient's imaging currently shows for one present entity.

    ``severity`` indexes the concept's severity scale (0..2) or is None for conditions;
    ``side`` is ``right``/``left``/``bilateral`` or None; ``location`` is a suffix such as
    ``"in the right lower lobe"`` or ``""``.
    """

    entity_id: str
    phrase: str
    severity: int | None
    side: str | None
    location: str


@dataclass(frozen=True)
class PlannedMention:
    """One entity statement of a report: truth assertion/change plus how to phrase it."""

    entity_id: str
    assertion: str
    change: str
    state: EntityState


def _scale(concept: Concept, book: dict[str, Any]) -> list[str]:
    name = concept.preferred_name.lower()
    key = "size" if any(k in name for k in book["size_keywords"]) else "degree"
    return book["severity"][key]


@dataclass(frozen=True)
class ReportContext:
    """Restricted facts a report preamble/footer may quote, and the study it describes.

    Dates are local calendar dates; ``age_years`` at the study; ``prior_date``/``prior_exam``
    describe the patient's previous study of the same family (None when there is none).
    """

    family: str
    us_subtype: str | None
    side: str | None
    country: str
    patient_given: str
    patient_family: str
    patient_middle: str
    sex: str
    mrn: str
    birth_date: date
    age_years: int
    exam_name: str
    study_datetime: datetime
    report_datetime: datetime
    accession: str | None
    referrer: str
    radiologist: str
    phone: str
    technique_key: str
    exam_mentions: tuple[str, ...]
    prior_date: date | None
    prior_exam: str | None
    with_preamble: bool


@dataclass(frozen=True)
class RenderedReport:
    """Report text, its truth entities (entity_id, assertion, change) sorted by id, and PHI (type, value)."""

    text: str
    entities: list[dict[str, str]]
    phi: list[tuple[str, str]]


def render_preamble(
    rng: random.Random,
    ctx: ReportContext,
    header: dict[str, list[str]],
    shown_name: str,
    date_text: Callable[[date | datetime], str],
    phi: list[tuple[str, str]],
    truth: dict[str, tuple[str, str]],
) -> str:
    """The restricted preamble of a demo report, in any language: the patient line (``shown_name`` as written, its
    PHI recorded by the caller), the MRN, sometimes the birth date, the exam with its date, sometimes the accession
    number and the referrer, one per line, from the phrase book's ``header`` variants.

    Each PHI value written is appended to ``phi`` as ``(type, value)`` (dates through ``date_text``, which records
    them); the exam's anatomy mentions go into ``truth`` as present with no change. The random draws come in one
    fixed order, so one seed gives one corpus.
    """
    pre = [rng.choice(header["patient"]).format(name=shown_name)]
    pre.append(rng.choice(header["mrn"]).format(mrn=ctx.mrn))
    phi.append(("id", ctx.mrn))
    if rng.random() < 0.6:
        pre.append(rng.choice(header["dob"]).format(dob=date_text(ctx.birth_date)))
    pre.append(rng.choice(header["exam"]).format(exam=ctx.exam_name.upper(), date=date_text(ctx.study_datetime)))
    for a in ctx.exam_mentions:
        truth[a] = ("present", "none")
    if ctx.accession and rng.random() < 0.7:
        pre.append(rng.choice(header["accession"]).format(accession=ctx.accession))
        phi.append(("id", ctx.accession))
    if rng.random() < 0.7:
        pre.append(rng.choice(header["referrer"]).format(referrer=ctx.referrer))
        phi.append(("name", ctx.referrer))
    return "\n".join(pre)


def add_normal_sentences(
    rng: random.Random,
    book: dict[str, Any],
    ctx: ReportContext,
    busy_anatomy: set[str],
    sentences: list[str],
    truth: dict[str, tuple[str, str]],
) -> None:
    """Append the phrase book's normal statements of the study's family (or ultrasound sub-type) to ``sentences``,
    each with probability 0.65 and never one naming an anatomy in ``busy_anatomy`` (a finding already describes it);
    the anatomy each added statement names goes into ``truth`` as present with no change. Any language: ``book`` is
    that language's phrase book."""
    normals = book["normal"][ctx.family]
    if isinstance(normals, dict):
        normals = normals[ctx.us_subtype]
    for n in normals:
        if any(a in busy_anatomy for a in n["mentions"]) or rng.random() < 0.35:
            continue
        sentences.append(n["text"])
        for a in n["mentions"]:
            truth[a] = ("present", "none")
