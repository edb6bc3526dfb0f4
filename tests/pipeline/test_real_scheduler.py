"""The build DAG under a real Airflow 3 deployment on this machine: PostgreSQL metadata database, Redis
broker, CeleryExecutor; api-server (REST and Execution API), scheduler, dag-processor and one Celery worker
run as subprocesses. The run is triggered and watched through the REST API, and its snapshot must equal
the embedded ``dag.test()`` run's (same content hash, rows and table bytes) on the same corpus, config
and key.

Every process is started in its own process group and stopped by that group id (SIGINT, then SIGTERM,
then SIGKILL); the fresh database ``medreco_it_<pid>`` is dropped and the run's Redis keys are deleted at
the end. Skips with a one-line reason where PostgreSQL or Redis is unreachable.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from schemas.config import PROJECT_ROOT

pytestmark = [pytest.mark.services, pytest.mark.slow]
VENV_BIN = Path(sys.executable).parent
PG_HOST = os.environ.get("PGHOST", "127.0.0.1")
PG_PORT = int(os.environ.get("PGPORT", "5432"))
PG_USER = os.environ.get("PGUSER", "postgres")
REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
DAG_ID = "medreco_build"
STARTUP_TIMEOUT_S = 420  # 2 shared cores: each Airflow component imports for 10-40 s
RUN_TIMEOUT_S = 1200


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ProcessGroups:
    """Subprocesses started in their own sessions, stopped by process-group id."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, args: list[str], env: dict, cwd: Path) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115  closed with the process
        proc = subprocess.Popen(args, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.procs[name] = proc
        return proc

    def tail(self, name: str, n: int = 40) -> str:
        path = self.log_dir / f"{name}.log"
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        return f"--- {name} (last {n} lines) ---\n" + "\n".join(lines[-n:])

    def dead(self) -> list[str]:
        return [name for name, p in self.procs.items() if p.poll() is not None]

    @staticmethod
    def _group_alive(pgid: int) -> bool:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        # a group that holds only zombies is gone for our purposes
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
        return False

    def stop(self, name: str) -> bool:
        """Stop one group: SIGINT, then SIGTERM, then SIGKILL. Returns True when nothing of it is left."""
        proc = self.procs[name]
        pgid = proc.pid  # start_new_session: the leader's pid is the group id
        for sig, grace in ((signal.SIGINT, 20), (signal.SIGTERM, 15), (signal.SIGKILL, 10)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                proc.poll()
                if not self._group_alive(pgid):
                    break
                time.sleep(0.5)
            else:
                continue
            break
        proc.poll()
        return not self._group_alive(pgid)

    def stop_all(self) -> list[str]:
        """Stop every group, newest first; names of the groups that would not die."""
        return [name for name in reversed(list(self.procs)) if not self.stop(name)]


class Api:
    """Minimal client for Airflow's REST API (SimpleAuthManager, all users admin)."""

    def __init__(self, base: str):
        self.base = base.rstrip("/")
        self.token: str | None = None

    def request(self, method: str, path: str, body: dict | None = None, timeout: float = 30) -> tuple[int, dict]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw = resp.read()
                return resp.status, (json.loads(raw) if raw else {})
        except urllib.error.HTTPError as err:
            raw = err.read()
            try:
                return err.code, json.loads(raw)
            except ValueError:
                return err.code, {"detail": raw.decode(errors="replace")[:500]}

    def login(self) -> None:
        status, body = self.request("GET", "/auth/token")
        assert status in (200, 201), f"token: {status} {body}"
        self.token = body["access_token"]


def _wait(what: str, check, timeout: float, groups: ProcessGroups, interval: float = 2.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dead = groups.dead()
        if dead:
            pytest.fail(
                f"{', '.join(dead)} exited while waiting for {what}\n" + "\n".join(groups.tail(n) for n in dead)
            )
        try:
            result = check()
        except (OSError, urllib.error.URLError):
            result = None
        if result:
            return result
        time.sleep(interval)
    pytest.fail(
        f"timed out after {timeout:.0f} s waiting for {what}\n" + "\n".join(groups.tail(n) for n in groups.procs)
    )


def _task_errors(home: Path, task_ids: set[str]) -> str:
    """The error events of the last attempt of each failed task (Airflow 3 task logs are JSON lines)."""
    out = []
    for task_id in sorted(task_ids):
        logs = sorted(home.glob(f"logs/dag_id={DAG_ID}/run_id=*/task_id={task_id}/**/attempt=*.log"))
        for line in logs[-1].read_text(errors="replace").splitlines() if logs else []:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("level") == "error":
                detail = event.get("error_detail") or [{}]
                frames = detail[0].get("frames", [])[-3:]
                out.append(
                    f"{task_id}: {event.get('event')} {detail[0].get('exc_type', '')}: "
                    f"{detail[0].get('exc_value', '')} at "
                    + " <- ".join(f"{f['filename']}:{f['lineno']}" for f in reversed(frames))
                )
    return "\n".join(out) or "(no task error events found)"


def _config(root_dir: Path, corpus: Path) -> Path:
    """Config with the storage root given relative to the config file, so both runs' configs (and config
    hashes) are identical while their roots differ."""
    shutil.copytree(corpus / "sources", root_dir / "root" / "sources")
    data = yaml.safe_load((PROJECT_ROOT / "config" / "demo.yaml").read_text())
    data["storage"] = {"root": "root"}
    data["shard_count"] = 4
    data["max_map_length"] = 2  # 4 shards in 2 mapped tasks of 2
    path = root_dir / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def services():
    missing = [
        f"{name} ({host}:{port})"
        for name, host, port in (("PostgreSQL", PG_HOST, PG_PORT), ("Redis", REDIS_HOST, REDIS_PORT))
        if not _reachable(host, port)
    ]
    if missing:
        pytest.skip(f"needs PostgreSQL and Redis; unreachable: {', '.join(missing)}")
    from importlib import metadata

    # by distribution metadata: importing Airflow here would configure it before AIRFLOW_HOME is set
    for dist in ("apache-airflow-providers-celery", "celery", "redis", "psycopg2-binary", "asyncpg"):
        try:
            metadata.version(dist)
        except metadata.PackageNotFoundError:
            pytest.fail(
                f"{dist} is not installed: it is pinned in pyproject.toml (CeleryExecutor on PostgreSQL needs it)"
            )


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rs_corpus")
    proc = subprocess.run(
        [str(VENV_BIN / "medreco"), "demo-corpus", str(out), "--seed", "5", "--patients", "8"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=PROJECT_ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def scheduled(services, corpus, tmp_path_factory):
    """One build run through the real deployment; yields what the tests read."""
    import psycopg2
    import redis

    work = tmp_path_factory.mktemp("rs_sched")
    cfg = _config(work, corpus)
    home = work / "airflow_home"
    home.mkdir()
    db = f"medreco_it_{os.getpid()}"
    queue = db
    api_port, log_port = _free_port(), _free_port()
    redis_db = 15
    pg_url = f"postgresql+psycopg2://{PG_USER}@{PG_HOST}:{PG_PORT}/{db}"

    admin = psycopg2.connect(host=PG_HOST, port=PG_PORT, user=PG_USER, dbname="postgres")
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{db}"')
        cur.execute(f'CREATE DATABASE "{db}"')

    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "PYTHONPATH": str(PROJECT_ROOT),
            "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
            "MEDRECO_CONFIG": str(cfg),
            "MEDRECO_PSEUDONYM_KEY": os.environ["MEDRECO_PSEUDONYM_KEY"],  # the session's test key (conftest)
            "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT_ROOT / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": "4",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",  # the @daily ingestion DAGs stay paused
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{api_port}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__CORE__FERNET_KEY": "",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": pg_url,
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(api_port),
            "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{api_port}",
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
            "AIRFLOW__CELERY__BROKER_URL": f"redis://{REDIS_HOST}:{REDIS_PORT}/{redis_db}",
            "AIRFLOW__CELERY__RESULT_BACKEND": f"db+postgresql+psycopg2://{PG_USER}@{PG_HOST}:{PG_PORT}/{db}",
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": "2",
            "AIRFLOW__OPERATORS__DEFAULT_QUEUE": queue,
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(log_port),
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
        }
    )
    airflow = str(VENV_BIN / "airflow")
    groups = ProcessGroups(work)
    rds = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=redis_db)
    result: dict = {"config": cfg, "queue": queue, "db": db}
    try:
        t0 = time.monotonic()
        mig = subprocess.run([airflow, "db", "migrate"], env=env, cwd=work, capture_output=True, text=True, timeout=900)
        assert mig.returncode == 0, f"airflow db migrate failed:\n{mig.stdout[-2000:]}\n{mig.stderr[-3000:]}"
        result["migrate_s"] = time.monotonic() - t0

        groups.start(
            "api-server",
            [airflow, "api-server", "--host", "127.0.0.1", "--port", str(api_port), "--workers", "1"],
            env,
            work,
        )
        groups.start("scheduler", [airflow, "scheduler"], env, work)
        groups.start("dag-processor", [airflow, "dag-processor"], env, work)
        groups.start(
            "celery-worker",
            [
                airflow,
                "celery",
                "worker",
                "--queues",
                queue,
                "--concurrency",
                "2",
                "--skip-serve-logs",
                "--without-gossip",
                "--without-mingle",
                "--celery-hostname",
                f"{queue}@%h",
            ],
            env,
            work,
        )
        result["pids"] = {n: p.pid for n, p in groups.procs.items()}
        api = Api(f"http://127.0.0.1:{api_port}")
        _wait(
            "the api-server",
            lambda: api.request("GET", "/api/v2/monitor/health", timeout=5)[0] == 200,
            STARTUP_TIMEOUT_S,
            groups,
        )
        api.login()
        _wait(
            f"the dag-processor to register {DAG_ID}",
            lambda: api.request("GET", f"/api/v2/dags/{DAG_ID}")[0] == 200,
            STARTUP_TIMEOUT_S,
            groups,
        )
        status, body = api.request("PATCH", f"/api/v2/dags/{DAG_ID}", {"is_paused": False})
        assert status == 200 and body["is_paused"] is False, body
        status, run = api.request(
            "POST", f"/api/v2/dags/{DAG_ID}/dagRuns", {"logical_date": None, "conf": {"config": str(cfg)}}
        )
        assert status == 200, run
        run_id = run["dag_run_id"]
        t1 = time.monotonic()

        def finished():
            st, body = api.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}", timeout=10)
            return body if st == 200 and body.get("state") in ("success", "failed") else None

        final = _wait(f"run {run_id} to finish", finished, RUN_TIMEOUT_S, groups, interval=3)
        result["run_s"] = time.monotonic() - t1
        status, tis = api.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances?limit=100")
        assert status == 200, tis
        result.update(run=final, run_id=run_id, task_instances=tis["task_instances"])
        status, events = api.request("GET", f"/api/v2/assets/events?source_dag_id={DAG_ID}&limit=100")
        assert status == 200, events
        result["asset_events"] = [e for e in events["asset_events"] if e.get("source_run_id") == run_id]
        result["all_asset_events"] = events["asset_events"]
        if final["state"] != "success":
            failed = [(t["task_id"], t["map_index"]) for t in result["task_instances"] if t["state"] != "success"]
            pytest.fail(
                f"run {run_id} ended {final['state']}; not successful: {failed}\n"
                + _task_errors(home, {t for t, _ in failed})
            )
        result["worker_log"] = (work / "celery-worker.log").read_text(errors="replace")
    finally:
        result["left_running"] = groups.stop_all()
        with admin.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (db,))
            cur.execute(f'DROP DATABASE IF EXISTS "{db}"')
            cur.execute("SELECT count(*) FROM pg_database WHERE datname = %s", (db,))
            result["db_left"] = cur.fetchone()[0]
        admin.close()
        keys = [k for k in rds.scan_iter(match=f"*{queue}*")]
        if keys:
            rds.delete(*keys)
        rds.close()
    result["storage_root"] = work / "root"
    yield result


