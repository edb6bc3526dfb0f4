"""One source DICOM file to one de-identified instance: the per-file step of the de-identification stage.

:func:`deidentify_file` parses the bytes, infers the body part from the source descriptors (before they are
cleaned), applies :func:`etl.deid.dicom.deidentify_dataset` under a time limit and builds the ``instances`` row.
Every failure becomes a :class:`DeidOutcome` with a reason code and a PHI-free detail, never an exception:
reason-coded de-identification failures keep their code, a file that cannot be parsed or written is
``unreadable_dicom`` (the exception's type only), one over :data:`etl.limits.FILE_TIME_LIMIT_S` is
``deidentification_timeout``, a value the row cannot hold is ``invalid_value``; a file past a bound before parsing
is ``inflated_too_large``, ``inflate_error`` or ``too_many_sequence_items`` (:mod:`etl.sources.dicom_bounds`); a
native library's panic (a ``BaseException`` that is not an interrupt) is ``decoder_crashed``.
"""

from __future__ import annotations

import datetime as dt
import io
import re
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pydicom

from etl.deid.dicom import DeidentificationError, DeidResult, deidentify_dataset
from etl.deid.policy import Policy
from etl.keys import PseudonymKey
from etl.limits import FILE_TIME_LIMIT_S, RecordLimitError, time_limit
from etl.sources.dicom_bounds import SourceBoundsError, bounded_source
from schemas.config import Institution, PixelCleaningRule
from schemas.ontology import infer_body_part, modality_family

if TYPE_CHECKING:
    from etl.deid.series_text import SeriesSlot

_IS_INTEGER = re.compile(r"[+-]?\d{1,12}")
#: a Code String (PS3.5 6.2, VR CS): upper-case letters, digits, space and underscore, at most 16 characters
_CODE_STRING = re.compile(r"[A-Z0-9_ ]{1,16}")


@dataclass(frozen=True)
class DeidOutcome:
    """What de-identifying one source file gave.

    Attributes
    ----------
    result : DeidResult or None
        the de-identified instance and its pseudonyms (None when quarantined).
    payload : bytes or None
        the verified Part 10 bytes to write (None when quarantined).
    instance : dict or None
        the ``instances`` row (columns of :mod:`schemas.instances`; None when quarantined).
    reason, detail : str or None
        the quarantine reason code and a message without values (None when ingested).
    preview : etl.deid.preview.Preview or None
        the pixels that failed, for a file quarantined ``burned_in_text_remaining`` (restricted: may show PHI).
    """

    result: DeidResult | None = None
    payload: bytes | None = None
    instance: dict[str, Any] | None = None
    reason: str | None = None
    detail: str | None = None
    preview: Any = None

    @property
    def ingested(self) -> bool:
        """True when the file was de-identified (``result``, ``payload`` and ``instance`` are set)."""
        return self.reason is None


def study_datetime(ds: pydicom.Dataset) -> dt.datetime | None:
    """StudyDate + StudyTime (seconds, fractions dropped) of a dataset; the date alone when the time is unusable;
    None without an 8-digit StudyDate.

    Raises
    ------
    ValueError
        for a StudyDate that is no calendar date.
    """
    date = str(ds.get("StudyDate", "") or "").strip()
    if len(date) != 8:
        return None
    time = str(ds.get("StudyTime", "") or "").strip().split(".")[0].ljust(6, "0")[:6]
    try:
        return dt.datetime.strptime(date + (time if time.isdigit() else "000000"), "%Y%m%d%H%M%S")
    except ValueError:
        return dt.datetime.strptime(date, "%Y%m%d")


