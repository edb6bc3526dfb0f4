"""Quiet, honest output of the ``medreco`` entry point (:mod:`medreco.cli.output`): libraries' deprecation warnings
filtered there (and only there), Airflow's harmless "XCom not found" line dropped, the demo's training metrics
printed with what they are."""

from __future__ import annotations

import os
import subprocess
import sys

from medreco.cli.app import _print_training
from schemas.config import PROJECT_ROOT

#: imports an Airflow provider module that warns "determine_kwargs ... is deprecated" as it loads
AIRFLOW_IMPORT = """
import os, sys
from medreco.cli import output
if sys.argv[1] == "quiet":
    output.quiet_entry_point()
    output.after_airflow_setup()
import airflow.providers.standard.sensors.python  # noqa
import warnings
warnings.warn_explicit("our own deprecation", DeprecationWarning, "x.py", 1, module="etl.somewhere")
"""


def run_python(code: str, *args: str, tmp_path) -> str:
    env = {
        **os.environ,
        "PYTHONPATH": str(PROJECT_ROOT),
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "PYTHONWARNINGS": "default",
    }
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout + proc.stderr


def test_entry_point_filters_library_deprecations_and_keeps_ours(tmp_path):
    loud = run_python(AIRFLOW_IMPORT, "loud", tmp_path=tmp_path)
    assert "determine_kwargs" in loud  # without the entry point's filters the library warning shows
    quiet = run_python(AIRFLOW_IMPORT, "quiet", tmp_path=tmp_path)
    assert "determine_kwargs" not in quiet and "deprecated" not in quiet.replace("our own deprecation", "")
    assert "our own deprecation" in quiet


def test_xcom_not_found_line_is_dropped_and_other_errors_kept(monkeypatch, capsys):
    from airflow.sdk.api import client

    from medreco.cli import output

    lines: list[str] = []

    class Log:
        def error(self, event, **kw):
            lines.append(event)

        def warning(self, event, **kw):
            lines.append(event)

    monkeypatch.setattr(client, "log", Log())  # restored after the test: other tests see Airflow's own logger
    output.suppress_harmless_airflow_lines()
    output.suppress_harmless_airflow_lines()  # idempotent: one wrapper
    client.log.error("XCom not found", dag_id="d", key="return_value")
    client.log.error("Server error", status_code=500)
    client.log.warning("XCom not found")  # only the error line is the known-harmless one
    assert lines == ["Server error", "XCom not found"]
    assert not isinstance(client.log._log, type(client.log))


def test_demo_training_metrics_carry_the_smoke_test_note(capsys):
    record = {
        "snapshot_version": "0.1.0",
        "content_hash": "cd" * 32,
        "jobs": {
            "vlm": {"status": "succeeded", "lineage_record": {"metrics": {"eval": {"test": {"mc_accuracy": 0.0}}}}}
        },
    }
    _print_training(record, 47)
    out = capsys.readouterr().out
    assert "test.mc_accuracy=0.000" in out
    assert "demo metrics mean nothing: a tiny CPU model trained for a few steps on 47 patients is a smoke test" in out
