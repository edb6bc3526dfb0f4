"""Every zone path under a storage root, named once.

Paths are relative to the storage root (:class:`etl.storage.Storage`), ``/``-separated. Restricted zones
(:data:`RESTRICTED`) may hold PHI or name source paths; only de-identified data is written elsewhere::

    sources/<institution>/     raw deliveries, read-only to the pipeline (restricted)
    ledger/                    one row per input file per run, run folders, incremental state, lock (restricted)
    quarantine/<run>/          one record per quarantined file: source path + reason code, never a value (restricted)
    curated/<table>/           de-identified Parquet tables, one partition per patient-hash shard
    snapshots/                 Delta tables shared by releases, one folder per release
    reports/                   dashboard, quality results, Data Docs, curator decisions, training lineage
"""

from __future__ import annotations

import hashlib
import re

from schemas.errors import ReasonCodedError

SOURCES = "sources"
LEDGER = "ledger"
QUARANTINE = "quarantine"
CURATED = "curated"
SNAPSHOTS = "snapshots"
REPORTS = "reports"
#: every zone, in the order of the data flow
ZONES = (SOURCES, QUARANTINE, LEDGER, CURATED, SNAPSHOTS, REPORTS)
#: zones that may hold PHI or source paths
RESTRICTED = (SOURCES, LEDGER, QUARANTINE)

# ---- path components -----------------------------------------------------------------------------------------

#: a value that may stand as one path component as it is: starts with a letter or digit, then letters, digits,
#: ``.``, ``_``, ``+``, ``-``; at most 128 characters (so never ``.``, ``..``, a ``/`` or a NUL)
SAFE_COMPONENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")


class UnsafePathError(ReasonCodedError, ValueError):
    """A path or path component that could leave its root or zone (``..``, ``/``, NUL, an unexpected zone).

    ``reason``: ``unsafe_path`` (a root-relative path) or ``unsafe_path_component`` (one value that becomes a
    component). The message names what was refused, never the value (it may come from a file header).
    """


def component(value: str, what: str) -> str:
    """Check that a trusted identifier (institution id, run id, version, job name) is one safe path component.

    Parameters
    ----------
    value : str
        the identifier.
    what : str
        what it is, for the message (``"institution id"``).

    Returns
    -------
    str
        ``value`` unchanged.

    Raises
    ------
    UnsafePathError
        ``unsafe_path_component`` when ``value`` does not match :data:`SAFE_COMPONENT`.
    """
    if not isinstance(value, str) or not SAFE_COMPONENT.fullmatch(value):
        raise UnsafePathError(
            "unsafe_path_component",
            f"the {what} is not a safe path component "
            "(letters, digits, '.', '_', '+', '-'; starting with a letter or digit)",
        )
    return value


def partition_value(value: object) -> str:
    """Encode a data value (a header's Modality, ...) for a Hive-style ``key=value`` folder name.

    A value matching :data:`SAFE_COMPONENT` is kept as it is (``CT``, ``us-bos-general``); any other value
    (``/../../sources/x``, an empty string, a space, non-ASCII) becomes ``_h`` + the first 20 hex digits of its
    SHA-256, which no safe value can equal (safe values never start with ``_``). Readers take the value
    from the row's column, never from the folder name.

    Returns
    -------
    str
        one path component that cannot leave its folder.
    """
    text = "" if value is None else str(value)
    if SAFE_COMPONENT.fullmatch(text):
        return text
    return "_h" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:20]


def zone_of(rel: str) -> str | None:
    """The zone a root-relative path lies in (its first component when that is a zone), else None."""
    first = rel.strip("/").split("/", 1)[0]
    return first if first in ZONES else None


def check_in_zone(rel: str, zone: str) -> str:
    """Check that a root-relative path lies inside ``zone`` (and has no ``..``/``.``/empty component).

    Returns
    -------
    str
        ``rel`` unchanged.

    Raises
    ------
    UnsafePathError
        ``unsafe_path`` when it does not.
    """
    parts = rel.strip("/").split("/")
    if parts[0] != zone or any(p in ("", ".", "..") or "\x00" in p for p in parts):
        raise UnsafePathError("unsafe_path", f"a path outside the {zone}/ zone was refused")
    return rel


