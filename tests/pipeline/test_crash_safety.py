"""Crash safety: a de-identification worker killed mid-shard is retried with no partial or duplicate rows
and the same snapshot as a clean run; two builds on one storage root cannot interleave (build lock, and
max_active_runs=1 on the build DAG)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from conftest import PROJECT_ROOT, config_for
from test_incremental import build

from etl.pipeline.lock import BUILD_LOCK, BuildLock, BuildLockHeldError
from etl.storage import Storage

pytestmark = pytest.mark.slow  # kills and reruns builds in subprocesses

KILL_STAGE = textwrap.dedent("""
    import sys
    from etl.pipeline.context import BuildContext
    from etl.pipeline.stages import deidentify_shard
    ctx = BuildContext.from_config_file(sys.argv[1], run_id=sys.argv[2])
    deidentify_shard(ctx, 0)
""")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    from helpers import demo_sources

    return demo_sources(tmp_path_factory.mktemp("crash"))


def _root(corpus: Path, name: str) -> Path:
    from helpers import fresh_root

    return fresh_root(corpus, name)


def test_worker_killed_mid_shard_then_retried_equals_a_clean_run(corpus):
    from etl.pipeline import incremental, stages
    from etl.pipeline.context import BuildContext

    clean = build(config_for(_root(corpus, "clean"), shard_count=1), "clean")
    cfg = config_for(_root(corpus, "crashed"), shard_count=1)
    ctx = BuildContext.from_config_file(cfg, run_id="run-1")
    ctx.check_key()
    for inst in ctx.cfg.institutions:
        stages.discover(ctx, inst.id)
    stages.plan(ctx)
    expected = incremental.deid_inputs(ctx, 0).height
    dicom_dir = Path(ctx.storage.path(ctx.dicom_dir(0)))
    proc = subprocess.Popen(
        [sys.executable, "-c", KILL_STAGE, str(cfg), "run-1"],
        cwd=PROJECT_ROOT,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
    )
    written = 0
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        if dicom_dir.is_dir() and (written := sum(1 for p in dicom_dir.iterdir() if p.suffix == ".dcm")) >= 3:
            proc.send_signal(signal.SIGKILL)  # a worker lost mid-shard: some files written, no partition yet
            break
        time.sleep(0.002)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    assert 3 <= written < expected
    assert not ctx.storage.is_file(ctx.table_path("instances", 0))
    assert not ctx.storage.is_file(ctx.stage_state_path("deidentify", 0))
    # the retry of the same run (Airflow task retry), then the rest of the build
    retried = build(cfg, "run-1")
    assert retried["deidentify"][0]["skipped"] is False
    st, st_clean = retried["ctx"].storage, clean["ctx"].storage
    instances = st.read_table("curated/instances")
    assert instances.num_rows == len(set(instances["sop_key"].to_pylist()))  # no duplicate rows
    assert sorted(p.rsplit("/", 1)[1] for p in st.list_files(ctx.dicom_dir(0))) == sorted(
        f"{k}.dcm" for k in instances["sop_key"].to_pylist()
    )  # no orphan files of the killed attempt
    assert st.list_files("curated") == st_clean.list_files("curated")
    for rel in st_clean.list_files("curated"):
        assert st.read_bytes(rel) == st_clean.read_bytes(rel), rel
    assert retried["summary"]["content_hash"] == clean["summary"]["content_hash"]
    assert retried["ledger"]["balanced"] and retried["ledger"]["ingested"] == clean["ledger"]["ingested"]


def test_build_lock_is_exclusive_and_names_the_holder(tmp_path):
    st = Storage.open(str(tmp_path / "root"))
    with BuildLock(st, owner="run-A"):
        record = json.loads(st.read_text(BUILD_LOCK))
        assert record["owner"] == "run-A" and record["pid"] == os.getpid()
        with pytest.raises(BuildLockHeldError, match=r"owner 'run-A'.*pid " + str(os.getpid())) as err:
            BuildLock(st, owner="run-B").acquire()
        assert err.value.holder["owner"] == "run-A"
    assert not st.is_file(BUILD_LOCK)  # released
    with BuildLock(st, owner="run-B"):
        assert json.loads(st.read_text(BUILD_LOCK))["owner"] == "run-B"


def test_expired_lock_of_a_dead_holder_is_taken_over(tmp_path):
    st = Storage.open(str(tmp_path / "root"))
    stale = BuildLock(st, owner="killed-run", ttl_s=0.5, heartbeat=False).acquire()  # never released
    with pytest.raises(BuildLockHeldError):
        BuildLock(st, owner="run-B").acquire()
    time.sleep(1.1)
    with BuildLock(st, owner="run-B"):
        assert json.loads(st.read_text(BUILD_LOCK))["owner"] == "run-B"
        stale.release()  # the old holder's late release must not remove the new holder's lock
        assert st.is_file(BUILD_LOCK)


def test_heartbeat_keeps_a_live_lock(tmp_path):
    st = Storage.open(str(tmp_path / "root"))
    with BuildLock(st, owner="long-run", ttl_s=0.6):
        first = json.loads(st.read_text(BUILD_LOCK))["expires_at"]
        time.sleep(1.5)  # longer than the ttl: only the heartbeat keeps it valid
        with pytest.raises(BuildLockHeldError):
            BuildLock(st, owner="run-B").acquire()
        assert json.loads(st.read_text(BUILD_LOCK))["expires_at"] > first


RACE = textwrap.dedent("""
    import sys, time
    from etl.pipeline.lock import BuildLock, BuildLockHeldError
    from etl.storage import Storage
    st = Storage.open(sys.argv[1])
    while time.time() < float(sys.argv[2]):
        pass
    try:
        BuildLock(st, owner=sys.argv[3], heartbeat=False).acquire()
        print("won", flush=True)
        time.sleep(5)  # the winner lives on while the others try: a dead holder's lock is taken over at once
    except BuildLockHeldError:
        print("lost")
