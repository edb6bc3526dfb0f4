"""The build stages: each a function of (context, input partition) -> output partition.

Airflow tasks in ``dags/`` call these and nothing else: the stages defined here, the ledger, delivery check and
publish stages re-exported from their modules (:func:`finalise`, :func:`check_delivery`, :func:`publish_stage`),
and the quality gate (:func:`quality.gate.quality_stage`, which lives above ``etl`` because it runs the quality
package). Each stage reads its inputs, calls pure functions of the step's package (``etl.sources``,
``etl.deid``, ``etl.pixels``, ``etl.assemble``, ``entity_extraction``) and writes. Every per-shard stage reads and
writes only its own shard partitions (``curated/<table>/shard=NNNNN/part-0.parquet``), writes atomically, and writes an
empty partition for an empty shard, so a re-run of the same inputs writes the same bytes and an
interrupted run can simply be retried.

Incremental runs. Each per-shard stage (de-identify, normalise, entities, assemble) records, after all its
writes, the digest of what its outputs were built from (``ledger/incremental/<stage>/shard=N.json``: the
shard's clean-view input files, the upstream partitions it reads, and the build fingerprint of config, key
and code). A later run whose digest is the same skips the shard: its partitions are kept and its events and
audit counts are carried into the new run from the run that built them. A shard with any new, removed or
re-classified input file is rebuilt from all its files, so the curated tables equal a clean build's of
everything under the sources. A stage killed part-way never recorded its digest, so the next attempt
rebuilds the shard whole (every partition is rewritten atomically; stale files of the shard are removed).
The cross-shard stages (reports, retrieval) run in full every time: a study delivered later links a report
delivered earlier.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import warnings
from collections import Counter

import polars as pl
import pyarrow as pa
import pydicom

from etl import zones
from etl.deid.instance import DeidOutcome, deidentify_file
from etl.deid.policy import build_policy
from etl.deid.series_text import SeriesTextGate
from etl.pipeline.batches import balanced_shard_batches, pending_files_per_shard
from etl.pipeline.context import EVENT_SCHEMA, BuildContext
from etl.pipeline.incremental import (
    deid_digest,
    deid_inputs,
    file_sha256,
    inputs_digest,
    read_plan,
    record,
    resume,
)
from etl.pipeline.ingest import check_delivery
from etl.pipeline.ledger import finalise
from etl.pipeline.publish_stage import publish_stage
from etl.sources.discover import (
    PLAN_SCHEMA,
    discover_institution,
    load_seen_index,
    mark_duplicates,
    mark_seen,
)
from etl.sources.report_files import read_report_file
from etl.sources.source_access import check_sources
from etl.storage import read_uri
from schemas import deid_audit as deid_audit_schema
from schemas import entity_mentions as entity_mentions_schema
from schemas import images as images_schema
from schemas import instances as instances_schema
from schemas import reports as reports_schema
from schemas import series as series_schema
from schemas import studies as studies_schema
from schemas import study_labels as study_labels_schema
from schemas.base import table_from_rows
from schemas.config import CONFIG_DIR
from schemas.ontology import modality_family
from schemas.tables import metadata_columns

__all__ = [
    "assemble_shard",
    "check_delivery",
    "deidentify_shard",
    "discover",
    "entities_shard",
    "finalise",
    "normalise_shard",
    "plan",
    "preflight",
    "publish_stage",
    "reports",
    "retrieval",
]

log = logging.getLogger(__name__)
DEID_AUDIT_COUNTS = deid_audit_schema.COUNTS


def _read_events(ctx: BuildContext, stage: str, shard: int | None = None) -> pa.Table:
    path = ctx.events_path(stage, shard)
    return (
        ctx.storage.read_table(path, schema=EVENT_SCHEMA) if ctx.storage.is_file(path) else EVENT_SCHEMA.empty_table()
    )


#: tables stored partitioned by institution and modality inside each shard (large binary payloads):
#: ``curated/<table>/institution=<id>/modality=<code>/shard=NNNNN.parquet``
INSTITUTION_MODALITY_PARTITIONED = frozenset({"images"})
#: rows per Parquet row group for tables of large binary values (keeps a row group to tens of MB)
PAYLOAD_ROW_GROUP_ROWS = 64


def _shard_files(ctx: BuildContext, table: str, shard: int) -> list[str]:
    if table not in INSTITUTION_MODALITY_PARTITIONED:
        path = ctx.table_path(table, shard)
        return [path] if ctx.storage.is_file(path) else []
    suffix = f"/shard={shard:05d}.parquet"
    return [f for f in ctx.storage.list_files(zones.curated_table(table)) if f.endswith(suffix)]


def _shard_table(
    ctx: BuildContext, table: str, schema: pa.Schema, shard: int, columns: list[str] | None = None
) -> pa.Table:
    files = _shard_files(ctx, table, shard)
    if not files:
        return schema.empty_table() if columns is None else schema.empty_table().select(columns)
    return pa.concat_tables([ctx.storage.read_table(f, schema=schema, columns=columns) for f in files])


def _all_shards(ctx: BuildContext, table: str, schema: pa.Schema, columns: list[str] | None = None) -> pa.Table:
    return ctx.storage.read_table(zones.curated_table(table), schema=schema, columns=columns)


def _sorted(table: pa.Table, schema: pa.Schema) -> pa.Table:
    keys = schema.metadata[b"medreco.key"].decode().split(",")
    return table.sort_by([(k, "ascending") for k in keys]) if table.num_rows else table


def write_partition(ctx: BuildContext, table: str, schema: pa.Schema, shard: int, rows: list[dict] | pa.Table) -> int:
    """Write one shard partition of a curated table, sorted by key; returns the row count.

    Tables in :data:`INSTITUTION_MODALITY_PARTITIONED` are split further by institution and modality
    (Hive-style folders) with small row groups; this shard's files from earlier runs that the new content
    no longer has are removed, so a re-run leaves exactly the new partition.
    """
    t = rows if isinstance(rows, pa.Table) else table_from_rows(rows, schema)
    t = _sorted(t.cast(schema), schema)
    if table not in INSTITUTION_MODALITY_PARTITIONED:
        ctx.storage.write_table(ctx.table_path(table, shard), t)
        return t.num_rows
    stale = set(_shard_files(ctx, table, shard))
    df = pl.from_arrow(t)
    for (institution, modality), part in sorted(df.group_by(["institution", "modality"]), key=lambda kv: kv[0]):
        path = zones.curated_modality_partition(table, institution, modality, shard)
        ctx.storage.write_table(
            path, _sorted(part.to_arrow().cast(schema), schema), row_group_size=PAYLOAD_ROW_GROUP_ROWS
        )
        stale.discard(path)
    for path in sorted(stale):
        ctx.storage.delete(path)
    return t.num_rows


# ---- discover / plan -----------------------------------------------------------------------------


def preflight(ctx: BuildContext) -> list[str]:
    """Before any work: every configured source there and readable
    (:func:`etl.sources.source_access.check_sources`, first, so that a typo in ``source_uri`` does not bind the
    root to the key), then the key (:meth:`etl.pipeline.context.BuildContext.check_key`). Returns the institution ids.

    Raises
    ------
    etl.sources.source_access.SourceUnavailableError, etl.pipeline.context.KeyMismatchError
    """
    check_sources(ctx.cfg, ctx.storage)
    ctx.check_key()
    return [i.id for i in ctx.cfg.institutions]


def discover(ctx: BuildContext, institution: str) -> dict:
    """Hash and classify one institution's delivery into its plan file. Returns counts per kind/status."""
    inst = ctx.cfg.institution(institution)
    plan = discover_institution(ctx.cfg, inst, ctx.storage, ctx.key)
    ctx.storage.write_table(ctx.plan_path(institution), plan)
    return dict(Counter(f"{k}:{s}" for k, s in zip(plan["kind"].to_pylist(), plan["status"].to_pylist())))


