"""Incremental builds: a per-shard stage records the digest of its inputs after writing its outputs, and a later
run whose inputs have the same digest carries the recorded result (and the run-folder files it wrote) forward
instead of building the shard again.

The state lives under ``ledger/incremental/<stage>/shard=N.json`` (:func:`etl.zones.incremental_state`). The build
fingerprint in every digest (:meth:`etl.pipeline.context.BuildContext.build_fingerprint`) hashes the config, the
code (file paths and bytes) and the key, so a change of any of them rebuilds every shard once.
"""

from __future__ import annotations

import hashlib
import json

import polars as pl

from etl import zones
from etl.pipeline.context import BuildContext
from etl.sources.discover import PLAN_SCHEMA


def read_plan(ctx: BuildContext) -> pl.DataFrame:
    """The run's merged plan (``plan.parquet``: every discovered file with its shard, kind and status)."""
    return pl.from_arrow(ctx.storage.read_table(ctx.plan_path(), schema=PLAN_SCHEMA))


def inputs_digest(*parts: object) -> str:
    """sha256 (hex) of ``parts`` as canonical JSON (sorted keys, no spaces; other objects by ``str``)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def deid_inputs(ctx: BuildContext, shard: int) -> pl.DataFrame:
    """The run plan's pending DICOM files of one shard."""
    return read_plan(ctx).filter(
        (pl.col("kind") == "dicom") & (pl.col("status") == "pending") & (pl.col("shard") == shard)
    )


def deid_digest(ctx: BuildContext, shard: int, inputs: pl.DataFrame | None = None) -> str:
    p = (deid_inputs(ctx, shard) if inputs is None else inputs).sort("source_uri")
    files = list(zip(p["source_uri"].to_list(), p["sha256"].to_list(), p["institution"].to_list()))
    return inputs_digest("deidentify", ctx.build_fingerprint(), shard, files)


def file_sha256(ctx: BuildContext, rel: str) -> str | None:
    """sha256 (hex) of a file under the storage root, None when there is none."""
    return hashlib.sha256(ctx.storage.read_bytes(rel)).hexdigest() if ctx.storage.is_file(rel) else None


#: a partition each per-shard stage always writes (empty ones too): its absence means the shard was not built
STAGE_OUTPUT = {"deidentify": "instances", "normalise": "series", "entities": "study_labels", "assemble": "studies"}


def carried_files(ctx: BuildContext, stage: str, shard: int) -> list[str]:
    """Run-folder files a stage writes for a shard (carried into a run that skips the shard)."""
    if stage == "deidentify":
        return [ctx.events_path(stage, shard), ctx.audit_path(stage, shard), ctx.audit_path("deface", shard)]
    if stage == "normalise":
        return [ctx.events_path(stage, shard)]
    return []


def resume(ctx: BuildContext, stage: str, shard: int, digest: str) -> dict | None:
    """The recorded result when ``stage`` already built ``shard`` from inputs with this ``digest``.

    Carries the run-folder files of the run that built it (events, audit counts) into this run; None (so
    the shard is rebuilt) when there is no matching state or those files are gone.
    """
    path = ctx.stage_state_path(stage, shard)
    if not ctx.storage.is_file(path):
        return None
    state = json.loads(ctx.storage.read_text(path))
    if state.get("digest") != digest or not ctx.storage.is_file(ctx.table_path(STAGE_OUTPUT[stage], shard)):
        return None
    here = carried_files(ctx, stage, shard)
    there = [p.replace(ctx.run_dir, zones.run_dir(state["run_id"]), 1) for p in here]
    if not all(ctx.storage.is_file(p) for p in there):
        return None
    for src, dst in zip(there, here):
        if src != dst:
            ctx.storage.write_bytes(dst, ctx.storage.read_bytes(src))
    return {**state["result"], "skipped": True}


def record(ctx: BuildContext, stage: str, shard: int, digest: str, result: dict) -> dict:
    """Record a shard's digest after every output of the stage is written (the stage's commit point)."""
    ctx.storage.write_text(
        ctx.stage_state_path(stage, shard),
        json.dumps({"digest": digest, "run_id": ctx.run_id, "result": result}, sort_keys=True),
    )
    return {**result, "skipped": False}
