"""DICOM de-identification: PS3.15 Annex E Basic Application Level Confidentiality Profile, every element at
every depth, with keyed pseudonyms, per-patient date shifts, and verification after.

The policy (Table E.1-1 resolved with the deployment's options) is :mod:`etl.deid.policy`; this module
walks a dataset and applies it:

- public attributes get their table action (X remove, Z empty, D dummy, K keep, U remap UIDs, C clean)
  at every depth, in sequences and in the file meta; attributes the table does not list are kept, except
  person names (emptied), UIDs (remapped unless registered, e.g. SOP classes) and dates (shifted);
- private attributes are removed with everything nested in them (also VR UN values that are really
  sequences), unless Retain Safe Private (113111) allow-lists them;
- curves (50xx) and overlays (60xx) are removed whole;
- dates (DA, DT) move by one offset per patient (113107), keeping precision, fractional seconds and UTC
  offsets; partial values stay partial; a value that cannot be parsed quarantines the file;
- burned-in text: a device's pixel-cleaning rule blanks its known regions, then OCR reads every frame and
  blanks every text line (:mod:`etl.deid.burned_in_text`), verified after; with OCR off for the file's
  institution and modality, files at risk of burned-in text (BurnedInAnnotation YES, ultrasound, secondary
  capture, ...) are quarantined unless a rule applies;
- after writing, a verifier looks for every identifying value of the input (name parts, IDs, original
  UIDs, addresses, phone numbers, digit-bearing free-text tokens) in the output bytes outside the pixel
  data; any hit quarantines the file (``verification_failed``).

Fail closed: every problem raises :class:`DeidentificationError` with a reason code and a message that
never quotes a value from the file.
"""

from __future__ import annotations

import datetime as dt
import io
import re
from collections import Counter
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING

import pydicom
from pydicom import config as pydicom_config
from pydicom.charset import convert_encodings, decode_bytes
from pydicom.datadict import dictionary_VM, dictionary_VR, keyword_for_tag
from pydicom.dataelem import DataElement, RawDataElement
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.filebase import DicomBytesIO
from pydicom.filewriter import write_sequence
from pydicom.multival import MultiValue
from pydicom.sequence import Sequence
from pydicom.tag import Tag
from pydicom.uid import (
    PYDICOM_IMPLEMENTATION_UID,
    UID,
    DeflatedExplicitVRLittleEndian,
    ExplicitVRLittleEndian,
    UID_dictionary,
)

from etl.deid.coded_terms import clean_header_text
from etl.deid.policy import CODE_CLEAN_PIXEL, PHOTOGRAPHIC_SOP_CLASSES, Policy, build_policy
from etl.keys import PseudonymKey, patient_key_for
from etl.limits import MAX_DICOM_TEXT_CHARS
from etl.sources.dicom_integrity import last_element_cut
from schemas.config import PixelCleaningRule
from schemas.errors import ReasonCodedError

if TYPE_CHECKING:
    from etl.deid.series_text import SeriesSlot

#: values of already de-identified input that are not identifying (and equal our own dummies)
PLACEHOLDERS = frozenset(
    {
        "ANONYMIZED",
        "ANONYMOUS",
        "ANON",
        "UNKNOWN",
        "NONE",
        "NULL",
        "REMOVED",
        "DEIDENTIFIED",
        "PATIENT",
        "TEST",
        "PHANTOM",
        "THE",
        "AND",
        "FOR",
        "DOCTOR",
        "PHYSICIAN",
        "OPERATOR",
    }
)
#: LO/SH/AE/UC attributes whose whole value identifies (others are descriptors or codes that legitimately
#: recur in kept, cleaned text: only person names, UIDs and these are verified absent)
IDENTIFYING_KEYWORDS = frozenset(
    {
        "PatientID",
        "OtherPatientIDs",
        "IssuerOfPatientID",
        "AccessionNumber",
        "StudyID",
        "RequestedProcedureID",
        "ScheduledProcedureStepID",
        "PerformedProcedureStepID",
        "AdmissionID",
        "ServiceEpisodeID",
        "PatientAddress",
        "PatientTelephoneNumbers",
        "MilitaryRank",
        "BranchOfService",
        "MedicalRecordLocator",
        "InsurancePlanIdentification",
        "InstitutionName",
        "InstitutionAddress",
        "InstitutionalDepartmentName",
        "DeviceSerialNumber",
        "StationName",
        "DetectorID",
        "PlateID",
        "CassetteID",
        "GantryID",
        "DeviceUID",
        "PersonTelephoneNumbers",
        "PersonAddress",
        "ResponsibleOrganization",
        "FillerOrderNumberImagingServiceRequest",
        "PlacerOrderNumberImagingServiceRequest",
        "OrderEnteredBy",
        "OrderCallbackPhoneNumber",
        "RegionOfResidence",
        "CountryOfResidence",
    }
)
ASCII_VRS = frozenset({"UI", "DA", "DT", "TM", "AS", "IS", "DS"})
#: VRs whose value is opaque bytes: an unlisted public element with one is removed unless in :data:`KEPT_BINARY_TAGS`
BINARY_VRS = frozenset({"OB", "OW", "OF", "OD", "OL", "OV", "UN", "OB or OW", "US or OW", "US or SS or OW"})
#: numeric VRs: their bytes are searched for name parts too (a name can be written as numbers)
NUMERIC_VRS = frozenset({"US", "SS", "UL", "SL", "FL", "FD", "UV", "SV", "AT", "US or SS"})
#: binary public elements kept when the profile does not list them: pixel data and what decodes or displays it
#: (offset tables, LUTs, palettes, ICC profile) and waveform samples. Their bytes are not searched for names
#: (short name parts occur in pixel bytes by chance).
KEPT_BINARY_TAGS = frozenset(
    {
        0x7FE00001,
        0x7FE00002,
        0x7FE00008,
        0x7FE00009,
        0x7FE00010,  # offset tables, Float/Double/Pixel Data
        0x00283006,
        0x00281201,
        0x00281202,
        0x00281203,
        0x00281204,  # LUT Data, palette colour LUT data
        0x00281221,
        0x00281222,
        0x00281223,
        0x00282000,  # segmented palette LUT data, ICC Profile
        0x00283010,
        0x00285000,
        0x00286030,  # (sequences/values of LUTs), bi-plane, mask pixel data
        0x54001010,
        0x5400100A,
        0x56000020,
        0x56000010,  # waveform data and padding value, spectroscopy data
    }
)
#: tags of a sequence's structure (items and delimiters): never valid as an element of a dataset
_STRUCTURAL_GROUP = 0xFFFE
#: numeric values longer than this (bytes) are not searched for name parts (chance matches in long arrays)
_NUMERIC_SEARCH_MAX = 4096
TEXT_VRS = frozenset({"AE", "CS", "LO", "LT", "PN", "SH", "ST", "UC", "UT", "UR"})
#: free-text VRs: an attribute with one that the profile does not list is cleaned (Clean Descriptors) when kept
FREE_TEXT_VRS = frozenset({"LO", "LT", "ST", "UT", "UC"})
#: bytes a text value may not hold (PS3.5 6.1.2.3, 6.2: control characters other than TAB, LF, FF, CR and the
#: ESC of ISO 2022 code extensions); a value holding them has swallowed other elements' bytes after a length fault
_CONTROL_BYTES = re.compile(rb"[\x00-\x08\x0b\x0e-\x1a\x1c-\x1f\x7f]")
#: the two-letter VRs of PS3.5 6.2 (a raw element's VR as read from an explicit VR file)
_STANDARD_VRS = frozenset(v.value for v in pydicom.valuerep.VR if len(v.value) == 2)
#: bytes per value of the numeric VRs (PS3.5 6.2)
_NUMERIC_SIZE = {"US": 2, "SS": 2, "US or SS": 2, "UL": 4, "SL": 4, "FL": 4, "AT": 4, "FD": 8, "UV": 8, "SV": 8}
#: a value multiplicity with an upper bound: "1", "3", "1-3" (not "1-n", "2-2n")
_BOUNDED_VM = re.compile(r"^(?:\d+-)?(\d+)$")
#: binary values kept whole whose bytes are pixel or sample arrays (not searched for names: short words occur by
#: chance in them); every other binary value kept (LUTs, palettes, ICC profile, allow-listed private) is searched
_SAMPLE_ARRAY_TAGS = frozenset({0x7FE00008, 0x7FE00009, 0x7FE00010, 0x54001010, 0x56000020, 0x00286030})
_DA_RE = re.compile(r"^\d{4}(\d{2}(\d{2})?)?$")
_DT_RE = re.compile(r"^(\d{4})(\d{2})?(\d{2})?(\d{2})?(\d{2})?(\d{2})?(\.\d{1,6})?([+-]\d{4})?$")
_TM_RE = re.compile(r"^\d{2}(\d{2}(\d{2}(\.\d{1,6})?)?)?$|^\d{2}(:\d{2}(:\d{2}(\.\d{1,6})?)?)?$")
_PIXEL_DATA = 0x7FE00010
#: words after which the report scrubber looks for names or organisations (see entity_extraction/phi_patterns.json)
_SCRUB_TRIGGER = re.compile(
    r"\b(?:dr|doctor|prof|mr|mrs|ms|miss|patient|name|signed|by|md|hospital|clinic|infirmary|cent(?:er|re)|"
    r"health|imaging|radiology|@|www|http)\b|@",
    re.IGNORECASE,
)
#: InstitutionName, InstitutionAddress, InstitutionalDepartmentName: whole values are verified absent
INSTITUTION_TAGS = frozenset({0x00080080, 0x00080081, 0x00081040})
#: Manufacturer: kept by the profile and searched like every kept value; only an institution value that is
#: the vendor's name (the whole Manufacturer value or its leading words: test data often sets InstitutionName
#: "TOSHIBA" beside Manufacturer "TOSHIBA_MEC") is not looked for inside it. ManufacturerModelName and
#: SoftwareVersions get no exemption at all.
MANUFACTURER_TAG = 0x00080070
_SPECIFIC_CHARSET = 0x00080005
#: device identification kept verbatim, never cleaned (pixel-cleaning rules and the series table use them): an
#: identifying value in them is found by the verifier and quarantines the file (Manufacturer,
#: ManufacturerModelName, SoftwareVersions)
DEVICE_TAGS = frozenset({MANUFACTURER_TAG, 0x00081090, 0x00181020})
#: SOP classes of Encapsulated Documents (PS3.4 B.5: PDF, CDA, STL, OBJ, MTL): quarantined ``encapsulated_document``
ENCAPSULATED_DOCUMENT_PREFIX = "1.2.840.10008.5.1.4.1.1.104."
#: decoder outcomes that quarantine with their own reason (etl.pixels.contained): sizes refused before decoding,
#: a decoder whose worker process died or ran over its time
CONTAINED_DECODE_REASONS = frozenset({"image_too_large", "declared_size_mismatch", "decoder_crashed"})