def plan(ctx: BuildContext) -> list[list[int]]:
    """Merge the institutions' plans, mark duplicates, and return the shard batches to map over (balanced by
    pending DICOM files, :func:`etl.pipeline.batches.balanced_shard_batches`)."""
    parts = [ctx.storage.read_table(ctx.plan_path(i.id), schema=PLAN_SCHEMA) for i in ctx.cfg.institutions]
    merged = mark_duplicates(pa.concat_tables(parts) if parts else PLAN_SCHEMA.empty_table())
    merged = mark_seen(merged, load_seen_index(ctx.storage))
    ctx.storage.write_table(ctx.plan_path(), merged)
    return balanced_shard_batches(pending_files_per_shard(merged), ctx.cfg.shard_count, ctx.cfg.max_map_length)


# ---- de-identification ---------------------------------------------------------------------------


def deidentify_shard(ctx: BuildContext, shard: int) -> dict:
    """De-identify every pending DICOM file of one shard.

    Writes the de-identified files to ``curated/dicom/shard=N/<sop_key>.dcm``, the ``instances``
    partition, the stage's events (restricted) and audit counts. Files that cannot be de-identified
    with certainty get a ``quarantined`` event with the reason code and are not written; so does a file whose
    de-identification raises anything unexpected (``unreadable_dicom``, with the exception's type only), takes
    longer than :data:`etl.limits.FILE_TIME_LIMIT_S` (``deidentification_timeout``) or has a value the instances
    row cannot hold (``invalid_value``). No file can fail the task. A file quarantined ``burned_in_text_remaining``
    or ``defacing_failed`` gets a review preview (:func:`etl.zones.quarantine_preview`, restricted). Burned-in text
    is read per series (:class:`etl.deid.series_text.SeriesTextGate`, series from the plan's ``series_uid_key``):
    the files of each series are de-identified with its sample first; events are written in source order.

    Skipped (result ``skipped: True``) when the shard's input files are those it was last built from (see
    the module docstring).
    """
    p = deid_inputs(ctx, shard)
    digest = deid_digest(ctx, shard, p)
    done = resume(ctx, "deidentify", shard, digest)
    if done is not None:
        return done
    policy = build_policy(ctx.cfg.deid)
    events, instances, audit, audit_rows = [], [], Counter(), []
    written: set[str] = set()
    rows = {r["source_uri"]: r for r in p.sort("source_uri").iter_rows(named=True)}
    # burned-in text per series: each series' sample first, if the policy has one (etl.deid.series_text)
    gate = SeriesTextGate((uri, r["series_uid_key"]) for uri, r in rows.items())
    for uri in gate.order():
        row = rows[uri]
        inst = ctx.cfg.institution(row["institution"])
        event = {"source_uri": row["source_uri"], "sha256": row["sha256"], "stage": "deidentify"}
        try:
            data = read_uri(row["source_uri"], endpoint_url=ctx.cfg.storage.s3_endpoint_url)
        except Exception as err:  # noqa: BLE001  an unreadable source file is quarantined, never a failed task
            data, outcome = b"", DeidOutcome(reason="unreadable_dicom", detail=f"{type(err).__name__} while reading")
        else:
            outcome = deidentify_file(
                data,
                ctx.key,
                inst,
                policy,
                ctx.dicom_dir(shard),
                shard,
                pixel_cleaning=ctx.cfg.deid.pixel_cleaning,
                series_text=gate.slot(uri),
            )
        if not outcome.ingested:
            events.append({**event, "status": "quarantined", "reason": outcome.reason, "detail": outcome.detail})
            audit[f"quarantined:{outcome.reason}"] += 1
            if outcome.preview is not None:  # for the curator's review (restricted ledger zone)
                _write_preview(ctx, row["sha256"], outcome.preview)
            continue
        assert outcome.result is not None and outcome.payload is not None and outcome.instance is not None
        result, payload, instance = outcome.result, outcome.payload, outcome.instance
        gate.record(uri, result.text_regions)
        path = instance["dicom_path"]
        if result.sop_key in written:
            events.append(
                {
                    **event,
                    "status": "quarantined",
                    "reason": "duplicate_sop_instance_uid",
                    "detail": "another file of this run has the same SOPInstanceUID",
                }
            )
            audit["quarantined:duplicate_sop_instance_uid"] += 1
            continue
        written.add(result.sop_key)
        audit_rows.append(
            {
                "sop_key": result.sop_key,
                "study_key": result.study_key,
                "institution": inst.id,
                **{k: int(result.audit.get(k, 0)) for k in DEID_AUDIT_COUNTS},
                "text_regions": json.dumps(result.text_regions) if result.text_regions else None,
                "shard": shard,
            }
        )
        if result.audit.get("text_images_blanked"):  # the dashboard's count per modality and device
            device = " ".join(v for v in (instance.get("manufacturer"), instance.get("model")) if v) or "unknown"
            audit[f"text_images_blanked_by_modality_device:{instance['modality']} {device}"] += 1
        ctx.storage.write_bytes(path, payload)
        audit.update(result.audit)
        instances.append(instance)
        events.append(
            {
                **event,
                "status": "ingested",
                "reason": None,
                "detail": None,
                "sop_key": result.sop_key,
                "study_key": result.study_key,
            }
        )
    _deface(ctx, shard, instances, audit_rows, events, written, audit)
    # remove de-identified files of this shard that this run did not write (re-runs with fewer inputs)
    for stale in ctx.storage.list_files(ctx.dicom_dir(shard)):
        if stale.rsplit("/", 1)[-1].removesuffix(".dcm") not in written:
            ctx.storage.delete(stale)
    events.sort(key=lambda e: e["source_uri"])  # in source order, whatever order the series were read in
    n = write_partition(ctx, "instances", instances_schema.SCHEMA, shard, instances)
    write_partition(ctx, "deid_audit", deid_audit_schema.SCHEMA, shard, audit_rows)
    ctx.storage.write_table(ctx.events_path("deidentify", shard), table_from_rows(events, EVENT_SCHEMA))
    ctx.storage.write_text(ctx.audit_path("deidentify", shard), json.dumps(dict(sorted(audit.items()))))
    return record(
        ctx,
        "deidentify",
        shard,
        digest,
        {"shard": shard, "instances": n, "quarantined": sum(e["status"] == "quarantined" for e in events)},
    )


