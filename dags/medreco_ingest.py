"""Per-institution ingestion DAGs: one DAG per institution of the deployment's config, each on the
schedule a data engineer sets (default daily). A run checks the institution's delivery and, when new
files arrived, emits the ``medreco://sources/<institution>`` Asset that schedules the build DAG.

The config is read at parse time only for the institution list (a small YAML file, no I/O to sources).
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import Param, dag, task
from airflow.sdk.exceptions import AirflowSkipException

from dags.assets import configured_institutions, source_asset
from etl.pipeline.runtime import default_config_path, task_context

SCHEDULE = os.environ.get("MEDRECO_INGEST_SCHEDULE", "@daily")


def make_ingest_dag(institution: str):
    """Build the ingestion DAG of one institution."""

    @dag(
        dag_id=f"medreco_ingest__{institution}",
        schedule=SCHEDULE,
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,
        params={"config": Param(default_config_path(), type="string")},
        tags=["medreco", "ingest"],
        doc_md=__doc__,
    )
    def ingest():
        @task(multiple_outputs=True, outlets=[source_asset(institution)])
        def check_delivery() -> dict:
            from etl.pipeline.stages import check_delivery as run

            result = run(task_context(), institution)
            if not result["changed"]:
                raise AirflowSkipException(f"no new delivery from {institution}")
            return result

        check_delivery()

    return ingest()


for _inst in configured_institutions():
    globals()[f"ingest_{_inst.replace('-', '_')}"] = make_ingest_dag(_inst)
