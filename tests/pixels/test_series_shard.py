"""A shard's CT/MR slices through :func:`etl.pixels.series.normalise_shard_guarded`: the shard holds the slices of one
series at a time (the files are read again per series), with the same image rows as when every slice is held."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pydicom
from pydicom.data import get_testdata_file

from etl.pixels.npy_payload import read_npy
from etl.pixels.series import normalise_instances, normalise_shard_guarded
from schemas.config import NormalisationConfig

SERIES = 3


def _ct5n_files() -> list[Path]:
    path = get_testdata_file("CT_small.dcm", download=False)
    assert path is not None, "pydicom's test files (in its wheel) are missing"
    return sorted((Path(path).parent / "dicomdirtests" / "98892001" / "CT5N").iterdir())


def _rows(files: list[Path]) -> list[dict]:
    """Three series of the five CT5N slices each, their rows interleaved in sop_key order (as a shard's are: the
    key is a pseudonym, so the slices of its series are spread over the shard)."""
    rows = []
    for i in range(len(files) * SERIES):
        rows.append(
            {
                "sop_key": f"sop{i:03d}",
                "series_key": f"series{i % SERIES}",
                "study_key": "st1",
                "patient_key": "p1",
                "institution": "us-a",
                "modality": "CT",
                "view_position": None,
                "transfer_syntax": "1.2.840.10008.1.2.1",
                "shard": 0,
                "file": str(files[i // SERIES]),
            }
        )
    return rows


def test_a_shard_holds_the_slices_of_one_series_at_a_time():
    files = _ct5n_files()
    rows = _rows(files)
    alive, most = [0], [0]

    def gone() -> None:
        alive[0] -= 1

    def read(row: dict) -> pydicom.Dataset:
        gc.collect()  # what is no longer referenced is gone before the next file is read
        ds = pydicom.dcmread(row["file"])
        alive[0] += 1
        most[0] = max(most[0], alive[0])
        weakref.finalize(ds, gone)
        return ds

    out = normalise_shard_guarded(rows, read, NormalisationConfig())
    assert not out.failures
    assert sorted(i.row["series_key"] for i in out.images) == [f"series{k}" for k in range(SERIES)]
    assert most[0] <= len(files) + 1, most[0]  # one series, and the file being read
    # the same rows as when every slice is held until the series are normalised
    held = normalise_instances(((r, pydicom.dcmread(r["file"])) for r in rows), NormalisationConfig())
    assert [i.row["image_key"] for i in out.images] == [i.row["image_key"] for i in held.images]
    for a, b in zip(out.images, held.images):
        assert (read_npy(a.row["payload"]) == read_npy(b.row["payload"])).all()
        assert {k: v for k, v in a.row.items() if k != "payload"} == {k: v for k, v in b.row.items() if k != "payload"}
