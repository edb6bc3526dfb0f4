"""Progress of a build run, per stage: tasks and files done of total, throughput and time left.

The numbers come from where Airflow and the stages keep them, so the serial ``dag.test()`` run and the scheduled
run (:mod:`medreco.cli.scheduled`) show the same thing: the task instances of the DAG run in the metadata database
(state, start and end of every mapped task) and the run's plan files in the ledger zone (files per institution
once discovered; files per shard batch once planned). Files are counted for the stages that work file by file
(``discover``, ``deidentify``, ``normalise``: the DICOM files of the plan); the other stages show tasks only.

Three displays: a rich progress table on a terminal (stderr), one line per finished stage in a log (stderr not a
terminal), nothing with ``--quiet``. :func:`stage_progress` and :func:`format_line` are pure and tested alone.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TextIO

#: the build DAG's tasks in the order they run (others are shown after them, in the order they appear)
STAGE_ORDER = (
    "build_lock",
    "institutions",
    "discover",
    "plan",
    "deidentify",
    "normalise",
    "reports",
    "entities",
    "assemble",
    "retrieval",
    "ledger",
    "quality",
    "snapshot",
    "release_lock",
)
#: task-instance states after which a task does not run again in this run
FINISHED_STATES = frozenset({"success", "failed", "skipped", "upstream_failed", "removed"})
#: stages whose work is counted in files (the plan's DICOM files)
FILE_STAGES = ("discover", "deidentify", "normalise")


@dataclass(frozen=True)
class TaskRow:
    """One task instance of the run: ``state`` as Airflow writes it (``None`` before scheduling), ``start`` and
    ``end`` in seconds since the epoch (``None`` until set)."""

    task_id: str
    map_index: int
    state: str | None
    start: float | None
    end: float | None


@dataclass(frozen=True)
class StageProgress:
    """Where one stage (one task id, all its mapped instances) stands.

    Attributes
    ----------
    stage : str
        the task id.
    tasks_done, tasks_total : int
        finished task instances and all of them (an unexpanded mapped task counts as one).
    failed : int
        instances that ended ``failed`` or ``upstream_failed``.
    files_done : int or None
        files of the finished instances (``None`` for a stage not counted in files).
    files_total : int or None
        files of all its instances, once known for every one of them.
    started, ended : float or None
        first start and (when every instance is finished) last end, seconds since the epoch.
    """

    stage: str
    tasks_done: int
    tasks_total: int
    failed: int
    files_done: int | None
    files_total: int | None
    started: float | None
    ended: float | None

    @property
    def done(self) -> bool:
        """Every instance finished (and the mapped task is expanded)."""
        return self.tasks_total > 0 and self.tasks_done == self.tasks_total

    def elapsed(self, now: float) -> float | None:
        """Seconds from the first start to the last end (or to ``now`` while running)."""
        if self.started is None:
            return None
        return max(0.0, (self.ended if self.done and self.ended is not None else now) - self.started)

    def rate(self, now: float) -> tuple[float, str] | None:
        """Throughput so far: ``(files per second, "files/s")``, or tasks per second for a mapped stage without
        files; ``None`` before anything finished (and for a single task without files)."""
        elapsed = self.elapsed(now)
        if not elapsed:
            return None
        if self.files_done is not None:
            return (self.files_done / elapsed, "files/s") if self.files_done else None
        return (self.tasks_done / elapsed, "tasks/s") if self.tasks_done and self.tasks_total > 1 else None

    def eta(self, now: float) -> float | None:
        """Seconds left at the throughput so far (files when counted and known, else tasks); 0 when done."""
        if self.done:
            return 0.0
        elapsed = self.elapsed(now)
        if not elapsed:
            return None
        if self.files_total is not None and self.files_done:
            return (self.files_total - self.files_done) * elapsed / self.files_done
        if self.tasks_done:
            return (self.tasks_total - self.tasks_done) * elapsed / self.tasks_done
        return None


def _short(state: str | None) -> str | None:
    return None if state is None else str(state).rsplit(".", 1)[-1]


def stage_progress(rows: Iterable[TaskRow], files: dict[tuple[str, int], int]) -> list[StageProgress]:
    """Aggregate task instances into one :class:`StageProgress` per task id, in :data:`STAGE_ORDER`.

    Parameters
    ----------
    rows : iterable of TaskRow
        the run's task instances (a mapped task before expansion: one row with map_index -1).
    files : dict
        ``{(task_id, map_index): files}`` for the instances whose file count is known.
    """
    by_stage: dict[str, list[TaskRow]] = {}
    for r in rows:
        by_stage.setdefault(r.task_id, []).append(r)
    order = {s: i for i, s in enumerate(STAGE_ORDER)}
    out = []
    for stage in sorted(by_stage, key=lambda s: (order.get(s, len(order)), list(by_stage).index(s))):
        tis = by_stage[stage]
        if len(tis) > 1:  # expanded: the placeholder of the unexpanded task is gone, but be safe
            tis = [t for t in tis if t.map_index >= 0] or tis
        finished = [t for t in tis if _short(t.state) in FINISHED_STATES]
        counted = stage in FILE_STAGES
        expanded = all(t.map_index >= 0 for t in tis)  # a mapped task before expansion: one row, map_index -1
        known = [files[(stage, t.map_index)] for t in tis if (stage, t.map_index) in files]
        done_files = sum(files.get((stage, t.map_index), 0) for t in finished)
        starts = [t.start for t in tis if t.start is not None]
        ends = [t.end for t in finished if t.end is not None]
        out.append(
            StageProgress(
                stage=stage,
                tasks_done=len(finished),
                tasks_total=len(tis),
                failed=sum(_short(t.state) in ("failed", "upstream_failed") for t in tis),
                files_done=done_files if counted else None,
                files_total=sum(known) if counted and len(known) == len(tis) and expanded else None,
                started=min(starts) if starts else None,
                ended=max(ends) if ends else None,
            )
        )
    return out


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    return (
        f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        if seconds >= 3600
        else f"{seconds // 60}:{seconds % 60:02d}"
    )


def _files(p: StageProgress) -> str:
    if p.files_done is None:
        return ""
    return f"{p.files_done}/{p.files_total if p.files_total is not None else '?'} files"


def format_line(p: StageProgress, now: float) -> str:
    """One log line for a stage: ``stage deidentify: 2/2 tasks, 120/120 files in 12.3 s (9.76 files/s)``
    (``FAILED`` and the count when instances failed)."""
    parts = [f"{p.tasks_done}/{p.tasks_total} tasks"]
    if _files(p):
        parts.append(_files(p))
    elapsed = p.elapsed(now)
    text = f"stage {p.stage}: " + ", ".join(parts) + (f" in {elapsed:.1f} s" if elapsed is not None else "")
    rate = p.rate(now)
    if rate is not None:
        text += f" ({rate[0]:.3g} {rate[1]})"
    if p.failed:
        text += f" FAILED {p.failed}"
    return text


def read_task_rows(dag_id: str, run_id: str) -> list[TaskRow]:
    """The run's task instances from Airflow's metadata database (Airflow must be configured)."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = (
            session.query(
                TaskInstance.task_id,
                TaskInstance.map_index,
                TaskInstance.state,
                TaskInstance.start_date,
                TaskInstance.end_date,
            )
            .filter(TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id)
            .all()
        )
    return [
        TaskRow(t, int(m), None if s is None else str(s), a.timestamp() if a else None, b.timestamp() if b else None)
        for t, m, s, a, b in rows
    ]


