"""Discovery: list an institution's delivery, hash every file, classify it and assign a patient shard.

Output is the run *plan* (restricted zone: it names source paths): one row per input file with
``kind`` (dicom | report | other), ``sha256``, ``shard`` (for DICOM: from the patient pseudonym) and a
preliminary status (``pending`` | ``skipped`` | ``quarantined``). Duplicates are marked across the whole
run by :func:`mark_duplicates`.

Incremental ingestion. A storage root keeps a *seen index* (``ledger/seen_index.parquet``, restricted: it
names source paths): one row per (source_uri, sha256) any earlier run recorded, with that file's latest
outcome. The plan of a run is always the plan a clean build of everything now under the sources would make
(the *clean view*: the same statuses, duplicates and UID collisions), annotated by :func:`mark_seen` with the
earlier run that already recorded the same content (``seen_run``, ``seen_uri``, ``seen_status``). Stages use
the clean view (a shard whose inputs did not change is skipped, see :mod:`etl.pipeline.stages`); the ledger uses the
annotation to record re-delivered files as ``duplicate`` (:func:`etl.pipeline.ledger.build_ledger`).
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import posixpath
import warnings

import pyarrow as pa
import pydicom
from pydicom.errors import InvalidDicomError

from etl import zones
from etl.keys import PseudonymKey, patient_key_for
from etl.sources.dicom_bounds import SourceBoundsError, bounded_source
from etl.sources.dicom_integrity import last_element_cut
from etl.sources.source_access import UNREADABLE_REASON, check_source, list_source, source_storage
from etl.storage import Storage, StorageError, escape_name
from schemas.config import Institution, PipelineConfig

#: extensions that are never pipeline input in a delivery folder (documentation, manifests, previews)
NON_INPUT_EXTENSIONS = (
    ".md",
    ".txt",
    ".csv",
    ".json",
    ".yaml",
    ".yml",
    ".png",
    ".jpg",
    ".jpeg",
    ".pdf",
    ".xml",
    ".html",
    ".zip",
    ".py",
    ".log",
)
REPORT_GLOBS = {"jsonl": "*.jsonl", "csv": "*.csv", "text": "*.txt", "hl7": "*.hl7", "none": ""}

PLAN_SCHEMA = pa.schema(
    [
        pa.field("source_uri", pa.string(), nullable=False),
        pa.field("institution", pa.string(), nullable=False),
        pa.field("sha256", pa.string(), nullable=False),
        pa.field("bytes", pa.int64(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("shard", pa.int32()),
        pa.field("status", pa.string(), nullable=False),
        pa.field("reason", pa.string()),
        pa.field("detail", pa.string()),
        pa.field("duplicate_of", pa.string()),
        # keyed pseudonyms of the header identifiers, for collision checks across the whole run
        pa.field("patient_key", pa.string()),
        pa.field("study_uid_key", pa.string()),
        pa.field("series_uid_key", pa.string()),
        pa.field("sop_uid_key", pa.string()),
        # incremental ingestion (:func:`mark_seen`): the earlier run that recorded the same sha256, the path
        # it had there and the outcome it got; null for content no earlier run recorded
        pa.field("seen_run", pa.string()),
        pa.field("seen_uri", pa.string()),
        pa.field("seen_status", pa.string()),
    ]
)

#: the seen index of a storage root (restricted zone)
SEEN_INDEX = zones.SEEN_INDEX
SEEN_SCHEMA = pa.schema(
    [
        pa.field("source_uri", pa.string(), nullable=False),
        pa.field("sha256", pa.string(), nullable=False),
        pa.field("institution", pa.string(), nullable=False),
        pa.field("bytes", pa.int64(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("first_run_id", pa.string(), nullable=False),  # the run that first recorded this file
        pa.field("seq", pa.int64(), nullable=False),  # order of first_run_id among the root's runs (1, 2, ...)
        pa.field("last_run_id", pa.string(), nullable=False),  # the latest run that saw it
        # the file's latest clean-view outcome (ledger status, stage and reason code; never a value)
        pa.field("status", pa.string(), nullable=False),
        pa.field("stage", pa.string()),
        pa.field("reason", pa.string()),
    ]
)


def report_glob(inst: Institution) -> str:
    """File-name pattern of an institution's report files."""
    return inst.report_glob or REPORT_GLOBS[inst.report_format]


