"""Start training for a snapshot the way the pipeline does it (one code path for the CLI and the DAG).

:func:`start_job` resolves the pipeline config, verifies the snapshot (a tampered one is refused before
anything is launched), picks the job config and the launcher, and launches; :func:`record_runs` writes the
per-snapshot training record ``reports/training/<version>.json`` (handles, launcher, and for finished jobs
their lineage records: metrics, checkpoint, code version) and its page ``reports/training/<version>.html`` (the
evaluation cells, :mod:`training.report`).
"""

from __future__ import annotations

import json
from pathlib import Path

from etl import zones
from schemas.config import PROJECT_ROOT
from training.config import effective_launch, load_job_config, resolve_job_config
from training.data import open_snapshot
from training.jobs import lineage_path, open_storage
from training.launchers import LaunchRequest, launch
from training.vision_init import is_encoder_ref, resolve_vision_init


def snapshot_from_events(events) -> str | None:
    """The snapshot version carried by the latest triggering ``medreco://snapshot`` Asset event (its
    ``extra["version"]``), or None (a run started by hand)."""
    extras = [e.extra for evs in (events or {}).values() for e in evs if (e.extra or {}).get("version")]
    return extras[-1]["version"] if extras else None


def start_job(
    kind: str,
    pipeline_config: str | Path,
    snapshot: str | None = None,
    job_config: str | None = None,
    launcher: str | None = None,
) -> dict:
    """Verify the snapshot and launch one training job.

    Parameters
    ----------
    kind : str
        ``encoder`` | ``vlm``.
    pipeline_config : str or Path
        the pipeline YAML (storage root; ``training.launcher``, ``image``, ``namespace``, ``gpus``,
        ``<kind>_config``).
    snapshot : str, optional
        release version (default: the latest).
    job_config : str, optional
        job YAML (default: the pipeline's ``training.<kind>_config``).
    launcher : str, optional
        overrides the configured launcher.

    Returns
    -------
    dict
        the launcher's handle (``status``, ``snapshot_version``, ``content_hash`` ...).

    Raises
    ------
    training.data.SnapshotRefusedError, training.config.TrainingConfigError, FileNotFoundError,
    training.launchers.LauncherError
    training.vision_init.VisionInitError
        a VLM whose ``vision_init`` names the encoder job of the snapshot, and that job has not finished.
    """
    from schemas.config import load_config

    if launcher not in (None, "local", "kubernetes", "sagemaker"):
        raise ValueError(f"unknown launcher {launcher!r}: local, kubernetes or sagemaker")
    pipeline_config = str(Path(pipeline_config).resolve())
    cfg = load_config(pipeline_config)
    ref = open_snapshot(open_storage(pipeline_config), snapshot)
    if launcher is None and cfg.training.launcher == "none":
        return {
            "launcher": "none",
            "job": kind,
            "status": "disabled",
            "snapshot_version": ref.version,
            "content_hash": ref.content_hash,
            "lineage": None,
        }
    path = resolve_job_config(job_config or getattr(cfg.training, f"{kind}_config"), cfg.base_dir)
    job = load_job_config(path, expect=kind)
    if kind == "vlm" and is_encoder_ref(job.model.vision_init):
        # refused here, ahead of the launch, when the encoder job has not finished on this snapshot
        resolve_vision_init(job.model.vision_init, ref.storage, ref.version, check_file=False)
    launch_cfg = effective_launch(job, cfg.training, launcher)
    rel = path.relative_to(PROJECT_ROOT) if path.is_relative_to(PROJECT_ROOT) else path
    req = LaunchRequest(
        job=kind,
        name=job.name,
        snapshot_version=ref.version,
        content_hash=ref.content_hash,
        job_config=str(path) if launch_cfg.launcher == "local" else str(rel),
        pipeline_config=pipeline_config,
    )
    handle = launch(req, launch_cfg)
    handle["lineage"] = lineage_path(ref.version, job)
    return handle


def record_runs(pipeline_config: str | Path, handles: list[dict]) -> dict:
    """Write ``reports/training/<version>.json`` (per job its handle and, when finished, its lineage record) and
    the page of its evaluation cells ``reports/training/<version>.html``. Jobs of the same release recorded
    earlier and not in ``handles`` are kept.

    Returns
    -------
    dict
        ``{"snapshot_version", "content_hash", "jobs": {job: {...handle, "lineage_record": {...} | None}}}``.
    """
    storage = open_storage(str(pipeline_config))
    version = handles[0]["snapshot_version"]
    rel = zones.training_record(version)
    old = json.loads(storage.read_text(rel)) if storage.is_file(rel) else {}
    # a job recorded alone (``medreco train encoder`` then ``vlm``) keeps the other jobs of the same release
    jobs = dict(old.get("jobs") or {}) if old.get("content_hash") == handles[0]["content_hash"] else {}
    for h in handles:
        lin = json.loads(storage.read_text(h["lineage"])) if h["lineage"] and storage.is_file(h["lineage"]) else None
        jobs[h["job"]] = {**h, "lineage_record": lin}
    record = {"snapshot_version": version, "content_hash": handles[0]["content_hash"], "jobs": jobs}
    storage.write_text(rel, json.dumps(record, indent=1, sort_keys=True))
    from training.report import render_training_page

    storage.write_text(rel.removesuffix(".json") + ".html", render_training_page(record))
    return record