class DeidentificationError(ReasonCodedError):
    """An input that cannot be de-identified with certainty. ``reason`` is a reason code; the message
    never contains a value from the file. ``preview``: an :class:`etl.deid.preview.Preview` of the pixels that
    failed (``burned_in_text_remaining``), else None."""

    message_format = "{message}"
    preview = None


@dataclass
class DeidResult:
    """A de-identified instance and the pseudonyms that identify it.

    ``date_shift_days`` is the per-patient offset applied (days); ``audit`` counts elements per action
    (removed, emptied, replaced, shifted, remapped, cleaned, kept). ``payload`` is the verified Part-10
    file.
    """

    dataset: Dataset
    patient_key: str
    study_key: str
    series_key: str
    sop_key: str
    accession_key: str | None
    date_shift_days: int
    audit: Counter = field(default_factory=Counter)
    payload: bytes = b""
    #: pixel regions blanked for burned-in text: {"frame": int or "all", "box": [x0, y0, x1, y1], "reason"}
    text_regions: list = field(default_factory=list)

    def to_bytes(self) -> bytes:
        """The de-identified, verified file (Part 10, with preamble and file meta)."""
        return self.payload


# ---- dates ---------------------------------------------------------------------------------------


def _shift_ymd(y: int, m: int, d: int, days: int) -> dt.date:
    return dt.date(y, m, d) + dt.timedelta(days=days)


def shift_date(value: str, days: int) -> str:
    """Shift a DA value by ``days``. ``YYYYMMDD`` moves exactly; a partial ``YYYYMM`` or ``YYYY`` (seen in
    the field though not valid DA) moves its first day and keeps its precision. The legacy ACR-NEMA form
    ``YYYY.MM.DD`` is read and written as DA.

    Raises
    ------
    DeidentificationError
        ``unparseable_date`` when the value is not a date.
    """
    v = value.strip()
    if re.fullmatch(r"\d{4}\.\d{2}\.\d{2}", v):
        v = v.replace(".", "")
    if not _DA_RE.match(v):
        raise DeidentificationError("unparseable_date", "a DA value is not a YYYYMMDD date")
    try:
        new = _shift_ymd(int(v[:4]), int(v[4:6] or 1), int(v[6:8] or 1), days)
    except ValueError:
        raise DeidentificationError("unparseable_date", "a DA value is not a valid calendar date") from None
    return new.strftime("%Y%m%d")[: len(v)]


def shift_datetime(value: str, days: int) -> str:
    """Shift a DT value (PS3.5 Table 6.2-1) by ``days`` keeping its precision, fraction and UTC offset.

    Raises
    ------
    DeidentificationError
        ``unparseable_date`` when the value is not a valid DT.
    """
    v = value.strip()
    m = _DT_RE.match(v)
    if not m:
        raise DeidentificationError("unparseable_date", "a DT value is not a valid date-time")
    n_date = 4 + (2 if m.group(2) else 0) + (2 if m.group(3) else 0)
    return shift_date(v[:n_date], days) + v[n_date:]


def check_time(value: str) -> str:
    """A TM value is unchanged by a whole-day shift; it must still be a time (else ``unparseable_date``)."""
    if not _TM_RE.match(value.strip()):
        raise DeidentificationError("unparseable_date", "a TM value is not a valid time")
    return value


# ---- the walk ------------------------------------------------------------------------------------


def _id_like(v: str) -> bool:
    """An identifier worth verifying: has a digit, and is long enough not to occur in numbers by chance
    (pure digits: 6 or more; mixed: 4 or more)."""
    if not any(ch.isdigit() for ch in v) or v.strip().upper() in PLACEHOLDERS:
        return False
    digits_only = re.fullmatch(r"[\d.\-+ ]+", v) is not None
    return len(v) >= (6 if digits_only else 4)


def _text(elem: DataElement | pydicom.dataelem.RawDataElement) -> list[str]:
    v = elem.value
    if v is None or v == b"" or v == "":
        return []
    if isinstance(v, bytes):
        v = v.decode("latin-1")
    if isinstance(v, (list, tuple, MultiValue)):
        return [str(x) for x in v]
    return str(v).split("\\")  # str, PersonName, IS/DS and other single values