def classify_dicom(data: bytes, uids: dict | None = None) -> tuple[str | None, str | None, str | None]:
    """Read a DICOM header and return ``(patient_id, reason, detail)``.

    ``reason`` is None when the file is a DICOM instance with a PatientID; else a reason code:
    ``not_dicom`` (no DICOM structure at all), ``unreadable_dicom`` (a parse error),
    ``truncated_file`` (the header is cut inside an element), ``missing_patient_id``, ``inflated_too_large``,
    ``inflate_error``, ``too_many_sequence_items`` (:func:`etl.sources.dicom_bounds.bounded_source`). When ``uids`` is
    given it receives StudyInstanceUID, SeriesInstanceUID and SOPInstanceUID (raw values: callers pseudonymise them at
    once).
    """
    try:
        data = bounded_source(data)  # a deflated dataset inflated with a cap, sequence items counted
    except SourceBoundsError as err:
        return None, err.reason, str(err)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds = pydicom.dcmread(io.BytesIO(data), stop_before_pixels=True, force=True)
            elems = list(ds.keys())
    except (InvalidDicomError, EOFError) as err:
        return None, "unreadable_dicom", f"{type(err).__name__} while reading the header"
    except Exception as err:  # noqa: BLE001  pydicom raises many types on corrupt headers
        return None, "unreadable_dicom", f"{type(err).__name__} while reading the header"
    if not elems or not any(k in ds for k in ("SOPInstanceUID", "SOPClassUID", "Modality")):
        return None, "not_dicom", "no DICOM identifying elements (SOPInstanceUID, SOPClassUID, Modality)"
    try:  # values are converted on access: a corrupt one (a VR of bytes no standard VR has) raises here
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cut = last_element_cut(ds)
            if cut is not None:
                return None, "truncated_file", f"the file ends inside element {cut} of its header"
            if uids is not None:
                for kw in ("StudyInstanceUID", "SeriesInstanceUID", "SOPInstanceUID", "IssuerOfPatientID"):
                    uids[kw] = str(ds.get(kw, "") or "").strip()
            pid = str(ds.get("PatientID", "") or "").strip()
    except Exception as err:  # noqa: BLE001  pydicom raises many types on corrupt values (NotImplementedError ...)
        return None, "unreadable_dicom", f"{type(err).__name__} while reading a header value"
    if not pid:
        return None, "missing_patient_id", "PatientID is empty or absent"
    return pid, None, None