# ---- ledger/ (restricted) ----------------------------------------------------------------------------------

#: fingerprint of the pseudonymisation key the root was first built with (never the key)
KEY_FINGERPRINT_FILE = f"{LEDGER}/key_fingerprint.json"
#: every input file ever seen, by sha256 (incremental runs: re-deliveries are ``duplicate``)
SEEN_INDEX = f"{LEDGER}/seen_index.parquet"
#: the lock object of a storage root's build (PHI-free: run id, host, pid, times)
BUILD_LOCK = f"{LEDGER}/build.lock"


def run_dir(run_id: str) -> str:
    """Folder of one run's plan, per-stage events and audit counts: ``ledger/runs/<run>``."""
    return f"{LEDGER}/runs/{component(run_id, 'run id')}"


def run_plan(run_id: str, institution: str | None = None) -> str:
    """A run's merged plan (``<run>/plan.parquet``) or one institution's discovery output
    (``<run>/plan/<institution>.parquet``)."""
    base = run_dir(run_id)
    return f"{base}/plan/{component(institution, 'institution')}.parquet" if institution else f"{base}/plan.parquet"


def run_events(run_id: str, stage: str, shard: int | None = None) -> str:
    """Per-stage outcome events of a run (restricted: name source files): ``<run>/events/<stage>/shard=N.parquet``
    or ``all.parquet`` for a stage that is not sharded."""
    leaf = f"shard={int(shard):05d}.parquet" if shard is not None else "all.parquet"
    return f"{run_dir(run_id)}/events/{component(stage, 'stage')}/{leaf}"


def run_audit(run_id: str, stage: str, shard: int | None = None) -> str:
    """A run's per-shard de-identification audit counts (JSON, PHI-free): ``<run>/audit/<stage>/shard=N.json``;
    without ``shard``, the stage's folder."""
    base = f"{run_dir(run_id)}/audit/{component(stage, 'stage')}"
    return base if shard is None else f"{base}/shard={int(shard):05d}.json"


def run_withheld_reports(run_id: str) -> str:
    """The report records a run withheld, with reason codes (restricted): ``<run>/withheld_reports.json``."""
    return f"{run_dir(run_id)}/withheld_reports.json"


def ledger_file(run_id: str) -> str:
    """The run's ledger (one row per input file): ``ledger/run_id=<run>/ledger.parquet``."""
    return f"{LEDGER}/run_id={component(run_id, 'run id')}/ledger.parquet"


def inputs_file(run_id: str) -> str:
    """The run's cumulative input view (every file of every run): ``ledger/run_id=<run>/inputs.parquet``."""
    return f"{LEDGER}/run_id={component(run_id, 'run id')}/inputs.parquet"


def incremental_state(stage: str, shard: int) -> str:
    """Resume record of one stage and shard (input digest, outputs): ``ledger/incremental/<stage>/shard=N.json``."""
    return f"{LEDGER}/incremental/{component(stage, 'stage')}/shard={int(shard):05d}.json"


def publish_hash_cache(table: str) -> str:
    """sha256 and rows of a table's curated partition files by path, size and mtime (publish reads unchanged
    partitions from here instead of re-hashing them): ``ledger/incremental/publish/<table>.json``."""
    return f"{LEDGER}/incremental/publish/{table}.json"


def delivery_state(institution: str) -> str:
    """Content hashes of an institution's last checked delivery: ``ledger/deliveries/<institution>.json``."""
    return f"{LEDGER}/deliveries/{component(institution, 'institution id')}.json"


#: previews of quarantined files for the curator (restricted: the pixels may still show PHI)
PREVIEWS_DIR = f"{LEDGER}/previews"
_SHA256 = re.compile(r"[0-9a-f]{64}")