class _Walker:
    def __init__(
        self,
        policy: Policy,
        key: PseudonymKey,
        shift: int,
        patient_key: str,
        institution_key: str,
        scrub_known: list[str],
    ):
        self.p = policy
        self.key = key
        self.shift = shift
        self.patient_key = patient_key
        self.institution_key = institution_key
        self.scrub_known = scrub_known
        self.audit: Counter = Counter()
        self.phi: set[tuple[str, str]] = set()  # (kind, value) identifying values of the input
        self._known_parts: set[str] | None = None
        self.top: dict[int, str] = {}  # top-level actions resolved by Type in the IOD (set by deidentify_dataset)

    # remember identifying values of an element before it is changed or removed
    def _collect(self, vr: str, values: list[str], kind: str | None = None, keyword: str = "") -> None:
        """Remember identifying values: person-name parts, original UIDs, digit-bearing IDs and tokens.

        Words without digits from descriptions are not collected: they legitimately recur in kept,
        scrubbed descriptors ("CT CHEST"); placeholders of already de-identified input are skipped.
        """
        for v in values:
            v = v.strip()
            if not v:
                continue
            if kind == "institution" and len(v) >= 4:
                self.phi.add(("institution", v))
            elif vr == "PN":
                for part in re.split(r"[\^=,\s]+", v):
                    if (
                        len(part.rstrip(".")) >= 3
                        and sum(ch.isalpha() for ch in part) >= 2
                        and part.upper().strip(".") not in PLACEHOLDERS
                    ):
                        self.phi.add(("name", part))
            elif vr == "UI":
                if v.count(".") >= 2 and len(v) >= 8:
                    self.phi.add(("uid", v))
            elif vr in ("LO", "SH", "AE", "UC"):
                if keyword in IDENTIFYING_KEYWORDS and _id_like(v):
                    self.phi.add(("value", v))
            elif vr in ("ST", "LT", "UT"):  # comments: their digit-bearing tokens (IDs, numbers, dates)
                self.phi.update(("value", t) for t in re.findall(r"[\w-]*\d[\w-]*", v) if _id_like(t))

    def _uid(self, value: str, tag: int) -> str:
        v = value.strip().rstrip("\x00")
        if not v or v in UID_dictionary or tag in self.p.keep_uid_tags:
            return v
        self._collect("UI", [v])
        return self.key.uid(v)

    def walk(self, ds: Dataset, depth: int = 0) -> None:
        removed_groups = self.p.removed_group_prefixes
        for tag, elem in list(ds.items()):  # raw elements: values are converted only where needed
            if isinstance(elem, RawDataElement) and elem.VR and elem.VR not in _STANDARD_VRS:
                # VR bytes that name no VR (a flipped byte): the value cannot be typed, so neither cleaned nor
                # verified, and no reader can read it back (fail closed)
                raise DeidentificationError(
                    "malformed_structure", f"element {Tag(tag)} has VR bytes that name no DICOM VR"
                )
            group = tag >> 16
            if group & 1:  # private (odd group)
                self._private(ds, tag, elem, depth)
                continue
            if group == _STRUCTURAL_GROUP:
                # an item or delimiter where an element belongs: a sequence length that does not match its items
                # (e.g. a length field of 0) leaves the items' bytes here, unparsed and unvetted: fail closed
                raise DeidentificationError(
                    "malformed_structure",
                    "a sequence item or delimiter stands where a data element belongs "
                    "(a sequence's length does not match its items)",
                )
            if tag & 0xFFFF == 0 or (group & 0xFF00) in removed_groups:
                self._remove(ds, tag, elem)
                continue
            if dictionary_VR_or_none(tag) in (None, "NONE"):
                # a public tag the data dictionary does not know: what it holds cannot be vetted (fail closed)
                self._remove(ds, tag, elem)
                continue
            vr = elem.VR or dictionary_VR_or_none(tag)
            if vr == "UN" and dictionary_VR_or_none(tag) not in (None, "UN"):
                try:  # a known attribute written with VR UN: read it with its dictionary VR
                    vr = ds[tag].VR
                except Exception:  # noqa: BLE001  undecodable: handled as untyped below
                    vr = "UN"
            if vr is None or vr == "UN":
                # a public attribute this reader cannot type: cannot be vetted, so removed (fail closed)
                self._remove(ds, tag, elem)
                continue
            action = self.top.get(tag) if depth == 0 else None  # typed per IOD (etl.deid.types)
            if action is None:
                action = self.p.action_for(tag)
            if action is None:
                action = self._unlisted(vr, tag)
            self._apply(ds, tag, vr, action, depth)

    def _unlisted(self, vr: str, tag: int = 0) -> str:
        if vr in BINARY_VRS and int(tag) not in KEPT_BINARY_TAGS:
            return "X"  # opaque bytes the verifier cannot read as text: anything could be written in them
        if vr in FREE_TEXT_VRS and self.p.cleans_text and int(tag) not in DEVICE_TAGS:
            return "CLEAN"  # kept free text (CodeMeaning at any depth, ...): cleaned as descriptors are
        if vr == "PN":
            return self.p.unlisted_pn_action
        if vr == "UI":
            return "U"
        if vr in ("DA", "DT", "TM"):
            return "SHIFT" if self.p.modified_dates else "Z"
        if vr == "SQ":
            return "U*"
        return "K"

    def _remove(self, ds: Dataset, tag, elem) -> None:
        vr = elem.VR or dictionary_VR_or_none(tag)
        if vr and vr != "SQ" and self._collects(vr, tag):
            try:
                values = _text(ds[tag])  # decoded with the dataset's character set
            except Exception:  # noqa: BLE001  undecodable: the raw bytes still identify
                values = _text(elem)
            self._collect(vr, values, "institution" if tag in INSTITUTION_TAGS else None, keyword_for(tag))
        elif vr == "SQ":
            self._collect_sequence(ds[tag])
        del ds[tag]
        self.audit["removed"] += 1

    @staticmethod
    def _collects(vr: str, tag) -> bool:
        """Whether :meth:`_collect` would keep anything of such an element (saves decoding the rest)."""
        return (
            vr in ("PN", "UI", "ST", "LT", "UT")
            or tag in INSTITUTION_TAGS
            or (vr in ("LO", "SH", "AE", "UC") and keyword_for(tag) in IDENTIFYING_KEYWORDS)
        )

    def _collect_sequence(self, elem: DataElement) -> None:
        for item in elem.value or []:
            for sub in item.iterall():
                if sub.VR == "UI":  # registered UIDs (SOP classes, ...) and kept UIDs identify nothing
                    if sub.tag not in self.p.keep_uid_tags:
                        self._collect("UI", [v for v in _text(sub) if v.strip("\x00 ") not in UID_dictionary])
                elif sub.VR in TEXT_VRS:
                    self._collect(
                        sub.VR, _text(sub), "institution" if sub.tag in INSTITUTION_TAGS else None, sub.keyword
                    )

    def _private(self, ds: Dataset, tag, elem, depth: int) -> None:
        if self.p.safe_private and tag.element >= 0x1000:
            creator_tag = (tag.group << 16) | (tag.element >> 8)
            creator = ds.get(creator_tag)
            vr = elem.VR
            if (
                creator is not None
                and vr not in ("SQ", "UN", None)
                and (str(creator.value).strip().upper(), tag.group, tag.element & 0xFF, vr) in self.p.safe_private
            ):
                self.audit["kept"] += 1
                return
        if self.p.safe_private and 0x0010 <= tag.element <= 0x00FF:
            return  # private creators stay while an allow-listed element of theirs may; pruned after the walk
        if elem.VR == "PN":  # private values are removed; person names among them are also verified absent
            self._collect("PN", _text(elem))
        del ds[tag]
        self.audit["removed"] += 1

    def _apply(self, ds: Dataset, tag, vr: str, action: str, depth: int) -> None:
        if action == "K":
            self.audit["kept"] += 1
            return
        if action == "X":
            self._remove(ds, tag, ds.get_item(tag))
            return
        if vr in ASCII_VRS and action in ("U", "U*", "SHIFT", "Z", "D"):
            self._apply_ascii(ds, tag, vr, action, ds.get_item(tag))
            return
        if action in ("Z", "D") and vr in TEXT_VRS and not self._collects(vr, tag):
            # nothing to remember from it: replace without decoding the old value
            value = "" if action == "Z" else self.p.dummy.get(vr, "")
            _replace_value(ds, tag, vr, ds.get_item(tag), value)
            self.audit["emptied" if action == "Z" else "replaced"] += 1
            return
        elem = ds[tag]
        if vr == "SQ":
            if action in ("U*", "U", "D", "SHIFT", "CLEAN"):
                for item in elem.value or []:
                    self.walk(item, depth + 1)
                self.audit["walked"] += 1
            else:  # Z: an empty sequence
                self._collect_sequence(elem)
                elem.value = Sequence([])
                self.audit["emptied"] += 1
            return
        values = _text(elem) if vr in TEXT_VRS | {"UI", "DA", "DT", "TM", "AS", "IS", "DS"} else []
        kw = keyword_for(tag)
        if action == "Z":
            self._collect(vr, values, None, kw)
            elem.value = ""
            self.audit["emptied"] += 1
        elif action == "D":
            self._collect(vr, values, None, kw)
            if vr == "UI":
                elem.value = "\\".join(self._uid(v, tag) for v in values) if values else ""
                self.audit["remapped"] += 1
            elif vr in self.p.dummy:
                elem.value = self.p.dummy[vr]
                self.audit["replaced"] += 1
            else:  # binary VRs have no meaningful dummy: an empty value carries no information
                elem.value = b"" if vr in ("OB", "OW", "OF", "OD", "OL", "OV", "UN") else ""
                self.audit["emptied"] += 1
        elif action in ("U", "U*"):
            if vr != "UI":
                self._collect(vr, values, None, kw)
                elem.value = ""
                self.audit["emptied"] += 1
                return
            new = [self._uid(v, tag) for v in values]
            elem.value = new[0] if len(new) == 1 else new
            self.audit["remapped"] += 1
        elif action == "SHIFT":
            self._shift(elem, vr, values)
        elif action == "CLEAN":
            self._clean(elem, vr, values)
        elif action == "AGE":
            age = self._age(values[0]) if values else ""
            if age is None:  # not an AS value: removing it is always safe
                del ds[tag]
                self.audit["removed"] += 1
            else:
                elem.value = age
                self.audit["replaced" if values else "emptied"] += 1
        elif action == "PATIENT":
            self._collect("PN" if vr == "PN" else "LO", values, None, kw)
            elem.value = self.patient_key
            self.audit["replaced"] += 1
        elif action == "INSTITUTION":
            self._collect("LO", values, "institution")
            elem.value = f"INSTITUTION-{self.institution_key}" if values else ""
            self.audit["replaced"] += 1
        else:  # pragma: no cover - build_policy validates action codes
            raise DeidentificationError("policy_error", f"unknown action {action}")

    def _apply_ascii(self, ds: Dataset, tag, vr: str, action: str, elem) -> None:
        """UI/DA/DT/TM/AS/IS/DS: read the raw ASCII value, write a new element without re-validating it."""
        raw = elem.value
        if isinstance(raw, (bytes, bytearray)):
            text = bytes(raw).decode("ascii", "replace").rstrip("\x00 ")
            values = text.split("\\") if text else []
        else:
            values = _text(elem)
        if action == "Z" or (action == "D" and vr != "UI" and vr not in self.p.dummy):
            if vr == "UI":
                self._collect("UI", values)
            new, counter = "", "emptied"
        elif action == "D" and vr != "UI":
            new, counter = self.p.dummy[vr], "replaced"
        elif vr == "UI":
            mapped = [self._uid(v, tag) for v in values]
            new, counter = "\\".join(mapped), "remapped"
        elif action == "SHIFT" and vr in ("DA", "DT", "TM"):
            if not any(v.strip() for v in values):
                return
            fn = shift_date if vr == "DA" else shift_datetime if vr == "DT" else None
            mapped = [(fn(v, self.shift) if fn else check_time(v)) if v.strip() else v for v in values]
            new, counter = "\\".join(mapped), "shifted"
        else:  # U on a non-UID ASCII value, or SHIFT on AS/IS/DS: no identifying content is kept
            new, counter = "", "emptied"
        _replace_value(ds, tag, vr, elem, new)
        self.audit[counter] += 1

    def _shift(self, elem: DataElement, vr: str, values: list[str]) -> None:
        if not values or not any(v.strip() for v in values):
            return
        if vr == "DA":
            new = [shift_date(v, self.shift) if v.strip() else v for v in values]
        elif vr == "DT":
            new = [shift_datetime(v, self.shift) if v.strip() else v for v in values]
        elif vr == "TM":
            new = [check_time(v) for v in values]
        else:  # a C (modified dates) on a non-date VR: the table means a date-bearing text; clean it
            self._clean(elem, vr, values)
            return
        elem.value = new[0] if len(new) == 1 else new
        self.audit["shifted"] += 1

    def _clean(self, elem: DataElement, vr: str, values: list[str]) -> None:
        from entity_extraction.text_deid import deidentify_text

        if vr not in TEXT_VRS or vr == "PN":
            self._collect(vr, values)
            elem.value = ""
            self.audit["emptied"] += 1
            return
        cleaned = []
        for v in values:
            if len(v) > MAX_DICOM_TEXT_CHARS:  # never run the scrubber's patterns on megabytes of header text
                raise DeidentificationError(
                    "value_too_long",
                    f"a text value to clean has {len(v)} characters, more than the limit of {MAX_DICOM_TEXT_CHARS}",
                )
            if self._needs_scrub(v):  # "MR Lever" is a procedure: clinical words after the modality code are kept
                v = clean_header_text(
                    v,
                    lambda t: deidentify_text(t, known_phi=self.scrub_known, date_shift_days=self.shift)[0],
                    self._known_name_parts(),
                )
            cleaned.append(v)
        elem.value = cleaned[0] if len(cleaned) == 1 else cleaned
        self.audit["cleaned"] += 1

    def _needs_scrub(self, value: str) -> bool:
        """Whether the text scrubber could change ``value``: it has a digit, a known name part, or a word
        that introduces a name or an organisation. Saves running it on plain descriptors ("CT CHEST")."""
        if any(ch.isdigit() for ch in value) or _SCRUB_TRIGGER.search(value):
            return True
        return any(w.lower() in self._known_name_parts() for w in re.findall(r"\w+", value))

    def _known_name_parts(self) -> set[str]:
        """The words of the known PHI values (the patient's names, IDs), lower case."""
        if self._known_parts is None:
            self._known_parts = {p.lower() for k in self.scrub_known for p in re.split(r"[\^=,\s]+", k) if p}
        return self._known_parts

    def _age(self, value: str) -> str | None:
        """``nnnY`` capped at ``090Y`` above the policy's maximum age; None for a value that is not AS."""
        m = re.fullmatch(r"(\d{3})([DWMY])", value.strip())
        if not m:
            return None
        n, unit = int(m.group(1)), m.group(2)
        years = {"D": n / 365.25, "W": n * 7 / 365.25, "M": n / 12, "Y": n}[unit]
        return f"{self.p.max_age_years + 1:03d}Y" if years > self.p.max_age_years else value.strip()


