"""Subprocesses the CLI starts are stopped by id: their process group, then every group left in their session."""

from __future__ import annotations

import os
import sys
import time

import pytest

from medreco.cli import processes
from medreco.cli.processes import ProcessGroups, session_members

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# a leader that ignores SIGINT and SIGTERM and starts a child in a process group of its own (as Airflow's task
# supervisor does with each task runner), which ignores them too: only the session scan and SIGKILL reach it
STUBBORN = """
import os, signal, subprocess, sys, time
for s in (signal.SIGINT, signal.SIGTERM):
    signal.signal(s, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import os, signal, time; os.setpgid(0, 0); "
                          "[signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)]; "
                          "open(os.environ['READY'], 'w').write(str(os.getpid())); time.sleep(600)"])
time.sleep(600)
"""


def _wait_for(path, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return int(path.read_text())
        time.sleep(0.1)
    raise AssertionError(f"{path} not written")


def test_stop_reaches_a_child_in_another_group_of_the_session(tmp_path, monkeypatch):
    monkeypatch.setattr(processes, "STOP_SEQUENCE", tuple((s, 1.0) for s, _ in processes.STOP_SEQUENCE))
    groups = ProcessGroups(tmp_path / "logs")
    ready = tmp_path / "child.pid"
    proc = groups.start("stubborn", [sys.executable, "-c", STUBBORN], {**os.environ, "READY": str(ready)})
    child = _wait_for(ready)
    assert os.getpgid(child) == child != proc.pid  # its own group ...
    assert os.getsid(child) == proc.pid  # ... in the leader's session
    assert {pid for pid, _ in session_members(proc.pid)} >= {proc.pid, child}
    assert groups.stop_all() == {}
    assert session_members(proc.pid) == []
    stat = f"/proc/{child}/stat"
    # gone, or a zombie waiting for whoever inherited it to reap it: nothing runs any more
    assert not os.path.exists(stat) or open(stat).read().rsplit(")", 1)[1].split()[0] in ("Z", "X")


def test_a_cooperative_process_stops_at_the_first_signal(tmp_path):
    groups = ProcessGroups(tmp_path / "logs")
    proc = groups.start(
        "sleeper", [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"], dict(os.environ)
    )
    deadline = time.monotonic() + 30
    while "up" not in groups.log_tail("sleeper") and time.monotonic() < deadline:
        time.sleep(0.1)
    t0 = time.monotonic()
    assert groups.stop("sleeper") == []
    assert time.monotonic() - t0 < 10 and proc.returncode is not None  # SIGINT ended it (KeyboardInterrupt)
    assert groups.exited() == {"sleeper": proc.returncode}