def find_run_id(dag_id: str, build_lock_token: str) -> str | None:
    """The run of ``dag_id`` whose conf carries ``build_lock_token`` (what ``medreco run`` passes), if created."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        for run in session.query(DagRun).filter(DagRun.dag_id == dag_id).order_by(DagRun.id.desc()).limit(5):
            if (run.conf or {}).get("build_lock_token") == build_lock_token:
                return run.run_id
    return None


class RunFiles:
    """File counts per task instance, read from the run's plan files as they appear (ledger zone)."""

    def __init__(self, storage, cfg):
        self.storage, self.cfg = storage, cfg
        self.counts: dict[tuple[str, int], int] = {}
        self._planned = False

    def read(self, run_id: str, rows: list[TaskRow]) -> dict[tuple[str, int], int]:
        """Update and return ``{(task_id, map_index): files}`` for the instances known so far."""
        from etl import zones
        from etl.pipeline.batches import balanced_shard_batches, pending_files_per_shard
        from etl.pipeline.context import safe_run_id

        run_id = safe_run_id(run_id)  # the stages' run folder (BuildContext's run id)
        finished = {(r.task_id, r.map_index) for r in rows if _short(r.state) in FINISHED_STATES}
        for i, inst in enumerate(self.cfg.institutions):
            path = zones.run_plan(run_id, inst.id)
            if ("discover", i) not in self.counts and ("discover", i) in finished and self.storage.is_file(path):
                self.counts[("discover", i)] = self.storage.read_table(path, columns=["kind"]).num_rows
        if not self._planned and ("plan", -1) in finished and self.storage.is_file(zones.run_plan(run_id)):
            t = self.storage.read_table(zones.run_plan(run_id), columns=["kind", "status", "shard"])
            per_shard = pending_files_per_shard(t)  # the batches plan() returned: the same function of this file
            batches = balanced_shard_batches(per_shard, self.cfg.shard_count, self.cfg.max_map_length)
            for i, batch in enumerate(batches):
                n = sum(per_shard.get(s, 0) for s in batch)
                self.counts[("deidentify", i)] = self.counts[("normalise", i)] = n
            self._planned = True
        return self.counts


