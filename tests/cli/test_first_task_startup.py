"""Issue 40, point 12: a 3-file build showed 13.6 s on its first task, ``build_lock``, whose callable takes
milliseconds. A stack sample of that task (a 3-file ``dag.test()`` build, load 25 on 2 cores: 27 s wall, 5 s CPU)
put the time in Airflow's in-process Execution API: its app built on the first task, and Cadwyn's versioned routers
generated on its first request (the task's ``/run`` call), after the task instance's start was recorded; no wait
for the lock. ``medreco run`` now starts that API and sends it one request before the run (build_lock measured
0.67 s at the same load, the one-time start-up 8 s CPU before the run)."""

from __future__ import annotations

import pytest


def _cadwyn_apps(app) -> list:
    from cadwyn import Cadwyn

    return [a for a in (app, *(getattr(r, "app", None) for r in getattr(app, "routes", []))) if isinstance(a, Cadwyn)]


def test_warm_up_builds_the_in_process_api_and_its_versioned_routers(airflow_home):
    from airflow.sdk.execution_time.supervisor import in_process_api_server

    from medreco.cli.embedded import warm_in_process_api

    assert warm_in_process_api() >= 0
    apps = _cadwyn_apps(in_process_api_server().app)
    assert apps and all(a._cadwyn_initialized for a in apps)  # nothing left for the first task's request


def test_a_dag_test_run_starts_the_api_before_its_first_task(monkeypatch, tmp_path):
    import medreco.cli.embedded as embedded
    from dags.medreco_build import build_dag

    order: list[str] = []

    class Stop(Exception):
        pass

    def fake_test(**kw):
        order.append("dag.test")
        raise Stop

    monkeypatch.setattr(embedded, "warm_in_process_api", lambda: order.append("warm") or 0.0)
    monkeypatch.setattr(build_dag, "test", fake_test)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    with pytest.raises(Stop):
        embedded._run_dag_test({"config": "unused", "build_lock_token": "t"}, None)
    assert order == ["warm", "dag.test"]
