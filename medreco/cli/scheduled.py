"""Run one DAG run under a real Airflow 3 scheduler with the LocalExecutor, on the embedded metadata database.

``medreco run --workers N`` (N > 1) uses this instead of ``dag.test()``: the same DAG, scheduled by
``airflow scheduler`` (LocalExecutor, ``[core] parallelism`` = N worker processes, so mapped shard tasks run side
by side), its tasks executed through the Execution API of an ``airflow api-server --apps execution``. Airflow 3
allows the LocalExecutor on SQLite (``airflow standalone`` forces exactly that pair); the configured
``sql_alchemy_conn`` is used when it is set. What ``airflow standalone`` also starts is left out on purpose:
the DAG-processor (this process writes the serialized DAGs once, as ``dag.test()`` does), the triggerer (the
build has no deferrable task) and the UI. The scheduler starts warm (:mod:`medreco.cli.warm_scheduler`), so the
worker processes and task runners it forks inherit the loaded stage modules and caches.

While the run is on, the scheduler creates no other run (``[scheduler] use_job_schedule = False``: no cron or
Asset-triggered runs) and the DAG is unpaused; afterwards its paused flag is put back. Both components are
started in sessions of their own and stopped by id (:class:`medreco.cli.processes.ProcessGroups`); a process that
survives the stop raises :class:`ScheduledRunError`.
"""

from __future__ import annotations

import os
import secrets
import socket
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from medreco.cli.processes import ProcessGroups
from schemas.config import CONFIG_ENV, PROJECT_ROOT
from schemas.errors import ReasonCodedError

#: seconds the components get to come up (2 shared cores: each imports Airflow for 10-40 s)
STARTUP_TIMEOUT_S = 300.0
#: seconds between two looks at the run's state
POLL_INTERVAL_S = 1.0
#: ``[workers] min_heartbeat_interval`` of the scheduled run (Airflow's default 5; see :func:`component_env`)
MIN_HEARTBEAT_INTERVAL_S = 1
#: ``[scheduler] scheduler_idle_sleep_time`` of the scheduled run (Airflow's default 1.0)
SCHEDULER_IDLE_SLEEP_S = 1.0


