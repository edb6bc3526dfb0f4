"""Check one institution's delivery before a run, with the build's own checks, writing nothing
(``medreco validate-source --institution ID``).

The delivery is read where the build reads it (the institution's ``source_uri``) and put through the same
functions as the build's stages, in memory:

- discover / plan (:func:`etl.sources.discover.discover_institution`, :func:`~etl.sources.discover.mark_duplicates`):
  every file classified (DICOM, report by the institution's ``report_glob``, or skipped), DICOM headers checked
  (``not_dicom``, ``unreadable_dicom``, ``truncated_file``, ``missing_patient_id``), duplicates and UID collisions
  within the delivery;
- deidentify (:func:`etl.deid.instance.deidentify_file`, unless ``deidentify=False``): PS3.15 de-identification
  and its verification, burned-in annotation risk, limits; the de-identified bytes are dropped;
- reports (:func:`etl.sources.report_files.read_report_file`): the institution's ``report_format`` parsed record by
  record (the input-format table of the README), linked to the delivery's studies, text de-identified and
  verified; a file none of whose records can be read gets the first error's precise reason.

Against the storage root's ledger (its seen index, read only when it exists): files an earlier run already
recorded are counted apart from the new ones, and those the build would record ``duplicate``
(``seen_in_earlier_run``) say so, naming the run.

Not covered: pixel normalisation (decoding, volume geometry: the ``normalise`` stage's reasons), duplicates
and collisions against other institutions of the same delivery round (the build's plan spans every delivery),
and the key binding of the storage root.

Nothing is written anywhere: the storage root is not opened (no folder is created; its seen index is read when
present), the source is only read.
Pseudonyms are computed with the deployment key when ``MEDRECO_PSEUDONYM_KEY`` is set, else with a one-off
random key (the checks do not depend on the key; no pseudonym is shown).
"""

from __future__ import annotations

import secrets
from collections import Counter
from dataclasses import dataclass, field

import polars as pl
import pyarrow.fs as pafs

from etl.keys import PseudonymKey
from etl.storage import Storage, open_filesystem, read_uri
from schemas.config import PipelineConfig
from schemas.errors import ReasonCodedError

#: outcomes that fail the check (the build would quarantine the file or withhold the record)
FAILING = ("quarantined", "withheld")


class ValidateSourceError(ReasonCodedError, ValueError):
    """The delivery cannot be checked: ``reason`` ``unknown_institution`` or ``missing_delivery``."""


@dataclass
class DeliveryCheck:
    """What the build would do with one delivery.

    Attributes
    ----------
    institution : str
    source : str
        the delivery's URI.
    files : collections.Counter
        files per kind (``dicom``, ``report``, ``other``).
    statuses : collections.Counter
        files per ledger status the build would record (``ingested``, ``quarantined``, ``duplicate``,
        ``skipped``).
    records : collections.Counter
        report records: ``read``, ``withheld``, and per ``link_status`` (``link:linked``, ``link:no_study``...).
    ledger : collections.Counter
        the delivery's files against the storage root's ledger (its seen index): ``new`` (no earlier run recorded
        the content) and ``already_recorded`` (an earlier run did: the build records the file ``duplicate``
        (``seen_in_earlier_run``) unless it is quarantined again, or ingested after an earlier non-ingested
        outcome); empty when the delivery holds no file.
    ledger_root : str or None
        the root whose ledger was read; None when it holds no ledger yet (every file is new).
    findings : list of dict
        one per file not ingested and per withheld record: ``{"path", "kind", "stage", "outcome", "reason",
        "detail"}`` (``path`` relative to the delivery; ``outcome``: ``quarantined``, ``withheld``,
        ``duplicate`` or ``skipped``), in path order. Details name lines, elements and limits, never a value.
    """

    institution: str
    source: str
    files: Counter = field(default_factory=Counter)
    statuses: Counter = field(default_factory=Counter)
    records: Counter = field(default_factory=Counter)
    findings: list[dict] = field(default_factory=list)
    ledger: Counter = field(default_factory=Counter)
    ledger_root: str | None = None

    @property
    def problems(self) -> list[dict]:
        """The findings that fail the check (:data:`FAILING`)."""
        return [f for f in self.findings if f["outcome"] in FAILING]

    @property
    def ok(self) -> bool:
        """True when the build would ingest every input file and every report record."""
        return not self.problems

    def as_dict(self) -> dict:
        """JSON-ready summary (sorted keys in the counters)."""
        return {
            "institution": self.institution,
            "source": self.source,
            "ok": self.ok,
            "files": dict(sorted(self.files.items())),
            "statuses": dict(sorted(self.statuses.items())),
            "records": dict(sorted(self.records.items())),
            "ledger": dict(sorted(self.ledger.items())),
            "ledger_root": self.ledger_root,
            "problems": len(self.problems),
            "findings": self.findings,
        }


