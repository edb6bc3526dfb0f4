"""Run history of the embedded default: ``medreco runs`` and ``medreco logs`` read what Airflow recorded.

Runs and task instances come from the Airflow metadata database of ``$AIRFLOW_HOME`` (``DagRun``,
``TaskInstance``: state, try number, start, end, duration), the files each run ingested and quarantined from its
run summary (``reports/history/<run>.json`` under the storage root). Logs are Airflow's task log files
(``$AIRFLOW_HOME/logs/dag_id=<dag>/run_id=<run>/task_id=<task>/[map_index=<i>/]attempt=<n>.log``, written by the
scheduled run's workers); a ``dag.test()`` run (``--workers 1``) writes no task files, so its whole log is kept in
``run.log`` beside them (:func:`capture_run_log`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from schemas.errors import ReasonCodedError

BUILD_DAG = "medreco_build"
#: the whole log of a dag.test() run, in its run folder of Airflow's log tree
RUN_LOG = "run.log"


class RunHistoryError(ReasonCodedError, LookupError):
    """A run or task that the metadata database does not know (``unknown_run``, ``unknown_task``, ``no_logs``)."""


@dataclass(frozen=True)
class TaskRow:
    """One task instance: ``task_id``, ``map_index`` (-1 unmapped), ``state``, ``try_number``, ``duration_s``."""

    task_id: str
    map_index: int
    state: str
    try_number: int
    duration_s: float | None


@dataclass(frozen=True)
class RunRow:
    """One DAG run: ids, state, start and end (UTC), duration in seconds, task states counted, files by status."""

    run_id: str
    state: str
    start: datetime | None
    end: datetime | None
    tasks: dict[str, int]
    files: dict[str, int]

    @property
    def duration_s(self) -> float | None:
        """Seconds from start to end, None while running."""
        return (self.end - self.start).total_seconds() if self.start and self.end else None


def _state(value: Any) -> str:
    return str(value).rsplit(".", 1)[-1] if value is not None else "none"


def log_dir(airflow_home: str | Path, run_id: str, dag_id: str = BUILD_DAG) -> Path:
    """The run's folder in Airflow's log tree."""
    return Path(airflow_home) / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}"


def _run_root(conf: Any) -> str | None:
    """The storage root (as opened) of the config a run was started with, None when it cannot be read."""
    from etl.storage import Storage
    from schemas.config import ConfigError, storage_config

    path = (conf or {}).get("config") if isinstance(conf, dict) else None
    if not path:
        return None
    try:
        sc = storage_config(path)
        return Storage.open(
            sc.root, endpoint_url=sc.s3_endpoint_url, region=sc.s3_region, base_dir=Path(path).parent
        ).uri
    except (ConfigError, OSError, ValueError):
        return None


def list_runs(storage: Any = None, dag_id: str = BUILD_DAG, limit: int = 20) -> list[RunRow]:
    """The latest ``limit`` runs of ``dag_id`` on ``storage`` (all storage roots when None), newest first, with their
    task states counted and, where the storage root holds the run's summary, its files by ledger status
    (``ingested``, ``quarantined``, ``duplicate``, ``skipped``). A run is on a root when the config it was started
    with names that root. The Airflow environment must be prepared
    (:func:`medreco.cli.embedded.prepare_airflow_env`)."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    from etl import zones
    from etl.pipeline.context import safe_run_id

    out = []
    with create_session() as session:
        runs = (
            session.query(DagRun).filter(DagRun.dag_id == dag_id).order_by(DagRun.start_date.desc()).limit(limit).all()
        )
        for r in runs:
            if storage is not None and _run_root(r.conf) != storage.uri:
                continue  # a run of another deployment on the same metadata database
            states = [
                _state(s)
                for (s,) in session.query(TaskInstance.state)
                .filter(TaskInstance.dag_id == dag_id, TaskInstance.run_id == r.run_id)
                .all()
            ]
            files: dict[str, int] = {}
            summary = zones.run_summary(safe_run_id(r.run_id))
            if storage is not None and storage.is_file(summary):
                led = json.loads(storage.read_text(summary)).get("ledger", {})
                files = {k: int(led.get(k, 0)) for k in ("ingested", "quarantined", "duplicate", "skipped")}
            out.append(
                RunRow(
                    r.run_id,
                    _state(r.state),
                    r.start_date,
                    r.end_date,
                    {s: states.count(s) for s in sorted(set(states))},
                    files,
                )
            )
    return out


