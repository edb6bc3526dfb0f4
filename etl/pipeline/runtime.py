"""Glue between Airflow task instances and the stage functions (kept out of the DAG files).

Only this module and ``dags/`` know about Airflow's runtime context; stages never import Airflow.
"""

from __future__ import annotations

import logging
import warnings

from etl.pipeline.context import BuildContext
from schemas.config import default_config_path


def quiet_library_logs() -> None:
    """Silence pydicom's per-file warnings and decoder tracebacks in task logs.

    Every failure they describe is already recorded as a quarantine reason code with a PHI-free detail;
    the raw messages can quote header values, so they are not worth the risk or the noise.
    """
    logging.getLogger("pydicom").setLevel(logging.CRITICAL)
    warnings.filterwarnings("ignore", module=r"pydicom(\..*)?")
    warnings.filterwarnings("ignore", category=UserWarning, message=r".*(VR|Photometric|pixel|Pixel).*")


def task_context() -> BuildContext:
    """Build the :class:`BuildContext` of the running Airflow task (config from the DAG param ``config``,
    run id from the DAG run)."""
    from airflow.sdk import get_current_context

    quiet_library_logs()
    ctx = get_current_context()
    params = ctx.get("params") or {}
    return BuildContext.from_config_file(params.get("config") or default_config_path(), run_id=ctx["run_id"])
