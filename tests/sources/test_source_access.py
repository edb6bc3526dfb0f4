"""A configured source that is missing or unreadable stops the run before any work; every path under a source
(dangling links, pipes, loops, folders and files that cannot be read) gets one ledger row; an empty source is
allowed and a build that saw no file publishes nothing (:mod:`etl.sources.source_access`)."""

from __future__ import annotations

import json
import os

import pytest
import yaml
from typer.testing import CliRunner

from etl.pipeline.context import EVENT_SCHEMA, BuildContext
from etl.pipeline.ledger import balance, build_ledger
from etl.pipeline.publish_stage import publish_stage, run_summary_path
from etl.sources import source_access
from etl.sources.discover import SEEN_SCHEMA, discover_institution, mark_duplicates, mark_seen
from etl.sources.source_access import SourceUnavailableError, check_sources, list_source, source_storage
from etl.storage import Storage, StorageError
from medreco.cli.app import _print_summary, app
from schemas.config import parse_config


def config(tmp_path, *sources: str):
    doc = {
        "storage": {"root": str(tmp_path / "root")},
        "shard_count": 2,
        "institutions": [
            {
                "id": f"inst-{i}",
                "country": "US",
                "language": "en",
                "timezone": "UTC",
                "source_uri": s,
                "report_format": "jsonl",
            }
            for i, s in enumerate(sources)
        ],
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(doc))
    return parse_config(doc), path


def test_missing_source_is_refused_naming_institution_and_path(tmp_path):
    (tmp_path / "root" / "sources" / "here").mkdir(parents=True)
    cfg, _ = config(tmp_path, "sources/here", "sources/typo")
    root = Storage.from_config(cfg)
    with pytest.raises(SourceUnavailableError) as err:
        check_sources(cfg, root)
    assert err.value.reason == "source_not_found"
    assert "inst-1" in str(err.value) and str(tmp_path / "root" / "sources" / "typo") in str(err.value)
    assert not (tmp_path / "root" / "sources" / "typo").exists()  # opening the source created nothing


def test_file_dangling_link_and_unlistable_sources_are_refused(tmp_path, monkeypatch):
    (tmp_path / "root" / "sources").mkdir(parents=True)
    (tmp_path / "root" / "sources" / "a-file").write_text("x")
    os.symlink(tmp_path / "nowhere", tmp_path / "root" / "sources" / "link")
    (tmp_path / "root" / "sources" / "locked").mkdir()
    for uri, reason in (("sources/a-file", "source_not_a_folder"), ("sources/link", "source_not_found")):
        cfg, _ = config(tmp_path, uri)
        with pytest.raises(SourceUnavailableError, match=reason):
            check_sources(cfg, Storage.from_config(cfg))
    locked = str(tmp_path / "root" / "sources" / "locked")
    real_scandir = os.scandir

    def scandir(path="."):  # the tests run as root, whom permissions do not stop: refuse this folder here
        if str(path) == locked:
            raise PermissionError(13, "Permission denied")
        return real_scandir(path)

    monkeypatch.setattr(source_access.os, "scandir", scandir)
    cfg, _ = config(tmp_path, "sources/locked")
    with pytest.raises(SourceUnavailableError, match="source_unreadable: institution inst-0"):
        check_sources(cfg, Storage.from_config(cfg))


def test_every_path_gets_a_ledger_row(tmp_path, key, monkeypatch):
    src = tmp_path / "root" / "sources" / "site"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "a.dcm").write_bytes(b"not dicom at all")
    (src / "notes.md").write_text("readme")
    (src / "unreadable.dcm").write_bytes(b"secret bytes")
    os.symlink(src / "gone.dcm", src / "dangling.dcm")
    os.symlink(src, src / "sub" / "loop")
    os.mkfifo(src / "pipe.dcm")
    (src / "locked").mkdir()
    (src / "locked" / "b.dcm").write_bytes(b"x")
    real_scandir, real_read = os.scandir, Storage.read_bytes

    def scandir(path="."):
        if str(path).endswith("/locked"):
            raise PermissionError(13, "Permission denied")
        return real_scandir(path)

    def read_bytes(self, rel):
        if rel == "unreadable.dcm":
            raise StorageError("cannot read: Permission denied")
        return real_read(self, rel)

    monkeypatch.setattr(source_access.os, "scandir", scandir)
    monkeypatch.setattr(Storage, "read_bytes", read_bytes)
    cfg, _ = config(tmp_path, "sources/site")
    plan = discover_institution(cfg, cfg.institutions[0], Storage.from_config(cfg), key)
    rows = {r["source_uri"].rsplit("/site/", 1)[1]: r for r in plan.to_pylist()}
    assert set(rows) == {"sub/a.dcm", "notes.md", "unreadable.dcm", "dangling.dcm", "sub/loop", "pipe.dcm", "locked"}
    for rel, why in (
        ("unreadable.dcm", "cannot be read"),
        ("dangling.dcm", "link to nothing"),
        ("sub/loop", "loop"),
        ("pipe.dcm", "named pipe"),
        ("locked", "cannot be listed"),
    ):
        assert (rows[rel]["status"], rows[rel]["reason"]) == ("quarantined", "unreadable_file")
        assert why in rows[rel]["detail"] and rows[rel]["bytes"] == 0
    assert rows["sub/a.dcm"]["reason"] == "not_dicom" and rows["notes.md"]["status"] == "skipped"
    assert len({r["sha256"] for r in rows.values()}) == len(rows)  # placeholders never read as duplicates
    ledger = build_ledger("r1", mark_seen(mark_duplicates(plan), SEEN_SCHEMA.empty_table()), EVENT_SCHEMA.empty_table())
    counts = balance(ledger)
    assert counts["balanced"] and counts["files_seen"] == 7 and counts["quarantined"] == 6