def _write_preview(ctx: BuildContext, sha256: str, preview) -> None:
    """Store the review preview of one quarantined source file (:func:`etl.zones.quarantine_preview`)."""
    from etl.deid.preview import render_png

    ctx.storage.write_bytes(zones.quarantine_preview(sha256.lower()), render_png(preview))


def _deface(
    ctx: BuildContext,
    shard: int,
    instances: list[dict],
    audit_rows: list[dict],
    events: list[dict],
    written: set[str],
    audit: Counter,
) -> None:
    """Deface the shard's head CT/MR series in the files just written (config ``deid.deface``,
    :func:`etl.deid.deface_series.deface_written`); the files of a series that fails are withheld: their rows
    leave ``instances`` and ``deid_audit``, their events become ``quarantined`` with the reason, and the caller's
    stale-file sweep removes them. Per-series figures go to the run's ``audit/deface`` (PHI-free)."""
    from etl.deid.deface_series import deface_written

    done = deface_written(instances, ctx.storage.read_bytes, ctx.storage.write_bytes, ctx.cfg.deid.deface)
    for row in instances:
        if row["sop_key"] in done.transfer_syntax:
            row["transfer_syntax"] = done.transfer_syntax[row["sop_key"]]
    if done.quarantined:
        from etl.deid.preview import render_png

        rendered: dict[int, bytes] = {}
        instances[:] = [r for r in instances if r["sop_key"] not in done.quarantined]
        audit_rows[:] = [r for r in audit_rows if r["sop_key"] not in done.quarantined]
        written.difference_update(done.quarantined)
        for event in events:
            if event.get("sop_key") in done.quarantined:
                reason, detail = done.quarantined[event["sop_key"]]
                preview = done.previews.get(event["sop_key"])
                if preview is not None:
                    if id(preview) not in rendered:  # one render per series, one PNG per source file
                        rendered[id(preview)] = render_png(preview)
                    ctx.storage.write_bytes(zones.quarantine_preview(event["sha256"].lower()), rendered[id(preview)])
                event.update(status="quarantined", reason=reason, detail=detail, sop_key=None, study_key=None)
                audit[f"quarantined:{reason}"] += 1
    audit.update(done.counts)
    ctx.storage.write_text(ctx.audit_path("deface", shard), json.dumps(done.series, sort_keys=True))


