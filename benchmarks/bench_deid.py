"""De-identification throughput against a bare pydicom read+write baseline, in the same process.

Input: every uncompressed DICOM file of ../shared/data/dicom (or pydicom's bundled test files when the
shared data is absent), read from memory so disk speed does not count. Prints files/s, MB/s, the ratio
to the baseline, and peak traced memory (tracemalloc) of each.
"""

from __future__ import annotations

import io
import os
import sys
import time
import tracemalloc
import warnings
from pathlib import Path

import pydicom

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from etl.deid import DeidentificationError, deidentify_dataset  # noqa: E402
from etl.keys import PseudonymKey  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "dicom"


def corpus() -> list[bytes]:
    files = sorted(SHARED.rglob("*.dcm")) if SHARED.is_dir() else []
    if not files:
        from pydicom.data import get_testdata_files

        files = [Path(f) for f in get_testdata_files("*.dcm")]
    out = []
    for f in files:
        data = f.read_bytes()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                ds = pydicom.dcmread(io.BytesIO(data), stop_before_pixels=True)
            except Exception:  # noqa: BLE001
                continue
        if ds.file_meta.get("TransferSyntaxUID", "") in ("1.2.840.10008.1.2", "1.2.840.10008.1.2.1"):
            out.append(data)
    return out


def run(blobs: list[bytes], fn) -> tuple[float, int]:
    """Seconds for one timed pass (no tracing), then peak traced bytes of a second, traced pass."""
    t0 = time.perf_counter()
    for b in blobs:
        fn(b)
    dt = time.perf_counter() - t0
    tracemalloc.start()
    for b in blobs:
        fn(b)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return dt, peak


def baseline(b: bytes) -> None:
    ds = pydicom.dcmread(io.BytesIO(b))
    ds.save_as(io.BytesIO())


def main() -> None:
    warnings.simplefilter("ignore")
    key = PseudonymKey(os.urandom(32))
    blobs = corpus()
    mb = sum(map(len, blobs)) / 1e6

    def deid(b: bytes) -> None:
        try:
            deidentify_dataset(pydicom.dcmread(io.BytesIO(b)), key, "bench").to_bytes()
        except DeidentificationError:
            pass

    run(blobs[:5], baseline)  # warm up imports and caches
    t_base, m_base = run(blobs, baseline)
    t_deid, m_deid = run(blobs, deid)
    print(f"{len(blobs)} files, {mb:.1f} MB; baseline {len(blobs) / t_base:.1f} files/s, deid {len(blobs) / t_deid:.1f} files/s")
    print(
        f"BENCH deid files={len(blobs)} files_per_s={len(blobs) / t_deid:.1f} mb_per_s={mb / t_deid:.1f} "
        f"baseline_files_per_s={len(blobs) / t_base:.1f} ratio_vs_pydicom_rw={t_deid / t_base:.2f} "
        f"peak_mb={m_deid / 1e6:.1f} baseline_peak_mb={m_base / 1e6:.1f}"
    )


if __name__ == "__main__":
    main()
