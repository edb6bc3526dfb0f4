"""The training DAG under dag.test(): a snapshot version (as an Asset event carries it) starts both jobs with
the local launcher and the run records their lineage."""

from __future__ import annotations

import json
from types import SimpleNamespace

import yaml
from test_training_data import build_training_snapshot

from schemas.config import PROJECT_ROOT


def test_snapshot_version_comes_from_the_asset_event():
    from training.pipeline import snapshot_from_events

    ev = {
        "medreco://snapshot": [SimpleNamespace(extra={"version": "0.1.0"}), SimpleNamespace(extra={"version": "0.2.0"})]
    }
    assert snapshot_from_events(ev) == "0.2.0"
    assert snapshot_from_events({}) is None and snapshot_from_events(None) is None


def test_training_dag_runs_both_jobs_locally_and_records_lineage(tmp_path, airflow_home):
    root = tmp_path / "root"
    st = build_training_snapshot(root)
    cfgs = {}
    for kind in ("encoder", "vlm"):
        job = yaml.safe_load((PROJECT_ROOT / f"config/training/{kind}-tiny-cpu.yaml").read_text())
        job["optim"].update(max_steps=6, checkpoint_every=6)
        job["output_dir"] = str(tmp_path / "models")
        if kind == "vlm":
            job["data"]["max_eval_items"] = 8
        cfgs[kind] = tmp_path / f"{kind}.yaml"
        cfgs[kind].write_text(yaml.safe_dump(job))
    pipe = {
        "storage": {"root": str(root)},
        "institutions": [
            {
                "id": "inst-a",
                "country": "US",
                "language": "en",
                "timezone": "America/New_York",
                "source_uri": "sources/a",
            }
        ],
        "training": {"launcher": "local", "encoder_config": str(cfgs["encoder"]), "vlm_config": str(cfgs["vlm"])},
    }
    (tmp_path / "pipe.yaml").write_text(yaml.safe_dump(pipe))
    from dags.medreco_training import training_dag

    run = training_dag.test(run_conf={"config": str(tmp_path / "pipe.yaml"), "snapshot": "0.1.0"})
    assert str(run.state).endswith("success")
    record = json.loads(st.read_text("reports/training/0.1.0.json"))
    from training.data import open_snapshot

    assert record["snapshot_version"] == "0.1.0" and record["content_hash"] == open_snapshot(st).content_hash
    assert set(record["jobs"]) == {"encoder", "vlm"}
    for kind, job in record["jobs"].items():
        assert job["launcher"] == "local" and job["status"] == "succeeded"
        lin = job["lineage_record"]
        assert lin["snapshot_version"] == "0.1.0" and lin["metrics"]["step"] == 6
        assert lin["checkpoint"].endswith(f"{kind}/0.1.0/{kind}-tiny-cpu/checkpoints/last.pt")
    assert record["jobs"]["vlm"]["lineage_record"]["metrics"]["eval"]["val"]["n_items"] == 8