""")


def test_simultaneous_acquirers_exactly_one_wins(tmp_path):
    start = time.time() + 2.0
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACE, str(tmp_path / "root"), str(start), f"p{i}"],
            cwd=PROJECT_ROOT,
            env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(6)
    ]
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert sorted(outs) == ["lost"] * 5 + ["won"]
    winner = f"p{outs.index('won')}"
    assert json.loads((tmp_path / "root" / BUILD_LOCK).read_text())["owner"] == winner


HOLD = textwrap.dedent("""
    import sys, time
    from etl.pipeline.lock import BuildLock
    from etl.storage import Storage
    BuildLock(Storage.open(sys.argv[1]), owner="medreco build of another.yaml").acquire()
    print("held", flush=True)
    time.sleep(120)
""")


def test_second_medreco_run_fails_fast_naming_the_holder(tmp_path, airflow_home):
    root = tmp_path / "root"
    cfg = config_for(root)
    for inst in yaml.safe_load(cfg.read_text())["institutions"]:  # empty sources: past the source checks
        (root / inst["source_uri"]).mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(root)], cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        run = subprocess.run(
            [sys.executable, "-m", "medreco.cli", "run", "--config", str(cfg)],
            cwd=PROJECT_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        elapsed = time.monotonic() - t0
    finally:
        holder.kill()
        holder.wait()
    assert run.returncode != 0
    msg = run.stdout + run.stderr
    assert "another build holds the lock" in msg and "medreco build of another.yaml" in msg
    assert f"pid {holder.pid}" in msg
    assert not (root / "curated").exists() and not (root / "ledger" / "runs").exists()  # no work was done
    assert elapsed < 120


def test_build_dag_runs_one_at_a_time(airflow_home):
    from dags.medreco_build import build_dag

    assert build_dag.max_active_runs == 1


# ---- issue 19 item 6: the DAG takes the same lock; a dead holder on this host is taken over at once ----------

DAG_HOLD = textwrap.dedent("""
    import sys
    from etl.pipeline.lock import acquire_for_run
    from etl.storage import Storage
    print(acquire_for_run(Storage.open(sys.argv[1]), sys.argv[2]))
