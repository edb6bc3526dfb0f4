"""Training DAG, scheduled on the ``medreco://snapshot`` Asset: every published snapshot starts training.

It verifies the snapshot named by the triggering Asset event and hands it to the configured launcher
(``training.launch``); the snapshot version is recorded with the launch so a model always knows what it
trained on.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import Param, dag, get_current_context, task

from dags.assets import SNAPSHOT_ASSET
from etl.runtime import default_config_path, task_context


@dag(
    dag_id="medreco_training",
    schedule=[SNAPSHOT_ASSET],
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    params={"config": Param(default_config_path(), type="string")},
    tags=["medreco", "training"],
    doc_md=__doc__,
)
def medreco_training():
    @task
    def launch() -> dict:
        from training.launch import launch_for_snapshot

        events = get_current_context().get("triggering_asset_events") or {}
        extras = [e.extra for evs in events.values() for e in evs if e.extra.get("version")]
        version = extras[-1]["version"] if extras else None
        return launch_for_snapshot(task_context(), version)

    launch()


training_dag = medreco_training()
