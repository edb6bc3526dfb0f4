"""Entry point of a training job (what every launcher runs) and its lineage record.

``python -m training.jobs encoder|vlm --snapshot V --config JOB.yaml (--pipeline-config FILE | --root URI)
[--output DIR]``, or the same under ``torchrun --nproc-per-node N -m training.jobs ...``.

The job verifies the snapshot (refusing a tampered one), trains, evaluates and writes, besides the
checkpoint and ``metrics.json``, a lineage record that ties the weights to the data release:
``<run_dir>/lineage.json`` and ``reports/training/<version>/<job>-<name>.json`` under the storage root.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from etl import zones
from etl.storage import Storage
from schemas.config import PROJECT_ROOT
from training.config import JobConfig, load_job_config
from training.data import open_snapshot_once


def code_version() -> str:
    """``git describe --always --dirty`` of the source tree, else the installed ``medreco-db`` version."""
    if (PROJECT_ROOT / ".git").exists():
        try:
            out = subprocess.run(
                ["git", "-C", str(PROJECT_ROOT), "describe", "--always", "--dirty"],
                capture_output=True,
                text=True,
                timeout=10,
            )
            if out.returncode == 0 and out.stdout.strip():
                return f"git:{out.stdout.strip()}"
        except (OSError, subprocess.TimeoutExpired):
            pass
    try:
        return f"medreco-db=={metadata.version('medreco-db')}"
    except metadata.PackageNotFoundError:
        return "unknown"


def open_storage(pipeline_config: str | None = None, root: str | None = None) -> Storage:
    """The storage root named by a pipeline config file or directly by ``root`` (path or s3:// URI).

    Raises
    ------
    ValueError
        neither given.
    """
    if pipeline_config:
        from schemas.config import load_config

        cfg = load_config(pipeline_config)
        return Storage.from_config(cfg)
    if root:
        return Storage.open(root)
    raise ValueError("give the pipeline config or the storage root")


def run_dir_for(job: JobConfig, version: str, storage: Storage, output: str | None = None) -> Path:
    """``<output>/<job>/<version>/<name>``; output defaults to ``job.output_dir``, else ``<root>/models``.

    Raises
    ------
    ValueError
        no output folder given for a storage root that is not local.
    """
    base = output or job.output_dir
    if base is None:
        if not storage.is_local:
            raise ValueError("output_dir is required when the storage root is not a local folder")
        base = storage.path("models")
    return Path(base) / job.job / version / job.name


def lineage_path(version: str, job: JobConfig) -> str:
    """Root-relative path of a run's lineage record."""
    return zones.training_job_record(version, job.job, job.name)


def run_job(
    kind: str,
    snapshot: str | None,
    config: str | Path,
    *,
    pipeline_config: str | None = None,
    root: str | None = None,
    output: str | None = None,
) -> dict:
    """Verify the snapshot, train and evaluate one job, and write its lineage record.

    Parameters
    ----------
    kind : str
        ``encoder`` or ``vlm`` (must match the config's ``job``).
    snapshot : str or None
        the release version (None: the latest).
    config : str or Path
        the job YAML.
    pipeline_config, root : str, optional
        where the storage root is (one of them).
    output : str, optional
        checkpoint root (see :func:`run_dir_for`).

    Returns
    -------
    dict
        the lineage record: snapshot version and content hash, config (as validated), code version,
        metrics, checkpoint and run folder, timestamps; a VLM started from an encoder checkpoint also
        ``vision_init`` (:func:`training.vision_init.resolve_vision_init`: the reference, the checkpoint and the
        encoder's lineage record).

    Raises
    ------
    training.data.SnapshotRefusedError
        the snapshot is missing or fails verification.
    training.config.TrainingConfigError
        a bad job config.
    training.vision_init.VisionInitError
        ``vision_init`` names an encoder job that has not finished on the snapshot.
    """
    from training.loop import setup_runtime, train, write_json_atomic
    from training.tasks import EncoderTask, VLMTask

    job = load_job_config(config, expect=kind)
    storage = open_storage(pipeline_config, root)
    runtime = setup_runtime(job.optim)
    ref = open_snapshot_once(storage, snapshot)  # rank 0 re-hashes the release; the other ranks take its verdict
    run_dir = run_dir_for(job, ref.version, storage, output)
    vision_init = None
    if job.job == "vlm" and job.model.vision_init:
        from training.vision_init import resolve_vision_init

        vision_init = resolve_vision_init(job.model.vision_init, storage, ref.version)
        model = job.model.model_copy(update={"vision_init": vision_init["checkpoint"]})
        job = job.model_copy(update={"model": model})
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    if job.job == "encoder":
        task = EncoderTask(job, ref)
    elif job.model.path:
        from training.qwen_vl import QwenVLTask

        task = QwenVLTask(job, ref, run_dir)
    else:
        task = VLMTask(job, ref, run_dir)
    metrics = train(task, job.optim, run_dir, runtime)
    record = {
        "job": job.job,
        "name": job.name,
        "snapshot_version": ref.version,
        "content_hash": ref.content_hash,
        "snapshot_uri": storage.full_uri(zones.release_dir(ref.version)),
        "config": job.model_dump(mode="json"),
        "config_file": str(config),
        "code_version": code_version(),
        "metrics": metrics,
        "checkpoint": str(run_dir / "checkpoints" / "last.pt"),
        "run_dir": str(run_dir),
        "started_at": started,
        "finished_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    if vision_init is not None:
        record["vision_init"] = vision_init
    if job.job == "encoder":
        record["positives_source"] = task.positives.source
    if runtime.is_main:
        write_json_atomic(run_dir / "lineage.json", record)
        storage.write_text(lineage_path(ref.version, job), json.dumps(record, indent=1, sort_keys=True))
    return record


def main(argv: list[str] | None = None) -> int:
    """Command-line entry of a job process (see the module docstring); exit status 0 on success."""
    ap = argparse.ArgumentParser(prog="python -m training.jobs", description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=["encoder", "vlm"])
    ap.add_argument("--snapshot", default=None)
    ap.add_argument("--config", required=True)
    ap.add_argument("--pipeline-config", default=None)
    ap.add_argument("--root", default=None)
    ap.add_argument("--output", default=None)
    args = ap.parse_args(argv)
    try:
        record = run_job(
            args.kind,
            args.snapshot,
            args.config,
            pipeline_config=args.pipeline_config,
            root=args.root,
            output=args.output,
        )
    except Exception as err:  # noqa: BLE001 - one-line reason, non-zero exit (the CLI contract)
        print(f"error: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    if int(os.environ.get("RANK", "0")) == 0:
        print(
            json.dumps(
                {
                    "snapshot_version": record["snapshot_version"],
                    "lineage": record["run_dir"] + "/lineage.json",
                    "eval": record["metrics"]["eval"],
                },
                sort_keys=True,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
