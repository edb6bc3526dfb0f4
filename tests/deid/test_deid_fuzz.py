"""Issue 19: the seeded fuzzer's files (tests/fuzz_dicom.py) through ``medreco deid``: no crash, no hang, a balanced
ledger, and the planted identity in no output byte, whatever the mutation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter

import pyarrow.parquet as pq
import pytest
from conftest import PROJECT_ROOT, SHARED_DATA
from fuzz_dicom import MUTATIONS, PLANTED_BYTES, fuzz_corpus

N_FILES = 330  # 30 rounds of the 11 mutation kinds


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory):
    base = tmp_path_factory.mktemp("fuzz")
    made = fuzz_corpus(base / "src", N_FILES, SHARED_DATA if SHARED_DATA.is_dir() else None)
    out = base / "out"
    t0 = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "medreco.cli", "deid", str(base / "src"), str(out)], cwd=PROJECT_ROOT,
                         env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}, capture_output=True, text=True,
                         timeout=900)
    return {"made": made, "out": out, "run": run, "elapsed": time.monotonic() - t0}


def test_fuzzed_folder_deidentifies_without_a_crash_and_balances(fuzzed):
    run = fuzzed["run"]
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["balanced"] and result["files_seen"] == N_FILES
    assert "Traceback" not in run.stderr
    kinds = Counter(k for _, k in fuzzed["made"])
    assert set(MUTATIONS) - {"bad_instance_number"} <= set(kinds)  # every kind was made (one may fall back)
    assert fuzzed["elapsed"] < 600  # no hang: 330 files, a 40,000-letter description among every 11


def test_planted_identity_is_in_no_output_byte(fuzzed):
    out = fuzzed["out"]
    for f in (out / "files").iterdir():
        data = f.read_bytes()
        for p in PLANTED_BYTES:
            assert p not in data, (f.name, p)
    ledger = pq.read_table(out / "ledger.parquet").to_pylist()
    for row in ledger:  # reason codes and details never quote a value
        for p in PLANTED_BYTES:
            assert p.decode() not in str(row.get("detail") or ""), row


def test_each_attack_gets_its_outcome(fuzzed):
    ledger = {r["source_uri"].rsplit("/", 1)[-1]: r for r in pq.read_table(fuzzed["out"] / "ledger.parquet").to_pylist()}
    by_kind: dict[str, Counter] = {}
    for name, row in ledger.items():
        kind = name.split("-", 1)[1].removesuffix(".dcm")
        by_kind.setdefault(kind, Counter())[f"{row['status']}:{row.get('reason')}"] += 1
    for kind in ("zero_sequence_length", "device_identity"):
        assert all(k.startswith("quarantined:") for k in by_kind[kind]), (kind, by_kind[kind])
    assert "quarantined:malformed_structure" in by_kind["zero_sequence_length"]
    assert "quarantined:verification_failed" in by_kind["device_identity"]
    assert "quarantined:value_too_long" in by_kind["long_text"]
    assert not any("timeout" in k for c in by_kind.values() for k in c)  # the caps keep every file in time
    assert "ingested:None" in by_kind["binary_vr_identity"]  # the OB element is removed, the file goes on
    if "bad_instance_number" in by_kind:
        assert "ingested:None" in by_kind["bad_instance_number"]  # medreco deid builds no instances row


def test_quarantine_folder_is_restricted(fuzzed):
    q = fuzzed["out"] / "quarantine"
    assert oct(q.stat().st_mode & 0o777) == "0o700"
    assert all(oct(f.stat().st_mode & 0o777) == "0o600" for f in q.iterdir())
    assert oct((fuzzed["out"] / "ledger.parquet").stat().st_mode & 0o777) == "0o600"