def discover_institution(cfg: PipelineConfig, inst: Institution, root: Storage, key: PseudonymKey) -> pa.Table:
    """Plan rows (:data:`PLAN_SCHEMA`) for every path in one institution's source, sorted by source_uri.

    Reports are sharded later, per record; DICOM files get the shard of their patient pseudonym.
    Files that cannot be read as DICOM are marked quarantined here (reason code, never a value). A path that
    cannot be read at all (a dangling link, a named pipe, a folder that cannot be listed, a read error:
    :func:`etl.sources.source_access.list_source`) is quarantined with reason ``unreadable_file``; its
    ``sha256`` is then that of ``"unreadable:" + source_uri`` (no content to hash: a per-path placeholder,
    so it never reads as a duplicate of another file) and ``bytes`` is 0. A name that is not valid UTF-8 is
    recorded escaped (:func:`etl.storage.escape_name`) and its file processed on its content.

    Raises
    ------
    etl.sources.source_access.SourceUnavailableError
        when the source is missing or unreadable (before anything is read).
    """
    src = source_storage(cfg, inst, root)
    check_source(inst, src)
    pattern = report_glob(inst)
    rows = []
    for entry in list_source(src):
        rel = entry.rel
        uri = escape_name(src.full_uri(rel))  # a name that is not valid UTF-8 is recorded escaped
        problem = entry.problem
        data = b""
        if problem is None:
            try:
                data = src.read_bytes(rel)
            except StorageError:
                problem = "the file cannot be read"
            except UnicodeEncodeError:  # such a name on local disk: read by its bytes, processed on its content
                try:
                    with open(src.path(rel), "rb") as fh:
                        data = fh.read()
                except OSError:
                    problem = "the file cannot be read"
        row = {
            "source_uri": uri,
            "institution": inst.id,
            "sha256": hashlib.sha256(data).hexdigest()
            if problem is None
            else hashlib.sha256(f"unreadable:{uri}".encode()).hexdigest(),
            "bytes": len(data),
            "kind": "other",
            "shard": None,
            "status": "pending",
            "reason": None,
            "detail": None,
            "duplicate_of": None,
            "patient_key": None,
            "study_uid_key": None,
            "series_uid_key": None,
            "sop_uid_key": None,
            "seen_run": None,
            "seen_uri": None,
            "seen_status": None,
        }
        name = posixpath.basename(rel)
        if problem is not None:
            kind = "report" if pattern and fnmatch.fnmatch(name, pattern) else "other"
            row.update(kind=kind, status="quarantined", reason=UNREADABLE_REASON, detail=problem)
        elif pattern and fnmatch.fnmatch(name, pattern):
            row["kind"] = "report"
        elif not inst.dicom or name.lower().endswith(NON_INPUT_EXTENSIONS) or name.startswith("."):
            row.update(status="skipped", reason="not_an_input", detail="not a DICOM or report file of this source")
        else:
            row["kind"] = "dicom"
            uids: dict = {}
            pid, reason, detail = classify_dicom(data, uids)
            if reason or pid is None:
                row.update(status="quarantined", reason=reason or "missing_patient_id", detail=detail)
            else:
                patient_key = patient_key_for(key, inst.id, pid, uids["IssuerOfPatientID"] or inst.patient_id_issuer)
                row.update(
                    shard=key.shard(patient_key, cfg.shard_count),
                    patient_key=patient_key,
                    study_uid_key=key.pseudonym("study", uids["StudyInstanceUID"])
                    if uids["StudyInstanceUID"]
                    else None,
                    series_uid_key=key.pseudonym("series", uids["SeriesInstanceUID"])
                    if uids["SeriesInstanceUID"]
                    else None,
                    sop_uid_key=key.pseudonym("sop", uids["SOPInstanceUID"]) if uids["SOPInstanceUID"] else None,
                )
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=PLAN_SCHEMA)


def mark_duplicates(plan: pa.Table) -> pa.Table:
    """Mark duplicates and identifier collisions across the whole run (in institution, source_uri order).

    - a file whose sha256 was already seen: ``duplicate`` (``duplicate_of`` names the first copy);
    - a DICOM file whose SOPInstanceUID another pending file already has (different bytes):
      ``quarantined`` / ``duplicate_sop_instance_uid``;
    - a StudyInstanceUID (or SeriesInstanceUID) used for two patients (or two studies): every file of the
      later claimant is ``quarantined`` / ``study_uid_collision`` (``series_uid_collision``), since the
      keys of the curated tables would otherwise collide. PS3.5 9.1 requires these UIDs to be unique.
    """
    rows = sorted(plan.to_pylist(), key=lambda r: (r["institution"], r["source_uri"]))
    first: dict[str, str] = {}
    for r in rows:
        if r["status"] == "skipped":
            continue
        seen = first.get(r["sha256"])
        if seen is None:
            first[r["sha256"]] = r["source_uri"]
        else:
            r.update(
                status="duplicate", reason="same_content", duplicate_of=seen, detail="same sha256 as an earlier file"
            )
    _mark_uid_collisions(rows)
    return pa.Table.from_pylist(rows, schema=PLAN_SCHEMA)


def load_seen_index(storage: Storage) -> pa.Table:
    """The seen index of a storage root (:data:`SEEN_SCHEMA`); empty before the first run's ledger."""
    if not storage.is_file(SEEN_INDEX):
        return SEEN_SCHEMA.empty_table()
    return storage.read_table(SEEN_INDEX, schema=SEEN_SCHEMA)


