"""De-identification throughput: ours vs dicognito vs a bare pydicom read+write loop (the floor), one run.

Input: the uncompressed CT/MR/CR/DX files of ../shared/data/dicom (pydicom's bundled test files when the
shared data is absent), held in memory and replicated to at least ``TARGET`` files so disk speed does not
count. Each contender reads the bytes, does its work and writes Part-10 bytes to memory. Ours runs the
full profile: table-driven walk at every depth, date shifts, UID remapping, Clean Descriptors and the
verifier. The three run interleaved, best of three passes each. Prints files/s for each, the ratios, and peak
traced memory (tracemalloc, separate pass).
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
from etl.deid.dicom import DeidentificationError, deidentify_dataset  # noqa: E402
from etl.deid.policy import build_policy  # noqa: E402
from etl.keys import PseudonymKey  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "dicom"
TARGET = 300
REPEATS = 3
NATIVE = ("1.2.840.10008.1.2", "1.2.840.10008.1.2.1")


def corpus() -> list[bytes]:
    """Uncompressed CT/MR/CR/DX files that our profile de-identifies (not quarantined), replicated."""
    files = sorted(SHARED.rglob("*.dcm")) if SHARED.is_dir() else []
    if not files:
        from pydicom.data import get_testdata_files

        files = [Path(f) for f in get_testdata_files("*.dcm")]
    key = PseudonymKey(os.urandom(32))
    out = []
    for f in files:
        data = f.read_bytes()
        try:
            ds = pydicom.dcmread(io.BytesIO(data), stop_before_pixels=True)
            if ds.file_meta.get("TransferSyntaxUID", "") not in NATIVE or ds.get("Modality") not in (
                "CT",
                "MR",
                "CR",
                "DX",
            ):
                continue
            deidentify_dataset(pydicom.dcmread(io.BytesIO(data)), key, "bench")
        except Exception:  # noqa: BLE001  unreadable or quarantined files are not part of the speed test
            continue
        out.append(data)
    reps = max(1, -(-TARGET // max(1, len(out))))
    return out * reps


def peak_traced(blobs: list[bytes], fn) -> int:
    """Peak traced bytes (tracemalloc) over a quarter of the files."""
    tracemalloc.start()
    for b in blobs[: max(1, len(blobs) // 4)]:
        fn(b)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def main() -> None:
    warnings.simplefilter("ignore")
    import logging

    logging.getLogger("pydicom").setLevel(logging.CRITICAL)
    from dicognito.anonymizer import Anonymizer

    key = PseudonymKey(os.urandom(32))
    policy = build_policy()
    blobs = corpus()
    mb = sum(map(len, blobs)) / 1e6
    anonymizer = Anonymizer(seed="bench")

    def floor(b: bytes) -> None:
        pydicom.dcmread(io.BytesIO(b)).save_as(io.BytesIO(), enforce_file_format=True)

    def ours(b: bytes) -> None:
        try:
            deidentify_dataset(pydicom.dcmread(io.BytesIO(b)), key, "bench", policy).to_bytes()
        except DeidentificationError:
            pass

    def dicognito(b: bytes) -> None:
        ds = pydicom.dcmread(io.BytesIO(b))
        anonymizer.anonymize(ds)
        ds.save_as(io.BytesIO(), enforce_file_format=True)

    for fn in (floor, ours, dicognito):  # warm up imports and caches
        for b in blobs[:5]:
            fn(b)
    # contenders interleaved, best of REPEATS passes each: the machine's other load hits all of them alike
    best = {"floor": float("inf"), "ours": float("inf"), "dicognito": float("inf")}
    for _ in range(REPEATS):
        for name, fn in (("floor", floor), ("ours", ours), ("dicognito", dicognito)):
            t0 = time.perf_counter()
            for b in blobs:
                fn(b)
            best[name] = min(best[name], time.perf_counter() - t0)
    t_floor, t_ours, t_dg = best["floor"], best["ours"], best["dicognito"]
    m_floor, m_ours, m_dg = (peak_traced(blobs, fn) for fn in (floor, ours, dicognito))
    n = len(blobs)
    print(f"{n} files, {mb:.1f} MB: floor {n / t_floor:.1f} files/s, ours {n / t_ours:.1f}, dicognito {n / t_dg:.1f}")
    print(
        f"BENCH deid files={n} files_per_s={n / t_ours:.1f} mb_per_s={mb / t_ours:.1f} "
        f"floor_files_per_s={n / t_floor:.1f} dicognito_files_per_s={n / t_dg:.1f} "
        f"ratio_vs_floor={t_ours / t_floor:.2f} speedup_vs_dicognito={t_dg / t_ours:.2f} "
        f"peak_mb={m_ours / 1e6:.1f} floor_peak_mb={m_floor / 1e6:.1f} dicognito_peak_mb={m_dg / 1e6:.1f}"
    )


if __name__ == "__main__":
    main()