def _replace_value(ds: Dataset, tag, vr: str, elem, value: str) -> None:
    """Set an ASCII value (UIDs, dates, codes, dummies); a raw element stays raw (the writer copies its bytes,
    with no conversion to and from Python values), else a new element is stored without re-validation."""
    if isinstance(elem, RawDataElement) and (elem.value is None or isinstance(elem.value, (bytes, bytearray))):
        data = value.encode("ascii")
        if len(data) % 2:
            data += b"\x00" if vr == "UI" else b" "
        ds[tag] = elem._replace(value=data, length=len(data))
    else:
        ds[tag] = DataElement(tag, vr, value, validation_mode=pydicom_config.IGNORE)


@lru_cache(maxsize=4096)
def keyword_for(tag: int) -> str:
    """The DICOM keyword of a public tag, or "" when unknown."""
    return keyword_for_tag(tag) or ""


def dictionary_VR_or_none(tag) -> str | None:
    """The data dictionary VR of a public tag, or None when the tag is unknown."""
    try:
        return dictionary_VR(tag)
    except KeyError:
        return None


# ---- charset, burned-in text, pixel cleaning ------------------------------------------------------


def _drop_undecodable_text(ds: Dataset, encodings: list[str], audit: Counter) -> None:
    """Remove kept text values whose bytes do not decode under the declared character set (fail closed),
    so the output's SpecificCharacterSet matches its bytes."""
    for tag in list(ds.keys()):
        elem = ds.get_item(tag)
        vr = elem.VR
        if vr == "SQ":
            for item in ds[tag].value or []:
                _drop_undecodable_text(item, encodings, audit)
            continue
        if vr in TEXT_VRS and isinstance(elem.value, bytes) and elem.value:
            try:
                with _strict_charset():
                    decode_bytes(elem.value, encodings, {0x5C} if vr != "PN" else {0x5C, 0x5E, 0x3D})
            except (UnicodeDecodeError, LookupError, ValueError):
                del ds[tag]
                audit["removed_undecodable"] += 1