# ---- normalisation -------------------------------------------------------------------------------


def normalise_shard(ctx: BuildContext, shard: int) -> dict:
    """Decode and normalise one shard's de-identified instances into ``images`` and ``series`` partitions.

    The series rules (which instances become a volume, which stay 2D, fallbacks) are
    :func:`etl.pixels.series.normalise_instances`; each volume is written, as soon as it is made, as a
    content-addressed NIfTI object (:func:`etl.pixels.volume_objects.externalise_volume`,
    ``curated/volumes/<sha256>.nii.gz``) and its row points at it. Failures are quarantined (events name the source file
    through the de-identification events); an unforeseen error quarantines its series
    (``normalisation_error``, :func:`_normalise_guarded`), never fails the task. The written ``images`` files are read
    back one row group at a time and every payload is hashed against its ``payload_sha256``
    (:func:`etl.pixels.integrity.verify_image_files`); the counts are recorded in the stage's state
    (``payload_integrity``), which the quality task reads instead of the payloads.

    Raises
    ------
    etl.pixels.integrity.PayloadIntegrityError
        when a written payload does not hash to its ``payload_sha256`` (the shard is not recorded: a retry rebuilds it).
    """
    from etl.pixels.integrity import PayloadIntegrityError, verify_image_files
    from etl.pixels.series import normalise_shard_guarded
    from etl.pixels.volume_objects import externalise_volume

    digest = inputs_digest("normalise", deid_digest(ctx, shard))
    done = resume(ctx, "normalise", shard, digest)
    if done is not None:
        return done
    inst = pl.from_arrow(_shard_table(ctx, "instances", instances_schema.SCHEMA, shard))
    src = pl.from_arrow(_read_events(ctx, "deidentify", shard)).filter(pl.col("status") == "ingested")
    source_of = dict(zip(src["sop_key"].to_list(), zip(src["source_uri"].to_list(), src["sha256"].to_list())))

    def read(row: dict) -> pydicom.Dataset | Exception:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return pydicom.dcmread(io.BytesIO(ctx.storage.read_bytes(row["dicom_path"])), force=True)
        except Exception as err:  # noqa: BLE001  any parse failure of our own output is quarantined
            return err

    level = ctx.cfg.normalisation.nifti_gzip_level
    result = normalise_shard_guarded(
        list(inst.sort("sop_key").iter_rows(named=True)),
        read,
        ctx.cfg.normalisation,
        volume_sink=lambda r: externalise_volume(ctx.storage, r, level),
    )
    n_img = write_partition(ctx, "images", images_schema.SCHEMA, shard, [img.row for img in result.images])
    integrity = verify_image_files(
        ctx.storage, _shard_files(ctx, "images", shard)
    )  # read back, one row group at a time
    if integrity.mismatches or integrity.rows != n_img:
        raise PayloadIntegrityError(
            "payload_sha256_mismatch",
            f"shard {shard}: {len(integrity.mismatches)} of {n_img} written payloads do not "
            f"hash to payload_sha256 ({integrity.rows} rows read back)",
        )
    write_partition(ctx, "series", series_schema.SCHEMA, shard, result.series_rows(shard))
    events = []
    for failure in result.failures:
        for k in failure.sop_keys:
            uri, sha = source_of[k]
            events.append(
                {
                    "source_uri": uri,
                    "sha256": sha,
                    "stage": "normalise",
                    "status": "quarantined",
                    "reason": failure.reason,
                    "detail": failure.detail,
                    "sop_key": k,
                }
            )
    quarantined_keys = {e["sop_key"] for e in events}
    for k, (uri, sha) in sorted(source_of.items()):
        if k not in quarantined_keys:
            events.append({"source_uri": uri, "sha256": sha, "stage": "normalise", "status": "ingested", "sop_key": k})
    ctx.storage.write_table(ctx.events_path("normalise", shard), table_from_rows(events, EVENT_SCHEMA))
    return record(
        ctx,
        "normalise",
        shard,
        digest,
        {
            "shard": shard,
            "images": n_img,
            "quarantined": sum(e["status"] == "quarantined" for e in events),
            "payload_integrity": integrity.to_dict(),
        },
    )


