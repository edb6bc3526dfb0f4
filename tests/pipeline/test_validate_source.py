"""``medreco validate-source``: a delivery checked with the build's own checks before a run, nothing written.

A small hand-made CSV delivery: two real DICOM files (pydicom's CT_small and a copy cut inside its header), a
report file in the documented layout linked to the CT by StudyInstanceUID and by AccessionNumber, and a report
file with wrong columns.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pydicom
import pytest
import yaml
from pydicom.data import get_testdata_file
from typer.testing import CliRunner

from medreco.cli.app import app
from schemas.config import PROJECT_ROOT

GOOD_CSV = (
    "report_id,patient_id,accession_number,study_instance_uid,report_datetime,language,text\n"
    'R1,1CT1,,{uid},2004-01-19T08:00,en,"FINDINGS: No pleural effusion.\nIMPRESSION: Normal."\n'
    'R2,1CT1,ACC9,,,en,"FINDINGS: Clear lungs."\n'
    "R3,,,,,en,\n"
)
WRONG_COLUMNS_CSV = "id,patient,body\nR9,P9,Nothing acute.\n"


@pytest.fixture
def delivery(tmp_path) -> dict:
    src = tmp_path / "sources" / "csv-inst"
    (src / "dicom").mkdir(parents=True)
    (src / "reports").mkdir()
    ct = Path(get_testdata_file("CT_small.dcm", download=False))
    ds = pydicom.dcmread(ct)
    ds.AccessionNumber = "ACC9"
    ds.save_as(src / "dicom" / "ct.dcm")
    data = (src / "dicom" / "ct.dcm").read_bytes()
    (src / "dicom" / "cut.dcm").write_bytes(data[: data.find(b"1CT1") + 20])  # ends inside PatientSex
    (src / "reports" / "good.csv").write_text(GOOD_CSV.format(uid=ds.StudyInstanceUID))
    (src / "reports" / "wrong.csv").write_text(WRONG_COLUMNS_CSV)
    (src / "README.md").write_text("delivery notes\n")
    cfg = yaml.safe_load((PROJECT_ROOT / "config" / "demo.yaml").read_text())
    root = tmp_path / "root-not-created"
    cfg["storage"]["root"] = str(root)
    cfg["institutions"].append(
        {**cfg["institutions"][0], "id": "csv-inst", "source_uri": str(src), "report_format": "csv"}
    )
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return {"src": src, "root": root, "config": path, "tmp": tmp_path}


def _tree(folder: Path) -> dict:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns, p.stat().st_mode) for p in folder.rglob("*")}


def test_validate_source_names_each_problem_and_writes_nothing(delivery):
    before = _tree(delivery["tmp"])
    res = CliRunner().invoke(
        app, ["validate-source", "--institution", "csv-inst", "-c", str(delivery["config"]), "--json"]
    )
    assert res.exit_code == 1, res.output
    doc = json.loads(res.output)
    assert _tree(delivery["tmp"]) == before and not delivery["root"].exists()  # no write, not even the root
    assert doc["files"] == {"dicom": 2, "other": 1, "report": 2}
    assert doc["statuses"] == {"ingested": 2, "quarantined": 2, "skipped": 1}
    # R1 linked by StudyInstanceUID, R2 by AccessionNumber (the same study); R3 has no text
    assert doc["records"] == {"link:linked": 2, "read": 2, "withheld": 2}  # R3 and wrong.csv's header
    found = {(f["path"], f["stage"], f["outcome"], f["reason"]): f["detail"] for f in doc["findings"]}
    assert (
        found[("dicom/cut.dcm", "discover", "quarantined", "truncated_file")]
        == "the file ends inside element (0010,0040) of its header"
    )
    assert (
        found[("reports/good.csv", "reports", "withheld", "malformed_report_record")]
        == "malformed_report_record: good.csv line 5: missing or empty 'text'"
    )
    wrong = found[("reports/wrong.csv", "reports", "quarantined", "malformed_report_record")]
    assert wrong == (
        "no record could be read (1 error): malformed_report_record: wrong.csv line 1: CSV header "
        "lacks ['report_id', 'text']"
    )
    assert found[("README.md", "discover", "skipped", "not_an_input")]
    # the build lists the unreadable header under quarantine/<run>/reports/ too: one problem per record
    assert found[("reports/wrong.csv", "reports", "withheld", "malformed_report_record")] in wrong
    assert doc["problems"] == 4 and doc["ok"] is False
    for f in doc["findings"]:  # reasons name lines and fields, never a value of the delivery
        assert "Nothing acute" not in f["detail"] and "1CT1" not in f["detail"]


def test_validate_source_passes_a_clean_delivery_and_prints_one_line_per_problem(delivery):
    runner = CliRunner()
    res = runner.invoke(app, ["validate-source", "-i", "csv-inst", "-c", str(delivery["config"])])
    assert res.exit_code == 1
    assert "quarantined discover   truncated_file  dicom/cut.dcm: the file ends inside" in res.output
    assert "FAIL: 4 problems" in res.output
    for name in ("dicom/cut.dcm", "reports/wrong.csv"):
        os.remove(delivery["src"] / name)
    (delivery["src"] / "reports" / "good.csv").write_text(
        GOOD_CSV.format(uid=pydicom.dcmread(delivery["src"] / "dicom" / "ct.dcm").StudyInstanceUID).replace(
            "R3,,,,,en,\n", ""
        )
    )
    res = runner.invoke(app, ["validate-source", "-i", "csv-inst", "-c", str(delivery["config"])])
    assert res.exit_code == 0, res.output
    assert "the build would record: ingested 2, skipped 1" in res.output
    assert res.output.rstrip().endswith("OK: the build would ingest every file and record")
    res = runner.invoke(app, ["validate-source", "-i", "csv-inst", "-c", str(delivery["config"]), "--no-deid"])
    # without de-identification nothing is linked: no link counts are printed for links that were not checked
    assert res.exit_code == 0 and "report records: read 2, withheld 0\n" in res.output and "link:" not in res.output
    assert res.output.rstrip().endswith("(--no-deid: de-identification and report links not checked)")


def test_validate_source_refuses_what_it_cannot_check(delivery):
    runner = CliRunner()
    res = runner.invoke(app, ["validate-source", "-i", "nowhere", "-c", str(delivery["config"])])
    assert res.exit_code == 2 and "unknown_institution" in res.output and "csv-inst" in res.output
    cfg = yaml.safe_load(delivery["config"].read_text())
    cfg["institutions"][-1]["source_uri"] = "sources/absent"
    delivery["config"].write_text(yaml.safe_dump(cfg))
    res = runner.invoke(app, ["validate-source", "-i", "csv-inst", "-c", str(delivery["config"])])
    assert res.exit_code == 2 and "missing_delivery" in res.output
    assert not delivery["root"].exists()


def test_relative_source_uri_out_of_a_root_not_yet_created_resolves_as_the_run_does(delivery):
    """`source_uri: ../sources/csv-inst` is resolved from the storage root lexically, as `medreco run` does: the
    check works before the first run created the root, and a wrong path names the resolved folder."""
    runner = CliRunner()
    cfg = yaml.safe_load(delivery["config"].read_text())
    cfg["institutions"][-1]["source_uri"] = "../sources/csv-inst"
    delivery["config"].write_text(yaml.safe_dump(cfg))
    res = runner.invoke(app, ["validate-source", "-i", "csv-inst", "-c", str(delivery["config"]), "--no-deid"])
    assert res.exit_code == 1, res.output  # checked: the delivery's own faults (a cut file, bad CSV) fail it
    assert f"delivery csv-inst ({delivery['src']}): dicom 2, other 1, report 2" in res.output
    assert not delivery["root"].exists()
    cfg["institutions"][-1]["source_uri"] = "../sources/csv-typo"
    delivery["config"].write_text(yaml.safe_dump(cfg))
    res = runner.invoke(app, ["validate-source", "-i", "csv-inst", "-c", str(delivery["config"]), "--no-deid"])
    assert res.exit_code == 2 and "missing_delivery" in res.output and "source_not_found" in res.output
    assert res.output.count("source_not_found") == 1  # the reason is printed once
    assert str(delivery["tmp"] / "sources" / "csv-typo") in res.output


def test_validate_source_tells_files_already_in_the_ledger_from_new_ones(delivery):
    """Issue 40, a new user's trial: a delivery already ingested was counted as new. After a run of the build's
    stages on it (discover, plan, deidentify, reports, ledger), validate-source reads the root's seen index: the
    recorded files are duplicates naming the run, a file added since is new, and the root is left as it was."""
    from etl.pipeline import stages
    from etl.pipeline.context import BuildContext
    from etl.pipeline.ledger import finalise

    for name in ("dicom/cut.dcm", "reports/wrong.csv"):
        os.remove(delivery["src"] / name)
    cfg = yaml.safe_load(delivery["config"].read_text())
    cfg["institutions"] = [i for i in cfg["institutions"] if i["id"] == "csv-inst"]
    cfg["shard_count"] = 1
    cfg["splits"]["external_test_institutions"] = []
    delivery["config"].write_text(yaml.safe_dump(cfg))
    runner = CliRunner()
    res = runner.invoke(app, ["validate-source", "-i", "csv-inst", "-c", str(delivery["config"])])
    assert "no ledger at the storage root yet: all 3 files are new" in res.output
    ctx = BuildContext.from_config_file(delivery["config"], run_id="run-one")
    stages.discover(ctx, "csv-inst")
    for batch in stages.plan(ctx):
        for shard in batch:
            stages.deidentify_shard(ctx, shard)
    stages.reports(ctx)
    assert finalise(ctx)["balanced"]
    ledger = {
        r["source_uri"].rsplit("/", 1)[-1]: r["status"] for r in ctx.storage.read_table(ctx.ledger_path).to_pylist()
    }
    assert ledger == {"ct.dcm": "ingested", "good.csv": "ingested", "README.md": "skipped"}
    ds = pydicom.dcmread(delivery["src"] / "dicom" / "ct.dcm")
    ds.SOPInstanceUID = ds.SOPInstanceUID + ".2"
    ds.save_as(delivery["src"] / "dicom" / "ct_new.dcm")  # delivered since the run
    before = _tree(delivery["root"])
    res = runner.invoke(app, ["validate-source", "-i", "csv-inst", "-c", str(delivery["config"]), "--json"])
    doc = json.loads(res.output)
    assert doc["ledger"] == {"already_recorded": 3, "new": 1} and doc["ledger_root"] == str(delivery["root"])
    assert doc["statuses"] == {"duplicate": 2, "ingested": 1, "skipped": 1}
    seen = {f["path"]: (f["outcome"], f["reason"], f["detail"]) for f in doc["findings"] if f["outcome"] == "duplicate"}
    assert seen == {
        p: ("duplicate", "seen_in_earlier_run", "same sha256 as a file recorded in run run-one")
        for p in ("dicom/ct.dcm", "reports/good.csv")
    }
    res = runner.invoke(app, ["validate-source", "-i", "csv-inst", "-c", str(delivery["config"])])
    assert res.exit_code == 0, res.output
    assert f"against the ledger of {delivery['root']}: 1 new, 3 already recorded by an earlier run" in res.output
    assert "seen_in_earlier_run  2 file(s): same sha256 as a file recorded in run run-one" in res.output
    assert "the build would record: duplicate 2, ingested 1, skipped 1" in res.output
    assert res.output.rstrip().endswith("that is new (2 duplicates, nothing to ingest again)")
    assert _tree(delivery["root"]) == before  # read, never written