def quarantine_preview(sha256: str) -> str:
    """The review preview (PNG) of one quarantined source file (``burned_in_text_remaining``, ``defacing_failed``:
    :mod:`etl.deid.preview`), by the file's SHA-256: ``ledger/previews/<sha256>.png`` (restricted: served only by
    the review app behind its login, never copied to ``reports/``).

    Raises
    ------
    UnsafePathError
        ``unsafe_path_component`` when ``sha256`` is not 64 lowercase hex digits.
    """
    if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
        raise UnsafePathError("unsafe_path_component", "a preview is named by a SHA-256 (64 lowercase hex digits)")
    return f"{PREVIEWS_DIR}/{sha256}.png"


def quarantine_dir(run_id: str) -> str:
    """Quarantine records of one run: ``quarantine/<run>``."""
    return f"{QUARANTINE}/{component(run_id, 'run id')}"


# ---- curated/ ------------------------------------------------------------------------------------------------


def curated_table(table: str) -> str:
    """Folder of a curated table (all its partitions): ``curated/<table>``."""
    return f"{CURATED}/{component(table, 'table name')}"


def curated_partition(table: str, shard: int) -> str:
    """One shard's partition file: ``curated/<table>/shard=N/part-0.parquet``."""
    return f"{CURATED}/{component(table, 'table name')}/shard={int(shard):05d}/part-0.parquet"


def curated_volume(sha256: str) -> str:
    """A content-addressed volume object (NIfTI-1, gzipped): ``curated/volumes/<sha256>.nii.gz``."""
    return f"{CURATED}/volumes/{sha256}.nii.gz"


def curated_modality_partition(table: str, institution: str, modality: str, shard: int) -> str:
    """One shard's partition of a table partitioned by institution and modality (``images``).

    Both values are encoded by :func:`partition_value` (the modality comes from a file header: a value such as
    ``/../../sources/x`` becomes ``_h<hex>``), so the path never leaves ``curated/<table>/``.
    """
    return (
        f"{CURATED}/{component(table, 'table name')}/institution={partition_value(institution)}"
        f"/modality={partition_value(modality)}/shard={int(shard):05d}.parquet"
    )


def curated_dicom(shard: int) -> str:
    """De-identified DICOM files of one shard (what the normaliser reads): ``curated/dicom/shard=N``."""
    return f"{CURATED}/dicom/shard={int(shard):05d}"


# ---- snapshots/ ------------------------------------------------------------------------------------------------

#: one Delta Lake table per curated table, shared by all releases
TABLES_DIR = f"{SNAPSHOTS}/tables"


def release_dir(version: str) -> str:
    """Folder of one release: ``snapshots/<version>``."""
    return f"{SNAPSHOTS}/{component(version, 'snapshot version')}"


# ---- reports/ ---------------------------------------------------------------------------------------------------

DASHBOARD_DIR = f"{REPORTS}/dashboard"
DASHBOARD_INDEX = f"{DASHBOARD_DIR}/index.html"
#: Great Expectations file context and its Data Docs site (last runs)
GX_DIR = f"{REPORTS}/gx"
DATA_DOCS_DIR = f"{REPORTS}/data_docs"
#: curator decisions on quarantined items
REVIEW_FILE = f"{REPORTS}/quarantine_review.json"
LATEST_QUALITY_RUN = f"{REPORTS}/quality/latest_run.json"
HISTORY_DIR = f"{REPORTS}/history"
TRAINING_DIR = f"{REPORTS}/training"


def quality_report(run_id: str) -> str:
    """Quality results of one run: ``reports/quality/<run>.json``."""
    return f"{REPORTS}/quality/{component(run_id, 'run id')}.json"


def run_summary(run_id: str) -> str:
    """The run summary the CLI prints (and the dashboard's trend reads): ``reports/history/<run>.json``."""
    return f"{HISTORY_DIR}/{component(run_id, 'run id')}.json"


def training_record(version: str) -> str:
    """Training lineage of one snapshot: ``reports/training/<version>.json``."""
    return f"{TRAINING_DIR}/{component(version, 'snapshot version')}.json"


def training_job_record(version: str, job: str, name: str) -> str:
    """Result record of one training job: ``reports/training/<version>/<job>-<name>.json``."""
    return (
        f"{TRAINING_DIR}/{component(version, 'snapshot version')}/{component(job, 'training job')}-"
        f"{component(name, 'training job name')}.json"
    )