# ---- reports -------------------------------------------------------------------------------------


def reports(ctx: BuildContext) -> dict:
    """Ingest every report file of the run: parse, link to studies, de-identify, split into sections.

    Links by StudyInstanceUID or AccessionNumber through the same keyed pseudonyms as the images, so the
    link survives de-identification. Writes the ``reports`` partition of every shard (empty ones too).
    A report file that cannot be parsed is quarantined whole (reason ``malformed_report_record``); one record
    that cannot be processed is withheld with a reason code (``report_too_long``, ``report_timeout``,
    ``report_processing_error``, ``verification_failed``, ``unsupported_language``, or the parser's) and listed under
    ``quarantine/<run>/reports/``. No report can fail the task.
    """
    from etl.sources.report_linking import StudyIndex, header_phi

    key, shard_count = ctx.key, ctx.cfg.shard_count
    instances = pl.from_arrow(_all_shards(ctx, "instances", instances_schema.SCHEMA))
    dev = pl.concat([pl.from_arrow(_read_events(ctx, "deidentify", s)) for s in range(shard_count)])
    index = StudyIndex.build(instances, dev.filter(pl.col("status") == "ingested"))

    files = read_plan(ctx).filter((pl.col("kind") == "report") & (pl.col("status") == "pending")).sort("source_uri")
    rows_by_shard: dict[int, list[dict]] = {s: [] for s in range(shard_count)}
    events, seen_ids, withheld = [], set(), []
    phi_cache: dict[str, list[str]] = {}

    def header_phi_of(uri: str) -> list[str]:
        if uri not in phi_cache:
            phi_cache[uri] = header_phi(read_uri(uri, endpoint_url=ctx.cfg.storage.s3_endpoint_url))
        return phi_cache[uri]

    for f in files.iter_rows(named=True):
        try:
            data = read_uri(f["source_uri"], endpoint_url=ctx.cfg.storage.s3_endpoint_url)
        except Exception as err:  # noqa: BLE001  an unreadable file quarantines the file, not the task
            events.append(
                {
                    "source_uri": f["source_uri"],
                    "sha256": f["sha256"],
                    "stage": "reports",
                    "status": "quarantined",
                    "reason": "malformed_report_record",
                    "detail": f"{type(err).__name__} while reading the report file",
                }
            )
            continue
        event, rows, held = read_report_file(
            data,
            f["source_uri"],
            f["sha256"],
            ctx.cfg.institution(f["institution"]),
            key,
            index,
            header_phi_of,
            shard_count,
            seen_ids,
        )
        events.append(event)
        withheld += [{"run_id": ctx.run_id, **w} for w in held]
        for row in rows:
            rows_by_shard[row["shard"]].append(row)
    total = 0
    for shard, rows in rows_by_shard.items():
        total += write_partition(ctx, "reports", reports_schema.SCHEMA, shard, rows)
    ctx.storage.write_table(ctx.events_path("reports"), table_from_rows(events, EVENT_SCHEMA))
    ctx.storage.write_text(zones.run_withheld_reports(ctx.run_id), json.dumps(withheld, indent=1))
    links = Counter(r["link_status"] for rows in rows_by_shard.values() for r in rows)
    return {"reports": total, "withheld": len(withheld), **{f"link:{k}": v for k, v in sorted(links.items())}}


