"""DICOM de-identification (foundation version): allow-list, keyed pseudonyms, per-patient date shifts.

Fail-closed: anything that cannot be de-identified with certainty raises :class:`DeidentificationError`
with a reason code, and the caller quarantines the input. The policy is data
(``schemas/deid/foundation_policy.yaml``): every element not on the allow-list is removed at every depth,
including all private elements; UIDs are remapped to ``2.25.<keyed hash>``; dates are shifted by one
offset per patient (PS3.15 E.3.6, option 113107); patient characteristics are retained (113108) with
ages over 89 reported as ``090Y``.

Applied options are recorded in DeidentificationMethodCodeSequence (PS3.16 CID 7050):
113100 Basic Application Confidentiality Profile, 113107 Retain Longitudinal Temporal Information
with Modified Dates, 113108 Retain Patient Characteristics Option.
"""

from __future__ import annotations

import datetime as dt
import io
import re
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import pydicom
import yaml
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.sequence import Sequence
from pydicom.uid import PYDICOM_IMPLEMENTATION_UID, ExplicitVRLittleEndian

from etl.keys import PseudonymKey

POLICY_FILE = Path(__file__).resolve().parents[1] / "schemas" / "deid" / "foundation_policy.yaml"
#: DeidentificationMethod (LO: at most 64 characters)
DEID_METHOD = "MedReCo-DB allow-list: PS3.15 Basic Profile, 113107, 113108"
METHOD_CODES = (
    ("113100", "Basic Application Confidentiality Profile"),
    ("113107", "Retain Longitudinal Temporal Information Modified Dates Option"),
    ("113108", "Retain Patient Characteristics Option"),
)
_DT_RE = re.compile(r"^(\d{4})(\d{2})?(\d{2})?(\d{2})?(\d{2})?(\d{2})?(\.\d{1,6})?([+-]\d{4})?$")