class ScheduledRunError(ReasonCodedError, RuntimeError):
    """A component of the scheduled run failed to start, died, or survived being stopped."""

    default_reason = "scheduled_run_failed"
    message_format = "{message}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def component_env(workers: int, api_port: int, config_path: str) -> dict[str, str]:
    """The environment of the scheduler and the api-server (this process's, plus the scheduled-run settings).

    Parameters
    ----------
    workers : int
        LocalExecutor worker processes (``[core] parallelism`` and ``max_active_tasks_per_dag``).
    api_port : int
        port of the Execution API on 127.0.0.1.
    config_path : str
        the pipeline config (``$MEDRECO_CONFIG`` of the DAG files).
    """
    env = dict(os.environ)
    path = [str(PROJECT_ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env.update(
        {
            "PYTHONPATH": os.pathsep.join(dict.fromkeys(path)),
            CONFIG_ENV: config_path,
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": str(workers),
            "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": str(workers),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{api_port}/execution/",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(api_port),
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),  # shared by the token issuer and the API only
            "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
            "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
            # a task's supervisor (in the worker) often sees its task's sockets close before the process is
            # reaped, then waits in a select() on no socket for up to this many seconds before it notices the
            # exit, and the worker takes no other task meanwhile: at the default 5, 10 of 18 tasks of a build kept
            # their worker 5.1 s past their end (LocalExecutor; Airflow 3.3.2, task SDK 1.3.2). 1 s is the least
            # the setting takes (an integer); it is also the interval of the tasks' heartbeats to the API.
            "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": str(MIN_HEARTBEAT_INTERVAL_S),
            # the scheduler sleeps this long after a loop that queued and finished nothing: the latency from a
            # task's end to the queuing of the next (the barrier between two stages)
            "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": str(SCHEDULER_IDLE_SLEEP_S),
            # the task log files `medreco logs` prints hold the tasks' INFO lines (the console of the embedded
            # runner stays at WARNING: prepare_airflow_env)
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        }
    )
    return env


def _sync_dags() -> None:
    """Write the dags folder's serialized DAGs to the metadata database (what ``dag.test()`` does first)."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db
    from airflow.utils.session import create_session

    manager = DagBundlesManager()
    with create_session() as session:
        manager.sync_bundles_to_db(session=session)
    for bundle in manager.get_all_dag_bundles():
        if not bundle.is_initialized:
            bundle.initialize()
        bag = BundleDagBag(dag_folder=bundle.path, bundle_path=bundle.path, bundle_name=bundle.name)
        sync_bag_to_db(bag, bundle.name, bundle.version)


def _set_paused(dag_id: str, paused: bool) -> bool:
    """Set the DAG's paused flag; returns the flag it had."""
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session

    with create_session() as session:
        model = session.get(DagModel, dag_id)
        if model is None:
            raise ScheduledRunError(f"DAG {dag_id} is not in the metadata database after parsing the dags folder")
        before = bool(model.is_paused)
        model.is_paused = paused
    return before


def _run_state(dag_id: str, run_id: str) -> str | None:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        run = session.query(DagRun).filter(DagRun.dag_id == dag_id, DagRun.run_id == run_id).one_or_none()
        return None if run is None else str(run.state)


def unfinished_runs(dag_id: str) -> list[str]:
    """Run ids of ``dag_id`` marked running or queued in the metadata database."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState

    with create_session() as session:
        return [
            r.run_id
            for r in session.query(DagRun).filter(
                DagRun.dag_id == dag_id, DagRun.state.in_([DagRunState.RUNNING, DagRunState.QUEUED])
            )
        ]


def fail_run(dag_id: str, run_id: str) -> None:
    """Mark a run that did not finish (interrupted, timed out, a component died) failed, with its unfinished
    tasks, so that it does not hold the DAG's only active-run slot (``max_active_runs=1``) for the next one."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState, TaskInstanceState

    finished = [
        TaskInstanceState.SUCCESS,
        TaskInstanceState.FAILED,
        TaskInstanceState.SKIPPED,
        TaskInstanceState.UPSTREAM_FAILED,
        TaskInstanceState.REMOVED,
    ]
    with create_session() as session:
        run = session.query(DagRun).filter(DagRun.dag_id == dag_id, DagRun.run_id == run_id).one_or_none()
        if run is None or str(run.state).rsplit(".", 1)[-1] in ("success", "failed"):
            return
        for ti in session.query(TaskInstance).filter(TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id):
            if ti.state not in finished:
                ti.state = TaskInstanceState.FAILED
        run.state = DagRunState.FAILED


def _api_up(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/execution/health", timeout=3) as resp:
            return resp.status == 200
    except OSError:
        return False


def run_scheduled(
    dag_id: str,
    conf: dict,
    workers: int,
    config_path: str,
    log_dir: Path,
    on_poll: Callable[[str], None] | None = None,
    timeout_s: float | None = None,
) -> tuple[str, str]:
    """Trigger one run of ``dag_id`` and let a real scheduler (LocalExecutor, ``workers`` processes) run it.

    Parameters
    ----------
    dag_id : str
        a DAG of the dags folder (``medreco_build``).
    conf : dict
        the run's conf (DAG params).
    workers : int
        LocalExecutor worker processes, >= 1.
    config_path : str
        the pipeline config, for the components' ``$MEDRECO_CONFIG``.
    log_dir : Path
        where ``scheduler.log`` and ``api-server.log`` are written.
    on_poll : callable, optional
        called with the run id about once a second while the run is on (progress display).
    timeout_s : float, optional
        give up (and stop everything) after this many seconds of run time.

    Returns
    -------
    (run_id, state)
        the state as Airflow writes it (``success`` or ``failed``).

    Raises
    ------
    ScheduledRunError
        when a component does not come up, exits during the run, or a process survives the stop (its pids named);
        when the run does not finish within ``timeout_s``.
    """
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.utils.types import DagRunTriggeredByType

    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    api_port = _free_port()
    env = component_env(workers, api_port, config_path)
    groups = ProcessGroups(log_dir)
    airflow = [sys.executable, "-m", "airflow"]
    _sync_dags()
    stale = unfinished_runs(dag_id)
    if stale:
        raise ScheduledRunError(
            f"{dag_id} has runs still marked running or queued in the metadata database ({', '.join(stale)}): a "
            f"scheduled run would wait behind them (max_active_runs=1). If no build is running, mark them failed "
            f"(`airflow dags list-runs {dag_id}`, then the UI or the REST API) or use --workers 1"
        )
    run_id = f"manual__medreco_run_{time.strftime('%Y%m%dT%H%M%S')}_{secrets.token_hex(3)}"
    was_paused = _set_paused(dag_id, False)
    state: str | None = None
    try:
        groups.start(
            "api-server",
            [
                *airflow,
                "api-server",
                "--host",
                "127.0.0.1",
                "--port",
                str(api_port),
                "--workers",
                "1",
                "--apps",
                "execution",
            ],
            env,
        )
        # warm: the LocalExecutor's workers and their task runners are forks of the scheduler
        # (medreco.cli.warm_scheduler)
        groups.start(
            "scheduler", [sys.executable, "-m", "medreco.cli.warm_scheduler", "scheduler", "--skip-serve-logs"], env
        )
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not _api_up(api_port):
            _check_alive(groups)
            if time.monotonic() > deadline:
                raise ScheduledRunError(
                    f"the api-server did not answer within {STARTUP_TIMEOUT_S:.0f} s; log: {log_dir / 'api-server.log'}"
                )
            time.sleep(0.5)
        trigger_dag(
            dag_id, run_id=run_id, conf=conf, triggered_by=DagRunTriggeredByType.CLI, triggering_user_name="medreco run"
        )
        t0 = time.monotonic()
        while True:
            state = _run_state(dag_id, run_id)
            if state and state.rsplit(".", 1)[-1] in ("success", "failed"):
                break
            _check_alive(groups)
            if on_poll is not None:
                on_poll(run_id)
            if timeout_s is not None and time.monotonic() - t0 > timeout_s:
                raise ScheduledRunError(f"run {run_id} did not finish within {timeout_s:.0f} s")
            time.sleep(POLL_INTERVAL_S)
        if on_poll is not None:
            on_poll(run_id)
    finally:
        try:
            _set_paused(dag_id, was_paused)
        finally:
            left = groups.stop_all()
            if state is None or state.rsplit(".", 1)[-1] not in ("success", "failed"):
                fail_run(dag_id, run_id)  # interrupted or a component failed: do not leave it "running"
        if left:
            raise ScheduledRunError(
                "processes survived the stop: "
                + "; ".join(f"{name}: pids {', '.join(map(str, pids))}" for name, pids in left.items())
            )
    return run_id, state.rsplit(".", 1)[-1]


def _check_alive(groups: ProcessGroups) -> None:
    dead = groups.exited()
    if dead:
        name, code = next(iter(dead.items()))
        raise ScheduledRunError(
            f"airflow {name} exited with status {code}; last lines of "
            f"{groups.log_dir / (name + '.log')}:\n{groups.log_tail(name)}"
        )
