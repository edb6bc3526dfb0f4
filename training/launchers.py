"""Launchers: start a training job on a snapshot locally, as a Kubernetes Job, or as a SageMaker training job.

Every launcher runs the same entry point, ``python -m training.jobs <job> --snapshot V --config FILE ...``
(under ``torchrun`` when ``nproc_per_node`` > 1), so a model trained anywhere writes the same checkpoint,
metrics and lineage record. :func:`launch` returns a *handle* (a JSON-ready dict) and :func:`poll` tells
whether the job it names is ``running``, ``succeeded`` or ``failed``; the local launcher is synchronous (its
handle is final), the others are polled (the training DAG waits on them with a sensor).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass

from schemas.config import PROJECT_ROOT
from schemas.errors import ReasonCodedError
from training.config import KubernetesConfig, LaunchConfig, SageMakerConfig

#: label and annotation keys on Kubernetes objects (app.kubernetes.io recommended labels)
LABEL_SNAPSHOT = "medreco.org/snapshot-version"
ANNOTATION_CONTENT_HASH = "medreco.org/snapshot-content-hash"
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|Pi|M|G|T|P)?$")
#: SageMaker TrainingJobStatus -> handle status
_SM_STATUS = {
    "InProgress": "running",
    "Stopping": "running",
    "Completed": "succeeded",
    "Failed": "failed",
    "Stopped": "failed",
}


class LauncherError(ReasonCodedError, RuntimeError):
    """A job that could not be started or whose spec is invalid."""

    default_reason = "launcher_failed"
    message_format = "{message}"


@dataclass(frozen=True)
class LaunchRequest:
    """What to run: job kind, snapshot, job config, and where the storage root is.

    ``job_config`` and ``pipeline_config`` are paths as the job process sees them; ``root`` (a path or
    s3:// URI) replaces ``pipeline_config`` where the job runs elsewhere (containers).
    """

    job: str  # encoder | vlm
    name: str
    snapshot_version: str
    content_hash: str
    job_config: str
    pipeline_config: str | None = None
    root: str | None = None
    output: str | None = None


def job_args(
    req: LaunchRequest, root: str | None = None, output: str | None = None, job_config: str | None = None
) -> list[str]:
    """Arguments of ``training.jobs`` for a request (``root``/``output``/``job_config`` override)."""
    args = [req.job, "--snapshot", req.snapshot_version, "--config", job_config or req.job_config]
    if root or req.root:
        args += ["--root", root or req.root]
    elif req.pipeline_config:
        args += ["--pipeline-config", req.pipeline_config]
    if output or req.output:
        args += ["--output", output or req.output]
    return args


def entry_command(nproc_per_node: int, python: str = "python") -> list[str]:
    """``python -m training.jobs`` or ``torchrun --standalone --nproc-per-node N -m training.jobs``."""
    if nproc_per_node > 1:
        return ["torchrun", "--standalone", f"--nproc-per-node={nproc_per_node}", "-m", "training.jobs"]
    return [python, "-m", "training.jobs"]


# ---- local ------------------------------------------------------------------------------------------------


def local_command(req: LaunchRequest, launch: LaunchConfig) -> list[str]:
    """The local subprocess argv (this interpreter; torchrun from the same environment for DDP)."""
    if launch.nproc_per_node > 1:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={launch.nproc_per_node}",
            "-m",
            "training.jobs",
        ]
    else:
        cmd = [sys.executable, "-m", "training.jobs"]
    return cmd + job_args(req)


def launch_local(req: LaunchRequest, launch: LaunchConfig) -> dict:
    """Run the job in a subprocess (from the project root) and wait for it.

    Returns
    -------
    dict
        handle with ``status`` succeeded|failed, ``returncode``, ``summary`` (the job's last stdout line,
        parsed) and ``stderr_tail``.
    """
    cmd = local_command(req, launch)
    try:
        proc = subprocess.run(cmd, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=launch.timeout_s)
    except subprocess.TimeoutExpired:
        return {
            "launcher": "local",
            "job": req.job,
            "status": "failed",
            "returncode": None,
            "reason": f"timed out after {launch.timeout_s} s",
            "command": cmd,
        }
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    summary = json.loads(lines[-1]) if lines else None
    return {
        "launcher": "local",
        "job": req.job,
        "command": cmd,
        "returncode": proc.returncode,
        "status": "succeeded" if proc.returncode == 0 and summary else "failed",
        "summary": summary,
        "stderr_tail": proc.stderr.strip().splitlines()[-5:],
    }


# ---- Kubernetes -------------------------------------------------------------------------------------------


def k8s_job_name(req: LaunchRequest) -> str:
    """``medreco-<job>-<name>-<version>`` as a DNS-1123 label (dots -> dashes, at most 63 characters)."""
    raw = f"medreco-{req.job}-{req.name}-{req.snapshot_version}".lower()
    return re.sub(r"[^a-z0-9-]+", "-", raw)[:63].strip("-")


def render_k8s_job(req: LaunchRequest, k8s: KubernetesConfig, nproc_per_node: int = 1) -> dict:
    """A ``batch/v1`` Job manifest (plain dict, ready for ``yaml.safe_dump`` or the Kubernetes client).

    One pod, ``restartPolicy: Never`` (retries via ``backoffLimit``; a retried pod resumes from the last
    checkpoint on the output volume), ``nvidia.com/gpu`` requested and limited, the storage root and the
    model volume mounted from PVCs, ``/dev/shm`` as a memory ``emptyDir`` for DataLoader workers, the
    snapshot version in the arguments, a label and an environment variable.
    """
    name = k8s_job_name(req)
    labels = {
        "app.kubernetes.io/name": "medreco-training",
        "app.kubernetes.io/component": req.job,
        LABEL_SNAPSHOT: req.snapshot_version,
    }
    resources = {"cpu": k8s.cpu, "memory": k8s.memory}
    if k8s.gpus:
        resources["nvidia.com/gpu"] = str(k8s.gpus)
    cmd = entry_command(nproc_per_node)
    pod = {
        "restartPolicy": "Never",
        "containers": [
            {
                "name": "train",
                "image": k8s.image,
                "command": cmd[:1],
                "args": cmd[1:] + job_args(req, root=k8s.data_mount, output=k8s.output_mount),
                "workingDir": "/app",
                "env": [
                    {"name": "MEDRECO_SNAPSHOT_VERSION", "value": req.snapshot_version},
                    {"name": "MEDRECO_SNAPSHOT_CONTENT_HASH", "value": req.content_hash},
                ],
                "resources": {"requests": dict(resources), "limits": dict(resources)},
                "volumeMounts": [
                    {"name": "data", "mountPath": k8s.data_mount},
                    {"name": "models", "mountPath": k8s.output_mount},
                    {"name": "dshm", "mountPath": "/dev/shm"},
                ],
            }
        ],
        "volumes": [
            {"name": "data", "persistentVolumeClaim": {"claimName": k8s.data_pvc}},
            {"name": "models", "persistentVolumeClaim": {"claimName": k8s.output_pvc}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": k8s.shm_size}},
        ],
    }
    if k8s.gpus:
        pod["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    if k8s.node_selector:
        pod["nodeSelector"] = dict(k8s.node_selector)
    if k8s.service_account:
        pod["serviceAccountName"] = k8s.service_account
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": k8s.namespace,
            "labels": labels,
            "annotations": {ANNOTATION_CONTENT_HASH: req.content_hash},
        },
        "spec": {
            "backoffLimit": k8s.backoff_limit,
            "ttlSecondsAfterFinished": k8s.ttl_seconds_after_finished,
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


def validate_k8s_job(spec: dict) -> list[str]:
    """Check a Job manifest against the fields the batch/v1 API requires; return the problems (empty: valid).

    Checks: apiVersion/kind; metadata.name a DNS-1123 label of at most 63 characters; label values valid;
    spec.template.spec.containers non-empty, each with a DNS-1123 name and an image; restartPolicy Never or
    OnFailure (a Job's pods may not use Always); resource quantities well formed, GPU (``nvidia.com/gpu``)
    an integer with requests equal to limits (extended resources cannot be overcommitted); every volumeMount
    names a declared volume.
    """
    p: list[str] = []
    if spec.get("apiVersion") != "batch/v1" or spec.get("kind") != "Job":
        p.append("apiVersion/kind must be batch/v1 Job")
    meta = spec.get("metadata") or {}
    name = meta.get("name") or ""
    if not _DNS1123.match(name) or len(name) > 63:
        p.append(f"metadata.name {name!r} is not a DNS-1123 label")
    for k, v in (meta.get("labels") or {}).items():
        if not _LABEL_VALUE.match(str(v)) or len(str(v)) > 63:
            p.append(f"label {k}={v!r} has an invalid value")
    pod = ((spec.get("spec") or {}).get("template") or {}).get("spec") or {}
    if pod.get("restartPolicy") not in ("Never", "OnFailure"):
        p.append("spec.template.spec.restartPolicy must be Never or OnFailure")
    containers = pod.get("containers") or []
    if not containers:
        p.append("spec.template.spec.containers is empty")
    volumes = {v.get("name") for v in pod.get("volumes") or []}
    for c in containers:
        if not _DNS1123.match(c.get("name") or ""):
            p.append(f"container name {c.get('name')!r} is not a DNS-1123 label")
        if not c.get("image"):
            p.append(f"container {c.get('name')!r} has no image")
        res = c.get("resources") or {}
        for kind in ("requests", "limits"):
            for r, q in (res.get(kind) or {}).items():
                if not _QUANTITY.match(str(q)):
                    p.append(f"{kind}.{r} {q!r} is not a quantity")
        gpu_req, gpu_lim = (
            (res.get("requests") or {}).get("nvidia.com/gpu"),
            (res.get("limits") or {}).get("nvidia.com/gpu"),
        )
        if gpu_req is not None or gpu_lim is not None:
            if gpu_req != gpu_lim:
                p.append("nvidia.com/gpu requests must equal limits")
            if not str(gpu_lim).isdigit():
                p.append("nvidia.com/gpu must be a whole number")
        for m in c.get("volumeMounts") or []:
            if m.get("name") not in volumes:
                p.append(f"volumeMount {m.get('name')!r} names no volume")
    return p


def launch_kubernetes(req: LaunchRequest, launch: LaunchConfig) -> dict:
    """Render, validate and submit the Job with the ``kubernetes`` client (in-cluster or kubeconfig).

    Raises
    ------
    LauncherError
        an invalid spec, or the ``kubernetes`` package is not installed (the rendered spec is in the message
        context: use :func:`render_k8s_job` to write it out and ``kubectl apply`` it).
    """
    spec = render_k8s_job(req, launch.kubernetes, launch.nproc_per_node)
    problems = validate_k8s_job(spec)
    if problems:
        raise LauncherError("invalid Kubernetes Job: " + "; ".join(problems))
    try:
        from kubernetes import client, config  # optional dependency of deployments
    except ImportError:
        raise LauncherError(
            "the kubernetes Python client is not installed; render the Job with "
            "training.launchers.render_k8s_job and apply it with kubectl"
        ) from None
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    client.BatchV1Api().create_namespaced_job(spec["metadata"]["namespace"], spec)
    return {
        "launcher": "kubernetes",
        "job": req.job,
        "status": "running",
        "namespace": spec["metadata"]["namespace"],
        "name": spec["metadata"]["name"],
    }


def poll_kubernetes(handle: dict) -> str:
    """Status of a submitted Job from its ``status`` counters (succeeded / failed with no active pod)."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    st = client.BatchV1Api().read_namespaced_job_status(handle["name"], handle["namespace"]).status
    if st.succeeded:
        return "succeeded"
    if st.failed and not st.active:
        return "failed"
    return "running"


# ---- SageMaker --------------------------------------------------------------------------------------------


def sagemaker_job_name(req: LaunchRequest) -> str:
    """``medreco-<job>-<name>-<version>-<hash8>``: at most 63 characters of ``[a-zA-Z0-9-]``, unique per
    snapshot content (SageMaker job names are unique per account and region)."""
    base = re.sub(r"[^a-zA-Z0-9-]+", "-", f"medreco-{req.job}-{req.name}-{req.snapshot_version}")
    return f"{base[: 63 - 9].strip('-')}-{req.content_hash[:8]}"


def sagemaker_request(req: LaunchRequest, sm: SageMakerConfig, nproc_per_node: int = 1) -> dict:
    """The ``CreateTrainingJob`` request (bring-your-own container).

    The container runs ``training.jobs`` with ``--root`` set to the S3 storage root (the job reads the
    snapshot through pyarrow's S3 filesystem with the job's role) and checkpoints to
    ``/opt/ml/checkpoints``, which SageMaker syncs to ``CheckpointConfig.S3Uri`` (so a restarted job
    resumes). The snapshot version and content hash are also tags.
    """
    name = sagemaker_job_name(req)
    cmd = entry_command(nproc_per_node)
    prefix = f"{sm.output_s3_uri.rstrip('/')}/{req.job}/{req.snapshot_version}/{req.name}"
    return {
        "TrainingJobName": name,
        "RoleArn": sm.role_arn,
        "AlgorithmSpecification": {
            "TrainingImage": sm.image_uri,
            "TrainingInputMode": "File",
            "ContainerEntrypoint": cmd,
            "ContainerArguments": job_args(
                req, root=sm.storage_root, output="/opt/ml/checkpoints", job_config=req.job_config
            ),
        },
        "OutputDataConfig": {"S3OutputPath": f"{prefix}/output"},
        "CheckpointConfig": {"S3Uri": f"{prefix}/checkpoints", "LocalPath": "/opt/ml/checkpoints"},
        "ResourceConfig": {
            "InstanceType": sm.instance_type,
            "InstanceCount": sm.instance_count,
            "VolumeSizeInGB": sm.volume_size_gb,
        },
        "StoppingCondition": {"MaxRuntimeInSeconds": sm.max_runtime_s},
        "Environment": {
            "MEDRECO_SNAPSHOT_VERSION": req.snapshot_version,
            "MEDRECO_SNAPSHOT_CONTENT_HASH": req.content_hash,
        },
        "Tags": [
            {"Key": "medreco:snapshot-version", "Value": req.snapshot_version},
            {"Key": "medreco:snapshot-content-hash", "Value": req.content_hash},
            {"Key": "medreco:job", "Value": req.job},
        ],
    }


def launch_sagemaker(req: LaunchRequest, launch: LaunchConfig, client=None) -> dict:
    """Submit the training job with boto3 (``client``: a ``sagemaker`` client, default from the region)."""
    import boto3

    sm = launch.sagemaker
    client = client or boto3.client("sagemaker", region_name=sm.region)
    body = sagemaker_request(req, sm, launch.nproc_per_node)
    arn = client.create_training_job(**body)["TrainingJobArn"]
    return {
        "launcher": "sagemaker",
        "job": req.job,
        "status": "running",
        "name": body["TrainingJobName"],
        "arn": arn,
        "region": sm.region,
    }


def poll_sagemaker(handle: dict, client=None) -> str:
    """``DescribeTrainingJob`` -> running | succeeded | failed."""
    import boto3

    client = client or boto3.client("sagemaker", region_name=handle["region"])
    return _SM_STATUS.get(client.describe_training_job(TrainingJobName=handle["name"])["TrainingJobStatus"], "running")


# ---- dispatch ---------------------------------------------------------------------------------------------


def launch(req: LaunchRequest, launch_cfg: LaunchConfig) -> dict:
    """Start the job with ``launch_cfg.launcher``; returns the handle (see the module docstring)."""
    fn = {"local": launch_local, "kubernetes": launch_kubernetes, "sagemaker": launch_sagemaker}[launch_cfg.launcher]
    handle = fn(req, launch_cfg)
    handle.update(
        {"snapshot_version": req.snapshot_version, "content_hash": req.content_hash, "name_in_config": req.name}
    )
    return handle


def poll(handle: dict) -> str:
    """running | succeeded | failed (| disabled) for a handle returned by :func:`launch`."""
    if handle["launcher"] in ("local", "none"):
        return handle["status"]  # synchronous (or disabled): the handle is final
    return poll_kubernetes(handle) if handle["launcher"] == "kubernetes" else poll_sagemaker(handle)
