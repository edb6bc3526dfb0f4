"""Run the build DAG on the embedded default: Airflow ``dag.test()`` on SQLite, in this process.

Airflow reads its configuration from the environment at import time, so :func:`prepare_airflow_env`
must run before the first ``import airflow``. ``AIRFLOW_HOME`` defaults to ``<project>/.airflow``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from etl import zones
from schemas.config import PROJECT_ROOT
from schemas.errors import ReasonCodedError


class BuildFailedError(ReasonCodedError, RuntimeError):
    """Raised when the build DAG run does not end in success."""

    default_reason = "build_failed"
    message_format = "{message}"


class BuildLockedError(BuildFailedError):
    """Raised at once, before any work, when another build holds the storage root's lock."""

    default_reason = "build_locked"
    message_format = "{message}"


def prepare_airflow_env(airflow_home: str | Path | None = None) -> Path:
    """Set the Airflow environment for an embedded run (SQLite, no examples, our dags folder) and migrate
    the metadata database once per Airflow version. Returns AIRFLOW_HOME."""
    home = Path(airflow_home or os.environ.get("AIRFLOW_HOME") or PROJECT_ROOT / ".airflow").resolve()
    home.mkdir(parents=True, exist_ok=True)
    os.environ["AIRFLOW_HOME"] = str(home)
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(PROJECT_ROOT / "dags"))
    os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "False")
    os.environ.setdefault("AIRFLOW__LOGGING__LOGGING_LEVEL", "WARNING")
    from importlib import metadata

    marker = home / f".migrated-{metadata.version('apache-airflow')}"
    if not marker.exists():
        proc = subprocess.run(
            [sys.executable, "-m", "airflow", "db", "migrate"], capture_output=True, text=True, env=os.environ.copy()
        )
        if proc.returncode != 0:
            raise BuildFailedError(f"airflow db migrate failed: {proc.stderr.strip().splitlines()[-1:]}")
        marker.write_text("ok\n")
    return home


