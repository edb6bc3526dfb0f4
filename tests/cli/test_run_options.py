"""``medreco run`` options: --workers (default: the machine's cores; at least 1) and --quiet."""

from __future__ import annotations

import os

from typer.testing import CliRunner

from medreco.cli.app import app


def test_workers_default_is_the_machines_cores_and_zero_is_refused():
    run = next(c for c in app.registered_commands if c.name == "run" or c.callback.__name__ == "run")
    import inspect

    default = inspect.signature(run.callback).parameters["workers"].default.default
    assert default == (os.cpu_count() or 1)
    result = CliRunner().invoke(app, ["run", "--workers", "0"])
    assert result.exit_code != 0 and "--workers" in result.output


def test_demo_keeps_dag_test_by_default():
    demo = next(c for c in app.registered_commands if c.callback.__name__ == "demo")
    import inspect

    assert inspect.signature(demo.callback).parameters["workers"].default.default == 1


def test_run_without_a_key_fails_before_any_work_whatever_the_workers(tmp_path, monkeypatch):
    from helpers import demo_config_with_empty_sources

    monkeypatch.delenv("MEDRECO_PSEUDONYM_KEY", raising=False)
    monkeypatch.delenv("AIRFLOW_CONN_MEDRECO_PSEUDONYM", raising=False)
    result = CliRunner().invoke(
        app, ["run", "--workers", "2", "--config", str(demo_config_with_empty_sources(tmp_path))]
    )
    assert result.exit_code == 1 and "MEDRECO_PSEUDONYM_KEY" in result.output
