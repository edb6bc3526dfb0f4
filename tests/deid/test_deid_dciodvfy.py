"""De-identified files are as valid as their inputs: dicom3tools' ``dciodvfy`` (Debian ``dicom3tools``,
installed by ``make tools``) on every file of ../shared/data/dicom and ../shared/data/deid that
de-identification writes, and on its input; no error may appear that the input did not have (issue 22).

Errors are compared with their values blanked (de-identification changes UIDs, dates and names, so an
input's invalid date is still the output's). Where dciodvfy cannot read the input itself (a file with
trailing garbage, a Deflate transfer syntax it does not inflate), the input as pydicom reads it, written back
unchanged (Deflate: both input and output re-encoded Explicit VR Little Endian), is the reference.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import warnings
from collections import Counter
from pathlib import Path

import pydicom
import pytest
from pydicom.uid import DeflatedExplicitVRLittleEndian, ExplicitVRLittleEndian

from etl.deid.dicom import DeidentificationError, deidentify_dataset

pytestmark = pytest.mark.realdata
DCIODVFY = shutil.which("dciodvfy")
_UNREADABLE = ("Dicom dataset read failed", "Tags out of order")


def _errors(path: Path) -> tuple[Counter, bool]:
    """dciodvfy errors of a file, values blanked; and whether dciodvfy could not read it."""
    r = subprocess.run([DCIODVFY, "-new", str(path)], capture_output=True, text=True, errors="replace", timeout=120)
    lines = (r.stdout + r.stderr).splitlines()
    out = Counter()
    for ln in lines:
        if ln.startswith("Error"):
            ln = re.sub(r"= <[^>]*>", "= <>", ln)
            out[re.sub(r"\[[0-9]+\]", "[n]", ln)] += 1
    return out, any(any(u in ln for u in _UNREADABLE) for ln in lines)


def _explicit(src: bytes | Path, dst: Path) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = pydicom.dcmread(src if isinstance(src, Path) else __import__("io").BytesIO(src), force=True)
        if ds.file_meta.get("TransferSyntaxUID") == DeflatedExplicitVRLittleEndian:
            ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
        ds.save_as(dst)
    return dst


def _inputs(shared_data: Path) -> list[Path]:
    return sorted(
        p
        for d in ("dicom", "deid")
        for p in (shared_data / d).rglob("*")
        if p.is_file() and p.suffix.lower() not in (".csv", ".md", ".json", ".txt")
    )


@pytest.mark.skipif(DCIODVFY is None, reason="dciodvfy (Debian package dicom3tools) is not installed: run make tools")
def test_deidentification_adds_no_dciodvfy_error(shared_data, key, tmp_path):
    checked, new = 0, {}
    for src in _inputs(shared_data):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = deidentify_dataset(pydicom.dcmread(src, force=True), key, "shared")
        except DeidentificationError:
            continue  # quarantined: nothing written
        out = tmp_path / "out.dcm"
        out.write_bytes(result.payload)
        deflated = result.dataset.file_meta.TransferSyntaxUID == DeflatedExplicitVRLittleEndian
        if deflated:
            out = _explicit(out, tmp_path / "out_explicit.dcm")
        before, unreadable = _errors(_explicit(src, tmp_path / "in.dcm") if deflated else src)
        if unreadable and not deflated:
            before = before + _errors(_explicit(src, tmp_path / "in.dcm"))[0]
        after, _ = _errors(out)
        checked += 1
        added = after - before
        if added:
            new[src.relative_to(shared_data).as_posix()] = sorted(added)
    assert checked >= 100, f"only {checked} files were de-identified"
    assert new == {}