""")


def test_lock_of_a_dead_process_on_this_host_is_taken_over_at_once(tmp_path):
    root = tmp_path / "root"
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(root)], cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline().strip() == "held"
    st = Storage.open(str(root))
    with pytest.raises(BuildLockHeldError):  # alive: refused
        BuildLock(st, owner="run-B").acquire()
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    record = json.loads(st.read_text(BUILD_LOCK))
    assert record["pid"] == holder.pid and record["kind"] == "process"  # the killed holder's lock, unexpired
    t0 = time.monotonic()
    with BuildLock(st, owner="run-B"):
        assert json.loads(st.read_text(BUILD_LOCK))["owner"] == "run-B"
    assert time.monotonic() - t0 < 5  # at once, not after the 600 s expiry


def test_dag_run_lock_refuses_a_second_run_and_is_released_by_its_own_run_only(tmp_path):
    from etl.pipeline.lock import acquire_for_run, release_for_run

    root = tmp_path / "root"
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    # the first task of run A ran in a process that has exited since: the lock is the run's, not the process's
    out = subprocess.run(
        [sys.executable, "-c", DAG_HOLD, str(root), "scheduled__A"],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "'adopted': False" in out.stdout
    st = Storage.open(str(root))
    with pytest.raises(BuildLockHeldError, match="DAG run scheduled__A"):
        acquire_for_run(st, "manual__B")
    assert acquire_for_run(st, "scheduled__A") == {"owner": "DAG run scheduled__A", "adopted": False}  # a retry
    assert release_for_run(st, "manual__B") is False and st.is_file(BUILD_LOCK)
    assert release_for_run(st, "scheduled__A") is True and not st.is_file(BUILD_LOCK)
    assert acquire_for_run(st, "manual__B")["adopted"] is False
    assert release_for_run(st, "manual__B")


def test_dag_run_adopts_the_lock_of_medreco_run(tmp_path):
    from etl.pipeline.lock import acquire_for_run, release_for_run

    st = Storage.open(str(tmp_path / "root"))
    with BuildLock(st, owner="medreco build of x.yaml") as cli_lock:
        assert acquire_for_run(st, "manual__X", adopt_token=cli_lock.token)["adopted"] is True
        with pytest.raises(BuildLockHeldError):  # any other token is refused
            acquire_for_run(st, "manual__Y", adopt_token="not-the-token")
        assert release_for_run(st, "manual__X") is False  # the CLI releases its own lock
        assert json.loads(st.read_text(BUILD_LOCK))["token"] == cli_lock.token
    assert not st.is_file(BUILD_LOCK)


def test_concurrent_dag_run_on_one_root_is_refused_at_its_first_task(tmp_path, airflow_home):
    """Two build DAG runs on one root (a scheduler's run holds the lock, an ``airflow dags test`` starts): the
    second fails at ``build_lock``, does no work, and leaves the first run's lock in place."""
    from dags.medreco_build import build_dag
    from etl.pipeline.lock import dag_run_token

    root = tmp_path / "root"
    (root / "sources").mkdir(parents=True)
    cfg = config_for(root)
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    subprocess.run(
        [sys.executable, "-c", DAG_HOLD, str(root), "scheduled__first"],
        cwd=PROJECT_ROOT,
        env=env,
        check=True,
        capture_output=True,
    )
    dagrun = build_dag.test(run_conf={"config": str(cfg)})
    states = {ti.task_id: str(ti.state) for ti in dagrun.get_task_instances()}
    assert str(dagrun.state).endswith("failed")
    assert states["build_lock"].endswith("failed") and states["release_lock"].endswith("success")
    assert all(s.endswith("upstream_failed") for t, s in states.items() if t not in ("build_lock", "release_lock"))
    assert not (root / "curated").exists()
    assert json.loads((root / BUILD_LOCK).read_text())["token"] == dag_run_token("scheduled__first")
