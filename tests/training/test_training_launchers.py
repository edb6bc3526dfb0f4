"""Launchers: the Kubernetes Job spec and the SageMaker request field by field (moto), the local command,
launcher precedence, the DDP path (torchrun, gloo, 2 CPU processes) and the CLI."""

from __future__ import annotations

import json

import pytest
import yaml
from test_training_data import build_training_snapshot

from schemas.config import PROJECT_ROOT
from training.config import KubernetesConfig, LaunchConfig, SageMakerConfig, load_job_config
from training.launchers import LaunchRequest

HASH = "ab" * 32
REQ = LaunchRequest(
    job="encoder",
    name="encoder-vitb16",
    snapshot_version="1.4.0",
    content_hash=HASH,
    job_config="config/training/encoder-gpu.yaml",
    pipeline_config="/etc/medreco/prod.yaml",
)


def test_kubernetes_job_spec_field_by_field():
    from training.launchers import render_k8s_job, validate_k8s_job

    gpu = load_job_config(PROJECT_ROOT / "config/training/encoder-gpu.yaml")
    spec = render_k8s_job(REQ, gpu.launch.kubernetes, gpu.launch.nproc_per_node)
    assert validate_k8s_job(spec) == []
    assert (spec["apiVersion"], spec["kind"]) == ("batch/v1", "Job")
    md = spec["metadata"]
    assert md["name"] == "medreco-encoder-encoder-vitb16-1-4-0" and md["namespace"] == "medreco"
    assert md["labels"]["medreco.org/snapshot-version"] == "1.4.0"
    assert md["annotations"]["medreco.org/snapshot-content-hash"] == HASH
    assert spec["spec"]["backoffLimit"] == 2 and spec["spec"]["ttlSecondsAfterFinished"] == 86400
    pod = spec["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    (c,) = pod["containers"]
    assert c["image"] == "registry.example.org/medreco-db-train:latest"
    assert c["command"] == ["torchrun"]
    assert c["args"] == [
        "--standalone",
        "--nproc-per-node=8",
        "-m",
        "training.jobs",
        "encoder",
        "--snapshot",
        "1.4.0",
        "--config",
        "config/training/encoder-gpu.yaml",
        "--root",
        "/data",
        "--output",
        "/models",
    ]
    assert (
        c["resources"]["requests"]
        == c["resources"]["limits"]
        == {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8"}
    )
    assert {"name": "MEDRECO_SNAPSHOT_VERSION", "value": "1.4.0"} in c["env"]
    assert {m["name"]: m["mountPath"] for m in c["volumeMounts"]} == {
        "data": "/data",
        "models": "/models",
        "dshm": "/dev/shm",
    }
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["data"]["persistentVolumeClaim"] == {"claimName": "medreco-data"}
    assert vols["models"]["persistentVolumeClaim"] == {"claimName": "medreco-models"}
    assert vols["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}
    yaml.safe_load(yaml.safe_dump(spec))  # serialisable as a manifest


def test_kubernetes_validation_finds_broken_fields():
    from training.launchers import render_k8s_job, validate_k8s_job

    spec = render_k8s_job(REQ, KubernetesConfig(gpus=2))
    c = spec["spec"]["template"]["spec"]["containers"][0]
    spec["metadata"]["name"] = "Medreco_Job"
    spec["spec"]["template"]["spec"]["restartPolicy"] = "Always"
    c["resources"]["limits"]["nvidia.com/gpu"] = "1"
    c["resources"]["requests"]["memory"] = "lots"
    c["image"] = ""
    c["volumeMounts"].append({"name": "scratch", "mountPath": "/scratch"})
    problems = validate_k8s_job(spec)
    assert problems == [
        "metadata.name 'Medreco_Job' is not a DNS-1123 label",
        "spec.template.spec.restartPolicy must be Never or OnFailure",
        "container 'train' has no image",
        "requests.memory 'lots' is not a quantity",
        "nvidia.com/gpu requests must equal limits",
        "volumeMount 'scratch' names no volume",
    ]


def test_sagemaker_request_field_by_field_against_moto():
    boto3 = pytest.importorskip("boto3")
    from moto import mock_aws

    from training.launchers import launch_sagemaker, poll, sagemaker_request

    sm = SageMakerConfig(instance_type="ml.p4d.24xlarge", storage_root="s3://medreco-prod")
    body = sagemaker_request(REQ, sm, nproc_per_node=8)
    assert body["TrainingJobName"] == f"medreco-encoder-encoder-vitb16-1-4-0-{HASH[:8]}"
    assert len(body["TrainingJobName"]) <= 63
    algo = body["AlgorithmSpecification"]
    assert algo["TrainingImage"] == sm.image_uri and algo["TrainingInputMode"] == "File"
    assert algo["ContainerEntrypoint"] == ["torchrun", "--standalone", "--nproc-per-node=8", "-m", "training.jobs"]
    assert algo["ContainerArguments"] == [
        "encoder",
        "--snapshot",
        "1.4.0",
        "--config",
        "config/training/encoder-gpu.yaml",
        "--root",
        "s3://medreco-prod",
        "--output",
        "/opt/ml/checkpoints",
    ]
    prefix = "s3://medreco-db/models/encoder/1.4.0/encoder-vitb16"
    assert body["OutputDataConfig"] == {"S3OutputPath": f"{prefix}/output"}
    assert body["CheckpointConfig"] == {"S3Uri": f"{prefix}/checkpoints", "LocalPath": "/opt/ml/checkpoints"}
    assert body["ResourceConfig"] == {"InstanceType": "ml.p4d.24xlarge", "InstanceCount": 1, "VolumeSizeInGB": 100}
    assert body["StoppingCondition"] == {"MaxRuntimeInSeconds": 86400}
    assert {"Key": "medreco:snapshot-version", "Value": "1.4.0"} in body["Tags"]
    with mock_aws():
        client = boto3.client("sagemaker", region_name="us-east-1")
        handle = launch_sagemaker(REQ, LaunchConfig(launcher="sagemaker", sagemaker=sm, nproc_per_node=8), client)
        assert handle["status"] == "running" and handle["arn"].endswith(body["TrainingJobName"])
        desc = client.describe_training_job(TrainingJobName=body["TrainingJobName"])
        assert desc["RoleArn"] == sm.role_arn
        assert desc["AlgorithmSpecification"]["TrainingImage"] == sm.image_uri
        assert desc["ResourceConfig"]["InstanceType"] == "ml.p4d.24xlarge"
        assert desc["OutputDataConfig"]["S3OutputPath"] == f"{prefix}/output"
        assert desc["StoppingCondition"]["MaxRuntimeInSeconds"] == 86400  # (moto does not echo Environment)
        assert poll({**handle, "launcher": "sagemaker"}) in ("running", "succeeded")


def test_launcher_precedence_and_local_command():
    from schemas.config import TrainingConfig
    from training.config import effective_launch
    from training.launchers import local_command

    job = load_job_config(PROJECT_ROOT / "config/training/encoder-gpu.yaml")
    assert effective_launch(job).launcher == "kubernetes"
    eff = effective_launch(job, TrainingConfig(launcher="sagemaker", image="reg/img:2", gpus=4))
    assert (eff.launcher, eff.kubernetes.image, eff.kubernetes.gpus, eff.kubernetes.namespace) == (
        "sagemaker",
        "reg/img:2",
        4,
        "medreco",
    )
    assert effective_launch(job, TrainingConfig(launcher="sagemaker"), "local").launcher == "local"
    cmd = local_command(REQ, LaunchConfig(nproc_per_node=2))
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    assert cmd[-6:] == [
        "--snapshot",
        "1.4.0",
        "--config",
        "config/training/encoder-gpu.yaml",
        "--pipeline-config",
        "/etc/medreco/prod.yaml",
    ]


@pytest.mark.slow  # two torchrun processes train on CPU
def test_ddp_under_torchrun_with_gloo_and_the_cli(tmp_path):
    """Two CPU processes (gloo) through the local launcher via the CLI: one run, world size 2."""
    from typer.testing import CliRunner

    from medreco.cli.train import app

    root = tmp_path / "root"
    st = build_training_snapshot(root)
    job = yaml.safe_load((PROJECT_ROOT / "config/training/encoder-tiny-cpu.yaml").read_text())
    job["optim"].update(max_steps=4, batch_size=4, checkpoint_every=4)
    job["launch"]["nproc_per_node"] = 2
    job["output_dir"] = str(tmp_path / "models")
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
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
        "training": {"launcher": "local"},
    }
    (tmp_path / "pipe.yaml").write_text(yaml.safe_dump(pipe))
    res = CliRunner().invoke(
        app,
        [
            "encoder",
            "--snapshot",
            "0.1.0",
            "--config",
            str(tmp_path / "job.yaml"),
            "--pipeline-config",
            str(tmp_path / "pipe.yaml"),
        ],
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.output.strip().splitlines()[-1])
    assert out["status"] == "succeeded" and out["snapshot_version"] == "0.1.0"
    metrics = json.loads((tmp_path / "models/encoder/0.1.0/encoder-tiny-cpu/metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["step"] == 4 and len(metrics["losses"]) == 4
    record = json.loads(st.read_text("reports/training/0.1.0.json"))
    assert record["jobs"]["encoder"]["lineage_record"]["metrics"]["world_size"] == 2
    # a tampered snapshot: the CLI refuses with one line and exit status 1
    card = root / "snapshots/0.1.0/DATASET_CARD.md"
    card.chmod(0o644)
    card.write_text("edited\n")
    bad = CliRunner().invoke(
        app,
        [
            "encoder",
            "--snapshot",
            "0.1.0",
            "--config",
            str(tmp_path / "job.yaml"),
            "--pipeline-config",
            str(tmp_path / "pipe.yaml"),
        ],
    )
    assert bad.exit_code == 1 and "failed verification" in bad.output
