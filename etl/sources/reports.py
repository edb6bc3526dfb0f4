"""Read radiology report source files (JSONL, CSV, plain text, HL7 v2 ORU^R01) into uniform report records.

A record is ``{report_id, patient_id, patient_name, accession_number, study_instance_uid, report_datetime,
language, text}``; all values are ``str`` or ``None`` except ``report_id`` and ``text``, which are always
non-empty ``str``. Records still hold PHI (they come from ``sources/``): callers de-identify them
before anything leaves the restricted zone.

Errors never quote a value from the file (it may be PHI): they name the source, the line number and
what is wrong.

HL7 v2 ORU^R01 (``hl7``; HL7 v2.5.1 chapter 7, IHE Radiology TF-2 RAD-28 conventions). A file holds one or
more messages; segments end at CR, LF or CRLF; MLLP framing bytes (0x0B, 0x1C), blank lines and batch
envelopes (FHS/BHS/BTS/FTS) are ignored. Messages are parsed with python-hl7 (separators from MSH-1/MSH-2).
One record per OBR group (ORDER_OBSERVATION):

* ``text``: OBX-5 of every OBX with value type (OBX-2) TX, FT or ST, repetitions and segments joined by
  newlines in message order; OBX with result status (OBX-11) D, W or X are left out. Escape sequences are
  decoded (``\\F\\ \\S\\ \\T\\ \\R\\ \\E\\``, ``\\Xhh\\``, formatted-text ``\\.br\\ \\.sp\\ \\.sk\\ \\.ce\\``).
* ``accession_number``: OBR-18 (Placer Field 1, where IHE Radiology puts the Accession Number), else OBR-3.1
  (Filler Order Number, the RIS's number, which many sites use as the accession). OBR-2 (the ordering
  system's number) is never used: it is not the department's accession and could link a wrong study.
* ``study_instance_uid``: OBX-5 of an OBX whose OBX-3 is ``StudyInstanceUID`` or ``113014^...^DCM`` (DICOM
  Study), else ZDS-1.1 (IHE). Must be a valid DICOM UID.
* ``report_datetime``: OBR-22 (results report/status change time), else OBR-7 (observation time), in ISO 8601.
* ``patient_id``: PID-3.1 of the repetition with identifier type MR, else the first non-empty one. It holds
  PHI: callers use it only to link and as a known value to scrub, never output it.
* ``patient_name``: PID-5 (XPN) of the repetition with name type code (XPN-7) L (legal), else the first
  non-empty one, as a DICOM PN string ``FAMILY^GIVEN^MIDDLE^PREFIX^SUFFIX`` (family = first subcomponent of
  XPN-1; empty trailing components dropped). PHI: only a known value for text de-identification.
* ``report_id``: MSH-10 (message control ID); ``MSH-10-<n>`` for the n-th OBR group when there are several.
* ``language``: MSH-19.1 when it is a two-letter ISO 639-1 code.

A malformed message is one ``malformed_report_record`` error naming the message number and line and one of:
segments before any MSH, malformed MSH-1/MSH-2, a line that is not a segment, not ORU^R01 (MSH-9), empty
MSH-10, not UTF-8, no OBR, OBX before OBR, no OBX text, no study link (neither accession nor UID), an invalid
StudyInstanceUID, OBR-22/OBR-7 not an HL7 date/time. The other messages of the file are still read.
"""

from __future__ import annotations

import csv
import datetime as dt
import difflib
import io
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import PurePosixPath

from schemas.errors import ReasonCodedError

#: keys every record source may give (JSONL keys, CSV columns); see :data:`RECORD_FIELDS` for the record.
REPORT_FIELDS = (
    "report_id",
    "patient_id",
    "accession_number",
    "study_instance_uid",
    "report_datetime",
    "language",
    "text",
)
#: optional PHI keys a source may also give (HL7 PID-5, or a JSONL/CSV ``patient_name``); a record always has
#: them (None when unknown). Known values for text de-identification only, never output.
OPTIONAL_PHI_FIELDS = ("patient_name",)
#: record keys, in output order.
RECORD_FIELDS = (*REPORT_FIELDS[:2], *OPTIONAL_PHI_FIELDS, *REPORT_FIELDS[2:])
REQUIRED_FIELDS = ("report_id", "text")
FORMATS = ("jsonl", "csv", "text", "hl7")
#: Open-i / Indiana University CXR CSV layout (Demner-Fushman et al., JAMIA 2016;23(2):304-310).
OPENI_COLUMNS = ("uid", "MeSH", "Problems", "image", "indication", "comparison", "findings", "impression")
OPENI_SECTIONS = (
    ("indication", "INDICATION"),
    ("comparison", "COMPARISON"),
    ("findings", "FINDINGS"),
    ("impression", "IMPRESSION"),
)


