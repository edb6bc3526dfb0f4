"""``medreco train encoder|vlm``: launch training on a snapshot (the same code path as the training DAG).

Exit status 0 when the job was launched (and, for the synchronous local launcher, succeeded); 1 with a
one-line reason otherwise (a snapshot that fails verification, a bad config, a failed job).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from schemas.config import default_config_path

app = typer.Typer(
    add_completion=False, no_args_is_help=True, rich_markup_mode=None, help="train the encoder or the VLM on a snapshot"
)


def _run(kind: str, snapshot: str | None, config: Path | None, launcher: str | None, pipeline_config: Path) -> None:
    from training.pipeline import record_runs, start_job

    try:
        handle = start_job(kind, pipeline_config, snapshot, str(config) if config else None, launcher)
    except Exception as err:  # noqa: BLE001 - the CLI contract: one line, non-zero exit
        typer.echo(f"error: {type(err).__name__}: {err}", err=True)
        raise typer.Exit(1) from None
    if handle["status"] == "failed":
        typer.echo(
            f"error: {kind} job failed: {' | '.join(handle.get('stderr_tail') or [handle.get('reason', '')])}", err=True
        )
        raise typer.Exit(1)
    if handle["status"] in ("succeeded", "disabled"):
        from quality.training_page import stamp_training
        from training.jobs import open_storage

        record_runs(pipeline_config, [handle])
        stamp_training(open_storage(str(pipeline_config)), handle["snapshot_version"])
    typer.echo(
        json.dumps(
            {
                k: handle.get(k)
                for k in ("job", "launcher", "status", "snapshot_version", "content_hash", "name", "lineage", "summary")
            },
            sort_keys=True,
        )
    )


_SNAPSHOT = typer.Option(None, "--snapshot", help="snapshot version (default: the latest)")
_CONFIG = typer.Option(
    None,
    "--config",
    exists=True,
    dir_okay=False,
    help="job config YAML (default: the pipeline's training.<job>_config)",
)
_LAUNCHER = typer.Option(None, "--launcher", help="local | kubernetes | sagemaker (default: configured)")
_PIPELINE = typer.Option(
    default_config_path(),
    "--pipeline-config",
    exists=True,
    dir_okay=False,
    help="pipeline config (storage root, launcher)",
)


@app.command("encoder")
def encoder(
    snapshot: str | None = _SNAPSHOT,
    config: Path | None = _CONFIG,
    launcher: str | None = _LAUNCHER,
    pipeline_config: Path = _PIPELINE,
) -> None:
    """Train the entity-aware image encoder on a snapshot."""
    _run("encoder", snapshot, config, launcher, pipeline_config)


@app.command("vlm")
def vlm(
    snapshot: str | None = _SNAPSHOT,
    config: Path | None = _CONFIG,
    launcher: str | None = _LAUNCHER,
    pipeline_config: Path = _PIPELINE,
) -> None:
    """Train the comparative vision-language model on a snapshot."""
    _run("vlm", snapshot, config, launcher, pipeline_config)