class _strict_charset:
    def __enter__(self):
        self.old = pydicom_config.settings.reading_validation_mode
        pydicom_config.settings.reading_validation_mode = pydicom_config.RAISE

    def __exit__(self, *exc):
        pydicom_config.settings.reading_validation_mode = self.old
        return False


def _ascii(ds: Dataset, tag: int) -> str:
    """A CS/UI/AS value read from the raw element without converting it ("" when absent)."""
    elem = ds.get_item(tag)
    if elem is None or elem.value is None:
        return ""
    v = elem.value
    return (bytes(v).decode("ascii", "replace") if isinstance(v, (bytes, bytearray)) else str(v)).strip("\x00 ")


def burned_in_risk(ds: Dataset, policy: Policy) -> str | None:
    """Why an instance may carry burned-in text, or None (PS3.15 E.1.1 asks to remove it from pixels)."""
    if _ascii(ds, 0x00280301).upper() == "YES":  # BurnedInAnnotation
        return "BurnedInAnnotation is YES"
    if _ascii(ds, 0x00080060).upper() in policy.burned_in_modalities:  # Modality
        return "modality at risk of burned-in text"
    sop_class = _ascii(ds, 0x00080016)  # SOPClassUID
    if any(sop_class.startswith(p) for p in policy.burned_in_sop_prefixes):
        return "SOP class at risk of burned-in text"
    return None


def matching_cleaning_rule(ds: Dataset, rules: list[PixelCleaningRule]) -> PixelCleaningRule | None:
    """The first pixel-cleaning rule whose device (and image size, when given) matches ``ds``."""
    manufacturer = str(ds.get("Manufacturer", "") or "")
    model = str(ds.get("ManufacturerModelName", "") or "")
    for rule in rules:
        if (
            re.fullmatch(rule.manufacturer, manufacturer, re.IGNORECASE)
            and re.fullmatch(rule.model, model, re.IGNORECASE)
            and (rule.rows is None or rule.rows == ds.get("Rows"))
            and (rule.columns is None or rule.columns == ds.get("Columns"))
        ):
            return rule
    return None


def clean_pixels(ds: Dataset, rule: PixelCleaningRule) -> int:
    """Blank the rule's regions (value 0) in every frame; re-encode the pixel data uncompressed.

    Returns the number of pixels blanked per frame. Raises DeidentificationError ``pixel_cleaning_failed``
    when the pixel data cannot be decoded.
    """
    from etl.pixels.contained import pixel_array
    from etl.pixels.decode import NormalisationError

    try:
        arr = pixel_array(ds).copy()  # bounded; compressed syntaxes decoded in the decoder worker
    except NormalisationError as err:
        if err.reason in CONTAINED_DECODE_REASONS:
            raise DeidentificationError(err.reason, str(err)) from None
        raise DeidentificationError(
            "pixel_cleaning_failed", f"cannot decode pixels to clean them: {err.reason}"
        ) from None
    except Exception as err:  # noqa: BLE001  any decoder failure: the text cannot be removed
        raise DeidentificationError(
            "pixel_cleaning_failed", f"cannot decode pixels to clean them: {type(err).__name__}"
        ) from None
    frames = int(ds.get("NumberOfFrames", 1) or 1)
    rows, cols = int(ds.Rows), int(ds.Columns)
    blanked = 0
    for x0, y0, x1, y1 in rule.regions:
        if frames > 1:
            arr[:, y0:y1, x0:x1, ...] = 0
        else:
            arr[y0:y1, x0:x1, ...] = 0
        blanked += max(0, min(y1, rows) - y0) * max(0, min(x1, cols) - x0)
    photometric = str(ds.PhotometricInterpretation)
    if photometric.startswith("YBR"):
        photometric = "RGB"  # pydicom's decoder already converted YBR to RGB
    ds.set_pixel_data(arr, photometric, int(ds.BitsStored), generate_instance_uid=False)
    return blanked


# ---- entry point ---------------------------------------------------------------------------------


def _identity(ds: Dataset) -> tuple[str, str]:
    patient_id = str(ds.get("PatientID", "") or "").strip()
    issuer = str(ds.get("IssuerOfPatientID", "") or "").strip()
    return patient_id, issuer


def _output_header(payload: bytes, ds: Dataset) -> bytes:
    """The output bytes without the pixel data value (searched by the verifier)."""
    raw = ds.get_item(_PIXEL_DATA)
    value = getattr(raw, "value", None)
    if isinstance(value, (bytes, bytearray)) and len(value) >= 256:
        i = payload.find(bytes(value[:256]))
        if i >= 0:
            return payload[:i] + payload[i + len(value) :]
    return payload


def _text_bytes(
    ds: Dataset,
    free: list[bytes] | None = None,
    own: AbstractSet[bytes] = frozenset(),
    binary: list[bytes] | None = None,
) -> bytes:
    """Raw bytes of every value where a person name could be written, joined by NUL: character string VRs, UI,
    the values of sequences at any depth, kept numeric values up to 4 KiB.

    ``free`` receives the bytes of each character-string value (for the normalised ID search of
    :func:`verify_output`), except those in ``own`` (the pseudonyms the walk wrote); ``binary`` every kept binary
    value but pixel and sample arrays (LUTs, palettes, the ICC profile, allow-listed private values), searched for
    the longer name parts only.

    Raises
    ------
    DeidentificationError
        ``malformed_structure`` when a kept character-string value holds control bytes (see ``_CONTROL_BYTES``):
        after a length fault such a value carries other elements' tags, lengths and values, unvetted.
    """
    parts: list[bytes] = []
    _collect_text_bytes(ds, parts, free if free is not None else [], own, binary if binary is not None else [])
    return b"\x00".join(parts)