# ---- entities ------------------------------------------------------------------------------------

_EXTRACTORS: dict[str, object] = {}


def _extractor(language: str):
    from entity_extraction.extract import EntityExtractor

    if language not in _EXTRACTORS:
        _EXTRACTORS[language] = EntityExtractor(language=language)
    return _EXTRACTORS[language]


def entities_shard(ctx: BuildContext, shard: int) -> dict:
    """Extract entity mentions (with assertion, temporality, change, laterality, severity) from one
    shard's reports and derive per-study entity states (``study_labels``)."""
    from entity_extraction.extract import study_labels
    from schemas.ontology import load_ontology

    digest = inputs_digest("entities", deid_digest(ctx, shard), file_sha256(ctx, ctx.table_path("reports", shard)))
    done = resume(ctx, "entities", shard, digest)
    if done is not None:
        return done
    ontology = load_ontology()
    reps = pl.from_arrow(_shard_table(ctx, "reports", reports_schema.SCHEMA, shard))
    inst = pl.from_arrow(_shard_table(ctx, "instances", instances_schema.SCHEMA, shard))
    family_of = dict(zip(inst["study_key"].to_list(), inst["family"].to_list()))
    mentions, labels = [], []
    labelled: set[str] = set()
    for r in reps.sort("report_id").iter_rows(named=True):
        family = (
            family_of.get(r["study_key"]) if r["study_key"] else ctx.cfg.institution(r["institution"]).report_family
        )
        if family is None:
            continue
        found = _extractor(r["language"]).extract(r["text"], family)
        for m in found:
            mid = hashlib.sha256(
                f"{r['report_id']}|{m['span_start']}|{m['span_end']}|{m['entity_id']}".encode()
            ).hexdigest()[:16]
            mentions.append(
                {
                    **m,
                    "mention_id": mid,
                    "report_id": r["report_id"],
                    "study_key": r["study_key"],
                    "patient_key": r["patient_key"],
                    "shard": shard,
                }
            )
        if r["study_key"] and r["study_key"] not in labelled:
            labelled.add(r["study_key"])
            for lab in study_labels(found, family, ontology):
                labels.append(
                    {
                        **lab,
                        "study_key": r["study_key"],
                        "patient_key": r["patient_key"],
                        "family": family,
                        "shard": shard,
                    }
                )
    n_m = write_partition(
        ctx,
        "entity_mentions",
        entity_mentions_schema.SCHEMA,
        shard,
        [{k: m.get(k) for k in entity_mentions_schema.SCHEMA.names} for m in mentions],
    )
    n_l = write_partition(
        ctx,
        "study_labels",
        study_labels_schema.SCHEMA,
        shard,
        [{k: m.get(k) for k in study_labels_schema.SCHEMA.names} for m in labels],
    )
    return record(ctx, "entities", shard, digest, {"shard": shard, "entity_mentions": n_m, "study_labels": n_l})


