"""The training DAG: its order (the VLM after the encoder when its vision tower starts from the encoder job of the
same snapshot, else both at once), and a run under dag.test(): a snapshot version (as an Asset event carries it)
starts both jobs with the local launcher, the VLM's vision tower starts from the encoder's checkpoint, and the run
records their lineage."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
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


def _pipeline(tmp_path, root, cfgs: dict) -> str:
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
    path = tmp_path / "pipe.yaml"
    path.write_text(yaml.safe_dump(pipe))
    return str(path)


def _job_configs(tmp_path, vision_init: str | None) -> dict:
    """The tiny job configs (6 steps); the VLM's vision tower shaped as the encoder's backbone."""
    cfgs = {}
    enc = yaml.safe_load((PROJECT_ROOT / "config/training/encoder-tiny-cpu.yaml").read_text())
    for kind in ("encoder", "vlm"):
        job = yaml.safe_load((PROJECT_ROOT / f"config/training/{kind}-tiny-cpu.yaml").read_text())
        job["optim"].update(max_steps=6, checkpoint_every=6)
        job["output_dir"] = str(tmp_path / "models")
        if kind == "vlm":
            job["data"]["max_eval_items"] = 8
            job["model"]["vision"]["backbone"] = enc["model"]["backbone"]
            if vision_init:
                job["model"]["vision_init"] = vision_init
        cfgs[kind] = tmp_path / f"{kind}.yaml"
        cfgs[kind].write_text(yaml.safe_dump(job))
    return cfgs


def _upstream(dag) -> dict[str, set[str]]:
    return {tid: set(t.upstream_task_ids) for tid, t in dag.task_dict.items()}


@pytest.mark.parametrize(
    ("vision_init", "ordered"),
    [(None, False), ("encoder", True), ("encoder/encoder-tiny-cpu:best", True), ("/models/enc/last.pt", False)],
)
def test_vlm_waits_for_the_encoder_only_when_its_vision_starts_from_it(tmp_path, airflow_home, vision_init, ordered):
    # airflow_home: the DAG module imports Airflow, which must see the session's AIRFLOW_HOME from its first import
    from dags.medreco_training import build_training_dag
    from training.vision_init import vlm_after_encoder

    pipe = _pipeline(tmp_path, tmp_path / "root", _job_configs(tmp_path, vision_init))
    assert vlm_after_encoder(pipe) is ordered
    up = _upstream(build_training_dag(vlm_after_encoder(pipe)))
    assert up["launch_encoder"] == set() and up["wait_encoder"] == {"launch_encoder"}
    assert up["wait_vlm"] == {"launch_vlm"} and up["record"] == {"wait_encoder", "wait_vlm"}
    assert up["launch_vlm"] == ({"wait_encoder"} if ordered else set())


def test_an_unreadable_pipeline_config_leaves_the_jobs_parallel(tmp_path):
    from training.vision_init import vlm_after_encoder

    assert vlm_after_encoder(tmp_path / "missing.yaml") is False


def test_training_dag_runs_the_vlm_from_the_encoder_and_records_lineage(tmp_path, airflow_home):
    from dags.medreco_training import build_training_dag
    from training.vision_init import VisionInitError, resolve_vision_init, vlm_after_encoder

    root = tmp_path / "root"
    st = build_training_snapshot(root)
    cfgs = _job_configs(tmp_path, "encoder")
    pipe = _pipeline(tmp_path, root, cfgs)
    from training.pipeline import start_job

    with pytest.raises(VisionInitError, match="no encoder job has finished on snapshot 0.1.0"):
        start_job("vlm", pipe, "0.1.0")  # refused ahead of the launch: no encoder yet
    from etl import zones
    from quality.checks import QualityReport
    from quality.dashboard import build_dashboard, stamp_release
    from training.data import open_snapshot

    pages = build_dashboard({}, QualityReport(), {"run_id": "r1"}, tmp_path / "pages").parent
    for page in pages.glob("*.html"):  # the build's dashboard of release 0.1.0
        st.write_bytes(f"{zones.DASHBOARD_DIR}/{page.name}", page.read_bytes())
    stamp_release(st, "0.1.0", open_snapshot(st).content_hash)
    dag = build_training_dag(vlm_after_encoder(pipe))
    run = dag.test(run_conf={"config": pipe, "snapshot": "0.1.0"})
    assert str(run.state).endswith("success")
    record = json.loads(st.read_text("reports/training/0.1.0.json"))
    assert record["snapshot_version"] == "0.1.0" and record["content_hash"] == open_snapshot(st).content_hash
    assert set(record["jobs"]) == {"encoder", "vlm"}
    for kind, job in record["jobs"].items():
        assert job["launcher"] == "local" and job["status"] == "succeeded"
        lin = job["lineage_record"]
        assert lin["snapshot_version"] == "0.1.0" and lin["metrics"]["step"] == 6
        assert lin["checkpoint"].endswith(f"{kind}/0.1.0/{kind}-tiny-cpu/checkpoints/last.pt")
    enc_ckpt = record["jobs"]["encoder"]["lineage_record"]["checkpoint"]
    vlm = record["jobs"]["vlm"]["lineage_record"]
    assert vlm["metrics"]["eval"]["val"]["n_items"] == 8
    # the VLM's lineage names the encoder checkpoint it started from (no best metric kept: last.pt)
    assert vlm["vision_init"] == {
        "ref": "encoder",
        "checkpoint": enc_ckpt,
        "encoder_record": "reports/training/0.1.0/encoder-encoder-tiny-cpu.json",
        "encoder_step": 6,
    }
    assert vlm["config"]["model"]["vision_init"] == enc_ckpt
    # the record task filled the dashboard's Training page with this run's cells
    html = st.read_text(f"{zones.DASHBOARD_DIR}/training.html")
    assert "Training on release 0.1.0" in html and 'id="training-pending"' not in html
    enc_val = record["jobs"]["encoder"]["lineage_record"]["metrics"]["eval"]["val"]
    names = ["R@1", "R@3", "R@5", "R@10", "NDCG@10"]  # the tiny config's recall_ks, in the page's column order
    assert set(enc_val["cells_mean"]) == set(names) and len(enc_val["cells"]) == 12
    assert "".join(f'<th class="num">{n}</th>' for n in names) in html
    for key, c in enc_val["cells"].items():
        fam, cat = key.split("|")
        nums = "".join(f'<td class="num">{"–" if c[n] is None else f"{c[n]:.3f}"}</td>' for n in names)
        assert (
            f'<td>{fam}</td><td>{cat}</td><td class="num">{c["n_queries"]}</td><td class="num">{c["gallery"]}</td>'
            + nums
            in html
        )
    assert any(c["n_queries"] for c in enc_val["cells"].values())
    vqa_val = vlm["metrics"]["eval"]["val"]
    for fam, v in vqa_val["by_family"].items():
        assert (
            f'<tr><td>{fam}</td><td class="num">{v["n_mc"]}</td><td class="num">{v["mc_accuracy"]:.3f}</td></tr>'
            in html
        )
    with pytest.raises(VisionInitError, match="kept no best checkpoint"):
        resolve_vision_init("encoder:best", st, "0.1.0")
    with pytest.raises(VisionInitError, match="encoder job other has no lineage record for snapshot 0.1.0"):
        resolve_vision_init("encoder/other", st, "0.1.0")

    # a VLM built with that vision start holds the trained encoder's vision weights
    from training.config import load_job_config
    from training.tasks import VLMTask

    job = load_job_config(cfgs["vlm"])
    got = resolve_vision_init(job.model.vision_init, st, "0.1.0")
    assert got["checkpoint"] == enc_ckpt
    job = job.model_copy(update={"model": job.model.model_copy(update={"vision_init": got["checkpoint"]})})
    model = VLMTask(job, open_snapshot(st), tmp_path / "fresh").build_model()
    enc = torch.load(enc_ckpt, map_location="cpu", weights_only=False)
    vision = model.vision.state_dict()
    copied = [k for k in vision if not k.startswith("pool.queries")]
    assert len(copied) > 20 and any(k.startswith("tokens.backbone.") for k in copied)
    for k in copied:
        assert torch.equal(vision[k], enc["model"][k]), k
    # entity queries by entity id (the same ids here), so the whole table
    assert enc["task"]["entity_ids"] == ["F001", "F002", "F003"]
    assert torch.equal(vision["pool.queries.weight"], enc["model"]["pool.queries.weight"])
