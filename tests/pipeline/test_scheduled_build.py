"""``medreco run --workers 2``: the build DAG under a real scheduler with the LocalExecutor on the session's SQLite
database, against the serial ``dag.test()`` run of the same corpus, config and key.

One small corpus (8 patients, 4 shards in 2 mapped tasks per stage), built once each way; both runs show their
progress in log mode (one line per stage), which the tests read too.
"""

from __future__ import annotations

import io
import os
import re
import sys
from pathlib import Path

import pytest
from conftest import config_for

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")]
DAG_ID = "medreco_build"


def _processes_with_home(home: Path) -> list[int]:
    """Live processes (other than this one) whose environment names ``home`` as AIRFLOW_HOME."""
    needle = f"AIRFLOW_HOME={home}".encode()
    found = []
    for env in Path("/proc").glob("[0-9]*/environ"):
        pid = int(env.parent.name)
        if pid == os.getpid():
            continue
        try:  # this test process's own contained pixel decoder (etl.pixels.contained), reused for its life
            own_child = (env.parent / "stat").read_text().rsplit(")", 1)[1].split()[1] == str(os.getpid())
            if own_child and b"decode_worker.py" in (env.parent / "cmdline").read_bytes():
                continue
        except OSError:
            continue
        try:
            if (
                needle in env.read_bytes().split(b"\0")
                and (env.parent / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
            ):
                found.append(pid)
        except OSError:
            continue
    return found


@pytest.fixture(scope="module")
def builds(tmp_path_factory, airflow_home):
    from helpers import demo_sources, fresh_root

    from medreco.cli.embedded import run_build
    from medreco.cli.progress import BuildProgress, read_task_rows
    from medreco.cli.scheduled import fail_run, unfinished_runs

    for stale in unfinished_runs(DAG_ID):  # a run another test of the session left "running" would block ours
        fail_run(DAG_ID, stale)
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    def run_ids() -> set[str]:
        with create_session() as session:
            return {r.run_id for r in session.query(DagRun).filter(DagRun.dag_id == DAG_ID)}

    corpus = demo_sources(tmp_path_factory.mktemp("scheduled"), seed=11, n_patients=8)
    out = {}
    for name, workers in (("serial", 1), ("scheduled", 2)):
        cfg = config_for(fresh_root(corpus, name), shard_count=4, max_map_length=2)
        log = io.StringIO()
        known = run_ids()  # other tests of this session build the same DAG in the same Airflow home
        summary = run_build(cfg, workers=workers, progress=BuildProgress(mode="lines", stream=log))
        (run_id,) = run_ids() - known
        out[name] = {"summary": summary, "log": log.getvalue(), "root": corpus / name, "run_id": run_id}
    assert out["scheduled"]["run_id"].startswith("manual__medreco_run_")
    out["scheduled"]["tasks"] = read_task_rows(DAG_ID, out["scheduled"]["run_id"])
    out["home"] = airflow_home
    return out


def test_same_snapshot_as_the_serial_run(builds):
    serial, scheduled = builds["serial"]["summary"], builds["scheduled"]["summary"]
    assert scheduled["content_hash"] == serial["content_hash"]
    assert scheduled["tables"] == serial["tables"] and sum(serial["tables"].values()) > 0
    assert scheduled["ledger"] == serial["ledger"]
    assert scheduled["ledger"]["balanced"] and scheduled["version"] == serial["version"] == "0.1.0"


def test_mapped_tasks_ran_side_by_side(builds):
    tasks = builds["scheduled"]["tasks"]
    assert tasks and all(t.state.endswith("success") for t in tasks), [(t.task_id, t.state) for t in tasks]
    by_stage: dict[str, list] = {}
    for t in tasks:
        by_stage.setdefault(t.task_id, []).append(t)
    assert sorted(t.map_index for t in by_stage["discover"]) == list(range(8))
    for stage in ("deidentify", "normalise", "entities", "assemble"):
        assert sorted(t.map_index for t in by_stage[stage]) == [0, 1], stage
    mapped = [t for t in tasks if t.map_index >= 0]
    overlapping = [
        (a.task_id, a.map_index, b.map_index)
        for a in mapped
        for b in mapped
        if a.task_id == b.task_id and a.map_index < b.map_index and a.start < b.end and b.start < a.end
    ]
    assert overlapping, "no two instances of a mapped task ran at the same time with 2 workers"


def test_every_process_it_started_is_gone_and_the_dag_paused_again(builds):
    assert _processes_with_home(builds["home"]) == []
    logs = builds["home"] / "medreco-run-logs"
    assert (logs / "scheduler.log").is_file() and (logs / "api-server.log").is_file()
    # the workers fork from a warmed scheduler (medreco.cli.warm_scheduler)
    assert "medreco warm start: imports" in (logs / "scheduler.log").read_text(errors="replace")
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session

    with create_session() as session:
        assert session.get(DagModel, DAG_ID).is_paused is True  # paused at creation; unpaused only for the run


@pytest.mark.parametrize("name", ["serial", "scheduled"])
def test_one_progress_line_per_stage(builds, name):
    lines = builds[name]["log"].splitlines()
    stages = [m.group(1) for m in (re.match(r"stage (\w+): ", line) for line in lines) if m]
    expected = {
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
    }
    assert set(stages) == expected and len(stages) == len(expected), lines  # each stage once, when it finished
    by = {re.match(r"stage (\w+): ", line).group(1): line for line in lines}
    summary = builds[name]["summary"]["ledger"]
    assert re.search(rf"8/8 tasks, {summary['files_seen']}/{summary['files_seen']} files in ", by["discover"])
    pixels = re.search(r"2/2 tasks, (\d+)/(\d+) files in [\d.]+ s \([\d.e+]+ files/s\)$", by["deidentify"])
    assert pixels and pixels.group(1) == pixels.group(2) and int(pixels.group(1)) > 0, by["deidentify"]
    assert by["normalise"].split(" in ")[0].endswith(f"{pixels.group(1)}/{pixels.group(1)} files")
    assert re.fullmatch(r"stage quality: 1/1 tasks in [\d.]+ s", by["quality"])


@pytest.mark.parametrize("name", ["serial", "scheduled"])
def test_medreco_logs_shows_each_tasks_info_lines(builds, name, monkeypatch):
    """Issue 40, point 10, re-checked in a run: ``medreco logs RUN TASK`` prints the task's INFO lines (the
    scheduled workers log at INFO; a dag.test() run keeps its whole log), for a mapped and an unmapped task."""
    from typer.testing import CliRunner

    from medreco.cli.app import app

    run_id = builds[name]["run_id"]
    monkeypatch.setenv("AIRFLOW_HOME", str(builds["home"]))
    for task in ("deidentify", "snapshot"):
        res = CliRunner().invoke(app, ["logs", run_id, task])
        assert res.exit_code == 0, res.output
        info = [ln for ln in res.output.splitlines() if re.search(r"\bINFO\b|\"level\": ?\"info\"", ln)]
        assert len(info) >= 3, (task, res.output[-2000:])
        if name == "scheduled":  # one log file per task instance: the mapped task's two, the snapshot task's one
            files = [ln for ln in res.output.splitlines() if ln.startswith("==> ")]
            assert len(files) == (2 if task == "deidentify" else 1), files
            assert all(f"task_id={task}/" in f for f in files)
