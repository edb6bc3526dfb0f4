"""Benchmark: normalisation vs the decode floor (pydicom ``pixel_array`` on the same files, same run).

2D: every CR/DX file under ../shared/data/dicom/chest-cr-dx through :func:`etl.pixels.normalise.normalise_2d`.
CT: every CT slice under chest-ct and longitudinal-chest-ct-covid19-ny-sbu, grouped by
SeriesInstanceUID, through :func:`etl.pixels.normalise.normalise_volume` with the default configuration's
``ct_spacing_mm`` as the normalise stage passes it (46 slices in 42 series, most of one slice, so
per-series costs weigh heavily; resampling applies to the three series of two or three slices). Long
CT series: one real 512 x 512 native CT slice of that set written 120 times at 1.25 mm steps (real
series have hundreds of slices; per-voxel costs weigh here), at native spacing and resampled to the
default 0.75 x 0.75 x 1.5 mm (1.4x as many voxels out as in; an axis-aligned grid, so the separable
passes of :mod:`etl.pixels.separable` do it, written straight into the payload). Files are read into memory first;
timings cover reading + decoding + normalisation, on one core (SimpleITK and the BLAS of the separable column pass
limited to one thread). Peak memory (tracemalloc) is measured on a separate pass. The resampling step alone (decoded
volume in memory) is also timed against SimpleITK's linear ``Resample`` on the same volume. Ends with one
``BENCH normalise ...`` line.
Usage: ``python benchmarks/bench_normalise.py [repeats]``.
"""

from __future__ import annotations

import io
import os
import sys
import time
import tracemalloc
import warnings
from collections.abc import Callable
from pathlib import Path

# figures are per core: one BLAS thread (the separable resampling's column pass), set before numpy loads
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import pydicom  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from etl.pixels.decode import decode  # noqa: E402
from etl.pixels.normalise import NormalisationError, image_kind, normalise_2d, normalise_volume  # noqa: E402
from etl.pixels.volumes import Geometry, resample, resample_sitk  # noqa: E402
from schemas.config import NormalisationConfig  # noqa: E402

DICOM = Path(__file__).resolve().parents[2] / "shared" / "data" / "dicom"


def _read(blobs: list[bytes]) -> list[pydicom.Dataset]:
    return [pydicom.dcmread(io.BytesIO(b)) for b in blobs]


