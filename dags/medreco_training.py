"""Training DAG, scheduled on the ``medreco://snapshot`` Asset: every published snapshot starts training.

``launch_<job>`` (encoder and VLM) verifies the snapshot named by the triggering Asset event
(the latest when run by hand) and starts the job with the configured launcher; ``wait_<job>`` is a sensor
that pokes the launcher (immediate for the synchronous local launcher, rescheduled polling for Kubernetes
and SageMaker) and fails on a failed job; ``record`` writes ``reports/training/<version>.json`` with each
job's lineage (snapshot version and content hash, config, code version, metrics, checkpoint) and fills the
dashboard's Training page when the dashboard shows that release (``quality.training_page``).

The two jobs run at once, unless the VLM job's ``model.vision_init`` names the encoder job of the same snapshot
(``training.vision_init``): then ``launch_vlm`` waits for ``wait_encoder``. The order is read from the default
pipeline config when the DAG file is parsed. The work is in ``training.pipeline`` and ``training.launchers``.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import Param, dag, get_current_context, task
from airflow.sdk.bases.sensor import PokeReturnValue

from dags.assets import SNAPSHOT_ASSET
from etl.pipeline.runtime import default_config_path
from training.vision_init import vlm_after_encoder

JOBS = ["encoder", "vlm"]


def _config() -> str:
    params = get_current_context().get("params") or {}
    return params.get("config") or default_config_path()


def build_training_dag(ordered: bool):
    """The training DAG; ``ordered``: the VLM's launch waits for the encoder job to succeed (else both at once)."""

    @dag(
        dag_id="medreco_training",
        schedule=[SNAPSHOT_ASSET],
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,
        params={
            "config": Param(default_config_path(), type="string"),
            "snapshot": Param(None, type=["null", "string"], description="version when run by hand (default: latest)"),
        },
        tags=["medreco", "training"],
        doc_md=__doc__,
    )
    def medreco_training():
        @task(multiple_outputs=True)
        def launch(job: str) -> dict:
            from training.pipeline import snapshot_from_events, start_job

            ctx = get_current_context()
            params = ctx.get("params") or {}
            version = snapshot_from_events(ctx.get("triggering_asset_events")) or params.get("snapshot")
            return start_job(job, _config(), version)

        @task.sensor(poke_interval=60, timeout=7 * 24 * 3600, mode="reschedule")
        def wait(handle: dict) -> PokeReturnValue:
            from training.launchers import LauncherError, poll

            status = poll(handle)
            if status == "failed":
                raise LauncherError(
                    f"{handle['job']} training failed: {handle.get('stderr_tail') or handle.get('name')}"
                )
            return PokeReturnValue(is_done=status in ("succeeded", "disabled"), xcom_value=handle)

        @task(multiple_outputs=True)
        def record(handles: list[dict]) -> dict:
            from quality.training_page import stamp_training
            from training.jobs import open_storage
            from training.pipeline import record_runs

            rec = record_runs(_config(), list(handles))
            return {**rec, "dashboard": stamp_training(open_storage(_config()), rec["snapshot_version"])}

        launches = {job: launch.override(task_id=f"launch_{job}")(job) for job in JOBS}
        waits = {job: wait.override(task_id=f"wait_{job}")(launches[job]) for job in JOBS}
        if ordered:
            waits["encoder"] >> launches["vlm"]
        record([waits[job] for job in JOBS])

    return medreco_training()


training_dag = build_training_dag(vlm_after_encoder(default_config_path()))