def _collect_text_bytes(
    ds: Dataset, parts: list[bytes], free: list[bytes], own: AbstractSet[bytes], binary: list[bytes]
) -> None:
    for tag, elem in ds.items():  # raw elements are read as bytes, not converted
        if tag == 0x00120064:  # DeidentificationMethodCodeSequence: our own constant codes
            continue
        vr = elem.VR or dictionary_VR_or_none(tag)
        if vr == "SQ":
            for item in ds[tag].value or []:
                _collect_text_bytes(item, parts, free, own, binary)
        elif vr in TEXT_VRS or vr in ASCII_VRS:
            v = elem.value
            if isinstance(v, (bytes, bytearray)):
                b = bytes(v)
            elif v is None:
                continue
            elif isinstance(v, (list, tuple, MultiValue)):
                b = "\\".join(str(x) for x in v).encode("utf-8", "ignore")
            else:
                b = str(v).encode("utf-8", "ignore")
            parts.append(b)
            if _CONTROL_BYTES.search(b.rstrip(b"\x00 ")):  # DS, IS, UI ... too: none may hold a control byte
                raise DeidentificationError(
                    "malformed_structure",
                    f"a kept {vr} value holds control bytes (another element's bytes swallowed after a length fault)",
                )
            if vr in TEXT_VRS and b not in own:
                free.append(b)
        elif vr in NUMERIC_VRS and int(tag) not in KEPT_BINARY_TAGS:
            v = elem.value  # a kept numeric value: its bytes could spell a name
            _check_multiplicity(tag, vr, v)
            if isinstance(v, (bytes, bytearray)) and len(v) <= _NUMERIC_SEARCH_MAX:
                parts.append(bytes(v))
        elif vr in BINARY_VRS and int(tag) not in _SAMPLE_ARRAY_TAGS:
            v = elem.value  # a kept binary value (LUT, palette, ICC profile, allow-listed private): searched whole
            if isinstance(v, (bytes, bytearray)):
                binary.append(bytes(v))


def _check_multiplicity(tag: int, vr: str, value: object) -> None:
    """Raise ``malformed_structure`` when a public numeric element holds more values than its dictionary VM allows
    (a ``US`` of VM 1 holding 60 bytes): after a length fault such a value carries other elements' bytes, unvetted
    (a UID among them is not recognised as one)."""
    size = _NUMERIC_SIZE.get(vr)
    if size is None or (tag >> 16) & 1:
        return
    try:
        bound = _BOUNDED_VM.match(dictionary_VM(tag) or "")
    except KeyError:
        return
    if bound is None:
        return
    if isinstance(value, (bytes, bytearray)):
        count = len(value) / size
    else:
        count = len(value) if isinstance(value, (list, tuple, MultiValue)) else 1
    if count > int(bound.group(1)):
        raise DeidentificationError(
            "malformed_structure",
            f"a kept {vr} element ({Tag(tag)}) holds more values than its multiplicity allows (another element's "
            "bytes swallowed after a length fault)",
        )


def _vendor_names(manufacturer: bytes) -> set[bytes]:
    """The Manufacturer value and its leading words (``TOSHIBA_MEC`` -> ``toshiba_mec``, ``toshiba``), lowercase."""
    words = re.split(rb"[\s_,.-]+", manufacturer.strip(b" \x00").lower())
    return {b" ".join(words[:n]) for n in range(1, len(words) + 1) if words[0]} | {manufacturer.strip(b" \x00").lower()}


def _normalised(data: bytes) -> bytes:
    """Lower-case letters and digits of ``data``, NUL-separated values kept apart: case, spaces and separators
    ignored ("MR-7731 2458" and "mr77312458" read alike)."""
    return _NOT_ALNUM.sub(b"", data.lower())


_NOT_ALNUM = re.compile(rb"[^0-9a-z\x00]+")
_DIGIT_RUN = re.compile(rb"\d{5,}")
#: shortest name part looked for inside kept binary values (3-letter parts occur there by chance)
BINARY_NAME_MIN = 4


def verify_output(
    header: bytes,
    phi: set[tuple[str, str]],
    encodings: list[str],
    manufacturer: bytes = b"",
    text: bytes | None = None,
    free: bytes = b"",
    binary: bytes = b"",
) -> list[str]:
    """Identifying values of the input found in the output header bytes (their kinds only).

    Name parts match as whole words, case-insensitively, in the text values (``text``; default: the whole
    header); IDs, UIDs and other values as byte strings anywhere in the header, in the file's character
    set and in UTF-8. IDs (kind ``value``) are also looked for in the kept character-string values (``free``,
    NUL-separated) ignoring case, spaces and separators (:func:`_normalised`), and on their significant parts:
    a run of 5 or more digits of a kept value that is part of a run of 5 or more digits of the ID (an MRN's
    digits without its letters, 5 of its 8 digits, ...). Name parts of :data:`BINARY_NAME_MIN` or more letters are
    also looked for, as whole words, in the kept binary values (``binary``: LUTs, palettes, ICC profile); shorter
    ones occur there by chance ("lee" in a profile). Every kept value is searched, the device values (Manufacturer,
    ManufacturerModelName, SoftwareVersions) included; only an institution value that is the vendor's name
    (``manufacturer``, the kept Manufacturer value, or its leading words) is not looked for inside the Manufacturer
    value.

    Returns
    -------
    list of str
        the kinds (``name``, ``uid``, ``value``, ``institution``) of the values found, one per value.
    """
    found = []
    free_norm = _normalised(free) if free else b""
    free_runs = set(_DIGIT_RUN.findall(free_norm))
    names_in = text if text is not None else header
    vendor = _vendor_names(manufacturer) if manufacturer.strip(b" \x00") else set()
    without_vendor = header.replace(manufacturer, b"") if vendor else header
    lowered = names_in.lower()
    binary_lowered = binary.lower()
    for kind, value in phi:
        hay = header
        if kind == "institution" and vendor and value.strip().lower().encode("utf-8", "ignore") in vendor:
            hay = without_vendor
        forms = set()
        for enc in [*encodings, "utf-8"]:
            try:
                forms.add(value.encode(enc))
            except (UnicodeEncodeError, LookupError):
                continue
        for b in forms:
            if kind == "name":  # person-name parts: whole words, in text values (longer ones in binary values too)
                word = rb"(?<![A-Za-z])" + re.escape(b) + rb"(?![A-Za-z])"
                if (b.lower() in lowered and re.search(word, names_in, re.IGNORECASE)) or (
                    len(b) >= BINARY_NAME_MIN and b.lower() in binary_lowered and re.search(word, binary, re.IGNORECASE)
                ):
                    found.append(kind)
                    break
            elif kind == "uid":
                if b in hay:
                    found.append(kind)
                    break
            elif b in hay and re.search(rb"(?<![A-Za-z0-9])" + re.escape(b) + rb"(?![A-Za-z0-9])", hay):
                found.append(kind)  # whole tokens: "12345" is not found inside "112345.5"
                break
        else:
            if kind == "value" and free_norm:
                norm = _normalised(value.encode("utf-8", "ignore"))
                id_runs = _DIGIT_RUN.findall(norm)
                if (len(norm) >= 4 and norm in free_norm) or any(r in i for r in free_runs for i in id_runs):
                    found.append(kind)
    return found


