"""CPU time of de-identification and normalisation per input file, in one checkout, for comparing two checkouts on
the same inputs (issue 41: the de-identification and normalisation benchmarks against the start of a round).

Run with ``PYTHONPATH`` set to the checkout under test: ``python benchmarks/ab_cpu.py OUT.json [passes]``
(``MEDRECO_SHARED_DICOM`` names the shared DICOM folder when this file is run from elsewhere). Inputs
are those of ``bench_deid.py`` and ``bench_normalise.py`` without their filters that depend on the code under test:
every uncompressed CT/MR/CR/DX file of ``../shared/data/dicom`` (de-identified with ``deidentify_dataset``, written
to Part-10 bytes, whatever the outcome), every CR/DX radiograph of ``chest-cr-dx`` (``normalise_2d``) and every real
chest CT series (``normalise_volume``, each slice as 2D where it cannot be stacked, as the build does), each beside
its floor (a bare pydicom read + write; a bare decode). Each figure is the least ``time.process_time`` over
``passes`` passes, per file (per series), so load from other processes counts as little as it can. Writes JSON:
per item its CPU seconds, its floor's and, for de-identification, the outcome (ingested or the reason code).
Run it from two checkouts in turn (A B A B), each with its own ``PYTHONPATH``, and compare the per-item minima
over the runs of each checkout, on the items whose de-identification outcome is the same in both.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
import warnings
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import pydicom  # noqa: E402

DICOM = Path(os.environ.get("MEDRECO_SHARED_DICOM", Path(__file__).resolve().parents[2] / "shared" / "data" / "dicom"))
NATIVE = ("1.2.840.10008.1.2", "1.2.840.10008.1.2.1")


def _cpu(fn, *args) -> float:
    t = time.process_time()
    fn(*args)
    return time.process_time() - t


def deid_items() -> dict[str, bytes]:
    """Uncompressed CT/MR/CR/DX files of the shared data, by relative path."""
    out = {}
    for f in sorted(DICOM.rglob("*.dcm")):
        data = f.read_bytes()
        try:
            ds = pydicom.dcmread(io.BytesIO(data), stop_before_pixels=True)
        except Exception:  # noqa: BLE001  not a DICOM file
            continue
        if ds.file_meta.get("TransferSyntaxUID", "") in NATIVE and ds.get("Modality") in ("CT", "MR", "CR", "DX"):
            out[str(f.relative_to(DICOM))] = data
    return out


def main() -> None:
    """Measure and write the JSON."""
    warnings.simplefilter("ignore")
    import logging

    logging.getLogger("pydicom").setLevel(logging.CRITICAL)
    from etl.deid.dicom import DeidentificationError, deidentify_dataset
    from etl.deid.policy import build_policy
    from etl.keys import PseudonymKey
    from etl.pixels.normalise import NormalisationError, image_kind, normalise_2d, normalise_volume
    from schemas.config import NormalisationConfig

    out_path, passes = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 2
    key, policy, cfg = PseudonymKey(b"ab-cpu-key-0123456789abcdef0123456789"), build_policy(), NormalisationConfig()
    result: dict[str, dict] = {"deid": {}, "normalise_2d": {}, "normalise_ct": {}}

    items = deid_items()
    outcome: dict[str, str] = {}

    def ours(name: str, data: bytes) -> None:
        try:
            deidentify_dataset(pydicom.dcmread(io.BytesIO(data)), key, "bench", policy).to_bytes()
            outcome[name] = "ingested"
        except DeidentificationError as err:
            outcome[name] = err.reason
        except Exception as err:  # noqa: BLE001  recorded, not timed apart
            outcome[name] = type(err).__name__

    def floor(data: bytes) -> None:
        pydicom.dcmread(io.BytesIO(data)).save_as(io.BytesIO(), enforce_file_format=True)

    for name, data in list(items.items())[:3]:  # warm imports, lexicons and caches
        ours(name, data)
    for name, data in items.items():
        result["deid"][name] = {
            "cpu_s": min(_cpu(ours, name, data) for _ in range(passes)),
            "floor_cpu_s": min(_cpu(floor, data) for _ in range(passes)),
            "outcome": outcome[name],
        }

    def read(blobs: list[bytes]) -> list[pydicom.Dataset]:
        return [pydicom.dcmread(io.BytesIO(b)) for b in blobs]

    def decode(blobs: list[bytes]) -> None:
        for ds in read(blobs):
            ds.pixel_array  # noqa: B018

    xr = {str(p.relative_to(DICOM)): p.read_bytes() for p in sorted((DICOM / "chest-cr-dx").rglob("*.dcm"))}
    xr = {
        k: b for k, b in xr.items() if read([b])[0].get("Modality") in ("CR", "DX") and image_kind(read([b])[0]) == "2d"
    }
    for name, b in xr.items():
        result["normalise_2d"][name] = {
            "cpu_s": min(_cpu(lambda x: normalise_2d(read([x])[0], cfg), b) for _ in range(passes)),
            "floor_cpu_s": min(_cpu(lambda x: decode([x]), b) for _ in range(passes)),
        }
    series: dict[str, list[bytes]] = {}
    for d in ("chest-ct", "longitudinal-chest-ct-covid19-ny-sbu"):
        for p in sorted((DICOM / d).rglob("*.dcm")):
            b = p.read_bytes()
            ds = read([b])[0]
            if image_kind(ds) == "3d_slice" and ds.get("Modality") == "CT":
                series.setdefault(f"{d}/{ds.SeriesInstanceUID}", []).append(b)

    def run_series(blobs: list[bytes]) -> None:
        try:
            normalise_volume(read(blobs), cfg, target_spacing_mm=cfg.ct_spacing_mm)
        except NormalisationError:
            for ds in read(blobs):
                normalise_2d(ds, cfg)

    for name, blobs in series.items():
        result["normalise_ct"][name] = {
            "cpu_s": min(_cpu(run_series, blobs) for _ in range(passes)),
            "floor_cpu_s": min(_cpu(decode, blobs) for _ in range(passes)),
            "slices": len(blobs),
        }
    out_path.write_text(json.dumps(result, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