def instance_row(result: DeidResult, inst: Institution, body_part: str | None, path: str, shard: int) -> dict:
    """The ``instances`` row of a de-identified file written at ``path`` (root-relative) in ``shard``.

    Raises
    ------
    DeidentificationError
        ``invalid_value`` when a value the row needs cannot be read (Modality not a code string, InstanceNumber
        not an integer string, StudyDate/StudyTime not a date and time); the message names the attribute, never
        its value.
    """
    out = result.dataset
    modality = str(out.get("Modality", "") or "OT").strip() or "OT"
    if not _CODE_STRING.fullmatch(modality):  # e.g. "/../../sources/x": never a table value, nor a folder name
        raise DeidentificationError("invalid_value", "Modality is not a code string (CS)")
    number = str(out.get("InstanceNumber", "") or "").strip()
    if number and not _IS_INTEGER.fullmatch(number):
        raise DeidentificationError("invalid_value", "InstanceNumber is not an integer string (IS)")
    try:
        when = study_datetime(out)
    except ValueError:
        raise DeidentificationError("invalid_value", "StudyDate/StudyTime is not a valid date and time") from None
    return {
        "sop_key": result.sop_key,
        "series_key": result.series_key,
        "study_key": result.study_key,
        "patient_key": result.patient_key,
        "accession_key": result.accession_key,
        "institution": inst.id,
        "country": inst.country,
        "modality": modality,
        "body_part": body_part,
        "family": modality_family(modality, body_part),
        "view_position": str(out.get("ViewPosition", "") or "").strip().upper() or None,
        "study_datetime": when,
        "instance_number": int(number) if number else None,
        "manufacturer": str(out.get("Manufacturer", "") or "") or None,
        "model": str(out.get("ManufacturerModelName", "") or "") or None,
        "transfer_syntax": str(out.file_meta.TransferSyntaxUID),
        "dicom_path": path,
        "shard": shard,
    }


def deidentify_file(
    data: bytes,
    key: PseudonymKey,
    inst: Institution,
    policy: Policy,
    dicom_dir: str,
    shard: int,
    pixel_cleaning: list[PixelCleaningRule] | None = None,
    series_text: SeriesSlot | None = None,
) -> DeidOutcome:
    """De-identify one source file (its bytes) for institution ``inst``; never raises for a bad file.

    Parameters
    ----------
    data : bytes
        the source file.
    key, inst, policy
        the pseudonymisation key, the file's institution, the de-identification policy.
    dicom_dir : str
        the shard's folder of de-identified files (the row's ``dicom_path`` is ``<dicom_dir>/<sop_key>.dcm``).
    shard : int
    pixel_cleaning : list of PixelCleaningRule, optional
        per-device region rules (config ``deid.pixel_cleaning``).
    series_text : SeriesSlot, optional
        the file's place in its series for burned-in text (:class:`etl.deid.series_text.SeriesTextGate`).

    Returns
    -------
    DeidOutcome
        ingested (result, payload, instance row) or quarantined (reason, detail); the module docstring lists
        the reasons.
    """
    try:  # every failure of one file is that file's quarantine record, never a failed task
        with time_limit(FILE_TIME_LIMIT_S, "deidentification_timeout", "file's de-identification"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                data = bounded_source(data)  # deflated inflated with a cap, sequence items counted
                ds = pydicom.dcmread(io.BytesIO(data), force=True)
                body_part = infer_body_part(  # from the source descriptors, before they are cleaned
                    str(ds.get("BodyPartExamined", "") or ""),
                    [str(ds.get(k, "") or "") for k in ("StudyDescription", "SeriesDescription", "ProtocolName")],
                )
                result = deidentify_dataset(
                    ds,
                    key,
                    inst.id,
                    policy,
                    pixel_cleaning=pixel_cleaning,
                    default_issuer=inst.patient_id_issuer,
                    series_text=series_text,
                )
            payload = result.to_bytes()
        row = instance_row(result, inst, body_part, f"{dicom_dir}/{result.sop_key}.dcm", shard)
    except (DeidentificationError, RecordLimitError, SourceBoundsError) as err:
        return DeidOutcome(reason=err.reason, detail=str(err), preview=getattr(err, "preview", None))
    except Exception as err:  # noqa: BLE001  a file pydicom cannot fully parse or write: fail closed
        # the exception's text may quote a header value: only its type is recorded, nothing is logged
        return DeidOutcome(reason="unreadable_dicom", detail=f"{type(err).__name__} while de-identifying")
    except BaseException as err:  # a native library's panic (pyo3 PanicException) derives from BaseException
        if isinstance(err, (KeyboardInterrupt, SystemExit, GeneratorExit)):
            raise
        return DeidOutcome(reason="decoder_crashed", detail=f"{type(err).__name__} in a native library")
    return DeidOutcome(result=result, payload=payload, instance=row)