@pytest.fixture(scope="module")
def embedded(corpus, tmp_path_factory, airflow_home):
    """The same corpus/config/key through the embedded ``dag.test()`` runner."""
    from medreco.cli.embedded import run_build

    work = tmp_path_factory.mktemp("rs_embedded")
    return run_build(_config(work, corpus))


def test_every_task_ran_on_the_celery_worker(scheduled):
    tis = scheduled["task_instances"]
    assert tis and all(t["state"] == "success" for t in tis), [(t["task_id"], t["state"]) for t in tis]
    assert {t["queue"] for t in tis} == {scheduled["queue"]}
    by_task: dict[str, list[int]] = {}
    for t in tis:
        by_task.setdefault(t["task_id"], []).append(t["map_index"])
    # 8 institutions discovered in 8 mapped tasks; 4 shards batched into 2 mapped tasks (max_map_length 2)
    assert sorted(by_task["discover"]) == list(range(8))
    for stage in ("deidentify", "normalise", "entities", "assemble"):
        assert sorted(by_task[stage]) == [0, 1], stage
    for single in ("institutions", "plan", "reports", "ledger", "quality", "snapshot"):
        assert by_task[single] == [-1], single
    # the Celery worker (not a local executor) received the tasks: it logs each one it accepts
    assert scheduled["worker_log"].count("execute_workload") >= len(tis)