# ---- studies, pairs, splits, VQA ----------------------------------------------------------------


def _studies(inst: pl.DataFrame, images: pl.DataFrame, reps: pl.DataFrame, shard: int) -> list[dict]:
    n_img = Counter(images["study_key"].to_list())
    report_of: dict[str, str] = {}
    for r in reps.filter(pl.col("study_key").is_not_null()).sort("report_id").iter_rows(named=True):
        report_of.setdefault(r["study_key"], r["report_id"])
    out = []
    for study_key, g in sorted(inst.group_by("study_key"), key=lambda kv: kv[0][0]):
        g = g.sort("sop_key")
        first = g.row(0, named=True)
        modalities = Counter(g["modality"].to_list()).most_common()
        modality = min(modalities, key=lambda kv: (-kv[1], kv[0]))[0]
        dts = [d for d in g["study_datetime"].to_list() if d is not None]
        sdt = min(dts) if dts else None
        out.append(
            {
                "study_key": study_key[0],
                "patient_key": first["patient_key"],
                "accession_key": first["accession_key"],
                "institution": first["institution"],
                "country": first["country"],
                "modality": modality,
                "body_part": first["body_part"],
                "family": modality_family(modality, first["body_part"]),
                "study_datetime": sdt,
                "study_date_shifted": sdt.date() if sdt else None,
                "n_series": g["series_key"].n_unique(),
                "n_images": n_img.get(study_key[0], 0),
                "report_id": report_of.get(study_key[0]),
                "shard": shard,
            }
        )
    return out


def assemble_shard(ctx: BuildContext, shard: int) -> dict:
    """Build one shard's ``studies``, ``splits``, longitudinal ``pairs`` and ``vqa`` partitions."""
    from etl.assemble.pairs import build_pairs
    from etl.assemble.splits import assign_splits
    from etl.assemble.vqa import build_vqa, load_templates
    from schemas import pairs as pairs_schema
    from schemas import splits as splits_schema
    from schemas import vqa as vqa_schema
    from schemas.ontology import load_ontology

    digest = inputs_digest("assemble", deid_digest(ctx, shard), file_sha256(ctx, ctx.table_path("reports", shard)))
    done = resume(ctx, "assemble", shard, digest)
    if done is not None:
        return done
    inst = pl.from_arrow(_shard_table(ctx, "instances", instances_schema.SCHEMA, shard))
    images = pl.from_arrow(_shard_table(ctx, "images", images_schema.SCHEMA, shard, metadata_columns("images")))
    reps = pl.from_arrow(_shard_table(ctx, "reports", reports_schema.SCHEMA, shard))
    labels = pl.from_arrow(_shard_table(ctx, "study_labels", study_labels_schema.SCHEMA, shard))
    studies_rows = _studies(inst, images, reps, shard)
    write_partition(ctx, "studies", studies_schema.SCHEMA, shard, studies_rows)
    studies = pl.from_arrow(table_from_rows(studies_rows, studies_schema.SCHEMA))
    patients = studies.select("patient_key", "institution", "shard").unique().sort("patient_key", "institution")
    splits = assign_splits(patients, ctx.cfg.splits)
    write_partition(ctx, "splits", splits_schema.SCHEMA, shard, splits)
    pairs = build_pairs(studies, labels, images, ctx.cfg.pairing)
    write_partition(ctx, "pairs", pairs_schema.SCHEMA, shard, pairs)
    templates = load_templates(_config_file(ctx, ctx.cfg.vqa.templates))
    mentions = pl.from_arrow(_shard_table(ctx, "entity_mentions", entity_mentions_schema.SCHEMA, shard))
    vqa = build_vqa(
        pl.from_arrow(pairs),
        labels,
        studies,
        pl.from_arrow(splits),
        ctx.cfg.vqa,
        templates,
        load_ontology(),
        entity_mentions=mentions,
        images=images,
    )
    write_partition(ctx, "vqa", vqa_schema.SCHEMA, shard, vqa)
    return record(
        ctx,
        "assemble",
        shard,
        digest,
        {"shard": shard, "studies": len(studies_rows), "pairs": pairs.num_rows, "vqa": vqa.num_rows},
    )


