"""Launch training on a published snapshot through the configured launcher.

This module verifies the snapshot and writes the launch record (``reports/training/<version>.json``)
that binds a training run to the exact snapshot version and content hash. The encoder and VLM trainers
and the Kubernetes/cloud launchers arrive with the training issue; until then a launcher other than
``none`` records the request and reports ``status: recorded``.
"""

from __future__ import annotations

import json

from etl.context import BuildContext
from etl.snapshots import SnapshotError, list_versions, read_manifest, verify


def launch_for_snapshot(ctx: BuildContext, version: str | None) -> dict:
    """Verify snapshot ``version`` (default: the latest) and record the training launch.

    Raises
    ------
    SnapshotError
        when there is no snapshot or it fails verification (tampered or missing files).
    """
    versions = list_versions(ctx.storage)
    if not versions:
        raise SnapshotError("no published snapshot to train on")
    version = version or versions[-1]
    problems = verify(ctx.storage, version)
    if problems:
        raise SnapshotError(f"snapshot {version} failed verification: {'; '.join(problems)}")
    manifest = read_manifest(ctx.storage, version)
    record = {
        "snapshot_version": version,
        "content_hash": manifest["content_hash"],
        "launcher": ctx.cfg.training.launcher,
        "encoder_config": ctx.cfg.training.encoder_config,
        "vlm_config": ctx.cfg.training.vlm_config,
        "gpus": ctx.cfg.training.gpus,
        "status": "recorded" if ctx.cfg.training.launcher != "none" else "disabled",
        "run_id": ctx.run_id,
    }
    ctx.storage.write_text(f"reports/training/{version}.json", json.dumps(record, indent=1, sort_keys=True))
    return record