def test_snapshot_asset_emitted(scheduled):
    events = [
        e for e in scheduled["asset_events"] if e.get("name") == "medreco://snapshot"
    ]  # uri is normalised (".../")
    assert len(events) == 1, scheduled["all_asset_events"]
    assert events[0]["extra"]["version"] == "0.1.0"


def test_snapshot_equals_embedded_run(scheduled, embedded):
    from etl.snapshots import list_versions, read_manifest, read_publish_log, verify
    from etl.storage import Storage

    st = Storage.open(str(scheduled["storage_root"]))
    assert list_versions(st) == ["0.1.0"]
    assert verify(st, "0.1.0") == []
    manifest = read_manifest(st, "0.1.0")
    assert manifest["content_hash"] == embedded["content_hash"]
    assert {t: v["rows"] for t, v in manifest["tables"].items()} == embedded["tables"]
    assert sum(embedded["tables"].values()) > 0
    summary = json.loads(st.read_text(f"reports/history/{read_publish_log(st, '0.1.0')['publish_run_id']}.json"))
    assert summary["ledger"] == embedded["ledger"] and summary["ledger"]["balanced"] is True
    events = [
        e for e in scheduled["asset_events"] if e.get("name") == "medreco://snapshot"
    ]  # uri is normalised (".../")
    assert events and events[0]["extra"]["content_hash"] == embedded["content_hash"]


def test_everything_started_is_cleaned_up(scheduled):
    assert scheduled["left_running"] == []
    for name, pid in scheduled["pids"].items():
        assert not ProcessGroups._group_alive(pid), name
    assert scheduled["db_left"] == 0
