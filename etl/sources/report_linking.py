"""Linking a report record to its study and patient, and the checks that guard its text.

A report record (:func:`etl.sources.reports.iter_report_source`) links to a study through the same keyed
pseudonyms as the images, so the link survives de-identification: by StudyInstanceUID first, else by the
institution's AccessionNumber. A record without a study but with a PatientID still gets the patient's key
(``no_study``); a record of a report-only source (an institution without DICOM) is ``report_only_source``.

The header PHI of the linked study's source file (names, IDs, accession, address, institution: the values
of :data:`REPORT_PHI_KEYWORDS`) is handed to the text scrubber, and :func:`surviving_source_dates` checks
afterwards, with patterns independent of the scrubber's, that no date of the source text survived.
"""

from __future__ import annotations

import datetime as dt
import io
import re
import warnings
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import polars as pl
import pydicom
import yaml

from etl.keys import PseudonymKey, patient_key_for
from schemas.config import PROJECT_ROOT, Institution

#: header elements whose values are PHI to redact from the text of a report linked to that study
REPORT_PHI_KEYWORDS = (
    "PatientName",
    "OtherPatientNames",
    "PatientBirthName",
    "PatientMotherBirthName",
    "PatientID",
    "OtherPatientIDs",
    "AccessionNumber",
    "ReferringPhysicianName",
    "PerformingPhysicianName",
    "OperatorsName",
    "PatientAddress",
    "PatientTelephoneNumbers",
    "InstitutionName",
)
#: the quality gate's PHI patterns; the ``date_*`` ones verify report text (data shared with ``quality/``)
SOURCE_DATE_PATTERNS_FILE = PROJECT_ROOT / "quality" / "expectations.yaml"


@dataclass(frozen=True)
class StudyIndex:
    """Studies of the run's de-identified instances, by study key and by (institution, accession key).

    Attributes
    ----------
    by_study : dict
        ``study_key`` -> the study's first ``instances`` row.
    by_accession : dict
        ``(institution, accession_key)`` -> the first ``instances`` row of the lowest ``study_key``.
    study_source : dict
        ``study_key`` -> ``source_uri`` of its first ingested file (for the header PHI).
    """

    by_study: dict[str, dict[str, Any]]
    by_accession: dict[tuple[str, str], dict[str, Any]]
    study_source: dict[str, str]

    @classmethod
    def build(cls, instances: pl.DataFrame, ingested: pl.DataFrame) -> StudyIndex:
        """From the ``instances`` rows and the de-identification events with status ``ingested``
        (columns ``study_key``, ``source_uri``)."""
        by_study = {r["study_key"]: r for r in instances.unique("study_key", keep="first").iter_rows(named=True)}
        by_accession = {
            (r["institution"], r["accession_key"]): r
            for r in instances.filter(pl.col("accession_key").is_not_null())
            .sort("study_key")
            .unique(["institution", "accession_key"], keep="first")
            .iter_rows(named=True)
        }
        ingested = ingested.sort("source_uri")
        study_source = dict(zip(ingested["study_key"].to_list(), ingested["source_uri"].to_list()))
        return cls(by_study, by_accession, study_source)


@dataclass(frozen=True)
class ReportLink:
    """Where a report record belongs: its study row (or None), patient key (or None) and ``link_status``
    (``linked``, ``no_study`` or ``report_only_source``)."""

    study: dict[str, Any] | None
    patient_key: str | None
    link_status: str

    @property
    def study_key(self) -> str | None:
        """The linked study's key, or None."""
        return self.study["study_key"] if self.study else None


def link_report(record: dict[str, Any], inst: Institution, key: PseudonymKey, index: StudyIndex) -> ReportLink:
    """Link one report record (fields of :mod:`etl.sources.reports`) to its study and patient.

    StudyInstanceUID first (pseudonym ``study``), then the institution's AccessionNumber (pseudonym
    ``accession`` of ``<institution>|<accession>``); unlinked records with a PatientID get the patient's key.
    """
    study = None
    if record.get("study_instance_uid"):
        study = index.by_study.get(key.pseudonym("study", str(record["study_instance_uid"]).strip()))
    if study is None and record.get("accession_number"):
        acc = key.pseudonym("accession", f"{inst.id}|{str(record['accession_number']).strip()}")
        study = index.by_accession.get((inst.id, acc))
    if study is not None:
        return ReportLink(study, study["patient_key"], "linked")
    if record.get("patient_id"):
        return ReportLink(
            None, patient_key_for(key, inst.id, str(record["patient_id"]), inst.patient_id_issuer), "no_study"
        )
    return ReportLink(None, None, "report_only_source" if not inst.dicom else "no_study")


def header_phi(data: bytes) -> list[str]:
    """Values of :data:`REPORT_PHI_KEYWORDS` in a source DICOM file's header (bytes), each multi-value item
    apart, stripped, empty ones left out. Restricted: the result is PHI, for the text scrubber only."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = pydicom.dcmread(io.BytesIO(data), stop_before_pixels=True, force=True)
    out = []
    for kw in REPORT_PHI_KEYWORDS:
        v = ds.get(kw)
        if v in (None, ""):
            continue
        for item in v if isinstance(v, (list, pydicom.multival.MultiValue)) else [v]:
            if str(item).strip():
                out.append(str(item).strip())
    return out


@lru_cache(maxsize=1)
def _source_date_patterns() -> tuple[re.Pattern[str], ...]:
    doc = yaml.safe_load(SOURCE_DATE_PATTERNS_FILE.read_text(encoding="utf-8"))
    return tuple(
        re.compile(p["regex"], re.IGNORECASE)
        for p in doc["phi"]["patterns"]
        if p["name"].startswith("date_") and "regex" in p
    )


def surviving_source_dates(source: str, deidentified: str) -> int:
    """Number of date strings of the source text still present verbatim in the de-identified text.

    Uses the quality gate's date patterns (``date_*`` of ``quality/expectations.yaml``), an implementation
    independent of the text de-identifier's, so a date the de-identifier missed is caught here (fail-closed).
    Only matches of 6 or more characters count (after stripping `` ,.;:()``).
    """
    found = {m.group(0).strip(" ,.;:()") for rx in _source_date_patterns() for m in rx.finditer(source)}
    return sum(1 for d in found if len(d) >= 6 and d in deidentified)


def parse_report_datetime(value: str | None) -> dt.date | None:
    """The date of an ISO 8601 report datetime (``2023-03-14`` or ``2023-03-14T09:30``), None when absent or
    not ISO."""
    if not value:
        return None
    try:
        return dt.datetime.fromisoformat(str(value).strip()).date()
    except ValueError:
        return None
