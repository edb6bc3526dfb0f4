"""Where a VLM's vision tower starts: ``model.vision_init`` of a VLM job config.

The value is either a checkpoint path (an encoder job's ``checkpoints/last.pt`` or ``best.pt``) or a reference to
the encoder job of the **same snapshot**, read from that job's lineage record
``reports/training/<version>/encoder-<name>.json`` under the storage root:

==========================  ================================================================================
``encoder``                 the snapshot's only encoder job; its ``best.pt`` when it kept one, else ``last.pt``
``encoder:best``            its ``checkpoints/best.pt`` (the job must set ``optim.best_metric``)
``encoder:last``            its ``checkpoints/last.pt``
``encoder/NAME[:best|last]`` the encoder job called ``NAME`` (needed when several encoder jobs ran on the snapshot)
==========================  ================================================================================

A reference makes the training DAG run the VLM after the encoder (:func:`vlm_after_encoder`).
The checkpoint path is the one the encoder job wrote, so the VLM job must see the encoder's output folder at the
same path (the local launcher; Kubernetes with the shared output volume).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from etl import zones
from etl.storage import Storage
from schemas.errors import ReasonCodedError

#: ``encoder``, ``encoder:best``, ``encoder/NAME:last`` ... (NAME as a job name: a DNS-1123 label)
ENCODER_REF = re.compile(r"^encoder(?:/(?P<name>[a-z0-9][a-z0-9-]{0,40}))?(?::(?P<which>best|last))?$")


class VisionInitError(ReasonCodedError, ValueError):
    """``vision_init`` names an encoder job of the snapshot that has not finished (no lineage record), several
    candidate jobs, or a checkpoint the job did not keep."""

    default_reason = "vision_init_unresolved"
    message_format = "{message}"


def is_encoder_ref(value: str | None) -> bool:
    """Whether a ``vision_init`` value refers to the encoder job of the same snapshot (not a path)."""
    return bool(value) and ENCODER_REF.match(value) is not None


def encoder_record(storage: Storage, version: str, name: str | None = None) -> tuple[str, dict]:
    """The lineage record of the snapshot's encoder job.

    Parameters
    ----------
    storage : etl.storage.Storage
        the storage root.
    version : str
        the snapshot version.
    name : str, optional
        the encoder job's name (default: the snapshot's only encoder job).

    Returns
    -------
    tuple
        ``(root-relative path of the record, the record)``.

    Raises
    ------
    VisionInitError
        no record (the encoder job has not finished on this snapshot), or several encoder jobs and no name.
    """
    if name:
        rel = zones.training_job_record(version, "encoder", name)
        if not storage.is_file(rel):
            raise VisionInitError(
                f"vision_init: the encoder job {name} has no lineage record for snapshot {version} ({rel}): "
                "run the encoder job on this snapshot first"
            )
        return rel, json.loads(storage.read_text(rel))
    folder = f"{zones.TRAINING_DIR}/{zones.component(version, 'snapshot version')}"
    found = [p for p in storage.list_files(folder, recursive=False) if Path(p).name.startswith("encoder-")]
    if not found:
        raise VisionInitError(
            f"vision_init: no encoder job has finished on snapshot {version} (no {folder}/encoder-*.json): "
            "run the encoder job on this snapshot first"
        )
    if len(found) > 1:
        names = ", ".join(Path(p).stem.removeprefix("encoder-") for p in found)
        raise VisionInitError(
            f"vision_init: several encoder jobs ran on snapshot {version} ({names}): name one as encoder/NAME"
        )
    return found[0], json.loads(storage.read_text(found[0]))


def resolve_vision_init(value: str, storage: Storage, version: str, *, check_file: bool = True) -> dict:
    """Resolve a ``vision_init`` value to a checkpoint path.

    Parameters
    ----------
    value : str
        a checkpoint path or an encoder reference (see the module docstring).
    storage : etl.storage.Storage
        the storage root (for the encoder's lineage record).
    version : str
        the snapshot the VLM trains on.
    check_file : bool
        require the checkpoint file to exist here (False where the job runs elsewhere, e.g. a Kubernetes pod).

    Returns
    -------
    dict
        ``{"ref": value, "checkpoint": path, "encoder_record": rel or None, "encoder_step": int or None}``.

    Raises
    ------
    VisionInitError
        an unresolvable reference, or ``encoder:best`` for a job that kept no best checkpoint.
    FileNotFoundError
        ``check_file`` and no checkpoint at the resolved path.
    """
    m = ENCODER_REF.match(value)
    if m is None:
        out = {"ref": value, "checkpoint": value, "encoder_record": None, "encoder_step": None}
    else:
        rel, rec = encoder_record(storage, version, m["name"])
        metrics = rec.get("metrics") or {}
        best = (metrics.get("best") or {}).get("checkpoint")
        which = m["which"] or ("best" if best else "last")
        if which == "best" and not best:
            raise VisionInitError(
                f"vision_init: {value}: the encoder job {rec.get('name')} kept no best checkpoint on snapshot "
                f"{version} (set its optim.best_metric), or use encoder:last"
            )
        ckpt = best if which == "best" else rec["checkpoint"]
        out = {"ref": value, "checkpoint": ckpt, "encoder_record": rel, "encoder_step": metrics.get("step")}
    if check_file and not Path(out["checkpoint"]).is_file():
        raise FileNotFoundError(f"vision_init: no encoder checkpoint at {out['checkpoint']}")
    return out


def vlm_after_encoder(pipeline_config: str | Path) -> bool:
    """Whether the pipeline's VLM job starts its vision tower from the encoder job of the same snapshot (its
    ``model.vision_init`` is an encoder reference, :mod:`training.vision_init`): the training DAG then runs the VLM
    after the encoder, else both at once. False when the pipeline config or the VLM job config cannot be read (the
    launch then fails with the reason, and a VLM launched without a finished encoder is refused by
    :func:`training.pipeline.start_job`)."""
    from schemas.config import load_config
    from training.config import load_job_config, resolve_job_config

    try:
        cfg = load_config(str(pipeline_config))
        job = load_job_config(resolve_job_config(cfg.training.vlm_config, cfg.base_dir), expect="vlm")
    except Exception:  # noqa: BLE001 - a DAG file must parse; the launch reports the config's fault
        return False
    return is_encoder_ref(job.model.vision_init)