class ReportSourceError(ReasonCodedError, ValueError):
    """A report source that cannot be read.

    Attributes
    ----------
    reason : str
        Machine-readable reason code: ``malformed_report_record`` (a line/row that is not a valid record,
        including missing text), ``duplicate_report_id``, ``undecodable_report_file`` (not UTF-8),
        ``unsupported_report_format``.
    """

    @property
    def message(self) -> str:
        """The message without the reason code."""
        return self.detail


def _decode(data: bytes, source_name: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ReportSourceError(
            "undecodable_report_file", f"{source_name}: not UTF-8 (byte offset {exc.start})"
        ) from None


def _clean_value(value: object, key: str, where: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ReportSourceError("malformed_report_record", f"{where}: field {key!r} must be a string")
    value = str(value).strip() if key != "text" else str(value)
    return value if value.strip() else None


def _record(raw: Mapping[str, object], where: str) -> dict[str, str | None]:
    unknown = [str(k) for k in raw if k not in RECORD_FIELDS]
    if unknown:  # a field name is sender text (it may carry PHI): counted, never quoted; a near miss of a known
        # field is named by the known field it resembles (difflib ratio >= 0.8), which is our text, not the sender's
        near = sorted({m for k in unknown for m in difflib.get_close_matches(k, RECORD_FIELDS, n=1, cutoff=0.8)})
        hint = f"; did you mean {', '.join(f'`{m}`' for m in near)}?" if near else ""
        raise ReportSourceError(
            "malformed_report_record",
            f"{where}: {len(unknown)} unknown field(s){hint} (known fields: {', '.join(RECORD_FIELDS)})",
        )
    rec = {k: _clean_value(raw.get(k), k, where) for k in RECORD_FIELDS}
    for k in REQUIRED_FIELDS:
        if rec[k] is None:
            raise ReportSourceError("malformed_report_record", f"{where}: missing or empty {k!r}")
    return rec


def _iter_jsonl(text: str, source_name: str) -> Iterator[dict | ReportSourceError]:
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{source_name} line {lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            yield ReportSourceError("malformed_report_record", f"{where}: invalid JSON ({exc.msg}, column {exc.colno})")
            continue
        if not isinstance(obj, dict):
            yield ReportSourceError("malformed_report_record", f"{where}: not a JSON object")
            continue
        try:
            yield _record(obj, where)
        except ReportSourceError as exc:
            yield exc


def _openi_text(row: dict[str, str]) -> str:
    parts = [f"{header}: {row[col].strip()}" for col, header in OPENI_SECTIONS if (row.get(col) or "").strip()]
    return "\n".join(parts)


def _looks_like_a_row(line: str, width: int) -> bool:
    """Whether one physical line, read alone, is a complete CSV row of ``width`` fields with a first value."""
    try:
        rows = list(csv.reader(io.StringIO(line, newline="")))
    except csv.Error:
        return False
    return len(rows) == 1 and len(rows[0]) == width and bool(rows[0][0].strip())


def _iter_csv(text: str, source_name: str) -> Iterator[dict | ReportSourceError]:
    """CSV records. A quoted field may span lines (report text has line breaks), but a record whose quoted
    field swallowed a line that reads as a complete row of its own is an unbalanced quote merging rows: it is
    one ``malformed_report_record`` error naming the lines (so the merged rows are withheld, never published
    as one text), and reading goes on after it."""
    lines = io.StringIO(text, newline="").readlines()
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        return
    except csv.Error as exc:
        yield ReportSourceError("malformed_report_record", f"{source_name} line 1: bad CSV header ({exc})")
        return
    header = [h.strip() for h in header]
    openi = "uid" in header and {"findings", "impression"} <= set(header)
    if not openi:
        missing = [k for k in REQUIRED_FIELDS if k not in header]
        if missing:
            yield ReportSourceError("malformed_report_record", f"{source_name} line 1: CSV header lacks {missing}")
            return
    if len(set(header)) != len(header):
        yield ReportSourceError("malformed_report_record", f"{source_name} line 1: duplicate CSV column names")
        return
    while True:
        start_line = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            yield ReportSourceError("malformed_report_record", f"{source_name} line {start_line}: bad CSV ({exc})")
            return
        if not row or all(not c.strip() for c in row):
            continue
        where = f"{source_name} line {start_line}"
        end_line = reader.line_num
        if end_line > start_line and any(
            _looks_like_a_row(lines[n - 1], len(header)) for n in range(start_line + 1, min(end_line, len(lines)) + 1)
        ):
            yield ReportSourceError(
                "malformed_report_record",
                f"{source_name} lines {start_line}-{end_line}: a quoted field runs over "
                "a line that reads as a row of its own (unbalanced quote): the rows are withheld",
            )
            continue
        if len(row) != len(header):
            yield ReportSourceError("malformed_report_record", f"{where}: {len(row)} fields, header has {len(header)}")
            continue
        values = dict(zip(header, row))
        try:
            if openi:
                yield _record({"report_id": values["uid"], "text": _openi_text(values)}, where)
            else:
                yield _record(values, where)
        except ReportSourceError as exc:
            yield exc


# ---------------------------------------------------------------- HL7 v2 ORU^R01
#: OBX-2 value types whose OBX-5 is report text (HL7 v2.5.1 section 2.A: TX text data, FT formatted text,
#: ST string data).
HL7_TEXT_VALUE_TYPES = frozenset({"TX", "FT", "ST"})
#: OBX-11 result statuses whose observation is not part of the report (HL7 table 0085: D deleted,
#: W wrong / replaced, X could not be obtained).
HL7_SKIPPED_RESULT_STATUSES = frozenset({"D", "W", "X"})
#: OBX-3 identifiers of an observation carrying the Study Instance UID: the literal ``StudyInstanceUID`` (any
#: case), or DICOM code 113014 "DICOM Study" in coding scheme DCM (IHE RAD TF-2, RAD-28 report export).
HL7_STUDY_UID_OBSERVATION = "studyinstanceuid"
HL7_STUDY_UID_CODE = ("113014", "DCM")
_HL7_SEGMENT_ID = re.compile(r"[A-Z][A-Z0-9]{2}")
_HL7_LINE_BREAK = re.compile(rb"\r\n|\r|\n")
_DICOM_UID = re.compile(r"(?:0|[1-9][0-9]*)(?:\.(?:0|[1-9][0-9]*))*")
_HL7_TS = re.compile(
    r"(?P<Y>\d{4})(?:(?P<m>\d{2})(?:(?P<d>\d{2})(?:(?P<H>\d{2})(?:(?P<M>\d{2})(?:(?P<S>\d{2})(?:\.(?P<f>\d{1,4}))?)?)?)?)?)?"
    r"(?P<tz>[+-]\d{4})?"
)
_CODE_LIKE = re.compile(r"[A-Za-z0-9_]{1,10}")


def _hl7_unescape(value: str, esc: str, seps: dict[str, str]) -> str:
    """Decode HL7 v2 escape sequences (HL7 v2.5.1 sections 2.7.4-2.7.6).

    ``\\F\\ \\S\\ \\T\\ \\R\\ \\E\\`` become the message's field, component, subcomponent, repetition and escape
    characters; ``\\Xhh..\\`` hexadecimal bytes (UTF-8, else ISO 8859-1); formatted-text commands ``\\.br\\``
    (line break), ``\\.sp n\\`` (line break and n blank lines, n default 1), ``\\.ce\\`` (line break),
    ``\\.sk n\\`` (n spaces); ``\\.fi\\ \\.nf\\ \\.in n\\ \\.ti n\\`` (fill and indent), ``\\H\\ \\N\\``
    (highlighting), ``\\Zxx\\`` (locally defined) and ``\\Cxxyy\\ \\Mxxyyzz\\`` (character set switches, not
    supported) are dropped. An escape character without its closing partner is kept as text.
    """
    if esc not in value:
        return value
    out: list[str] = []
    pos = 0
    while True:
        start = value.find(esc, pos)
        end = value.find(esc, start + 1) if start >= 0 else -1
        if start < 0 or end < 0:
            out.append(value[pos:])
            break
        out.append(value[pos:start])
        seq = value[start + 1 : end]
        pos = end + 1
        if seq in seps:
            out.append(seps[seq])
        elif seq[:1] == "X" and len(seq) > 1:
            try:
                raw = bytes.fromhex(seq[1:])
            except ValueError:
                continue  # not hexadecimal: dropped
            try:
                out.append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                out.append(raw.decode("latin-1"))
        elif seq[:1] == ".":
            command, _, arg = seq[1:].partition(" ")
            count = int(arg) if arg.strip().lstrip("+-").isdigit() else 1
            if command == "br" or command == "ce":
                out.append("\n")
            elif command == "sp":
                out.append("\n" * (1 + max(count, 0)))
            elif command == "sk":
                out.append(" " * max(count, 0))
            # .fi .nf .in .ti: layout only, dropped
        # H, N, Z.., C.., M.. and unknown sequences: dropped
    return "".join(out)


def _hl7_ts_to_iso(value: str) -> str | None:
    """HL7 DTM/TS ``YYYY[MM[DD[HH[MM[SS[.S[S[S[S]]]]]]]]][+/-ZZZZ]`` -> ISO 8601 text of the same precision."""
    m = _HL7_TS.fullmatch(value)
    if m is None:
        return None
    g = m.groupdict()
    try:
        dt.datetime(
            int(g["Y"]), int(g["m"] or 1), int(g["d"] or 1), int(g["H"] or 0), int(g["M"] or 0), int(g["S"] or 0)
        )
    except ValueError:
        return None
    iso = g["Y"] + "".join(f"-{g[k]}" for k in ("m", "d") if g[k])
    if g["H"]:
        iso += "T" + g["H"] + (f":{g['M']}" if g["M"] else ":00") + (f":{g['S']}" if g["S"] else "")
        iso += f".{g['f']}" if g["f"] else ""
        iso += f"{g['tz'][:3]}:{g['tz'][3:]}" if g["tz"] else ""
    return iso


class _Hl7Message:
    """One parsed message: python-hl7 segments plus helpers returning unescaped field parts as ``str``."""

    def __init__(self, text: str) -> None:
        import hl7  # python-hl7 (https://python-hl7.readthedocs.io): separators, segment/field splitting

        self.msg = hl7.parse(text)
        self.esc = self.msg.esc
        field, rep, comp, sub = (self.msg.separators[i] for i in (1, 2, 3, 4))
        self.rep, self.comp, self.sub = rep, comp, sub
        self.seps = {"F": field, "S": comp, "T": sub, "R": rep, "E": self.esc}

    def segments(self) -> list[tuple[str, object]]:
        return [(str(seg[0]), seg) for seg in self.msg]

    @staticmethod
    def raw(seg, n: int) -> str:
        """Field ``n`` (HL7 numbering: MSH-9 is ``raw(msh, 9)``) as it stands in the message, or ``""``."""
        return str(seg[n]) if n < len(seg) else ""

    def repetitions(self, seg, n: int) -> list[str]:
        raw = self.raw(seg, n)
        return raw.split(self.rep) if raw else []

    def component(self, raw: str, k: int) -> str:
        """Component ``k`` (1-based) of one field repetition, unescaped and stripped."""
        parts = raw.split(self.comp)
        return _hl7_unescape(parts[k - 1], self.esc, self.seps).strip() if k <= len(parts) else ""

    def first(self, seg, n: int, k: int = 1) -> str:
        reps = self.repetitions(seg, n)
        return self.component(reps[0], k) if reps else ""

    def person_name(self, seg, n: int) -> str | None:
        """An XPN field as a DICOM PN string ``FAMILY^GIVEN^MIDDLE^PREFIX^SUFFIX``, or None when empty.

        The repetition with name type code (XPN-7) ``L`` (legal name, HL7 table 0200) wins, else the first
        repetition with a family or given name. XPN components (HL7 v2.5.1 section 2.A.88): 1 family name (FN;
        its first subcomponent is the surname), 2 given, 3 second given names or initials, 4 suffix, 5 prefix.
        """
        names = []
        for rep in self.repetitions(seg, n):
            family = _hl7_unescape(rep.split(self.comp)[0].split(self.sub)[0], self.esc, self.seps).strip()
            parts = [
                family,
                self.component(rep, 2),
                self.component(rep, 3),
                self.component(rep, 5),
                self.component(rep, 4),
            ]
            if parts[0] or parts[1]:
                names.append((self.component(rep, 7).upper() == "L", "^".join(parts).rstrip("^")))
        legal = [pn for is_legal, pn in names if is_legal]
        return next(iter(legal or [pn for _, pn in names]), None)

    def text(self, raw: str) -> str:
        """A whole text value (TX/FT/ST): unescaped; a stray component separator is kept as text."""
        return _hl7_unescape(raw, self.esc, self.seps).replace("\r\n", "\n").replace("\r", "\n")


def _split_hl7(data: bytes) -> Iterator[tuple[int, list[bytes]]]:
    """Split a file into messages: ``(line number of the first segment, segment byte strings)``.

    Segments end at CR, LF or CRLF; MLLP framing bytes (0x0B start block, 0x1C end block) and blank lines
    are ignored; batch/file envelope segments (FHS, BHS, BTS, FTS) are skipped; a message starts at each MSH.
    Segments before the first MSH come out as a "message" whose first segment is not MSH.
    """
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    data = data.replace(b"\x0b", b"").replace(b"\x1c", b"")
    current: list[bytes] = []
    start = 0
    for lineno, line in enumerate(_HL7_LINE_BREAK.split(data), start=1):
        seg = line.lstrip(b" \t")
        if not seg.strip():
            continue
        if seg[:3] in (b"FHS", b"BHS", b"BTS", b"FTS"):
            continue
        if seg[:3] == b"MSH" or not current:
            if current:
                yield start, current
            current, start = [], lineno
        current.append(seg.rstrip(b" \t"))
    if current:
        yield start, current


def _hl7_records(message: _Hl7Message, where: str) -> list[dict]:
    """Records of one ORU^R01 message (one per OBR group with text); raises ReportSourceError."""
    segs = message.segments()
    msh = segs[0][1]
    mtype = message.repetitions(msh, 9)[:1]
    code = message.component(mtype[0], 1) if mtype else ""
    event = message.component(mtype[0], 2) if mtype else ""
    if (code.upper(), event.upper()) != ("ORU", "R01"):
        shown = f"{code}^{event}" if _CODE_LIKE.fullmatch(code or "-") and _CODE_LIKE.fullmatch(event or "-") else "?"
        raise ReportSourceError("malformed_report_record", f"{where}: not an ORU^R01 message (MSH-9 {shown})")
    control_id = message.first(msh, 10)
    if not control_id:
        raise ReportSourceError("malformed_report_record", f"{where}: MSH-10 message control ID is empty")
    lang = message.first(msh, 19).lower()
    language = lang if len(lang) == 2 and lang.isalpha() else None
    groups: list[dict] = []
    patient_id: str | None = None
    patient_name: str | None = None
    for sid, seg in segs[1:]:
        if sid == "PID":
            patient_id = None
            reps = [r for r in message.repetitions(seg, 3) if message.component(r, 1)]
            mrn = [r for r in reps if message.component(r, 5).upper() == "MR"]
            if reps:
                patient_id = message.component((mrn or reps)[0], 1)
            patient_name = message.person_name(seg, 5)
        elif sid == "OBR":
            groups.append({"obr": seg, "pid": patient_id, "name": patient_name, "lines": [], "uid": None})
        elif sid == "OBX":
            if not groups:
                raise ReportSourceError("malformed_report_record", f"{where}: OBX segment before any OBR")
            group = groups[-1]
            ident = message.repetitions(seg, 3)[:1]
            obs_id = message.component(ident[0], 1) if ident else ""
            obs_system = message.component(ident[0], 3) if ident else ""
            if obs_id.lower() == HL7_STUDY_UID_OBSERVATION or (obs_id, obs_system.upper()) == HL7_STUDY_UID_CODE:
                group["uid"] = message.first(seg, 5)
                continue
            if message.first(seg, 11).upper() in HL7_SKIPPED_RESULT_STATUSES:
                continue
            if message.first(seg, 2).upper() in HL7_TEXT_VALUE_TYPES:
                group["lines"].extend(message.text(r) for r in message.repetitions(seg, 5))
        elif sid == "ZDS" and groups and groups[-1]["uid"] is None:
            groups[-1]["uid"] = message.first(seg, 1)
    if not groups:
        raise ReportSourceError("malformed_report_record", f"{where}: no OBR segment")
    records = []
    for i, group in enumerate(groups, start=1):
        gwhere = where if len(groups) == 1 else f"{where} OBR group {i}"
        text = "\n".join(group["lines"])
        if not text.strip():
            raise ReportSourceError("malformed_report_record", f"{gwhere}: no OBX text (value type TX, FT or ST)")
        obr = group["obr"]
        accession = message.first(obr, 18) or message.first(obr, 3) or None
        uid = group["uid"] or None
        if uid is not None and (len(uid) > 64 or not _DICOM_UID.fullmatch(uid)):
            raise ReportSourceError("malformed_report_record", f"{gwhere}: StudyInstanceUID is not a valid DICOM UID")
        if accession is None and uid is None:
            raise ReportSourceError(
                "malformed_report_record",
                f"{gwhere}: no study link (AccessionNumber in OBR-18/OBR-3, StudyInstanceUID in OBX or ZDS-1)",
            )
        when = message.first(obr, 22) or message.first(obr, 7)
        iso = _hl7_ts_to_iso(when) if when else None
        if when and iso is None:
            field = "OBR-22" if message.first(obr, 22) else "OBR-7"
            raise ReportSourceError("malformed_report_record", f"{gwhere}: {field} is not an HL7 date/time")
        report_id = control_id if len(groups) == 1 else f"{control_id}-{i}"
        records.append(
            _record(
                {
                    "report_id": report_id,
                    "patient_id": group["pid"],
                    "patient_name": group["name"],
                    "accession_number": accession,
                    "study_instance_uid": uid,
                    "report_datetime": iso,
                    "language": language,
                    "text": text,
                },
                gwhere,
            )
        )
    return records


def _iter_hl7(data: bytes, source_name: str) -> Iterator[dict | ReportSourceError]:
    for number, (lineno, segments) in enumerate(_split_hl7(data), start=1):
        if segments[0][:3] != b"MSH":
            yield ReportSourceError(
                "malformed_report_record",
                f"{source_name} line {lineno}: {len(segments)} segment(s) before any MSH (no message header)",
            )
            continue
        where = f"{source_name} message {number} line {lineno}"
        try:
            text = b"\r".join(segments).decode("utf-8")
        except UnicodeDecodeError as exc:
            yield ReportSourceError("malformed_report_record", f"{where}: not UTF-8 (byte offset {exc.start})")
            continue
        header = text.split("\r", 1)[0]
        fs = header[3:4]
        encoding_chars = header[4 : header.find(fs, 4)] if fs and header.find(fs, 4) > 0 else ""
        specials = fs + encoding_chars
        if (
            not 2 <= len(encoding_chars) <= 5
            or len(set(specials)) != len(specials)
            or any(c.isalnum() or c.isspace() for c in specials)
        ):
            yield ReportSourceError("malformed_report_record", f"{where}: MSH-1/MSH-2 separators are malformed")
            continue
        for segno, seg in enumerate(text.split("\r")[1:], start=1):
            if not _HL7_SEGMENT_ID.fullmatch(seg[:3]) or (len(seg) > 3 and seg[3] != fs):
                yield ReportSourceError(
                    "malformed_report_record", f"{where}: segment {segno + 1} does not start with a segment ID"
                )
                break
        else:
            try:
                yield from _hl7_records(_Hl7Message(text), where)
            except ReportSourceError as exc:
                yield exc


def _iter_text_formats(text: str, fmt: str, source_name: str) -> Iterator[dict | ReportSourceError]:
    if fmt == "text":
        stem = PurePosixPath(source_name.replace("\\", "/")).stem
        try:
            yield _record({"report_id": stem, "text": text}, f"{source_name} line 1")
        except ReportSourceError as exc:
            yield exc
    elif fmt == "jsonl":
        yield from _iter_jsonl(text, source_name)
    else:
        yield from _iter_csv(text, source_name)


def iter_report_source(data: bytes, fmt: str, source_name: str) -> Iterator[dict | ReportSourceError]:
    """Parse a report file record by record, yielding bad records as errors instead of raising.

    Lets a caller ledger/quarantine one bad line and keep the rest of the file.

    Parameters
    ----------
    data : bytes
        File content (UTF-8, optional BOM; ``hl7`` is decoded message by message, so one non-UTF-8 message
        is one error).
    fmt : {"jsonl", "csv", "text", "hl7"}
        Source format (institution config ``report_format``).
    source_name : str
        File name or URI, used in error messages and (``text``) for the report id.

    Yields
    ------
    dict or ReportSourceError
        A record (see :func:`read_report_source`) or the error of one line/row, in file order.

    Raises
    ------
    ReportSourceError
        ``unsupported_report_format`` for an unknown ``fmt``; ``undecodable_report_file`` when the bytes are
        not UTF-8 (the whole file is unreadable); ``duplicate_report_id`` is *yielded* for a repeated id.
    """
    if fmt not in FORMATS:
        raise ReportSourceError("unsupported_report_format", f"{source_name}: format {fmt!r} not in {FORMATS}")
    if fmt == "hl7":
        items: Iterator[dict | ReportSourceError] = _iter_hl7(data, source_name)
    else:
        items = _iter_text_formats(_decode(data, source_name), fmt, source_name)
    seen: set[str] = set()
    for item in items:
        if isinstance(item, dict):
            if item["report_id"] in seen:
                item = ReportSourceError(
                    "duplicate_report_id", f"{source_name}: a report id occurs more than once in the file"
                )
            else:
                seen.add(item["report_id"])
        yield item


def read_report_source(data: bytes, fmt: str, source_name: str) -> list[dict]:
    """Parse a whole report file; any bad line/row fails the file.

    Parameters
    ----------
    data : bytes
        File content, UTF-8 (a BOM is accepted).
    fmt : {"jsonl", "csv", "text", "hl7"}
        ``jsonl``: one JSON object per line with keys from :data:`RECORD_FIELDS` (blank lines skipped).
        ``csv``: a header row with those column names, or the Open-i layout (:data:`OPENI_COLUMNS`):
        ``report_id`` = ``uid``, text = ``"INDICATION: ...\\nCOMPARISON: ...\\nFINDINGS: ...\\nIMPRESSION: ..."``
        (empty sections omitted), no patient/study link. ``text``: the whole file is one report,
        ``report_id`` = file stem of ``source_name``. ``hl7``: HL7 v2 ORU^R01 messages, one record per OBR
        group (see the module docstring for the field mapping).
    source_name : str
        File name or URI (error messages; report id for ``text``).

    Returns
    -------
    list of dict
        Records ``{report_id, patient_id, patient_name, accession_number, study_instance_uid, report_datetime,
        language, text}`` (:data:`RECORD_FIELDS`) in file order; optional fields are ``None`` when absent or blank;
        ``report_datetime`` is kept as the source string (not parsed), except for ``hl7``, where the HL7 timestamp is
        rewritten in ISO 8601 at its own precision (``20230314101500`` -> ``2023-03-14T10:15:00``).

    Raises
    ------
    ReportSourceError
        ``malformed_report_record`` naming the line number (never the content) for invalid JSON/CSV, a
        wrong field count, unknown or non-string fields, or a missing/empty ``report_id`` or ``text``, and
        for ``hl7`` every malformed message (reasons in the module docstring); ``duplicate_report_id``;
        ``undecodable_report_file``; ``unsupported_report_format``.
    """
    records = []
    for item in iter_report_source(data, fmt, source_name):
        if isinstance(item, ReportSourceError):
            raise item
        records.append(item)
    return records


def unreadable_file_detail(errors: list[ReportSourceError]) -> str:
    """The ledger detail of a report file none of whose records could be read: how many errors and the first
    one's reason and message (a line number and what is wrong, never a value: the parser's messages quote none),
    e.g. ``no record could be read (1 error): malformed_report_record: r.csv line 1: CSV header lacks
    ['report_id']``; at most 300 characters. ``errors`` are the file's
    :class:`ReportSourceError` items, in file order (at least one)."""
    first = errors[0]
    more = f"; first: {first}" if len(errors) > 1 else f": {first}"
    return f"no record could be read ({len(errors)} error{'s' if len(errors) != 1 else ''}){more}"[:300]