def _root_without_writes(cfg: PipelineConfig) -> Storage:
    """The configured storage root as a :class:`Storage` (to resolve a relative ``source_uri``), without
    :meth:`Storage.open`'s folder creation."""
    fs, root = open_filesystem(
        cfg.storage.root, endpoint_url=cfg.storage.s3_endpoint_url, region=cfg.storage.s3_region, base_dir=cfg.base_dir
    )
    local = isinstance(fs, pafs.LocalFileSystem)
    return Storage(fs=fs, root=root, uri=root if local else f"s3://{root}")


def _relative(uri: str, src: Storage) -> str:
    base = src.full_uri("").rstrip("/")
    return uri[len(base) + 1 :] if uri.startswith(base + "/") else uri


def validate_delivery(
    cfg: PipelineConfig, institution: str, *, key: PseudonymKey | None = None, deidentify: bool = True
) -> DeliveryCheck:
    """Check one institution's delivery with the build's checks (see the module docstring); writes nothing.

    Parameters
    ----------
    cfg : schemas.config.PipelineConfig
        the pipeline config (institutions, storage root for a relative ``source_uri``, de-identification).
    institution : str
        the institution id.
    key : etl.keys.PseudonymKey, optional
        the pseudonymisation key (default: a one-off random key).
    deidentify : bool
        de-identify the DICOM files in memory (as the deidentify stage); ``False`` checks their headers and
        duplicates only (faster), and the report records then link to no study (formats and text checks still
        run).

    Returns
    -------
    DeliveryCheck

    Raises
    ------
    ValidateSourceError
        ``unknown_institution`` for an id not in the config, ``missing_delivery`` when the source folder does
        not exist or holds no file.
    """
    from etl.deid.instance import deidentify_file
    from etl.deid.policy import build_policy
    from etl.sources.discover import (
        discover_institution,
        load_seen_index,
        mark_duplicates,
        mark_seen,
        source_storage,
    )
    from etl.sources.report_files import read_report_file
    from etl.sources.report_linking import StudyIndex, header_phi
    from etl.sources.source_access import SourceUnavailableError, check_source
    from schemas import instances as instances_schema
    from schemas.base import table_from_rows

    try:
        inst = cfg.institution(institution)
    except KeyError:
        known = ", ".join(i.id for i in cfg.institutions)
        raise ValidateSourceError(
            "unknown_institution", f"no institution {institution!r} in the config (known: {known})"
        ) from None
    root = _root_without_writes(cfg)
    src = source_storage(cfg, inst, root)  # resolved as `medreco run` does (lexically: the root may not exist yet)
    try:
        check_source(inst, src)
    except SourceUnavailableError as err:
        raise ValidateSourceError("missing_delivery", str(err)) from None  # str(err) starts with its own reason
    key = key or PseudonymKey(secrets.token_bytes(32))
    seen = load_seen_index(root)  # read only: an empty index when the root or its ledger does not exist yet
    plan = mark_seen(mark_duplicates(discover_institution(cfg, inst, root, key)), seen)
    check = DeliveryCheck(institution, src.full_uri(""), ledger_root=root.full_uri("") if seen.num_rows else None)
    if plan.num_rows == 0:
        raise ValidateSourceError("missing_delivery", f"{institution}: the delivery holds no file")
    rows = sorted(plan.to_pylist(), key=lambda r: r["source_uri"])
    check.files.update(r["kind"] for r in rows)

    def find(row: dict, stage: str, outcome: str, reason: str | None, detail: str | None) -> None:
        check.findings.append(
            {
                "path": _relative(row["source_uri"], src),
                "kind": row["kind"],
                "stage": stage,
                "outcome": outcome,
                "reason": reason,
                "detail": detail,
            }
        )

    policy = build_policy(cfg.deid)
    instances, ingested, written = [], [], set()
    status: dict[str, str] = {}
    for r in rows:
        if r["status"] != "pending":
            status[r["source_uri"]] = r["status"]
            find(r, "discover", r["status"], r["reason"], r["detail"])
            continue
        if r["kind"] != "dicom":
            continue
        if not deidentify:
            status[r["source_uri"]] = "ingested"
            continue
        outcome = deidentify_file(
            src.read_bytes(_relative(r["source_uri"], src)),
            key,
            inst,
            policy,
            "validate",
            int(r["shard"]),
            pixel_cleaning=cfg.deid.pixel_cleaning,
        )
        if outcome.result is None or outcome.instance is None:
            status[r["source_uri"]] = "quarantined"
            find(r, "deidentify", "quarantined", outcome.reason, outcome.detail)
            continue
        if outcome.result.sop_key in written:  # as the deidentify stage: one de-identified file per SOP instance
            status[r["source_uri"]] = "quarantined"
            find(
                r,
                "deidentify",
                "quarantined",
                "duplicate_sop_instance_uid",
                "another file of this run has the same SOPInstanceUID",
            )
            continue
        written.add(outcome.result.sop_key)
        instances.append(outcome.instance)
        ingested.append({"study_key": outcome.result.study_key, "source_uri": r["source_uri"]})
        status[r["source_uri"]] = "ingested"
    index = StudyIndex.build(
        pl.from_arrow(table_from_rows(instances, instances_schema.SCHEMA)),
        pl.DataFrame(ingested, schema={"study_key": pl.Utf8, "source_uri": pl.Utf8}),
    )
    phi_cache: dict[str, list[str]] = {}

    def header_phi_of(uri: str) -> list[str]:
        if uri not in phi_cache:
            phi_cache[uri] = header_phi(read_uri(uri, endpoint_url=cfg.storage.s3_endpoint_url))
        return phi_cache[uri]

    seen_ids: set[str] = set()
    for r in rows:
        if r["kind"] != "report" or r["status"] != "pending":
            continue
        event, report_rows, withheld = read_report_file(
            src.read_bytes(_relative(r["source_uri"], src)),
            r["source_uri"],
            r["sha256"],
            inst,
            key,
            index,
            header_phi_of,
            cfg.shard_count,
            seen_ids,
        )
        status[r["source_uri"]] = event["status"]
        if event["status"] != "ingested":
            find(r, "reports", event["status"], event.get("reason"), event.get("detail"))
        for w in withheld:
            find(r, "reports", "withheld", w["reason"], w["detail"])
        check.records["read"] += len(report_rows)
        check.records["withheld"] += len(withheld)
        if deidentify:  # without the de-identified studies nothing was linked: no link counts to report
            check.records.update(f"link:{row['link_status']}" for row in report_rows)
    _against_ledger(check, rows, status, src)
    check.statuses.update(status.values())
    return check