def _config_file(ctx: BuildContext, name: str) -> str:
    """A data file named in the config: relative to the config's folder, else the project's config/."""
    from pathlib import Path

    for base in (Path(ctx.cfg.base_dir), CONFIG_DIR):
        if (base / name).is_file():
            return str(base / name)
    raise FileNotFoundError(f"data file {name!r} not found next to the config or in config/")


# ---- retrieval targets and the split check (cross-patient: after every shard is assembled) ---------------


def retrieval(ctx: BuildContext) -> dict:
    """Build the cross-patient ``retrieval_targets`` table and prove the splits leak-free.

    Reads every shard's ``study_labels``, ``entity_mentions`` and ``splits`` (entity-conditioned retrieval
    links studies of different patients, so it is not shard-local), writes ``retrieval_targets`` partitioned by
    the query study's shard (every shard, empty ones too, so a re-run leaves exactly the new content), writes the
    two-case VQA items (:func:`etl.assemble.vqa.build_case_comparison_vqa`) as ``curated/vqa/shard=N/part-1.parquet`` of
    every shard (``assemble_shard`` writes ``part-0``; readers of the whole table see both), then runs
    :func:`etl.assemble.splits.check_split_integrity` over studies, pairs, retrieval targets and VQA items.

    Raises
    ------
    etl.assemble.splits.SplitLeakError
        when a patient is in two splits or any table links two splits: the build fails.
    """
    from etl.assemble.retrieval import build_retrieval_targets, load_similarity
    from etl.assemble.splits import check_split_integrity
    from schemas import pairs as pairs_schema
    from schemas import retrieval_targets as retrieval_schema
    from schemas import splits as splits_schema
    from schemas import vqa as vqa_schema

    labels = pl.from_arrow(_all_shards(ctx, "study_labels", study_labels_schema.SCHEMA))
    mentions = pl.from_arrow(_all_shards(ctx, "entity_mentions", entity_mentions_schema.SCHEMA))
    splits = pl.from_arrow(_all_shards(ctx, "splits", splits_schema.SCHEMA))
    similarity = load_similarity(_config_file(ctx, ctx.cfg.retrieval.similarity))
    targets = pl.from_arrow(build_retrieval_targets(labels, mentions, splits, ctx.cfg.retrieval, similarity))
    total = 0
    for shard in range(ctx.cfg.shard_count):
        part = targets.filter(pl.col("shard") == shard).to_arrow()
        total += write_partition(ctx, "retrieval_targets", retrieval_schema.SCHEMA, shard, part)
    # two-case VQA items (query vs reference case): a second part file of every vqa shard partition
    from etl.assemble.vqa import build_case_comparison_vqa, load_templates
    from schemas.ontology import load_ontology

    case_vqa = pl.from_arrow(
        build_case_comparison_vqa(
            targets,
            labels,
            mentions,
            ctx.cfg.vqa,
            load_templates(_config_file(ctx, ctx.cfg.vqa.templates)),
            load_ontology(),
            similarity["severity"]["ordinal"],
        )
    )
    for shard in range(ctx.cfg.shard_count):
        part = _sorted(case_vqa.filter(pl.col("shard") == shard).to_arrow().cast(vqa_schema.SCHEMA), vqa_schema.SCHEMA)
        ctx.storage.write_table(ctx.table_path("vqa", shard).replace("part-0.parquet", "part-1.parquet"), part)
    n_case_vqa = case_vqa.height
    del case_vqa
    counts = check_split_integrity(  # only the key and split columns are read back
        splits,
        studies=_all_shards(ctx, "studies", studies_schema.SCHEMA, ["study_key", "patient_key"]),
        pairs=_all_shards(ctx, "pairs", pairs_schema.SCHEMA, ["patient_key", "prior_study_key", "current_study_key"]),
        retrieval_targets=targets,
        vqa=_all_shards(ctx, "vqa", vqa_schema.SCHEMA, ["patient_key", "split", "reference_study_key"]),
    )
    return {
        "retrieval_targets": total,
        "queries": targets.select("query_study_key", "entity_id").n_unique() if targets.height else 0,
        "case_vqa": n_case_vqa,
        **counts,
    }
