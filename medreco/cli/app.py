"""``medreco``: the project's command line (one console script; docs/command-line.md lists the contract).

Exit status 0 on success; non-zero with a one-line reason on failure.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import typer

from etl import zones
from medreco.cli import eval as cli_eval
from medreco.cli import reports as cli_reports
from medreco.cli import train as training_cli
from medreco.cli.help_format import plain_usage
from schemas.config import PROJECT_ROOT

plain_usage()
app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None, help="MedReCo-DB builder")
snapshot_app = typer.Typer(
    no_args_is_help=True, rich_markup_mode=None, help="list, show, diff, verify, export and publish snapshots"
)
app.add_typer(snapshot_app, name="snapshot")
app.add_typer(cli_reports.app, name="reports")
app.add_typer(cli_eval.app, name="eval")
app.add_typer(training_cli.app, name="train")

DEMO_DIR = PROJECT_ROOT / ".demo"
DEMO_CONFIG = PROJECT_ROOT / "config" / "demo.yaml"
CONFIG_HELP = "pipeline YAML config (default: $MEDRECO_CONFIG, else the checkout's config/demo.yaml)"
ROOT_HELP = (
    "the storage root the releases live under (a folder or s3://bucket/prefix; S3 endpoint from "
    "AWS_ENDPOINT_URL): read releases with no pipeline config at all"
)


def _fail(message: str, code: int = 1) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _config(config: Path | None) -> Path:
    """The config file a command reads: ``--config``, else ``$MEDRECO_CONFIG``, else ``config/demo.yaml``."""
    from schemas.config import default_config_path

    return Path(config) if config is not None else Path(default_config_path())


def _storage(config: Path | None):
    from etl.storage import Storage
    from schemas.config import ConfigError, load_config

    try:
        cfg = load_config(_config(config))
    except ConfigError as err:
        _fail(str(err))
    return cfg, Storage.from_config(cfg)


def _release_storage(config: Path | None, root: str | None):
    """The storage root of the snapshot commands: ``--root``; else the config's ``storage:`` section, which is all
    they need (a config holding only ``storage.root`` is enough; a full pipeline config works too)."""
    from etl.storage import Storage, StorageError
    from schemas.config import ConfigError, storage_config

    try:
        if root is not None:
            return Storage.open(root)
        path = _config(config)
        sc = storage_config(path)
        return Storage.open(sc.root, endpoint_url=sc.s3_endpoint_url, region=sc.s3_region, base_dir=path.parent)
    except (ConfigError, StorageError) as err:
        _fail(str(err))


def summary_lines(summary: dict) -> list[str]:
    """The run summary as printed: rows per table, the ledger balance and where its records are, quarantines by
    reason, quality warnings and withheld report records by count, the snapshot, content hash and dashboard."""
    led = summary["ledger"]
    lines = [f"run {summary['run_id']}", "rows per table:"]
    lines += [f"  {t:<16} {n:>8}" for t, n in summary["tables"].items()]
    lines.append(
        f"ledger: files_seen={led['files_seen']} = ingested {led['ingested']} + quarantined {led['quarantined']}"
        f" + duplicate {led['duplicate']} + skipped {led['skipped']}  "
        f"-> {'BALANCED' if led['balanced'] else 'UNBALANCED'}"
    )
    if summary.get("ledger_file"):
        lines.append(f"  ledger file: {summary['ledger_file']}")
    if summary.get("quarantined_by_reason"):
        lines.append(
            "quarantined by reason: " + ", ".join(f"{k}={v}" for k, v in summary["quarantined_by_reason"].items())
        )
    empty = [i for i, n in (led.get("files_by_institution") or {}).items() if n == 0]
    if empty:
        lines.append("no files: " + ", ".join(empty) + " (source there and readable, but empty)")
    if summary.get("quarantine") and (led.get("quarantined") or led.get("withheld_report_records")):
        lines.append(f"  quarantine records: {summary['quarantine']}")
    if "withheld_reports_by_reason" in summary:
        withheld = led.get("withheld_report_records", sum(summary["withheld_reports_by_reason"].values()))
        by_reason = ", ".join(f"{k}={v}" for k, v in summary["withheld_reports_by_reason"].items())
        lines.append(
            f"withheld report records: {withheld}"
            + (f" ({by_reason}; listed under the quarantine records' reports/)" if withheld else "")
        )
    if "quality_warnings" in summary:
        warns = summary["quality_warnings"]
        shown = ", ".join(f"{w['table']}/{w['check']}" for w in warns[:5]) + (", ..." if len(warns) > 5 else "")
        lines.append(
            f"quality warnings: {len(warns)}" + (f" ({shown}; {summary.get('quality_report', '')})" if warns else "")
        )
    if summary.get("published", True):
        lines.append(
            f"snapshot: {summary['version']} ({'new' if summary['created'] else 'unchanged content, existing release'})"
            f" at {summary['uri']}"
        )
        lines.append(f"content hash: {summary['content_hash']}")
    else:
        lines.append(f"snapshot: none ({summary['reason']}; latest release: {summary.get('latest_existing_version')})")
        lines.append("content hash: -")
    lines.append(f"dashboard: {summary['dashboard']}")
    return lines


def _print_summary(summary: dict) -> None:
    typer.echo("\n".join(summary_lines(summary)))


def _progress(quiet: bool):
    from medreco.cli.progress import BuildProgress

    return None if quiet else BuildProgress()


@app.command("demo-corpus")
def demo_corpus(
    out: Path = typer.Argument(..., metavar="OUT", help="output folder (sources/ and answer_key/ are written in it)"),
    seed: int = typer.Option(0, help="random seed: same seed, same bytes"),
    patients: int = typer.Option(48, help="number of patients"),
) -> None:
    """Generate the demo multi-institution corpus and its PHI answer key."""
    from etl.demo.corpus import DemoCorpusError, generate_corpus

    try:
        summary = generate_corpus(out, seed=seed, n_patients=patients)
    except DemoCorpusError as err:
        _fail(str(err))
    typer.echo(json.dumps(summary, sort_keys=True))


@app.command()
def run(
    config: Path | None = typer.Option(None, "--config", "-c", help=CONFIG_HELP, dir_okay=False),
    workers: int = typer.Option(
        os.cpu_count() or 1,
        "--workers",
        "-w",
        min=1,
        help="task processes: 1 runs dag.test() in this process; N > 1 runs the DAG under "
        "a real scheduler with the LocalExecutor (N workers) on the same database",
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress display: print the summary only"),
) -> None:
    """Run the build DAG on the embedded default (Airflow on SQLite): dag.test() with --workers 1, else a
    scheduler with the LocalExecutor running mapped tasks in parallel (default: one worker per CPU core)."""
    from etl.keys import MissingKeyError, load_key
    from etl.pipeline.context import KeyMismatchError
    from etl.sources.source_access import SourceUnavailableError, check_sources
    from etl.storage import Storage
    from medreco.cli.embedded import BuildFailedError, run_build
    from schemas.config import ConfigError, load_config

    try:
        cfg = load_config(_config(config))
        check_sources(cfg, Storage.from_config(cfg))  # a missing or unreadable source: refused before Airflow starts
        if not os.environ.get("AIRFLOW_CONN_MEDRECO_PSEUDONYM"):
            load_key(allow_airflow=False)  # refuse before any work; tasks may also read the Airflow connection
        summary = run_build(_config(config), workers=workers, progress=_progress(quiet))
    except (ConfigError, MissingKeyError, KeyMismatchError, BuildFailedError, SourceUnavailableError) as err:
        _fail(str(err))
    _print_summary(summary)


@app.command()
def demo(
    seed: int = typer.Option(0, help="demo corpus seed"),
    patients: int = typer.Option(48, help="demo corpus patients"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no corpus line, no progress display: the summaries only"),
    workers: int = typer.Option(
        1,
        "--workers",
        "-w",
        min=1,
        help="task processes (as `medreco run`); 1 by default: on the small demo corpus "
        "the scheduler's start-up and per-task warm-up cost more than they save",
    ),
    train: bool = typer.Option(True, "--train/--no-train", help="then run the training DAG on the snapshot"),
) -> None:
    """Generate the demo corpus (once), create a local demo key (demo only), run the build, then the training
    DAG the new snapshot triggers (local launcher, tiny CPU configs)."""
    from etl.demo.corpus import generate_corpus
    from etl.keys import ENV_VAR, demo_key
    from etl.pipeline.context import KeyMismatchError
    from medreco.cli.embedded import BuildFailedError, run_build

    root = DEMO_DIR / "root"
    if not (root / "sources").is_dir():
        corpus = generate_corpus(root, seed=seed, n_patients=patients)
        if not quiet:
            typer.echo(f"demo corpus: {json.dumps(corpus, sort_keys=True)}")
    elif not quiet:
        typer.echo(
            f"demo corpus: reusing {root / 'sources'} (--seed/--patients apply to a new corpus; "
            "`make clean` removes it)"
        )
    from etl.sources.source_access import SourceUnavailableError

    os.environ[ENV_VAR] = demo_key(DEMO_DIR / "demo.key")
    try:
        summary = run_build(DEMO_CONFIG, workers=workers, progress=_progress(quiet))
    except (BuildFailedError, KeyMismatchError, SourceUnavailableError) as err:
        _fail(str(err))
    _print_summary(summary)
    if not train or not summary.get("published", True):
        return
    # the training DAG the snapshot Asset triggers, run here the same way (dag.test, local launcher, tiny CPU configs)
    from etl.pipeline.context import BuildContext
    from medreco.cli.embedded import run_training

    version = str(summary["version"])
    existing = zones.training_record(version)
    storage = BuildContext.from_config_file(str(DEMO_CONFIG), run_id="demo-training").storage
    try:
        record = (
            json.loads(storage.read_text(existing))
            if not summary["created"] and storage.is_file(existing)
            else run_training(DEMO_CONFIG, version)
        )
    except BuildFailedError as err:
        _fail(str(err))
    _print_training(record, summary["tables"].get("splits"))


#: printed under the demo's training metrics: what they are, and what they are not
DEMO_METRICS_NOTE = (
    "note: demo metrics mean nothing: a tiny CPU model trained for a few steps on {n} patients is a "
    "smoke test of snapshot -> training -> lineage, not a model (figures near 0 are expected)"
)


def _print_training(record: dict, n_patients: int | None = None) -> None:
    lines = [f"training on snapshot {record['snapshot_version']} (content hash {record['content_hash'][:16]}):"]
    for job, h in sorted(record["jobs"].items()):
        lin = h.get("lineage_record") or {}
        metrics = (lin.get("metrics") or {}).get("eval") or {}
        shown = ", ".join(
            f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
            for k, v in _flat(metrics)
            if k.endswith(
                ("micro.R@1", "micro.R@5", "mc_accuracy", "open_exact_match", "bleu1", "n_queries", "n_items")
            )
        )
        lines.append(f"  {job:<8} {h.get('status')}  {shown}")
        if lin.get("checkpoint"):
            lines.append(f"           checkpoint {lin['checkpoint']}")
    lines.append(DEMO_METRICS_NOTE.format(n=n_patients if n_patients is not None else "the demo's"))
    typer.echo("\n".join(lines))


def _flat(d: dict, prefix: str = "") -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    for k, v in d.items():
        if isinstance(v, dict) and not k.startswith("by_"):  # per-entity / per-question-type detail: in the record
            out += _flat(v, f"{prefix}{k}.")
        elif isinstance(v, (int, float, str)):
            out.append((f"{prefix}{k}", v))
    return out


@app.command()
def deid(
    src: Path = typer.Argument(..., metavar="SRC", exists=True, file_okay=False, help="folder of DICOM files"),
    out: Path = typer.Argument(
        ..., metavar="OUT", help="output folder: de-identified files, ledger.parquet, quarantine/"
    ),
    institution: str = typer.Option("local", help="institution id the PatientIDs belong to"),
    config: Path | None = typer.Option(None, "--config", "-c", help="take the deid: options from this config"),
) -> None:
    """De-identify a folder of DICOM files (ledger + quarantine under OUT)."""
    from etl.keys import MissingKeyError, load_key
    from medreco.cli.deid_folder import DeidFolderError, deidentify_folder

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


@app.command()
def runs(
    run_id: str | None = typer.Argument(None, metavar="RUN", help="one run: its task instances"),
    limit: int = typer.Option(20, min=1, help="runs listed, newest first"),
    config: Path | None = typer.Option(None, "--config", "-c", help=CONFIG_HELP, dir_okay=False),
    root: str | None = typer.Option(None, "--root", help="the storage root whose runs are listed"),
) -> None:
    """Build runs of the embedded default, newest first: state, start, duration, task states, files ingested and
    quarantined; with RUN, that run's task instances (state, try, duration). Read from Airflow's metadata
    database in $AIRFLOW_HOME (default: the checkout's .airflow)."""
    from medreco.cli.embedded import prepare_airflow_env
    from medreco.cli.runs import RunHistoryError, format_runs, format_tasks, list_runs, resolve_run_id, run_tasks

    prepare_airflow_env()
    if run_id is not None:
        try:
            typer.echo("\n".join(format_tasks(run_tasks(resolve_run_id(run_id)))))
        except RunHistoryError as err:
            _fail(str(err))
        return
    storage = _release_storage(config, root)  # only the storage root is needed: a storage-only config is enough
    rows = list_runs(storage, limit=limit)
    if not rows:
        _fail(f"no build run on {storage.uri} recorded in this AIRFLOW_HOME yet (medreco run starts one)")
    typer.echo("\n".join(format_runs(rows)))


@app.command()
def logs(
    run_id: str = typer.Argument(
        ..., metavar="RUN", help="a run id (medreco runs lists them; the form a build's summary prints works too)"
    ),
    task: str | None = typer.Argument(None, metavar="TASK", help="one task id (e.g. deidentify_shard)"),
) -> None:
    """Print the logs of a build run, or of one of its tasks: Airflow's task log files, or the whole log of a
    one-process (dag.test) run."""
    from medreco.cli.embedded import prepare_airflow_env
    from medreco.cli.runs import RunHistoryError, resolve_run_id, task_logs

    home = prepare_airflow_env()
    try:
        files = task_logs(home, resolve_run_id(run_id), task)
    except RunHistoryError as err:
        _fail(str(err))
    for path in files:
        typer.echo(f"==> {path} <==")
        typer.echo(path.read_text(encoding="utf-8", errors="replace"))


@snapshot_app.command("list")
def snapshot_list(
    config: Path | None = typer.Option(None, "--config", "-c", help=CONFIG_HELP, dir_okay=False),
    root: str | None = typer.Option(None, "--root", help=ROOT_HELP),
) -> None:
    """Published releases, oldest first, one per line under a header: version, created_at, change, content hash
    (first 16 hex digits) and the rows of the tables users load first (studies, images, pairs, vqa; "-" where a
    release has no such table). ``snapshot show V`` prints every table's rows."""
    from etl.snapshots import list_versions, read_manifest

    st = _release_storage(config, root)
    versions = list_versions(st)
    if not versions:
        _fail(f"no release under {st.uri} (publish one with `medreco run` or `medreco snapshot publish`)")
    tables = ("studies", "images", "pairs", "vqa")
    typer.echo("\t".join(("version", "created_at", "change", "content_hash", *tables)))
    for v in versions:
        m = read_manifest(st, v)
        rows = [str(m["tables"][t]["rows"]) if t in m["tables"] else "-" for t in tables]
        typer.echo("\t".join((v, m["created_at"], m.get("change", "?"), m["content_hash"][:16], *rows)))


@snapshot_app.command("show")
def snapshot_show(
    version: str = typer.Argument(..., metavar="VERSION", help="MAJOR.MINOR.PATCH or 'latest'"),
    config: Path | None = typer.Option(None, "--config", "-c", help=CONFIG_HELP, dir_okay=False),
    root: str | None = typer.Option(None, "--root", help=ROOT_HELP),
) -> None:
    """Print a release's manifest (JSON)."""
    from etl.snapshots import SnapshotError, read_manifest, resolve_version

    st = _release_storage(config, root)
    try:
        typer.echo(json.dumps(read_manifest(st, resolve_version(st, version)), indent=1, sort_keys=True))
    except SnapshotError as err:
        _fail(str(err))


@snapshot_app.command("diff")
def snapshot_diff(
    old: str = typer.Argument(..., metavar="OLD", help="the older release (MAJOR.MINOR.PATCH or 'latest')"),
    new: str = typer.Argument(..., metavar="NEW", help="the newer release"),
    limit: int = typer.Option(20, help="keys listed per table and kind (0: all)"),
    as_json: bool = typer.Option(False, "--json", help="print every key as JSON"),
    config: Path | None = typer.Option(None, "--config", "-c", help=CONFIG_HELP, dir_okay=False),
    root: str | None = typer.Option(None, "--root", help=ROOT_HELP),
) -> None:
    """Rows added, removed and changed per table between two releases, by each table's key columns."""
    from etl.snapshots import SnapshotError, diff, resolve_version

    st = _release_storage(config, root)
    try:
        a, b = resolve_version(st, old), resolve_version(st, new)
        result = diff(st, a, b)
    except SnapshotError as err:
        _fail(str(err))
    if as_json:
        typer.echo(json.dumps({t: d.to_dict() for t, d in result.items()}, indent=1, sort_keys=True))
        return
    typer.echo(f"diff {a} -> {b}")
    for t, d in result.items():
        schema = f"  schema {d.schema[0]} -> {d.schema[1]}" if d.schema else ""
        typer.echo(f"{t:<18} {d.status:<14} +{len(d.added)} -{len(d.removed)} ~{len(d.changed)}{schema}")
        for sign, keys in (("+", d.added), ("-", d.removed), ("~", d.changed)):
            shown = keys if limit <= 0 else keys[:limit]
            typer.echo("".join(f"  {sign} {'/'.join(str(x) for x in k)}\n" for k in shown), nl=False)
            if len(shown) < len(keys):
                typer.echo(f"  {sign} ... {len(keys) - len(shown)} more (--limit 0 or --json lists all)")


@snapshot_app.command("verify")
def snapshot_verify(
    version: str = typer.Argument(..., metavar="VERSION", help="MAJOR.MINOR.PATCH or 'latest'"),
    config: Path | None = typer.Option(None, "--config", "-c", help=CONFIG_HELP, dir_okay=False),
    root: str | None = typer.Option(None, "--root", help=ROOT_HELP),
) -> None:
    """Re-hash every file of a release; fail (exit 1, one line) naming each tampered or missing file."""
    from etl.snapshots import SnapshotError, resolve_version, verify

    st = _release_storage(config, root)
    try:
        version = resolve_version(st, version)
        problems = verify(st, version)
    except SnapshotError as err:
        _fail(str(err))
    if problems:
        _fail(f"snapshot {version} failed verification: " + "; ".join(problems))
    typer.echo(f"snapshot {version}: all files match the manifest")


@snapshot_app.command("export")
def snapshot_export(
    version: str = typer.Argument(..., metavar="VERSION", help="MAJOR.MINOR.PATCH or 'latest'"),
    dest: Path = typer.Argument(..., metavar="DEST", help="a new or empty folder"),
    config: Path | None = typer.Option(None, "--config", "-c", help=CONFIG_HELP, dir_okay=False),
    root: str | None = typer.Option(None, "--root", help=ROOT_HELP),
) -> None:
    """Write a release as one self-contained folder (per-split Parquet, volumes, Hugging Face card) that a plain
    copy or huggingface_hub's upload_folder can move: datasets.load_dataset(DEST, "pairs", split="train")."""
    from etl.snapshots.export import ExportError, export_release

    st = _release_storage(config, root)
    try:
        record = export_release(st, version, dest)
    except ExportError as err:
        _fail(str(err))
    counts = ", ".join(f"{t} {sum(r.values())}" for t, r in record["rows"].items())
    typer.echo(f"snapshot {record['version']} exported to {dest}: {len(record['files'])} files ({counts})")


@snapshot_app.command("publish")
def snapshot_publish(
    config: Path | None = typer.Option(None, "--config", "-c", help=CONFIG_HELP, dir_okay=False),
    run_id: str | None = typer.Option(
        None,
        "--run-id",
        help="lineage: the run whose ledger describes the inputs (default: the most recent run ledger)",
    ),
) -> None:
    """Publish the current curated tables as a release (no new version if the content is unchanged)."""
    from etl.deid.policy import build_policy
    from etl.keys import MissingKeyError, load_key
    from etl.snapshots import SnapshotError, publish
    from schemas.ontology import load_ontology

    cfg, st = _storage(config)
    try:
        rel = publish(
            st,
            config_hash=cfg.config_hash(),
            ontology_version=load_ontology().version,
            run_id=run_id or "cli",
            ledger_run_id=run_id,
            key_fingerprint=load_key(allow_airflow=False).fingerprint(),
            deid_method_codes=build_policy(cfg.deid).release_method_codes,
        )
    except (MissingKeyError, SnapshotError) as err:
        _fail(str(err))
    typer.echo(
        f"{rel.version}\t{'created' if rel.created else 'unchanged'}\t{rel.manifest['content_hash']}\t{rel.path}"
    )


@app.command("validate-source")
def validate_source(
    institution: str = typer.Option(..., "--institution", "-i", help="institution id of the config"),
    config: Path | None = typer.Option(None, "--config", "-c", help=CONFIG_HELP, dir_okay=False),
    deidentify: bool = typer.Option(
        True,
        "--deid/--no-deid",
        help="de-identify the DICOM files in memory "
        "(as the build); --no-deid checks headers, duplicates and reports only",
    ),
    as_json: bool = typer.Option(False, "--json", help="print the whole result as JSON"),
) -> None:
    """Check one institution's delivery with the build's own checks before a run; writes nothing.

    Exit status 0 when the build would ingest every file and report record, 1 (with one line per problem:
    path, stage, reason, detail) when it would quarantine a file or withhold a record, 2 when the delivery
    cannot be checked (unknown institution, no delivery, bad config).
    """
    from etl.keys import MissingKeyError, load_key
    from etl.pipeline.validate_source import ValidateSourceError, validate_delivery
    from schemas.config import ConfigError, load_config

    try:
        cfg = load_config(_config(config))
    except ConfigError as err:
        _fail(str(err), 2)
    try:
        key = load_key(allow_airflow=False)
    except MissingKeyError:
        key = None  # a one-off key: the checks do not depend on it, and no pseudonym is shown
    try:
        check = validate_delivery(cfg, institution, key=key, deidentify=deidentify)
    except ValidateSourceError as err:
        _fail(str(err), 2)
    if as_json:
        typer.echo(json.dumps(check.as_dict(), indent=1, sort_keys=True))
    else:
        files = ", ".join(f"{k} {v}" for k, v in sorted(check.files.items()))
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(check.statuses.items()))
        records = ", ".join(f"{k} {v}" for k, v in sorted(check.records.items())) or "none"
        new, old = check.ledger.get("new", 0), check.ledger.get("already_recorded", 0)
        lines = [
            f"delivery {check.institution} ({check.source}): {files}",
            (
                f"against the ledger of {check.ledger_root}: {new} new, {old} already recorded by an earlier run"
                if check.ledger_root
                else f"no ledger at the storage root yet: all {new} files are new"
            ),
            f"the build would record: {statuses}",
            f"report records: {records}",
        ]
        from collections import Counter

        seen = Counter(
            f["detail"] for f in check.findings if f["outcome"] == "duplicate" and f["reason"] == "seen_in_earlier_run"
        )
        lines += [f"duplicate   discover   seen_in_earlier_run  {n} file(s): {d}" for d, n in sorted(seen.items())]
        lines += [
            f"{f['outcome']:<11} {f['stage']:<10} {f['reason']}  {f['path']}: {f['detail']}"
            for f in check.findings
            if f["outcome"] != "skipped" and f["reason"] != "seen_in_earlier_run"
        ]
        n = len(check.problems)
        dup = check.statuses.get("duplicate", 0)
        lines.append(
            (
                "OK: the build would ingest every file and record"
                + (f" that is new ({dup} duplicate{'s' if dup != 1 else ''}, nothing to ingest again)" if dup else "")
                if check.ok
                else f"FAIL: {n} problem{'s' if n != 1 else ''} (quarantined files, withheld records)"
            )
            + ("" if deidentify else " (--no-deid: de-identification and report links not checked)")
        )
        typer.echo("\n".join(lines))
    if not check.ok:
        raise typer.Exit(1)


