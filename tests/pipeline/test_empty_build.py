"""A build whose sources all exist but hold no file: the DAG runs to the end, publishes nothing (the snapshot task
ends skipped, so no ``medreco://snapshot`` event triggers training) and the summary says so."""

from __future__ import annotations

from conftest import config_for


def test_build_with_no_file_publishes_nothing(tmp_path, airflow_home):
    from etl.storage import Storage
    from medreco.cli.embedded import run_build

    root = tmp_path / "root"
    institutions = [
        {
            "id": f"empty-{i}",
            "country": "US",
            "language": "en",
            "timezone": "UTC",
            "source_uri": f"sources/empty-{i}",
            "report_format": "jsonl",
        }
        for i in range(2)
    ]
    for inst in institutions:
        (root / inst["source_uri"]).mkdir(parents=True)
    splits = {"train": 0.7, "val": 0.15, "test": 0.15, "external_test_institutions": []}
    summary = run_build(config_for(root, institutions=institutions, shard_count=2, splits=splits))
    assert summary["published"] is False and summary["version"] is None
    assert summary["ledger"]["files_seen"] == 0 and summary["ledger"]["files_by_institution"] == {
        "empty-0": 0,
        "empty-1": 0,
    }
    assert not Storage.open(str(root)).list_files("snapshots")
