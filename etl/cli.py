"""``medreco``: the project's command line (one console script; DESIGN.md lists the contract).

Exit status 0 on success; non-zero with a one-line reason on failure.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import typer

from etl.runtime import PROJECT_ROOT

app = typer.Typer(add_completion=False, no_args_is_help=True, help="MedReCo-DB builder")
snapshot_app = typer.Typer(no_args_is_help=True, help="list, show, verify and publish snapshots")
app.add_typer(snapshot_app, name="snapshot")

DEMO_DIR = PROJECT_ROOT / ".demo"
DEMO_CONFIG = PROJECT_ROOT / "config" / "demo.yaml"


def _fail(message: str, code: int = 1) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _storage(config: Path):
    from etl.storage import Storage
    from schemas.config import ConfigError, load_config

    try:
        cfg = load_config(config)
    except ConfigError as err:
        _fail(str(err))
    return cfg, Storage.open(cfg.storage.root, endpoint_url=cfg.storage.s3_endpoint_url,
                             region=cfg.storage.s3_region, base_dir=cfg.base_dir)


def _print_summary(summary: dict, quiet: bool = False) -> None:
    led = summary["ledger"]
    lines = [f"run {summary['run_id']}", "rows per table:"]
    lines += [f"  {t:<16} {n:>8}" for t, n in summary["tables"].items()]
    lines.append(
        f"ledger: files_seen={led['files_seen']} = ingested {led['ingested']} + quarantined {led['quarantined']}"
        f" + duplicate {led['duplicate']} + skipped {led['skipped']}  -> {'BALANCED' if led['balanced'] else 'UNBALANCED'}"
    )
    if summary.get("quarantined_by_reason"):
        lines.append("quarantined by reason: " + ", ".join(f"{k}={v}" for k, v in summary["quarantined_by_reason"].items()))
    lines.append(f"snapshot: {summary['version']} ({'new' if summary['created'] else 'unchanged content, existing release'})"
                 f" at {summary['uri']}")
    lines.append(f"content hash: {summary['content_hash']}")
    lines.append(f"dashboard: {summary['dashboard']}")
    typer.echo("\n".join(lines if not quiet else lines[-3:]))


@app.command("demo-corpus")
def demo_corpus(
    out: Path = typer.Argument(..., help="output folder (sources/ and answer_key/ are written in it)"),
    seed: int = typer.Option(0, help="random seed: same seed, same bytes"),
    patients: int = typer.Option(48, help="number of patients"),
) -> None:
    """Generate the demo multi-institution corpus and its PHI answer key."""
    from etl.demo_corpus import DemoCorpusError, generate_corpus

    try:
        summary = generate_corpus(out, seed=seed, n_patients=patients)
    except DemoCorpusError as err:
        _fail(str(err))
    typer.echo(json.dumps(summary, sort_keys=True))


@app.command()
def run(
    config: Path = typer.Option(DEMO_CONFIG, "--config", "-c", help="pipeline YAML config"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="print only the snapshot and dashboard lines"),
) -> None:
    """Run the build DAG on the embedded default (Airflow dag.test on SQLite)."""
    from etl.airflow_runner import BuildFailedError, run_build
    from etl.context import KeyMismatchError
    from etl.keys import MissingKeyError, load_key
    from schemas.config import ConfigError, load_config

    try:
        load_config(config)
        if not os.environ.get("AIRFLOW_CONN_MEDRECO_PSEUDONYM"):
            load_key(allow_airflow=False)  # refuse before any work; tasks may also read the Airflow connection
        summary = run_build(config)
    except (ConfigError, MissingKeyError, KeyMismatchError, BuildFailedError) as err:
        _fail(str(err))
    _print_summary(summary, quiet)


@app.command()
def demo(
    seed: int = typer.Option(0, help="demo corpus seed"),
    patients: int = typer.Option(48, help="demo corpus patients"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="print only the snapshot and dashboard lines"),
) -> None:
    """Generate the demo corpus (once), create a local demo key (demo only) and run the build."""
    from etl.airflow_runner import BuildFailedError, run_build
    from etl.context import KeyMismatchError
    from etl.demo_corpus import generate_corpus
    from etl.keys import ENV_VAR, demo_key

    root = DEMO_DIR / "root"
    if not (root / "sources").is_dir():
        summary = generate_corpus(root, seed=seed, n_patients=patients)
        if not quiet:
            typer.echo(f"demo corpus: {json.dumps(summary, sort_keys=True)}")
    elif not quiet:
        typer.echo(f"demo corpus: reusing {root / 'sources'} (--seed/--patients apply to a new corpus; "
                   "`make clean` removes it)")
    os.environ[ENV_VAR] = demo_key(DEMO_DIR / "demo.key")
    try:
        summary = run_build(DEMO_CONFIG)
    except (BuildFailedError, KeyMismatchError) as err:
        _fail(str(err))
    _print_summary(summary, quiet)


@app.command()
def deid(
    src: Path = typer.Argument(..., exists=True, file_okay=False, help="folder of DICOM files"),
    out: Path = typer.Argument(..., help="output folder: de-identified files, ledger.parquet, quarantine/"),
    institution: str = typer.Option("local", help="institution id the PatientIDs belong to"),
    config: Path | None = typer.Option(None, "--config", "-c", help="take the deid: options from this config"),
) -> None:
    """De-identify a folder of DICOM files (ledger + quarantine under OUT)."""
    from etl.deid_folder import DeidFolderError, deidentify_folder
    from etl.keys import MissingKeyError, load_key

    try:
        key = load_key(allow_airflow=False)
    except MissingKeyError as err:
        _fail(str(err))
    deid_cfg = _storage(config)[0].deid if config else None
    try:
        result = deidentify_folder(src, out, key, institution, deid_cfg)
    except DeidFolderError as err:
        _fail(str(err))
    typer.echo(json.dumps(result, sort_keys=True))
    if not result["balanced"]:
        _fail("ledger does not balance")


@snapshot_app.command("list")
def snapshot_list(config: Path = typer.Option(DEMO_CONFIG, "--config", "-c")) -> None:
    """Published versions, oldest first, with content hash and total rows."""
    from etl.snapshots import list_versions, read_manifest

    _, st = _storage(config)
    for v in list_versions(st):
        m = read_manifest(st, v)
        typer.echo(f"{v}\t{m['created_at']}\t{m['content_hash'][:16]}\t{sum(t['rows'] for t in m['tables'].values())} rows")


@snapshot_app.command("show")
def snapshot_show(version: str, config: Path = typer.Option(DEMO_CONFIG, "--config", "-c")) -> None:
    """Print a release's manifest."""
    from etl.snapshots import SnapshotError, read_manifest

    _, st = _storage(config)
    try:
        typer.echo(json.dumps(read_manifest(st, version), indent=1, sort_keys=True))
    except SnapshotError as err:
        _fail(str(err))


