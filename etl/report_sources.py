"""Read radiology report source files (JSONL, CSV, plain text) into uniform report records.

A record is ``{report_id, patient_id, accession_number, study_instance_uid, report_datetime, language,
text}``; all values are ``str`` or ``None`` except ``report_id`` and ``text``, which are always
non-empty ``str``. Records still hold PHI (they come from ``sources/``): callers de-identify them
before anything leaves the restricted zone.

Errors never quote a value from the file (it may be PHI): they name the source, the line number and
what is wrong.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from pathlib import PurePosixPath

#: record keys, in output order.
REPORT_FIELDS = (
    "report_id",
    "patient_id",
    "accession_number",
    "study_instance_uid",
    "report_datetime",
    "language",
    "text",
)
REQUIRED_FIELDS = ("report_id", "text")
FORMATS = ("jsonl", "csv", "text")
#: Open-i / Indiana University CXR CSV layout (Demner-Fushman et al., JAMIA 2016;23(2):304-310).
OPENI_COLUMNS = ("uid", "MeSH", "Problems", "image", "indication", "comparison", "findings", "impression")
OPENI_SECTIONS = (("indication", "INDICATION"), ("comparison", "COMPARISON"), ("findings", "FINDINGS"),
                  ("impression", "IMPRESSION"))


class ReportSourceError(ValueError):
    """A report source that cannot be read.

    Attributes
    ----------
    reason : str
        Machine-readable reason code: ``malformed_report_record`` (a line/row that is not a valid record,
        including missing text), ``duplicate_report_id``, ``undecodable_report_file`` (not UTF-8),
        ``unsupported_report_format``.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


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


def _record(raw: dict[str, object], where: str) -> dict[str, str | None]:
    unknown = sorted(k for k in raw if k not in REPORT_FIELDS)
    if unknown:
        raise ReportSourceError("malformed_report_record", f"{where}: unknown field(s) {unknown}")
    rec = {k: _clean_value(raw.get(k), k, where) for k in REPORT_FIELDS}
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


def _iter_csv(text: str, source_name: str) -> Iterator[dict | ReportSourceError]:
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
        if len(row) != len(header):
            yield ReportSourceError(
                "malformed_report_record", f"{where}: {len(row)} fields, header has {len(header)}"
            )
            continue
        values = dict(zip(header, row))
        try:
            if openi:
                yield _record({"report_id": values["uid"], "text": _openi_text(values)}, where)
            else:
                yield _record(values, where)
        except ReportSourceError as exc:
            yield exc


def iter_report_source(data: bytes, fmt: str, source_name: str) -> Iterator[dict | ReportSourceError]:
    """Parse a report file record by record, yielding bad records as errors instead of raising.

    Lets a caller ledger/quarantine one bad line and keep the rest of the file.

    Parameters
    ----------
    data : bytes
        File content (UTF-8, optional BOM).
    fmt : {"jsonl", "csv", "text"}
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
    text = _decode(data, source_name)
    if fmt == "text":
        stem = PurePosixPath(source_name.replace("\\", "/")).stem
        try:
            single: dict | ReportSourceError = _record({"report_id": stem, "text": text}, f"{source_name} line 1")
        except ReportSourceError as exc:
            single = exc
        items: Iterator[dict | ReportSourceError] = iter([single])
    elif fmt == "jsonl":
        items = _iter_jsonl(text, source_name)
    else:
        items = _iter_csv(text, source_name)
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
    fmt : {"jsonl", "csv", "text"}
        ``jsonl``: one JSON object per line with keys from :data:`REPORT_FIELDS` (blank lines skipped).
        ``csv``: a header row with those column names, or the Open-i layout (:data:`OPENI_COLUMNS`):
        ``report_id`` = ``uid``, text = ``"INDICATION: ...\\nCOMPARISON: ...\\nFINDINGS: ...\\nIMPRESSION: ..."``
        (empty sections omitted), no patient/study link. ``text``: the whole file is one report,
        ``report_id`` = file stem of ``source_name``.
    source_name : str
        File name or URI (error messages; report id for ``text``).

    Returns
    -------
    list of dict
        Records ``{report_id, patient_id, accession_number, study_instance_uid, report_datetime, language,
        text}`` in file order; optional fields are ``None`` when absent or blank; ``report_datetime`` is kept
        as the source string (not parsed).

    Raises
    ------
    ReportSourceError
        ``malformed_report_record`` naming the line number (never the content) for invalid JSON/CSV, a
        wrong field count, unknown or non-string fields, or a missing/empty ``report_id`` or ``text``;
        ``duplicate_report_id``; ``undecodable_report_file``; ``unsupported_report_format``.
    """
    records = []
    for item in iter_report_source(data, fmt, source_name):
        if isinstance(item, ReportSourceError):
            raise item
        records.append(item)
    return records