def _against_ledger(check: DeliveryCheck, rows: list[dict], status: dict[str, str], src: Storage) -> None:
    """Count the files an earlier run recorded (``already_recorded``) and the ``new`` ones; a recorded file the
    build would record ``duplicate`` (the run ledger's rule, :func:`etl.pipeline.ledger.build_ledger`) gets that
    status and a ``seen_in_earlier_run`` finding naming the run."""
    from etl.pipeline.ledger import SEEN_REASON

    for r in rows:
        if not r["seen_run"]:
            check.ledger["new"] += 1
            continue
        check.ledger["already_recorded"] += 1
        now = status.get(r["source_uri"], r["status"])
        if now in ("skipped", "quarantined", "withheld") or (
            now == "ingested" and r["seen_status"] not in (None, "ingested")
        ):
            continue  # as the run ledger: these keep their own outcome
        status[r["source_uri"]] = "duplicate"
        check.findings = [f for f in check.findings if f["path"] != _relative(r["source_uri"], src)]
        check.findings.append(
            {
                "path": _relative(r["source_uri"], src),
                "kind": r["kind"],
                "stage": "discover",
                "outcome": "duplicate",
                "reason": SEEN_REASON,
                "detail": f"same sha256 as a file recorded in run {r['seen_run']}",
            }
        )
    check.findings.sort(key=lambda f: f["path"])