@snapshot_app.command("verify")
def snapshot_verify(version: str, config: Path = typer.Option(DEMO_CONFIG, "--config", "-c")) -> None:
    """Re-hash every file of a release; fail naming each tampered or missing file."""
    from etl.snapshots import SnapshotError, verify

    _, st = _storage(config)
    try:
        problems = verify(st, version)
    except SnapshotError as err:
        _fail(str(err))
    if problems:
        _fail(f"snapshot {version} failed verification: " + "; ".join(problems))
    typer.echo(f"snapshot {version}: all files match the manifest")


@snapshot_app.command("publish")
def snapshot_publish(config: Path = typer.Option(DEMO_CONFIG, "--config", "-c")) -> None:
    """Publish the current curated tables as a release (no new version if the content is unchanged)."""
    from etl.keys import MissingKeyError, load_key
    from etl.snapshots import SnapshotError, publish
    from schemas.ontology import load_ontology

    cfg, st = _storage(config)
    try:
        rel = publish(st, config_hash=cfg.config_hash(), ontology_version=load_ontology().version,
                      run_id="cli", key_fingerprint=load_key(allow_airflow=False).fingerprint())
    except (MissingKeyError, SnapshotError) as err:
        _fail(str(err))
    typer.echo(f"{rel.version}\t{'created' if rel.created else 'unchanged'}\t{rel.path}")


@app.command()
def dashboard(
    config: Path = typer.Option(DEMO_CONFIG, "--config", "-c"),
    serve: bool = typer.Option(False, "--serve", help="serve it on http://127.0.0.1:PORT"),
    port: int = typer.Option(8765),
) -> None:
    """Print the dashboard path (built by each run), or serve it on localhost."""
    _, st = _storage(config)
    index = "reports/dashboard/index.html"
    if not st.is_file(index):
        _fail(f"no dashboard yet under {st.full_uri('reports/dashboard')}: run the build first")
    if not serve:
        typer.echo(st.full_uri(index))
        return
    if not st.is_local:
        _fail("--serve needs a local storage root")
    import functools
    import http.server

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=st.path("reports/dashboard"))
    with http.server.ThreadingHTTPServer(("127.0.0.1", port), handler) as httpd:
        typer.echo(f"serving {st.full_uri(index)} on http://127.0.0.1:{port}/ (Ctrl-C to stop)")
        httpd.serve_forever()


def main() -> None:  # pragma: no cover
    """Entry point for ``python -m etl.cli``."""
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