def main(repeats: int = 5) -> None:
    warnings.simplefilter("ignore")
    import SimpleITK as sitk

    sitk.ProcessObject.SetGlobalDefaultNumberOfThreads(1)  # figures are per core; SimpleITK would use all
    cfg = NormalisationConfig()
    xr = [p.read_bytes() for p in sorted((DICOM / "chest-cr-dx").rglob("*.dcm"))]
    xr = [b for b, ds in zip(xr, _read(xr)) if ds.get("Modality") in ("CR", "DX") and image_kind(ds) == "2d"]
    ct_blobs = [
        p.read_bytes()
        for d in ("chest-ct", "longitudinal-chest-ct-covid19-ny-sbu")
        for p in sorted((DICOM / d).rglob("*.dcm"))
    ]
    series: dict[str, list[bytes]] = {}
    for b, ds in zip(ct_blobs, _read(ct_blobs)):
        if image_kind(ds) == "3d_slice" and ds.get("Modality") == "CT":
            series.setdefault(str(ds.SeriesInstanceUID), []).append(b)
    n_ct = sum(len(v) for v in series.values())
    long_series = _long_series(ct_blobs)

    def decode_floor(blobs: list[bytes]) -> float:
        t = time.perf_counter()
        for ds in _read(blobs):
            ds.pixel_array  # noqa: B018
        return time.perf_counter() - t

    def run_2d() -> float:
        t = time.perf_counter()
        for ds in _read(xr):
            normalise_2d(ds, cfg)
        return time.perf_counter() - t

    def run_long(target: tuple[float, float, float] | None = None) -> float:
        t = time.perf_counter()
        normalise_volume(_read(long_series), cfg, target_spacing_mm=target)
        return time.perf_counter() - t

    def run_ct() -> float:
        t = time.perf_counter()
        for blobs in series.values():
            try:
                normalise_volume(_read(blobs), cfg, target_spacing_mm=cfg.ct_spacing_mm)
            except NormalisationError:
                for ds in _read(blobs):  # unstackable: as stages.py does, each slice as a 2D image
                    normalise_2d(ds, cfg)
        return time.perf_counter() - t

    def paired(floor: Callable[[], float], *runs: Callable[[], float]) -> list[float]:
        """Best of ``repeats`` of the floor and of each run, taken in turn, so that all see the same machine
        (on a shared virtual machine the speed drifts by tens of percent within a minute)."""
        times: list[list[float]] = [[] for _ in range(1 + len(runs))]
        for _ in range(repeats):
            for t, f in zip(times, (floor, *runs)):
                t.append(f())
        return [min(t) for t in times]

    all_ct = [b for v in series.values() for b in v]
    t_xr_dec, t_xr = paired(lambda: decode_floor(xr), run_2d)
    t_ct_dec, t_ct = paired(lambda: decode_floor(all_ct), run_ct)
    t_long_dec, t_long, t_long_resampled = paired(
        lambda: decode_floor(long_series), run_long, lambda: run_long(cfg.ct_spacing_mm)
    )
    # the resampling step alone on the decoded 120-slice volume: the separable passes against SimpleITK's linear
    # Resample (the method they replace on axis-aligned grids), same volume, same run, taken in turn
    volume = np.stack([decode(ds) for ds in _read(long_series)]).astype(np.float32)
    base = _read(long_series[:1])[0]
    geometry = Geometry([float(v) for v in base.PixelSpacing] + [1.25], [0.0, 0.0, 0.0], [1, 0, 0, 0, 1, 0, 0, 0, 1])

    def timed(f: Callable[[], object]) -> Callable[[], float]:
        def run() -> float:
            t = time.perf_counter()
            f()
            return time.perf_counter() - t

        return run

    t_sep, t_sitk = paired(
        timed(lambda: resample(volume, geometry, cfg.ct_spacing_mm, -1000.0)),
        timed(lambda: resample_sitk(volume, geometry, cfg.ct_spacing_mm, -1000.0)),
    )
    tracemalloc.start()
    run_2d()
    run_ct()
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    ratio_500, mb_500 = peak_500_slices(cfg)
    print(f"2D: {len(xr)} radiographs, normalise {t_xr:.3f} s, decode floor {t_xr_dec:.3f} s")
    print(f"500-slice CT series: volume {mb_500:.0f} MB, peak traced memory {ratio_500:.2f}x the volume")
    print(f"CT: {n_ct} slices in {len(series)} series, normalise {t_ct:.3f} s, decode floor {t_ct_dec:.3f} s")
    print(
        f"CT long series: {len(long_series)} slices of 512 x 512 in one series, normalise {t_long:.3f} s, "
        f"decode floor {t_long_dec:.3f} s; resampled to {cfg.ct_spacing_mm} mm {t_long_resampled:.3f} s"
    )
    print(f"resampling step alone: separable {t_sep:.3f} s, SimpleITK {t_sitk:.3f} s (one thread each)")
    print(
        f"BENCH normalise images_per_s={len(xr) / t_xr:.2f} ct_slices_per_s={n_ct / t_ct:.2f} "
        f"ratio_2d_vs_decode={t_xr / t_xr_dec:.2f} ratio_ct_vs_decode={t_ct / t_ct_dec:.2f} "
        f"ratio_ct_{len(long_series)}_slices_vs_decode={t_long / t_long_dec:.2f} "
        f"ratio_ct_{len(long_series)}_slices_resampled_vs_decode={t_long_resampled / t_long_dec:.2f} "
        f"peak_mb={peak:.1f} "
        f"peak_500_slices_vs_volume={ratio_500:.2f} resample_separable_vs_sitk_speedup={t_sitk / t_sep:.2f}"
    )


def _long_series(ct_blobs: list[bytes], n: int = 120, step_mm: float = 1.25) -> list[bytes]:
    """``n`` files of one series: the first native (uncompressed) 512 x 512 CT slice among ``ct_blobs``,
    moved along z by ``step_mm`` per slice (ImagePositionPatient, InstanceNumber, SOPInstanceUID)."""
    from pydicom.uid import generate_uid

    base = next(
        ds
        for ds in _read(ct_blobs)
        if ds.get("Modality") == "CT"
        and image_kind(ds) == "3d_slice"
        and ds.Rows == ds.Columns == 512
        and not ds.file_meta.TransferSyntaxUID.is_compressed
    )
    x, y, z = (float(v) for v in base.ImagePositionPatient)
    out = []
    for k in range(n):
        base.ImagePositionPatient = [x, y, z + step_mm * k]
        base.InstanceNumber = k + 1
        base.SOPInstanceUID = base.file_meta.MediaStorageSOPInstanceUID = generate_uid(entropy_srcs=[str(k)])
        buf = io.BytesIO()
        base.save_as(buf)
        out.append(buf.getvalue())
    return out


def peak_500_slices(cfg: NormalisationConfig, n: int = 500) -> tuple[float, float]:
    """Peak traced memory of one 500-slice CT series (pydicom's CT_small slice stacked along z at 1 mm),
    as a multiple of the float32 volume's size; the datasets themselves are allocated before tracing.

    Returns ``(peak / volume bytes, volume MB)``.
    """
    import copy

    from pydicom.data import get_testdata_file

    base = pydicom.dcmread(get_testdata_file("CT_small.dcm", download=False))
    pixels = base.PixelData
    del base.PixelData
    slices = []
    for i in range(n):
        ds = copy.deepcopy(base)  # headers only; every slice shares the one pixel bytes object
        ds.PixelData = pixels
        ds.ImagePositionPatient = [0.0, 0.0, float(i)]
        ds.InstanceNumber = i + 1
        slices.append(ds)
    volume_bytes = n * int(base.Rows) * int(base.Columns) * 4
    tracemalloc.start()
    normalise_volume(slices, cfg)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / volume_bytes, volume_bytes / 2**20


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