def test_links_to_folders_are_followed(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "x.dcm").write_bytes(b"x")
    src = tmp_path / "src"
    src.mkdir()
    os.symlink(tmp_path / "real", src / "linked")
    cfg, _ = config(tmp_path, str(src))
    entries = list_source(source_storage(cfg, cfg.institutions[0], Storage.from_config(cfg)))
    assert [(e.rel, e.problem) for e in entries] == [("linked/x.dcm", None)]


def empty_ctx(tmp_path, key):
    (tmp_path / "root" / "sources" / "empty").mkdir(parents=True)
    cfg, _ = config(tmp_path, "sources/empty")
    ctx = BuildContext.from_config(cfg, "run-empty", key)
    ctx.storage.write_table(ctx.plan_path(), discover_institution(cfg, cfg.institutions[0], ctx.storage, key))
    return ctx


def test_a_build_with_no_file_publishes_nothing(tmp_path, key):
    from etl.pipeline.ledger import finalise

    ctx = empty_ctx(tmp_path, key)
    result = finalise(ctx)
    assert result["balanced"] and result["files_seen"] == 0 and result["files_by_institution"] == {"inst-0": 0}
    summary = publish_stage(ctx)
    assert summary["published"] is False and summary["version"] is None
    assert not ctx.storage.exists("snapshots")
    assert json.loads(ctx.storage.read_text(run_summary_path(ctx.run_id)))["published"] is False


def test_summary_says_no_files_and_nothing_published(capsys):
    summary = {
        "run_id": "r",
        "tables": {},
        "published": False,
        "reason": "no files under any source: nothing published",
        "latest_existing_version": None,
        "dashboard": "d",
        "quarantined_by_reason": {},
        "ledger": {
            "files_seen": 0,
            "ingested": 0,
            "quarantined": 0,
            "duplicate": 0,
            "skipped": 0,
            "balanced": True,
            "files_by_institution": {"inst-0": 0, "inst-1": 3},
        },
    }
    _print_summary(summary)
    out = capsys.readouterr().out
    assert "no files: inst-0 " in out and "inst-1" not in out.split("no files:")[1].split("\n")[0]
    assert "snapshot: none (no files under any source: nothing published" in out


def test_cli_run_refuses_a_missing_source_before_any_work(tmp_path):
    _, path = config(tmp_path, "sources/typo")
    result = CliRunner().invoke(app, ["run", "--config", str(path)])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "error: source_not_found: institution inst-0: source_uri 'sources/typo'"
    )
    assert not (tmp_path / "root" / "ledger").exists()  # no key binding, no ledger, no plan


def test_s3_sources_missing_empty_and_present(monkeypatch):
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"
        for var, value in (
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("AWS_DEFAULT_REGION", "us-east-1"),
        ):
            monkeypatch.setenv(var, value)
        s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1")
        s3.create_bucket(Bucket="med")
        s3.put_object(Bucket="med", Key="root/sources/full/a.dcm", Body=b"x")
        s3.put_object(Bucket="med", Key="root/sources/empty/", Body=b"")  # a folder marker: an existing, empty source
        doc = {
            "storage": {"root": "s3://med/root", "s3_endpoint_url": url},
            "shard_count": 1,
            "institutions": [
                {
                    "id": i,
                    "country": "US",
                    "language": "en",
                    "timezone": "UTC",
                    "source_uri": f"sources/{i}",
                    "report_format": "none",
                }
                for i in ("full", "empty")
            ],
        }
        cfg = parse_config(doc)
        root = Storage.from_config(cfg)
        assert check_sources(cfg, root) == {
            "full": "s3://med/root/sources/full",
            "empty": "s3://med/root/sources/empty",
        }
        doc["institutions"][1]["source_uri"] = "sources/typo"
        cfg = parse_config(doc)
        with pytest.raises(
            SourceUnavailableError, match="source_not_found: institution empty: source_uri 'sources/typo'"
        ):
            check_sources(cfg, root)
    finally:
        server.stop()


def test_a_name_that_is_not_utf8_is_escaped_and_processed_on_its_content(tmp_path, key):
    """Issue 41: bytes \\xff\\xfe in a file name crashed discovery (UnicodeEncodeError)."""
    from pathlib import Path

    from etl.storage import read_uri

    ct = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "dicom" / "transfer-syntaxes"
    ct = ct / "1.2.840.10008.1.2.1.dcm"
    assert ct.is_file(), "needs ../shared/data/dicom beside the project (CI copies it there)"
    src = tmp_path / "root" / "sources" / "site"
    src.mkdir(parents=True)
    data = ct.read_bytes()
    (src / os.fsdecode(b"ct-\xff\xfe.dcm")).write_bytes(data)
    cfg, _ = config(tmp_path, "sources/site")
    plan = discover_institution(cfg, cfg.institutions[0], Storage.from_config(cfg), key).to_pylist()
    assert [r["source_uri"].rsplit("/", 1)[1] for r in plan] == ["ct-\\xff\\xfe.dcm"]
    assert plan[0]["kind"] == "dicom" and plan[0]["bytes"] == len(data) and plan[0]["reason"] != "unreadable_file"
    assert read_uri(plan[0]["source_uri"]) == data  # the stages read it back by its escaped name
    json.dumps(plan[0])
