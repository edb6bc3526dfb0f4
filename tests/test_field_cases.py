"""Publicly reported DICOM faults (../shared/tools/dicom_field_cases.py) through `medreco deid`:
the ledger balances, and no planted identifying value survives anywhere in the output bytes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

TOOL = Path(__file__).resolve().parents[2] / "shared" / "tools" / "dicom_field_cases.py"


@pytest.fixture(scope="module")
def field_cases(tmp_path_factory, key):
    if not TOOL.is_file():
        pytest.skip("../shared/tools/dicom_field_cases.py is not present")
    out = tmp_path_factory.mktemp("field_cases")
    subprocess.run([sys.executable, str(TOOL), str(out / "cases"), "--check"], check=True, capture_output=True)
    from etl.deid_folder import deidentify_folder

    result = deidentify_folder(out / "cases", out / "deid", key, "fc")
    return out, result, json.loads((out / "cases" / "answer_key.json").read_text())


def test_ledger_balances_one_row_per_file(field_cases):
    out, result, _ = field_cases
    files = [p for p in (out / "cases").rglob("*") if p.is_file()]
    ledger = pq.read_table(out / "deid" / "ledger.parquet")
    assert result["balanced"] and result["files_seen"] == len(files) == ledger.num_rows
    by_name = {Path(r["source_uri"]).name: r for r in ledger.to_pylist()}
    assert by_name["answer_key.json"]["status"] == "skipped"
    quarantined = [r for r in ledger.to_pylist() if r["status"] == "quarantined"]
    assert all(r["reason"] for r in quarantined)
    assert len(list((out / "deid" / "quarantine").glob("*.json"))) == len(quarantined)


def test_no_identifying_value_survives(field_cases):
    out, _, key_file = field_cases
    blob = b"".join(p.read_bytes() for p in (out / "deid" / "files").glob("*.dcm"))
    assert blob, "most field cases are de-identifiable"
    leaks = []
    for case in key_file["cases"]:
        for p in case["planted"]:
            # dates are shifted, not removed, and compared per element by the de-identification tests
            if p["expected"] in ("keep", "shift") or p["kind"] in ("date", "datetime", "time"):
                continue
            value = str(p["value"])
            if any(enc in blob for enc in (value.encode("utf-8", "ignore"), value.encode("latin-1", "ignore")) if enc):
                leaks.append(f"{case['id']}:{p['path']}")
    assert not leaks, f"identifying values survived: {leaks}"