@app.command()
def dashboard(
    config: Path | None = typer.Option(None, "--config", "-c", help=CONFIG_HELP, dir_okay=False),
    root: str | None = typer.Option(None, "--root", help="the storage root whose dashboard is shown"),
    serve: bool = typer.Option(
        False,
        "--serve",
        help="serve it with the review app on http://127.0.0.1:PORT "
        "(needs $MEDRECO_REVIEW_TOKEN: curators log in with it)",
    ),
    port: int = typer.Option(8765),
) -> None:
    """Print the dashboard path (built by each run), or serve it with the quarantine review app on localhost."""
    st = _release_storage(config, root)  # the storage root alone is enough
    index = zones.DASHBOARD_INDEX
    if not st.is_file(index):
        _fail(f"no dashboard yet under {st.full_uri(zones.DASHBOARD_DIR)}: run the build first")
    if not serve:
        typer.echo(st.full_uri(index))
        return
    import uvicorn

    from quality.review_app import create_app
    from quality.review_auth import (
        RequestGuard,
        ReviewAuthError,
        TokenAuth,
        allowed_hosts_from_env,
        token_from_env,
    )

    try:
        auth = TokenAuth(token_from_env())
    except ReviewAuthError as err:
        _fail(str(err))
    typer.echo(
        f"serving {st.full_uri('reports')} on http://127.0.0.1:{port}/ (dashboard, Data Docs, "
        f"quarantine review at /review; log in with your name and the token of $MEDRECO_REVIEW_TOKEN; "
        f"Ctrl-C to stop)"
    )
    uvicorn.run(
        create_app(st, authenticate=auth, guard=RequestGuard(allowed_hosts_from_env())),
        host="127.0.0.1",
        port=port,
        log_level="warning",
    )


def main() -> int:  # pragma: no cover
    """Entry point of the ``medreco`` console script and ``python -m medreco.cli``: quiet, honest output
    (:func:`medreco.cli.output.quiet_entry_point`), then the command (Typer exits with its status itself)."""
    from medreco.cli.output import quiet_entry_point

    quiet_entry_point()
    app()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
