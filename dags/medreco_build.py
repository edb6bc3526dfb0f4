"""The MedReCo-DB build DAG: sources -> ledger/quarantine -> curated tables -> quality -> snapshot.

Wiring only: every task calls one function of ``etl.pipeline.stages`` / ``etl.pipeline.ledger`` / ``quality.gate`` /
``etl.pipeline.publish_stage``. Per-shard stages are dynamically mapped over batches of patient-hash shards (never more
than ``max_map_length`` mapped tasks). The last task emits the ``medreco://snapshot`` Asset whose extra
carries the published version; the training DAG is scheduled on it. The first task takes the storage root's build
lock (``etl.pipeline.lock``) and the last one, ``trigger_rule=all_done``, gives it back, so two runs on one root never
interleave (the second fails at its first task, naming the holder).
"""

from __future__ import annotations

import pendulum
from airflow.sdk import Param, TriggerRule, dag, get_current_context, task

from dags.assets import SNAPSHOT_ASSET, any_delivery
from etl.pipeline.runtime import default_config_path, task_context

DEFAULT_ARGS = {"retries": 2, "retry_delay": pendulum.duration(seconds=30)}


@dag(
    dag_id="medreco_build",
    schedule=any_delivery(),  # runs when any institution's ingestion DAG reports a new delivery
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    params={
        "config": Param(default_config_path(), type="string", description="pipeline YAML config"),
        "build_lock_token": Param(
            "", type="string", description="set by `medreco run`: the token of the build lock it holds"
        ),
    },
    tags=["medreco"],
    doc_md=__doc__,
)
def medreco_build():
    @task(multiple_outputs=False, retries=0)
    def build_lock() -> dict:
        """Take the storage root's build lock for this run (fails at once when another build holds it)."""
        from etl.pipeline.lock import acquire_for_run

        ctx = task_context()
        token = (get_current_context().get("params") or {}).get("build_lock_token") or None
        return acquire_for_run(
            ctx.storage,
            ctx.run_id,
            adopt_token=token,
            endpoint_url=ctx.cfg.storage.s3_endpoint_url,
            region=ctx.cfg.storage.s3_region,
        )

    @task(trigger_rule=TriggerRule.ALL_DONE, retries=3)
    def release_lock() -> bool:
        """Give the lock back, whatever the other tasks' states (a no-op for a run refused at ``build_lock``)."""
        from etl.pipeline.lock import release_for_run

        ctx = task_context()
        return release_for_run(
            ctx.storage, ctx.run_id, endpoint_url=ctx.cfg.storage.s3_endpoint_url, region=ctx.cfg.storage.s3_region
        )

    @task
    def institutions() -> list[str]:
        """Validate config, sources (each one there and readable) and key (and that it is this root's key) before
        any work; list the institutions."""
        from etl.pipeline.stages import preflight

        return preflight(task_context())

    @task(multiple_outputs=True, map_index_template="{{ task.op_kwargs['institution'] }}")
    def discover(institution: str) -> dict:
        from etl.pipeline.stages import discover as run

        return run(task_context(), institution)

    @task
    def plan() -> list[list[int]]:
        from etl.pipeline.stages import plan as run

        return run(task_context())

    @task
    def deidentify(batch: list[int]) -> list[dict]:
        from etl.pipeline.stages import deidentify_shard

        ctx = task_context()
        return [deidentify_shard(ctx, s) for s in batch]

    @task
    def normalise(batch: list[int]) -> list[dict]:
        from etl.pipeline.stages import normalise_shard

        ctx = task_context()
        return [normalise_shard(ctx, s) for s in batch]

    @task(multiple_outputs=True)
    def reports() -> dict:
        from etl.pipeline.stages import reports as run

        return run(task_context())

    @task
    def entities(batch: list[int]) -> list[dict]:
        from etl.pipeline.stages import entities_shard

        ctx = task_context()
        return [entities_shard(ctx, s) for s in batch]

    @task
    def assemble(batch: list[int]) -> list[dict]:
        """Studies, splits, longitudinal pairs and VQA items of each shard."""
        from etl.pipeline.stages import assemble_shard

        ctx = task_context()
        return [assemble_shard(ctx, s) for s in batch]

    @task(multiple_outputs=True)
    def retrieval() -> dict:
        """Cross-patient retrieval targets (all shards) and the split leak check that fails the build."""
        from etl.pipeline.stages import retrieval as run

        return run(task_context())

    @task(multiple_outputs=True)
    def ledger() -> dict:
        from etl.pipeline.stages import finalise

        return finalise(task_context())

    @task(multiple_outputs=True)
    def quality() -> dict:
        from quality.gate import quality_stage

        return quality_stage(task_context())

    @task(multiple_outputs=True, outlets=[SNAPSHOT_ASSET])
    def snapshot() -> dict:
        from etl.pipeline.stages import publish_stage

        ctx = task_context()
        result = publish_stage(ctx)
        if not result["published"]:  # no file at all: no release, and no Asset event to trigger training
            from airflow.sdk.exceptions import AirflowSkipException

            raise AirflowSkipException(result["reason"])
        from quality.dashboard import stamp_release

        stamp_release(ctx.storage, result["version"], result["content_hash"])  # the dashboard names the release
        get_current_context()["outlet_events"][SNAPSHOT_ASSET].extra = {
            "version": result["version"],
            "content_hash": result["content_hash"],
            "uri": result["uri"],
        }
        return result

    lock = build_lock()
    names = institutions()
    lock >> names
    found = discover.expand(institution=names)
    batches = plan()
    found >> batches
    deid = deidentify.expand(batch=batches)
    norm = normalise.expand(batch=batches)
    deid >> norm
    reps = reports()
    deid >> reps
    ents = entities.expand(batch=batches)
    reps >> ents
    asm = assemble.expand(batch=batches)
    [norm, ents] >> asm
    ret = retrieval()
    asm >> ret
    led = ledger()
    [norm, reps] >> led
    q = quality()
    [ret, led] >> q
    snap = snapshot()
    q >> snap
    # setup/teardown: the run's state is that of its other tasks (a failed build stays failed), and clearing a
    # task clears the lock tasks with it; the release runs whatever happened before it (all_done)
    release = release_lock()
    release.as_teardown(setups=lock)
    release.operator.trigger_rule = TriggerRule.ALL_DONE
    [lock, names, found, batches, deid, norm, reps, ents, asm, ret, led, q, snap] >> release


build_dag = medreco_build()
