"""``medreco deid``'s ledger (issue 41): written atomically with the outputs (a run killed or interrupted at any point
leaves no output that the ledger does not name; a re-run overwrites consistently), and each row names what its input
became (``output`` relative to OUT for an ingested file, ``quarantine_record`` for a quarantined one)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import hostile_dicom as h
import pyarrow.parquet as pq
import pytest

import medreco.cli.deid_folder as deid_folder
from etl.keys import PseudonymKey
from medreco.cli.deid_folder import STAGING, deidentify_folder

assert h.NATIVE_CT.is_file(), "needs ../shared/data/dicom beside the project (CI copies it there)"
ROOT = Path(__file__).resolve().parents[2]
KEY_TEXT = "deid-folder-ledger-test-key-0123456789abcdef"
KEY = PseudonymKey(KEY_TEXT.encode())


def ct_bytes(n: int) -> bytes:
    """The shared native CT slice as a distinct instance ``n`` (its own SOPInstanceUID and InstanceNumber)."""
    ds = h.with_ids(h.read(h.NATIVE_CT))
    ds.SOPInstanceUID = f"2.25.4141000000000000000000000{n:04d}"
    ds.InstanceNumber = n
    return h.to_bytes(ds)


def sop_uid(n: int) -> str:
    return f"2.25.4141000000000000000000000{n:04d}"


def folder(path: Path, instances: list[int], bad: bool = True) -> Path:
    """A source folder: CT instances ``instances``, a truncated file and a duplicate of the first instance."""
    path.mkdir(parents=True)
    for n in instances:
        (path / f"ct-{n}.dcm").write_bytes(ct_bytes(n))
    if bad:
        (path / "cut.dcm").write_bytes(ct_bytes(99)[:700])
        (path / "zz-copy.dcm").write_bytes(ct_bytes(instances[0]))
    return path


def ledger(out: Path) -> list[dict]:
    return pq.read_table(out / "ledger.parquet").to_pylist()


def assert_every_output_named_once(out: Path) -> list[dict]:
    """Every file under OUT/files and OUT/quarantine is named by exactly one ledger row; returns the rows."""
    rows = ledger(out) if (out / "ledger.parquet").is_file() else []
    named = [r[k] for r in rows for k in ("output", "quarantine_record") if r.get(k)]
    present = [f"{d}/{f.name}" for d in ("files", "quarantine") if (out / d).is_dir() for f in (out / d).iterdir()]
    assert len(named) == len(set(named)), named
    assert set(present) <= set(named), sorted(set(present) - set(named))
    return rows


def test_each_row_names_its_output_or_its_quarantine_record(tmp_path):
    src = folder(tmp_path / "src", [1, 2, 3])
    out = tmp_path / "out"
    balance = deidentify_folder(src, out, KEY, "ledger")
    assert balance["balanced"] and balance["ingested"] == 3 and balance["quarantined"] == 1 == balance["duplicate"]
    rows = {Path(r["source_uri"]).name: r for r in assert_every_output_named_once(out)}
    for n in (1, 2, 3):  # input -> output: the file named by the input's SOP Instance UID pseudonym
        row = rows[f"ct-{n}.dcm"]
        assert row["output"] == f"files/{KEY.pseudonym('sop', sop_uid(n))}.dcm" and row["quarantine_record"] is None
        assert h.read(out / row["output"]).InstanceNumber == n
    cut = rows["cut.dcm"]
    assert cut["status"] == "quarantined" and cut["output"] is None
    assert cut["quarantine_record"] == f"quarantine/{cut['sha256']}.json" and (out / cut["quarantine_record"]).is_file()
    assert rows["zz-copy.dcm"]["status"] == "duplicate" and rows["zz-copy.dcm"]["output"] is None
    # exactly: every output present, every present file named
    present = sorted(f"{d}/{f.name}" for d in ("files", "quarantine") for f in (out / d).iterdir())
    assert present == sorted(r[k] for r in rows.values() for k in ("output", "quarantine_record") if r[k])
    assert not (out / STAGING).exists()


def test_an_interrupted_run_leaves_the_previous_ledger_and_outputs(tmp_path, monkeypatch):
    out = tmp_path / "out"
    deidentify_folder(folder(tmp_path / "a", [1, 2, 3]), out, KEY, "ledger")
    before = (out / "ledger.parquet").read_bytes()
    files_before = sorted(p.name for p in (out / "files").iterdir())
    real, calls = deid_folder.deidentify_dataset, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the second file: one output is already written (staged)
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(deid_folder, "deidentify_dataset", interrupted)
    with pytest.raises(KeyboardInterrupt):
        deidentify_folder(folder(tmp_path / "b", [1, 4, 5]), out, KEY, "ledger")
    assert (out / "ledger.parquet").read_bytes() == before  # nothing committed
    assert sorted(p.name for p in (out / "files").iterdir()) == files_before
    assert_every_output_named_once(out)
    monkeypatch.setattr(deid_folder, "deidentify_dataset", real)
    deidentify_folder(tmp_path / "b", out, KEY, "ledger")  # the re-run overwrites: only folder b's outputs
    rows = assert_every_output_named_once(out)
    assert sorted(p.name for p in (out / "files").iterdir()) == sorted(
        f"{KEY.pseudonym('sop', sop_uid(n))}.dcm" for n in (1, 4, 5)
    )
    assert {Path(r["source_uri"]).parent.name for r in rows} == {"b"} and not (out / STAGING).exists()


def test_a_kill_while_committing_leaves_no_output_without_a_row(tmp_path, monkeypatch):
    out = tmp_path / "out"
    deidentify_folder(folder(tmp_path / "a", [1, 2]), out, KEY, "ledger")
    real, calls = os.replace, []

    def killed(a, b):
        if STAGING in Path(a).parts:
            calls.append(b)
        if len(calls) == 3:  # the ledger and one output moved in
            raise KeyboardInterrupt
        return real(a, b)

    monkeypatch.setattr(deid_folder.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        deidentify_folder(folder(tmp_path / "b", [3, 4, 5]), out, KEY, "ledger")
    monkeypatch.setattr(deid_folder.os, "replace", real)
    rows = assert_every_output_named_once(out)  # the new ledger: one of its outputs in, none of the old run's
    assert {Path(r["source_uri"]).parent.name for r in rows} == {"b"}
    assert len(list((out / "files").iterdir())) == 1
    deidentify_folder(tmp_path / "b", out, KEY, "ledger")
    rows = assert_every_output_named_once(out)
    assert all((out / r["output"]).is_file() for r in rows if r["status"] == "ingested")
    assert len(list((out / "files").iterdir())) == 3


def test_a_killed_process_leaves_no_output_and_a_rerun_completes(tmp_path):
    """SIGKILL in the middle of the folder (third file), in a real ``medreco deid``-like process."""
    src, out = folder(tmp_path / "src", [1, 2, 3, 4]), tmp_path / "out"
    script = f"""
import os, signal, sys
import medreco.cli.deid_folder as m
from etl.keys import PseudonymKey
real, calls = m.deidentify_dataset, []
def killing(*a, **k):
    calls.append(1)
    if len(calls) == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(*a, **k)
m.deidentify_dataset = killing
m.deidentify_folder(sys.argv[1], sys.argv[2], PseudonymKey({KEY_TEXT.encode()!r}), "ledger")
"""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'reader' / 'src'}:{ROOT / 'tests'}"}
    run = subprocess.run([sys.executable, "-c", script, str(src), str(out)], cwd=ROOT, env=env, timeout=600)
    assert run.returncode == -signal.SIGKILL
    assert len(list((out / STAGING / "files").iterdir())) == 2  # two outputs were written, both only staged
    assert not (out / "ledger.parquet").exists() and not (out / "files").exists()
    balance = deidentify_folder(src, out, KEY, "ledger")
    rows = assert_every_output_named_once(out)
    assert balance["balanced"] and sum(r["status"] == "ingested" for r in rows) == 4 == len(
        list((out / "files").iterdir())
    )
    assert not (out / STAGING).exists()