def run_build(config_path: str | Path, workers: int = 1, progress=None) -> dict:
    """Run the ``medreco_build`` DAG once and return the run summary.

    Parameters
    ----------
    config_path : str or Path
        the pipeline config.
    workers : int
        1 (default): ``dag.test()`` in this process, one task at a time. N > 1: the same DAG under a real
        scheduler with the LocalExecutor and N worker processes on the same metadata database
        (:func:`medreco.cli.scheduled.run_scheduled`), mapped tasks in parallel; every process it starts is
        stopped before this returns.
    progress : medreco.cli.progress.BuildProgress, optional
        shown while the run is on (per stage: tasks and files done of total, throughput, time left).

    Raises
    ------
    BuildFailedError
        naming the failed tasks when the run does not succeed (also when a scheduler component fails).
    BuildLockedError
        before any work, naming the holder, when another build holds the root's lock
        (:class:`etl.pipeline.ledger.BuildLock`): two builds on one root never interleave.
    ConfigError, MissingKeyError, KeyMismatchError, etl.sources.source_access.SourceUnavailableError
        before any work.
    ValueError
        when ``workers`` < 1.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    home = prepare_airflow_env()
    from etl.pipeline.runtime import quiet_library_logs
    from medreco.cli.output import after_airflow_setup

    quiet_library_logs()
    after_airflow_setup()
    from etl.pipeline.context import BuildContext
    from etl.pipeline.lock import BuildLock, BuildLockHeldError
    from etl.pipeline.publish_stage import run_summary_path
    from etl.sources.source_access import check_sources
    from schemas.config import load_config

    cfg_path = str(Path(config_path).resolve())
    # fail before any work on a bad config, a missing or unreadable source, a missing key or a key other than the
    # root's (a source checked first: a typo in source_uri must not bind the root to the key)
    pre = BuildContext.from_config(load_config(cfg_path), run_id="precheck")
    check_sources(pre.cfg, pre.storage)
    pre.check_key()
    lock = BuildLock(
        pre.storage,
        owner=f"medreco build of {cfg_path}",
        endpoint_url=pre.cfg.storage.s3_endpoint_url,
        region=pre.cfg.storage.s3_region,
    )
    try:
        lock.acquire()
    except BuildLockHeldError as err:
        raise BuildLockedError(str(err)) from None
    # the DAG's first task adopts this lock (same token) instead of refusing its own caller
    conf = {"config": cfg_path, "build_lock_token": lock.token}
    try:
        if progress is not None:
            progress.start(pre.storage, pre.cfg)
        if workers == 1:
            run_id, state, failed = _run_dag_test(conf, progress)
        else:
            run_id, state, failed = _run_under_scheduler(conf, workers, cfg_path, home, progress)
    finally:
        try:
            if progress is not None:
                progress.stop()
        finally:
            lock.release()
    if state != "success":
        raise BuildFailedError(f"build run {run_id} ended {state}; failed tasks: {', '.join(failed) or '?'}")
    ctx = BuildContext.from_config_file(cfg_path, run_id=run_id)
    import json

    return json.loads(ctx.storage.read_text(run_summary_path(ctx.run_id)))


def _failed_tasks(dag_id: str, run_id: str) -> list[str]:
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = (
            session.query(TaskInstance.task_id, TaskInstance.state)
            .filter(TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id)
            .all()
        )
    return sorted({t for t, s in rows if str(s).endswith(("failed", "upstream_failed"))})


def warm_in_process_api() -> float:
    """Start Airflow's in-process Execution API (the FastAPI app ``dag.test()`` sends its task requests to; one per
    process, cached by Airflow) and answer one request with it before a run; return the seconds it took.

    ``dag.test()`` builds the app when its first task starts, and Cadwyn (the API's versioning layer) builds the
    versioned routers of every API version on the app's first request, the first task's ``/run`` call, after the
    task instance's start was recorded. In a 3-file build the first task, ``build_lock``, showed 13.6 s for a
    callable that takes under 0.01 s (``acquire_for_run``: 0.003 s): a stack sample of that task put its time in
    the app's creation and in ``cadwyn ... _cadwyn_initialize`` / ``generate_versioned_routers`` (pydantic schema
    generation) in the API's event-loop thread, not in any wait for the lock. Done here, that one-time cost is paid
    before the run and every task's duration is its own.
    """
    import time

    import httpx
    from airflow.sdk.execution_time.supervisor import in_process_api_server

    t0 = time.perf_counter()
    api = in_process_api_server()
    with httpx.Client(transport=api.transport, base_url="http://in-process.invalid") as client:
        client.get("/execution/health")  # any request: Cadwyn initialises its versioned routers on the first
    return time.perf_counter() - t0


def _run_dag_test(conf: dict, progress) -> tuple[str, str, list[str]]:
    """One run with ``dag.test()`` in this process; the progress display polls the database from a thread."""
    from dags.medreco_build import build_dag
    from medreco.cli.runs import capture_run_log

    warm_in_process_api()  # before the run: else its start-up is counted in the first task (build_lock)
    watcher = progress.watch_thread(build_dag.dag_id, conf["build_lock_token"]) if progress is not None else None
    try:
        with capture_run_log(os.environ["AIRFLOW_HOME"]) as log:  # dag.test() writes no task log files
            dagrun = build_dag.test(run_conf=conf)
            log["run_id"] = dagrun.run_id
    finally:
        if watcher is not None:
            watcher.stop()
    state = str(getattr(dagrun, "state", "")).rsplit(".", 1)[-1]
    failed = sorted({ti.task_id for ti in dagrun.get_task_instances() if str(ti.state).endswith("failed")})
    return dagrun.run_id, state, failed


def _run_under_scheduler(conf: dict, workers: int, cfg_path: str, home: Path, progress) -> tuple[str, str, list[str]]:
    """One run under ``airflow scheduler`` (LocalExecutor, ``workers`` processes) and the Execution API."""
    from medreco.cli.scheduled import ScheduledRunError, run_scheduled

    dag_id = "medreco_build"
    on_poll = (lambda run_id: progress.poll(dag_id, run_id)) if progress is not None else None
    try:
        run_id, state = run_scheduled(dag_id, conf, workers, cfg_path, home / "medreco-run-logs", on_poll=on_poll)
    except ScheduledRunError as err:
        raise BuildFailedError(f"scheduled build ({workers} workers) failed: {err}") from None
    return run_id, state, _failed_tasks(dag_id, run_id) if state != "success" else []


def run_training(config_path: str | Path, version: str) -> dict:
    """Run the ``medreco_training`` DAG once with ``dag.test()`` on one snapshot version, as the snapshot
    Asset event would, and return the training record (``reports/training/<version>.json``).

    Parameters
    ----------
    config_path : str or Path
        the pipeline config (its ``training`` section selects launcher and job configs).
    version : str
        the published snapshot version the build just emitted.

    Raises
    ------
    BuildFailedError
        naming the failed tasks when the run does not succeed.
    """
    prepare_airflow_env()
    from etl.pipeline.runtime import quiet_library_logs
    from medreco.cli.output import after_airflow_setup

    quiet_library_logs()
    after_airflow_setup()
    from dags.medreco_training import training_dag
    from training.jobs import open_storage

    cfg_path = str(Path(config_path).resolve())
    dagrun = training_dag.test(run_conf={"config": cfg_path, "snapshot": version})
    state = str(getattr(dagrun, "state", ""))
    if not state.endswith("success"):
        failed = sorted({ti.task_id for ti in dagrun.get_task_instances() if str(ti.state).endswith("failed")})
        raise BuildFailedError(f"training run {dagrun.run_id} ended {state}; failed tasks: {', '.join(failed) or '?'}")
    import json

    return json.loads(open_storage(cfg_path).read_text(zones.training_record(version)))