class DeidentificationError(Exception):
    """An input that cannot be de-identified with certainty. ``reason`` is a reason code; the message
    never contains a value from the file."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Policy:
    """The allow-list policy loaded from YAML."""

    edition: str
    keep: frozenset[str]
    keep_sequences: dict[str, frozenset[str]]
    remap_uids: tuple[str, ...]
    shift_dates: tuple[str, ...]
    shift_datetimes: tuple[str, ...]
    keep_times: tuple[str, ...]
    empty: tuple[str, ...]
    verify_absent: tuple[str, ...]


@lru_cache(maxsize=2)
def load_policy(path: str | None = None) -> Policy:
    """Load the de-identification policy (default: ``schemas/deid/foundation_policy.yaml``)."""
    d = yaml.safe_load(Path(path or POLICY_FILE).read_text())
    return Policy(
        edition=d["edition"],
        keep=frozenset(d["keep"]),
        keep_sequences={k: frozenset(v) for k, v in d["keep_sequences"].items()},
        remap_uids=tuple(d["remap_uids"]),
        shift_dates=tuple(d["shift_dates"]),
        shift_datetimes=tuple(d["shift_datetimes"]),
        keep_times=tuple(d["keep_times"]),
        empty=tuple(d["empty"]),
        verify_absent=tuple(d["verify_absent"]),
    )


@dataclass
class DeidResult:
    """A de-identified instance and the pseudonyms that identify it.

    ``date_shift_days`` is the per-patient offset applied (days); ``audit`` counts elements per action
    (removed, remapped, shifted, replaced, kept).
    """

    dataset: Dataset
    patient_key: str
    study_key: str
    series_key: str
    sop_key: str
    accession_key: str | None
    date_shift_days: int
    audit: Counter = field(default_factory=Counter)

    def to_bytes(self) -> bytes:
        """The de-identified file (Part 10, with preamble and file meta)."""
        buf = io.BytesIO()
        self.dataset.save_as(buf, enforce_file_format=True)
        return buf.getvalue()


def patient_value(institution: str, patient_id: str) -> str:
    """The string pseudonymised for a patient: PatientID is unique only within its institution."""
    return f"{institution}|{patient_id.strip()}"


def shift_date(value: str, days: int) -> str:
    """Shift a DA value (``YYYYMMDD``) by ``days``; partial dates (``YYYY``/``YYYYMM``) are refused.

    Raises
    ------
    DeidentificationError
        ``unparseable_date`` when the value is not a full valid date.
    """
    v = value.strip()
    try:
        if not re.fullmatch(r"\d{8}", v):
            raise ValueError
        d = dt.date(int(v[:4]), int(v[4:6]), int(v[6:8]))
    except ValueError:
        raise DeidentificationError("unparseable_date", "a DA value is not a valid YYYYMMDD date") from None
    return (d + dt.timedelta(days=days)).strftime("%Y%m%d")


def shift_datetime(value: str, days: int) -> str:
    """Shift a DT value by ``days`` keeping its precision, fractional seconds and UTC offset.

    Raises
    ------
    DeidentificationError
        ``unparseable_date`` when the value is not a valid DT (PS3.5 Table 6.2-1).
    """
    m = _DT_RE.match(value.strip())
    if not m or not m.group(3):
        raise DeidentificationError("unparseable_date", "a DT value is not a valid date-time with a full date")
    head = value.strip()[:8]
    return shift_date(head, days) + value.strip()[8:]


def _age_capped(age: str) -> str:
    m = re.fullmatch(r"(\d{3})([DWMY])", age.strip())
    if not m:
        raise DeidentificationError("unparseable_age", "PatientAge is not an AS value (nnnD/W/M/Y)")
    n, unit = int(m.group(1)), m.group(2)
    years = {"D": n / 365.25, "W": n / 52.18, "M": n / 12, "Y": n}[unit]
    return "090Y" if years > 89 else age.strip()


#: identity values of these kinds may legitimately equal a device vendor name (test data often sets
#: InstitutionName to the manufacturer); they are not checked against the device elements.
_INSTITUTION_KWS = frozenset({"InstitutionName", "InstitutionAddress"})
_DEVICE_KWS = frozenset({"Manufacturer", "ManufacturerModelName"})


def _strings(ds: Dataset, skip: frozenset[str] = frozenset()) -> list[str]:
    out = []
    for elem in ds.iterall():
        if elem.keyword in skip:
            continue
        if elem.VR in ("PN", "LO", "SH", "ST", "LT", "UT", "CS", "DA", "DT", "TM", "AE", "UC", "AS", "IS", "DS"):
            vals = elem.value if isinstance(elem.value, (list, pydicom.multival.MultiValue)) else [elem.value]
            out.extend(str(v) for v in vals if v is not None and str(v) != "")
    return out


def _phi_values(ds: Dataset, policy: Policy) -> set[tuple[str, str]]:
    values: set[tuple[str, str]] = set()
    for kw in policy.verify_absent:
        elem = ds.get(kw)
        if elem in (None, ""):
            continue
        vals = elem if isinstance(elem, (list, pydicom.multival.MultiValue)) else [elem]
        for v in vals:
            s = str(v).strip()
            if kw.endswith("Name"):
                # each name component of 3+ characters on its own
                values.update((kw, p.strip()) for p in re.split(r"[\^=, ]+", s) if len(p.strip()) >= 3)
            elif len(s) >= 4:
                values.add((kw, s))
    return values


def _contains(haystack: str, value: str, whole_word: bool) -> bool:
    """Case-insensitive containment; name components must match a whole word ('MARY' is not in 'PRIMARY')."""
    if not whole_word:
        return value.lower() in haystack.lower()
    return re.search(rf"(?<![A-Za-z]){re.escape(value)}(?![A-Za-z])", haystack, re.IGNORECASE) is not None


def _copy_allowed(src: Dataset, policy: Policy, audit: Counter) -> Dataset:
    out = Dataset()
    for elem in src:
        kw = elem.keyword
        if elem.tag.is_private or not kw:
            audit["removed"] += 1
            continue
        if elem.VR == "SQ":
            allowed = policy.keep_sequences.get(kw)
            if allowed is None:
                audit["removed"] += 1
                continue
            items = []
            for item in elem.value:
                new = Dataset()
                for sub in item:
                    if sub.keyword in allowed and sub.VR != "SQ":
                        new.add(sub)
                        audit["kept"] += 1
                    else:
                        audit["removed"] += 1
                items.append(new)
            setattr(out, kw, Sequence(items))
            continue
        if kw in policy.keep or kw in policy.keep_times:
            out.add(elem)
            audit["kept"] += 1
        else:
            audit["removed"] += 1
    return out


def deidentify_dataset(ds: Dataset, key: PseudonymKey, institution: str, policy: Policy | None = None) -> DeidResult:
    """De-identify one DICOM instance.

    Parameters
    ----------
    ds : pydicom.Dataset
        the source instance (read with pixel data; it is not modified).
    key : PseudonymKey
        the deployment's pseudonymisation key.
    institution : str
        institution id; PatientID and AccessionNumber are pseudonymised within it.

    Returns
    -------
    DeidResult

    Raises
    ------
    DeidentificationError
        reason codes: ``missing_patient_id``, ``missing_uid``, ``burned_in_annotation``,
        ``unparseable_date``, ``unparseable_age``, ``phi_verification_failed``.
    """
    policy = policy or load_policy()
    audit: Counter = Counter()
    patient_id = str(ds.get("PatientID", "") or "").strip()
    if not patient_id:
        raise DeidentificationError("missing_patient_id", "PatientID is empty or absent")
    for kw in ("StudyInstanceUID", "SeriesInstanceUID", "SOPInstanceUID"):
        if not str(ds.get(kw, "") or "").strip():
            raise DeidentificationError("missing_uid", f"{kw} is empty or absent")
    if str(ds.get("BurnedInAnnotation", "") or "").upper() == "YES":
        raise DeidentificationError("burned_in_annotation", "BurnedInAnnotation is YES: pixel data may show PHI")

    patient_key = key.pseudonym("patient", patient_value(institution, patient_id))
    shift = key.date_shift_days(patient_key)
    out = _copy_allowed(ds, policy, audit)

    out.PatientName = patient_key
    out.PatientID = patient_key
    audit["replaced"] += 2
    for kw in policy.empty:
        setattr(out, kw, "")
        audit["replaced"] += 1
    accession = str(ds.get("AccessionNumber", "") or "").strip()
    accession_key = key.pseudonym("accession", f"{institution}|{accession}") if accession else None
    out.AccessionNumber = accession_key or ""
    for kw in policy.remap_uids:
        if kw in ds and str(ds[kw].value).strip():
            setattr(out, kw, key.uid(str(ds[kw].value)))
            audit["remapped"] += 1
    for kw in policy.shift_dates:
        if str(ds.get(kw, "") or "").strip():
            setattr(out, kw, shift_date(str(ds[kw].value), shift))
            audit["shifted"] += 1
    for kw in policy.shift_datetimes:
        if str(ds.get(kw, "") or "").strip():
            setattr(out, kw, shift_datetime(str(ds[kw].value), shift))
            audit["shifted"] += 1
    if "PatientAge" in out and str(out.PatientAge).strip():
        try:
            out.PatientAge = _age_capped(str(out.PatientAge))
        except DeidentificationError:
            del out.PatientAge  # not an AS value: removing it is always safe
            audit["removed"] += 1

    out.PatientIdentityRemoved = "YES"
    out.LongitudinalTemporalInformationModified = "MODIFIED"
    out.DeidentificationMethod = DEID_METHOD
    codes = []
    for value, meaning in METHOD_CODES:
        item = Dataset()
        item.CodeValue = value
        item.CodingSchemeDesignator = "DCM"
        item.CodeMeaning = meaning
        codes.append(item)
    out.DeidentificationMethodCodeSequence = Sequence(codes)

    src_meta = getattr(ds, "file_meta", None)
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = ds.SOPClassUID if "SOPClassUID" in ds else "1.2.840.10008.5.1.4.1.1.7"
    meta.MediaStorageSOPInstanceUID = out.SOPInstanceUID
    ts = src_meta.get("TransferSyntaxUID") if src_meta is not None else None
    meta.TransferSyntaxUID = ts or ExplicitVRLittleEndian
    meta.ImplementationClassUID = PYDICOM_IMPLEMENTATION_UID
    meta.ImplementationVersionName = "MEDRECO_0_1"
    out.file_meta = meta
    out.preamble = b"\x00" * 128

    # Fail closed: no identifying header value may survive anywhere in the output.
    phi = _phi_values(ds, policy)
    if phi:
        all_strings = _strings(out)
        non_device = _strings(out, skip=_DEVICE_KWS)
        survivors = [
            v for kw, v in phi
            if any(_contains(s, v, whole_word=kw.endswith("Name"))
                   for s in (non_device if kw in _INSTITUTION_KWS else all_strings))
        ]
        if survivors:
            raise DeidentificationError(
                "phi_verification_failed", f"{len(survivors)} element(s) still hold an identifying value"
            )
    audit["verified"] += 1
    return DeidResult(
        dataset=out,
        patient_key=patient_key,
        study_key=key.pseudonym("study", str(ds.StudyInstanceUID).strip()),
        series_key=key.pseudonym("series", str(ds.SeriesInstanceUID).strip()),
        sop_key=key.pseudonym("sop", str(ds.SOPInstanceUID).strip()),
        accession_key=accession_key,
        date_shift_days=shift,
        audit=audit,
    )