class BuildProgress:
    """The progress display of one build run.

    Parameters
    ----------
    mode : {"auto", "tty", "lines", "off"}
        ``auto``: a rich table when ``stream`` is a terminal, else one line per finished stage.
    stream : text stream
        where it is written (default stderr; the summary goes to stdout).
    """

    def __init__(self, mode: str = "auto", stream: TextIO | None = None):
        self.stream = stream or sys.stderr
        if mode == "auto":
            mode = "tty" if getattr(self.stream, "isatty", lambda: False)() else "lines"
        if mode not in ("tty", "lines", "off"):
            raise ValueError(f"progress mode {mode!r} not in auto, tty, lines, off")
        self.mode = mode
        self.files: RunFiles | None = None
        self.printed: set[str] = set()
        self.last: list[StageProgress] = []
        self._rich: Any = None  # rich.progress.Progress while a terminal display is on
        self._rich_tasks: dict[str, int] = {}
        self._lock = threading.Lock()

    def start(self, storage, cfg) -> None:
        """Begin a run on ``storage`` with config ``cfg`` (file counts come from its plan files)."""
        self.files = RunFiles(storage, cfg)
        if self.mode == "tty":
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn

            self._rich = Progress(
                TextColumn("{task.description:<13}"),
                BarColumn(),
                TextColumn("{task.fields[tasks]:>12}"),
                TextColumn("{task.fields[files]:>16}"),
                TextColumn("{task.fields[rate]:>15}"),
                TextColumn("{task.fields[eta]}"),
                console=Console(file=self.stream),
                transient=False,
            )
            self._rich.start()

    def poll(self, dag_id: str, run_id: str) -> None:
        """Read the run's state once and show it (errors reading a busy database skip this look)."""
        if self.mode == "off":
            return
        from sqlalchemy.exc import OperationalError

        try:
            rows = read_task_rows(dag_id, run_id)
            files = self.files.read(run_id, rows) if self.files is not None else {}
        except (OperationalError, OSError):  # a locked SQLite database, a storage hiccup: look again later
            return
        self.show(stage_progress(rows, files), time.time())

    def show(self, stages: list[StageProgress], now: float) -> None:
        """Display ``stages`` (one line per newly finished stage, or the rich table)."""
        with self._lock:
            self.last = stages
            if self.mode == "lines":
                for p in stages:
                    if p.done and p.stage not in self.printed:
                        self.printed.add(p.stage)
                        print(format_line(p, now), file=self.stream, flush=True)
            elif self.mode == "tty" and self._rich is not None:
                for p in stages:
                    self._update_rich(p, now)

    def _update_rich(self, p: StageProgress, now: float) -> None:
        rate, eta = p.rate(now), p.eta(now)
        fields = {
            "tasks": f"{p.tasks_done}/{p.tasks_total} tasks",
            "files": _files(p),
            "rate": f"{rate[0]:.3g} {rate[1]}" if rate else "",
            "eta": "done" if p.done else (f"{_duration(eta)} left" if eta is not None else ""),
        }
        total = p.files_total if p.files_total else p.tasks_total
        completed = p.files_done if p.files_total else p.tasks_done
        label = p.stage + (" FAILED" if p.failed else "")
        if p.stage not in self._rich_tasks:
            self._rich_tasks[p.stage] = self._rich.add_task(label, total=total, completed=completed, **fields)
        else:
            self._rich.update(self._rich_tasks[p.stage], description=label, total=total, completed=completed, **fields)

    def watch_thread(self, dag_id: str, build_lock_token: str, interval_s: float = 1.0) -> _Watcher:
        """Poll from a thread while this thread runs ``dag.test()``; the run is found by its lock token."""
        _preload()
        watcher = _Watcher(self, dag_id, build_lock_token, interval_s)
        watcher.start()
        return watcher

    def stop(self) -> None:
        """End the display (the rich table stays on screen)."""
        if self._rich is not None:
            self._rich.stop()
            self._rich = None


def _preload() -> None:
    """Import in the calling thread what the watcher thread needs: two threads importing Airflow's models at once
    (``dag.test()`` does at its start) deadlock on the import locks of its circular imports."""
    import pyarrow.compute  # noqa: F401
    import pyarrow.parquet  # noqa: F401
    from airflow.models import import_all_models

    import etl.sources.discover  # noqa: F401

    import_all_models()
    import airflow.models.dagrun  # noqa: F401
    import airflow.models.taskinstance  # noqa: F401
    import airflow.serialization.serialized_objects  # noqa: F401
    import sqlalchemy.exc  # noqa: F401

    import etl.pipeline.context  # noqa: F401


class _Watcher(threading.Thread):
    def __init__(self, progress: BuildProgress, dag_id: str, token: str, interval_s: float):
        super().__init__(name="medreco-progress", daemon=True)
        self.progress, self.dag_id, self.token, self.interval_s = progress, dag_id, token, interval_s
        self.run_id: str | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self._tick()
            self._stop_event.wait(self.interval_s)

    def _tick(self) -> None:
        from sqlalchemy.exc import OperationalError

        try:
            if self.run_id is None:
                self.run_id = find_run_id(self.dag_id, self.token)
        except OperationalError:  # database busy: look again later
            return
        if self.run_id is not None:
            self.progress.poll(self.dag_id, self.run_id)

    def stop(self) -> None:
        """Stop polling, after one last look (so the last stages are shown)."""
        self._stop_event.set()
        self.join(timeout=30)
        self._tick()
