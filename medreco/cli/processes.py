"""Subprocesses the CLI starts and stops itself: each in its own session, stopped by id, never by name.

Every component of a scheduled build (:mod:`medreco.cli.scheduled`) is started with ``start_new_session=True``, so
its process id is also its process-group id and its session id. Airflow's task supervisor puts each task runner
in a process group of its own (``os.setpgid(0, 0)``) but in the same session, so stopping a component stops its
group first (SIGINT, then SIGTERM, then SIGKILL: the scheduler may ignore SIGTERM alone, see STACK_NOTES) and
then every process group still left in its session. Linux only (``/proc``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

#: (signal, seconds to wait for the group to go) in the order they are sent
STOP_SEQUENCE = ((signal.SIGINT, 15.0), (signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0))


def session_members(sid: int) -> list[tuple[int, int]]:
    """Live (not zombie) processes of session ``sid``.

    Returns
    -------
    list of (pid, pgid)
        read from ``/proc/<pid>/stat`` (fields 5 and 6: pgrp, session); empty when none is left.
    """
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        state, pgrp, session = fields[0], int(fields[2]), int(fields[3])
        if session == sid and state not in ("Z", "X"):
            out.append((int(stat.parent.name), pgrp))
    return out


class ProcessGroups:
    """Named subprocesses, each the leader of its own session, logging to ``<log_dir>/<name>.log``.

    Parameters
    ----------
    log_dir : Path
        folder of the components' logs (stdout and stderr together).
    """

    def __init__(self, log_dir: Path):
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, args: list[str], env: dict[str, str], cwd: Path | None = None) -> subprocess.Popen:
        """Start ``args`` as a new session (its pid is its process-group and session id)."""
        with open(self.log_dir / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(
                args,
                env=env,
                cwd=cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.procs[name] = proc
        return proc

    def log_tail(self, name: str, n: int = 20) -> str:
        """The last ``n`` lines of a component's log (for error messages)."""
        path = self.log_dir / f"{name}.log"
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        return "\n".join(lines[-n:])

    def exited(self) -> dict[str, int]:
        """Components whose leader has exited, with their exit status."""
        return {name: p.returncode for name, p in self.procs.items() if p.poll() is not None}

    def sessions(self) -> dict[str, int]:
        """Session id of each component (its leader's pid)."""
        return {name: p.pid for name, p in self.procs.items()}

    def stop(self, name: str) -> list[int]:
        """Stop one component: its process group, then every group left in its session, SIGINT -> SIGTERM ->
        SIGKILL. Returns the pids of its session still alive afterwards (empty on success)."""
        proc = self.procs[name]
        sid = proc.pid
        for sig, grace in STOP_SEQUENCE:
            groups = {sid} | {pgrp for _, pgrp in session_members(sid)}
            for pgid in groups:
                try:
                    os.killpg(pgid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                proc.poll()
                if not session_members(sid):
                    break
                time.sleep(0.2)
            if not session_members(sid):
                break
        proc.poll()
        return [pid for pid, _ in session_members(sid)]

    def stop_all(self) -> dict[str, list[int]]:
        """Stop every component, newest first. Returns ``{name: pids still alive}`` for those that would not stop."""
        left = {}
        for name in reversed(list(self.procs)):
            alive = self.stop(name)
            if alive:
                left[name] = alive
        return left