def mark_seen(plan: pa.Table, seen: pa.Table) -> pa.Table:
    """Annotate plan rows whose content (sha256) an earlier run already recorded.

    The statuses are left as they are (the clean view); ``seen_run``, ``seen_uri`` and ``seen_status`` name
    the earlier record: the same path when that path was recorded with the same content (a re-delivery in
    place), else the first recorded copy (lowest ``seq``, then path).

    Parameters
    ----------
    plan : pyarrow.Table
        rows of :data:`PLAN_SCHEMA` (after :func:`mark_duplicates`).
    seen : pyarrow.Table
        rows of :data:`SEEN_SCHEMA` (:func:`load_seen_index`).

    Returns
    -------
    pyarrow.Table
        the plan, same rows and order, annotated.
    """
    by_sha: dict[str, list[dict]] = {}
    for r in seen.to_pylist():
        by_sha.setdefault(r["sha256"], []).append(r)
    rows = plan.to_pylist()
    for r in rows:
        copies = by_sha.get(r["sha256"])
        if not copies:
            continue
        same = [c for c in copies if c["source_uri"] == r["source_uri"]]
        first = same[0] if same else min(copies, key=lambda c: (c["seq"], c["source_uri"]))
        r.update(seen_run=first["first_run_id"], seen_uri=first["source_uri"], seen_status=first["status"])
    return pa.Table.from_pylist(rows, schema=PLAN_SCHEMA)


def update_seen_index(seen: pa.Table, inputs: pa.Table, run_id: str) -> pa.Table:
    """The seen index after a run: every file of the run's clean-view ledger recorded with its outcome.

    Files already recorded keep ``first_run_id`` and ``seq`` (their outcome and ``last_run_id`` are
    updated); new ones get this run and the next ``seq``. Idempotent for a retried run.

    Parameters
    ----------
    seen : pyarrow.Table
        the index before the run (:data:`SEEN_SCHEMA`).
    inputs : pyarrow.Table
        the run's clean-view ledger (:data:`schemas.ledger.SCHEMA`).
    run_id : str
        the run.

    Returns
    -------
    pyarrow.Table
        rows of :data:`SEEN_SCHEMA`, sorted by source_uri and sha256.
    """
    rows = {(r["source_uri"], r["sha256"]): r for r in seen.to_pylist()}
    runs = {r["first_run_id"]: r["seq"] for r in rows.values()}
    seq = runs.get(run_id) or (max(runs.values(), default=0) + 1)
    for r in inputs.to_pylist():
        outcome = {"status": r["status"], "stage": r["stage"], "reason": r["reason"], "last_run_id": run_id}
        k = (r["source_uri"], r["sha256"])
        if k in rows:
            rows[k].update(outcome)
        else:
            rows[k] = {
                "source_uri": r["source_uri"],
                "sha256": r["sha256"],
                "institution": r["institution"],
                "bytes": r["bytes"],
                "kind": r["kind"],
                "first_run_id": run_id,
                "seq": seq,
                **outcome,
            }
    return pa.Table.from_pylist([rows[k] for k in sorted(rows)], schema=SEEN_SCHEMA)


def _mark_uid_collisions(rows: list[dict]) -> None:
    pending = [r for r in rows if r["kind"] == "dicom" and r["status"] == "pending"]
    sop_owner: dict[str, str] = {}
    for r in pending:
        if r["sop_uid_key"] in sop_owner:
            r.update(
                status="quarantined",
                reason="duplicate_sop_instance_uid",
                detail="another file of this run has the same SOPInstanceUID and different content",
            )
        elif r["sop_uid_key"]:
            sop_owner[r["sop_uid_key"]] = r["source_uri"]
    for uid_col, owner_col, reason, what in (
        ("study_uid_key", "patient_key", "study_uid_collision", "StudyInstanceUID is used for another patient"),
        ("series_uid_key", "study_uid_key", "series_uid_collision", "SeriesInstanceUID is used for another study"),
    ):
        owner: dict[str, str] = {}
        for r in (r for r in pending if r["status"] == "pending" and r[uid_col]):
            first = owner.setdefault(r[uid_col], r[owner_col])
            if first != r[owner_col]:
                r.update(status="quarantined", reason=reason, detail=what)
