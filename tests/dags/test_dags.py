"""DAG files: they import without errors, stay thin, and wire the stages as documented."""

from __future__ import annotations

import ast

import pytest

from schemas.config import PROJECT_ROOT

DAGS = PROJECT_ROOT / "dags"


@pytest.fixture(scope="module")
def dagbag(airflow_home):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


def test_no_import_errors(dagbag):
    assert dagbag.import_errors == {}
    ids = set(dagbag.dag_ids)
    assert {"medreco_build", "medreco_training"} <= ids
    assert {f"medreco_ingest__{i}" for i in ("us-bos-general", "au-mel-central")} <= ids


def test_build_dag_wiring(dagbag):
    dag = dagbag.get_dag("medreco_build")
    assert dag.max_active_runs == 1
    assert set(dag.task_ids) == {
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
    up = {t: set(dag.get_task(t).upstream_task_ids) for t in dag.task_ids}
    assert up["deidentify"] == {"plan"} and up["normalise"] == {"deidentify", "plan"}
    assert up["reports"] == {"deidentify"} and up["snapshot"] == {"quality"}
    assert up["retrieval"] == {"assemble"} and up["quality"] == {"retrieval", "ledger"}
    # the build lock: taken first (every other task is downstream of it), given back last whatever happened
    assert up["build_lock"] == set() and up["institutions"] == {"build_lock"}
    assert dag.get_task("build_lock").retries == 0
    release = dag.get_task("release_lock")
    assert release.trigger_rule == "all_done" and release.is_teardown and dag.get_task("build_lock").is_setup
    assert up["release_lock"] == set(dag.task_ids) - {"release_lock"}
    assert dag.get_task("snapshot").downstream_task_ids == {"release_lock"}
    from dags.assets import SNAPSHOT_ASSET

    assert [o.uri for o in dag.get_task("snapshot").outlets] == [SNAPSHOT_ASSET.uri]


def test_training_dag_is_scheduled_on_the_snapshot_asset(dagbag):
    dag = dagbag.get_dag("medreco_training")
    assert "medreco://snapshot" in str(dag.timetable.asset_condition)


def test_dag_files_hold_no_business_logic():
    """Thin DAG files: no loops over data, no I/O, no pydicom/pyarrow/polars imports."""
    for f in DAGS.glob("*.py"):
        tree = ast.parse(f.read_text())
        imported = {n.names[0].name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)}
        imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not imported & {"pydicom", "pyarrow", "polars", "numpy", "pandas"}, f.name
        assert "open(" not in f.read_text(), f.name


def test_ingest_check_is_idempotent(tmp_path, key):
    import yaml

    from etl.pipeline.context import BuildContext
    from etl.pipeline.ingest import check_delivery
    from schemas.config import parse_config

    src = tmp_path / "root" / "sources" / "us-a"
    src.mkdir(parents=True)
    (src / "a.dcm").write_bytes(b"not really dicom")
    cfg = parse_config(
        yaml.safe_load(f"""
storage: {{root: {tmp_path / "root"}}}
institutions: [{{id: us-a, country: US, language: en, timezone: America/New_York, source_uri: sources/us-a}}]
""")
    )
    ctx = BuildContext.from_config(cfg, "r1", key)
    assert check_delivery(ctx, "us-a") == {
        "institution": "us-a",
        "files": 1,
        "new_files": 1,
        "removed_files": 0,
        "changed": True,
    }
    assert check_delivery(ctx, "us-a")["changed"] is False
    (src / "b.dcm").write_bytes(b"another")
    again = check_delivery(ctx, "us-a")
    assert (again["new_files"], again["files"], again["changed"]) == (1, 2, True)