def deidentify_dataset(
    ds: Dataset,
    key: PseudonymKey,
    institution: str,
    policy: Policy | None = None,
    *,
    pixel_cleaning: list[PixelCleaningRule] | None = None,
    default_issuer: str | None = None,
    series_text: SeriesSlot | None = None,
) -> DeidResult:
    """De-identify one DICOM instance **in place** and return it with its verified Part-10 bytes.

    Parameters
    ----------
    ds : pydicom.Dataset
        the source instance, read with its pixel data; it is modified.
    key : PseudonymKey
        the deployment's pseudonymisation key.
    institution : str
        institution id; PatientID, AccessionNumber and the institution pseudonym are derived within it.
    policy : Policy, optional
        the resolved profile (default: :func:`etl.deid.policy.build_policy` with default options).
    pixel_cleaning : list of PixelCleaningRule, optional
        rules that make files at risk of burned-in text acceptable by blanking their text regions.
    default_issuer : str, optional
        IssuerOfPatientID assumed when the file has none (the institution's own MRNs).
    series_text : SeriesSlot, optional
        the file's place in its series (:class:`etl.deid.series_text.SeriesTextGate`): burned-in text is then
        read in full on the series' sample and pre-checked elsewhere; without it every image is read in full.

    Returns
    -------
    DeidResult

    Raises
    ------
    DeidentificationError
        reason codes: ``encapsulated_document`` (an Encapsulated PDF, CDA or 3D model), ``missing_patient_id``,
        ``missing_uid``, ``recognizable_visual_features`` (a VL or Video Photographic image, or
        RecognizableVisualFeatures YES, from an institution not allowed them), ``truncated_file``,
        ``burned_in_annotation_risk``,
        ``pixel_cleaning_failed``, ``unparseable_date``, ``verification_failed``, ``malformed_structure`` (a
        sequence item or delimiter at dataset level), ``value_too_long`` (a text value to clean longer than
        :data:`etl.limits.MAX_DICOM_TEXT_CHARS`), ``deidentification_error`` (anything unexpected while walking or
        writing the file).
    """
    policy = policy or build_policy()
    if _ascii(ds, 0x00080016).startswith(ENCAPSULATED_DOCUMENT_PREFIX):
        raise DeidentificationError(
            "encapsulated_document",
            "an Encapsulated Document (PDF, CDA, 3D model): its "
            "content is not DICOM attributes and cannot be de-identified or verified",
        )
    cut = last_element_cut(ds)
    if cut is not None:  # a file cut before its pixel data reads as a complete, pixel-less object
        raise DeidentificationError("truncated_file", f"the file ends inside element {cut}: it is cut short")
    patient_id, issuer = _identity(ds)
    if not patient_id:
        raise DeidentificationError("missing_patient_id", "PatientID is empty or absent")
    uids = {}
    for kw, tag in (
        ("StudyInstanceUID", 0x0020000D),
        ("SeriesInstanceUID", 0x0020000E),
        ("SOPInstanceUID", 0x00080018),
    ):
        uids[kw] = _ascii(ds, tag)  # read raw: no conversion of values the walk replaces anyway
        if not uids[kw]:
            raise DeidentificationError("missing_uid", f"{kw} is empty or absent")
    sop_class = _ascii(ds, 0x00080016)
    if (
        sop_class in PHOTOGRAPHIC_SOP_CLASSES or _ascii(ds, 0x00280302).upper() == "YES"
    ) and institution not in policy.visual_features_allowed:  # a photograph or video of a face
        raise DeidentificationError(
            "recognizable_visual_features",
            "a VL/Video Photographic image or "
            "RecognizableVisualFeatures YES, and config deid.recognizable_visual_features_"
            "allowed does not list this institution",
        )
    raw_pixels = ds.get_item(_PIXEL_DATA)
    if (
        raw_pixels is not None
        and isinstance(raw_pixels.value, (bytes, bytearray))
        and getattr(raw_pixels, "length", 0) not in (0, 0xFFFFFFFF)
        and len(raw_pixels.value) < getattr(raw_pixels, "length", 0)
    ):
        # the file ends inside the pixel data: rewriting it would hide the truncation from normalisation
        raise DeidentificationError("truncated_file", "the file ends before the end of its Pixel Data")
    audit: Counter = Counter()
    text_regions = _burned_in_text(ds, policy, institution, pixel_cleaning, audit, series_text)

    patient_key = patient_key_for(key, institution, patient_id, issuer or default_issuer)
    shift = key.date_shift_days(patient_key)
    accession = str(ds.get("AccessionNumber", "") or "").strip()
    accession_key = key.pseudonym("accession", f"{institution}|{accession}") if accession else None
    # identifying header values the descriptor scrubber removes (read before the walk changes them)
    known = [
        str(ds.get(k, "") or "")
        for k in ("PatientName", "OtherPatientIDs", "ReferringPhysicianName", "PatientAddress")
        if k in ds and policy.cleans_text
    ] + [patient_id, accession]
    charset = ds.get("SpecificCharacterSet", "ISO_IR 6") or "ISO_IR 6"
    try:
        encodings = convert_encodings(charset)
    except (LookupError, ValueError):
        encodings = ["latin-1"]
    walker = _Walker(
        policy, key, shift, patient_key, key.pseudonym("institution", institution, 12), [k for k in known if k.strip()]
    )
    walker.top = policy.top_level_actions(_ascii(ds, 0x00080016))
    try:
        walker.walk(ds)
        meta = getattr(ds, "file_meta", None)
        ts = meta.get("TransferSyntaxUID") if meta is not None else None
        if ts == DeflatedExplicitVRLittleEndian:  # written inflated: what ships is what the verifier reads
            ts = ExplicitVRLittleEndian
        if not set(encodings) <= {"latin_1", "iso8859"}:  # every byte string decodes as ISO 8859-1
            _drop_undecodable_text(ds, encodings, walker.audit)
        _finish(ds, policy, ts, walker, pixels_cleaned=bool(audit["pixel_regions_cleaned"] or text_regions))
        buf = io.BytesIO()
        ds.save_as(buf, enforce_file_format=True)
        payload = buf.getvalue()
    except DeidentificationError:
        raise
    except Exception as err:  # noqa: BLE001  any failure while de-identifying quarantines the file
        raise DeidentificationError("deidentification_error", f"{type(err).__name__} while de-identifying") from None
    maker = ds.get_item(MANUFACTURER_TAG) if MANUFACTURER_TAG in ds else None
    manufacturer = (
        b""
        if maker is None
        else bytes(maker.value or b"")
        if isinstance(maker.value, (bytes, bytearray))
        else str(ds[MANUFACTURER_TAG].value).encode("utf-8", "ignore")
    )
    own = {walker.patient_key.encode(), f"INSTITUTION-{walker.institution_key}".encode()}
    free: list[bytes] = []
    binary: list[bytes] = []
    text = _text_bytes(ds, free, own, binary) + b"\x00" + _text_bytes(ds.file_meta, free, own, binary)
    hits = verify_output(
        _output_header(payload, ds), walker.phi, encodings, manufacturer, text, b"\x00".join(free), b"\x00".join(binary)
    )
    if hits:
        raise DeidentificationError(
            "verification_failed",
            f"{len(hits)} identifying value(s) of the input remain in the output ({', '.join(sorted(set(hits)))})",
        )
    walker.audit.update(audit)
    walker.audit["verified"] += 1
    return DeidResult(
        dataset=ds,
        patient_key=patient_key,
        study_key=key.pseudonym("study", uids["StudyInstanceUID"]),
        series_key=key.pseudonym("series", uids["SeriesInstanceUID"]),
        sop_key=key.pseudonym("sop", uids["SOPInstanceUID"]),
        accession_key=accession_key,
        date_shift_days=shift,
        audit=walker.audit,
        payload=payload,
        text_regions=text_regions,
    )