def resolve_run_id(run_id: str, dag_id: str = BUILD_DAG) -> str:
    """The Airflow run id of ``run_id``, which may also be its storage form (:func:`etl.pipeline.context.safe_run_id`:
    the run folder's name, which a build's summary prints: ``manual__2026-12-04T03_39_32.997717_00_00`` for
    ``manual__2026-12-04T03:39:32.997717+00:00``). An id the database does not hold in either form is returned as it
    is (the caller reports it unknown)."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    from etl.pipeline.context import safe_run_id

    with create_session() as session:
        if session.query(DagRun).filter(DagRun.dag_id == dag_id, DagRun.run_id == run_id).count():
            return run_id
        matches = [
            r for (r,) in session.query(DagRun.run_id).filter(DagRun.dag_id == dag_id).all() if safe_run_id(r) == run_id
        ]
    return matches[0] if len(matches) == 1 else run_id


def run_tasks(run_id: str, dag_id: str = BUILD_DAG) -> list[TaskRow]:
    """The task instances of one run, in start order (mapped ones by map index).

    Raises
    ------
    RunHistoryError
        ``unknown_run`` when the database has no such run.
    """
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        if not session.query(DagRun).filter(DagRun.dag_id == dag_id, DagRun.run_id == run_id).count():
            raise RunHistoryError("unknown_run", f"no run {run_id!r} of {dag_id} (medreco runs lists them)")
        tis = session.query(TaskInstance).filter(TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id).all()
        rows = [
            TaskRow(
                ti.task_id,
                int(ti.map_index),
                _state(ti.state),
                int(ti.try_number or 0),
                float(ti.duration) if ti.duration is not None else None,
            )
            for ti in tis
        ]
        order = {ti.task_id: ti.start_date for ti in tis}
    far = datetime.max.replace(tzinfo=None)
    return sorted(rows, key=lambda t: (_naive(order.get(t.task_id)) or far, t.task_id, t.map_index))


def _naive(value: datetime | None) -> datetime | None:
    return value.replace(tzinfo=None) if value is not None else None


def task_logs(airflow_home: str | Path, run_id: str, task_id: str | None = None, dag_id: str = BUILD_DAG) -> list[Path]:
    """Log files of a run (or of one of its tasks), in path order: Airflow's per-task files, else the run's whole
    log (``run.log``, a ``dag.test()`` run).

    Raises
    ------
    RunHistoryError
        ``no_logs`` when there is none (a run from before logs were kept, or another AIRFLOW_HOME),
        ``unknown_task`` for a task id with no log in the run.
    """
    folder = log_dir(airflow_home, run_id, dag_id)
    per_task = sorted(folder.glob("task_id=*/**/*.log"))
    if task_id is not None:
        mine = [p for p in per_task if f"task_id={task_id}" in p.parts]
        if mine:
            return mine
        if not per_task and (folder / RUN_LOG).is_file():
            return [folder / RUN_LOG]  # one log for the whole dag.test() run
        known = sorted({p.parts[len(folder.parts)].removeprefix("task_id=") for p in per_task})
        raise RunHistoryError(
            "unknown_task",
            f"no log of task {task_id!r} in run {run_id}"
            + (f" (tasks with logs: {', '.join(known)})" if known else ""),
        )
    if per_task:
        return per_task
    if (folder / RUN_LOG).is_file():
        return [folder / RUN_LOG]
    raise RunHistoryError("no_logs", f"no log of run {run_id} under {folder}")


@contextmanager
def capture_run_log(airflow_home: str | Path) -> Iterator[dict[str, Any]]:
    """Keep the log of a ``dag.test()`` run: every record of the root logger (INFO and above) goes to a file while
    the block runs; put the run id in the yielded dict (``"run_id"``) and the file is moved to the run's folder
    of Airflow's log tree as ``run.log`` on exit."""
    home = Path(airflow_home)
    (home / "logs").mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".run-", suffix=".log", dir=home / "logs")
    os.close(fd)
    handler = logging.FileHandler(tmp, encoding="utf-8")
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter("[%(asctime)s] %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(min(level, logging.INFO) if level else logging.INFO)  # INFO reaches the file (console: handlers)
    state: dict[str, Any] = {}
    try:
        yield state
    finally:
        root.setLevel(level)
        root.removeHandler(handler)
        handler.close()
        if state.get("run_id"):
            target = log_dir(home, state["run_id"]) / RUN_LOG
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(tmp, target)
        else:
            os.unlink(tmp)


def format_runs(rows: list[RunRow]) -> list[str]:
    """``medreco runs``: a header and one line per run (tab separated)."""
    lines = ["\t".join(("run_id", "state", "start_utc", "duration_s", "tasks", "ingested", "quarantined"))]
    for r in rows:
        tasks = ", ".join(f"{s} {n}" for s, n in r.tasks.items()) or "-"
        lines.append(
            "\t".join(
                (
                    r.run_id,
                    r.state,
                    r.start.strftime("%Y-%m-%d %H:%M:%S") if r.start else "-",
                    f"{r.duration_s:.1f}" if r.duration_s is not None else "-",
                    tasks,
                    str(r.files.get("ingested", "-")),
                    str(r.files.get("quarantined", "-")),
                )
            )
        )
    return lines


def format_tasks(rows: list[TaskRow]) -> list[str]:
    """``medreco runs RUN``: a header and one line per task instance."""
    lines = ["\t".join(("task_id", "map_index", "state", "try", "duration_s"))]
    lines += [
        "\t".join(
            (
                t.task_id,
                str(t.map_index),
                t.state,
                str(t.try_number),
                f"{t.duration_s:.1f}" if t.duration_s is not None else "-",
            )
        )
        for t in rows
    ]
    return lines
