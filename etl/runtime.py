"""Glue between Airflow task instances and the stage functions (kept out of the DAG files).

Only this module and ``dags/`` know about Airflow's runtime context; stages never import Airflow.
"""

from __future__ import annotations

import os
from pathlib import Path

from etl.context import BuildContext

PROJECT_ROOT = Path(__file__).resolve().parents[1]
CONFIG_ENV = "MEDRECO_CONFIG"


def default_config_path() -> str:
    """``$MEDRECO_CONFIG`` or the project's ``config/demo.yaml``."""
    return os.environ.get(CONFIG_ENV) or str(PROJECT_ROOT / "config" / "demo.yaml")


def task_context() -> BuildContext:
    """Build the :class:`BuildContext` of the running Airflow task (config from the DAG param ``config``,
    run id from the DAG run)."""
    from airflow.sdk import get_current_context

    ctx = get_current_context()
    params = ctx.get("params") or {}
    return BuildContext.from_config_file(params.get("config") or default_config_path(), run_id=ctx["run_id"])