def _burned_in_text(
    ds: Dataset,
    policy: Policy,
    institution: str,
    rules: list[PixelCleaningRule] | None,
    audit: Counter,
    series_text: SeriesSlot | None = None,
) -> list[dict]:
    """Burned-in text of one instance (before its header is de-identified): the device's region rule when one
    matches (the fast path), then OCR of every frame (:func:`etl.deid.burned_in_text.clean_text`) unless the
    config turns it off for this institution and modality; without OCR, files at header risk
    (:func:`burned_in_risk`) need a rule, as before. With ``series_text`` a file not at header risk is read as
    :func:`etl.deid.series_text.clean_slice` decides (in full, or pre-checked and skipped), counted in
    ``text_series_<why>``.

    Returns the blanked regions ({"frame", "box", "reason"}; rule regions have reason ``rule``) and counts
    ``pixel_regions_cleaned``, ``text_checked``, ``text_images_blanked``, ``text_regions_blanked`` and
    ``text_pixels_blanked`` in ``audit``.

    Raises
    ------
    DeidentificationError
        ``burned_in_annotation_risk`` (at risk, no rule, no OCR; or at risk and the pixels cannot be read),
        ``burned_in_text_remaining``, ``ocr_unavailable``; pixels OCR cannot read in a file not at header risk:
        the decoder check's reason (``pixel_data_length_mismatch``, ``truncated_file``,
        ``unsupported_transfer_syntax``, ``decode_error``, ...) or ``burned_in_text_unreadable``.
    """
    from etl.deid.burned_in_text import BurnedInTextError, clean_text, header_phi, load_text_policy

    risk = burned_in_risk(ds, policy)
    rule = matching_cleaning_rule(ds, rules or []) if risk else None
    modality = _ascii(ds, 0x00080060).upper()
    ocr = policy.burned_in_text.enabled(institution, modality) and _PIXEL_DATA in ds
    if risk and rule is None and not ocr:
        raise DeidentificationError("burned_in_annotation_risk", f"{risk} and no pixel-cleaning rule applies")
    regions: list[dict] = []
    if rule is not None:
        clean_pixels(ds, rule)
        ds.BurnedInAnnotation = "NO"
        audit["pixel_regions_cleaned"] += len(rule.regions)
        regions += [{"frame": "all", "box": list(r), "reason": "rule"} for r in rule.regions]
    if not ocr:
        return regions
    from etl.pixels.decode import NormalisationError

    text_policy = load_text_policy()
    try:
        try:
            if series_text is None or risk:  # at header risk: always read in full
                done = clean_text(ds, text_policy, header_phi(ds, text_policy))
            else:
                from etl.deid.series_text import audit_key, clean_slice

                found, why = clean_slice(ds, text_policy, lambda: header_phi(ds, text_policy), series_text)
                audit[audit_key(why)] += 1
                if found is None:  # pre-checked: no row of glyphs OCR reads as a word, in a clean-sampled series
                    return regions
                done = found
        except NormalisationError as fault:  # the decoder's own reason: bounds, crashes (etl.pixels.contained)
            if fault.reason in CONTAINED_DECODE_REASONS:
                raise DeidentificationError(fault.reason, str(fault)) from None
            if fault.reason == "decode_error":  # the check before decoding may know the fault better
                from etl.pixels.decode import check_decodable

                try:
                    check_decodable(ds)
                except NormalisationError as known:
                    raise DeidentificationError(known.reason, str(known)) from None
                raise DeidentificationError(fault.reason, str(fault)) from None
            raise BurnedInTextError(
                "pixel_cleaning_failed", f"cannot decode pixels to read burned-in text: {fault.reason}"
            ) from None
    except BurnedInTextError as err:
        if err.reason == "pixel_cleaning_failed":
            if risk:  # cannot be read, and the header says text is likely: as before, quarantined
                raise DeidentificationError("burned_in_annotation_risk", f"{risk}; {err}") from None
            # fail closed: pixels nobody could check for text are not written out; the reason is the one
            # normalisation would give when its decoder check knows the fault, else burned_in_text_unreadable
            from etl.pixels.decode import check_decodable

            try:
                check_decodable(ds)
            except NormalisationError as fault:
                raise DeidentificationError(fault.reason, str(fault)) from None
            raise DeidentificationError("burned_in_text_unreadable", str(err)) from None
        failed = DeidentificationError(err.reason, str(err))
        failed.preview = err.preview  # the pixels that failed, for the curator's review (restricted)
        raise failed from None
    audit["text_checked"] += 1
    if done.blanked:
        audit["text_images_blanked"] += 1
        audit["text_regions_blanked"] += len(done.regions)
        audit["text_pixels_blanked"] += done.pixels_blanked
    elif risk and _ascii(ds, 0x00280301).upper() == "YES":
        ds.BurnedInAnnotation = "NO"  # read and verified: no text left
    return regions + done.regions


@lru_cache(maxsize=32)
def _method_code_sequence(codes: tuple[tuple[str, str], ...], implicit_vr: bool, little_endian: bool) -> bytes:
    """Encoded value of DeidentificationMethodCodeSequence (0012,0064): one CID 7050 code item per option.

    Parameters
    ----------
    codes : tuple of (CodeValue, CodeMeaning)
        the profile and option codes, coding scheme DCM.
    implicit_vr, little_endian : bool
        the transfer syntax the file is written in.

    Returns
    -------
    bytes
        the sequence's items, ready to be written as the element's value.
    """
    ignore = pydicom_config.IGNORE
    items = []
    for value, meaning in codes:
        item = Dataset()
        item.add(DataElement(0x00080100, "SH", value, validation_mode=ignore))  # CodeValue
        item.add(DataElement(0x00080102, "SH", "DCM", validation_mode=ignore))  # CodingSchemeDesignator
        item.add(DataElement(0x00080104, "LO", meaning, validation_mode=ignore))  # CodeMeaning
        items.append(item)
    fp = DicomBytesIO()
    fp.is_implicit_VR, fp.is_little_endian = implicit_vr, little_endian
    write_sequence(fp, DataElement(0x00120064, "SQ", Sequence(items)), ["iso8859"])
    return fp.getvalue()


def _finish(
    ds: Dataset, policy: Policy, transfer_syntax: str | None, walker: _Walker, pixels_cleaned: bool = False
) -> None:
    if policy.safe_private:
        _prune_private_creators(ds)
    ignore = pydicom_config.IGNORE
    codes, text = policy.method_codes, policy.method_text
    if pixels_cleaned:  # burned-in text blanked: Clean Pixel Data Option (113101)
        codes, text = (*codes, CODE_CLEAN_PIXEL), (policy.method_text + " " + CODE_CLEAN_PIXEL[0])[:64]
    ds[0x00120062] = DataElement(0x00120062, "CS", "YES", validation_mode=ignore)  # PatientIdentityRemoved
    ds[0x00120063] = DataElement(0x00120063, "LO", text, validation_mode=ignore)
    ts = UID(transfer_syntax or ExplicitVRLittleEndian)
    implicit, little = (ts.is_implicit_VR, ts.is_little_endian) if ts.is_transfer_syntax else (False, True)
    # DeidentificationMethodCodeSequence: the same items in every file, encoded once per transfer syntax
    seq = _method_code_sequence(codes, implicit, little)
    ds[0x00120064] = RawDataElement(Tag(0x00120064), "SQ", len(seq), seq, 0, implicit, little)
    ds[0x00280303] = DataElement(
        0x00280303, "CS", "MODIFIED" if policy.modified_dates else "REMOVED", validation_mode=ignore
    )  # LongitudinalTemporalInformationModified
    sop_class_item = ds.get_item(0x00080016)
    sop_class = (
        bytes(sop_class_item.value).decode("ascii", "replace").rstrip("\x00 ")
        if sop_class_item is not None and isinstance(sop_class_item.value, bytes)
        else str(ds.get("SOPClassUID", "1.2.840.10008.5.1.4.1.1.7"))
    )
    meta = FileMetaDataset()
    meta.add(DataElement(0x00020002, "UI", sop_class, validation_mode=ignore))
    meta.add(DataElement(0x00020003, "UI", _ascii(ds, 0x00080018), validation_mode=ignore))
    meta.add(DataElement(0x00020010, "UI", transfer_syntax or ExplicitVRLittleEndian, validation_mode=ignore))
    meta.add(DataElement(0x00020012, "UI", PYDICOM_IMPLEMENTATION_UID, validation_mode=ignore))
    meta.add(DataElement(0x00020013, "SH", "MEDRECO_0_2", validation_mode=ignore))
    ds.file_meta = meta
    ds.preamble = b"\x00" * 128


def _prune_private_creators(ds: Dataset) -> None:
    """Remove private creator elements (gggg,0010-00FF) that no kept private element uses."""
    used = {(t.group, t.element >> 8) for t in ds.keys() if t.is_private and t.element >= 0x1000}
    for t in list(ds.keys()):
        if t.is_private and 0x0010 <= t.element <= 0x00FF and (t.group, t.element) not in used:
            del ds[t]
