"""Benchmark: de-identification CPU per DICOM file with the burned-in text OCR off and on, by modality, on an archive.

Every DICOM file under a folder (default: the ``bench_build.py`` archive of 8 patients in its cache,
``$MEDRECO_BENCH_CACHE/archive-p8-s11-*``) is de-identified as the deid stage does it (:class:`SeriesTextGate` order
over SeriesInstanceUID, :func:`etl.deid.dicom.deidentify_dataset`, Part 10 bytes), once with
``deid.burned_in_text.ocr`` off and once on (per series, :mod:`etl.deid.series_text`), in one process; CPU seconds
of the process per file, by modality, and the outcomes (``text_series_*`` audit counts, reason codes of files
quarantined). No pixel-cleaning rule is configured, so an ultrasound at header risk is read in full.
Usage: ``python benchmarks/bench_deid_mix.py [FOLDER]``; ends with one ``BENCH deid_mix ...`` line.
"""

from __future__ import annotations

import collections
import glob
import io
import os
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(folder: str | None = None) -> None:
    """Run the benchmark on ``folder`` (default: the cached bench_build archive) and print its figures."""
    warnings.simplefilter("ignore")
    os.environ.setdefault("OMP_THREAD_LIMIT", "1")
    import pydicom

    from etl.deid.dicom import deidentify_dataset
    from etl.deid.policy import build_policy
    from etl.deid.series_text import SeriesTextGate
    from etl.keys import PseudonymKey
    from schemas.config import BurnedInTextConfig, DeidConfig

    if folder is None:
        cache = Path(os.environ.get("MEDRECO_BENCH_CACHE", Path.home() / ".cache" / "medreco-bench"))
        found = sorted(cache.glob("archive-p8-s11-*/sources"))
        if not found:
            raise SystemExit(f"no bench_build archive under {cache}: run benchmarks/bench_build.py or name a folder")
        folder = str(found[-1])
    files = sorted(glob.glob(folder + "/**/*.dcm", recursive=True))
    datas = {f: Path(f).read_bytes() for f in files}
    meta = {}
    for f in files:
        ds = pydicom.dcmread(io.BytesIO(datas[f]), stop_before_pixels=True)
        meta[f] = (str(ds.get("Modality", "")), str(ds.get("SeriesInstanceUID", "")))
    key = PseudonymKey(b"bench-key-of-32-bytes-----------")

    def run(ocr: bool) -> tuple[collections.Counter, collections.Counter, collections.Counter]:
        policy = build_policy(DeidConfig(burned_in_text=BurnedInTextConfig(ocr=ocr)))
        gate = SeriesTextGate((f, meta[f][1]) for f in files)
        cpu, n, out = collections.Counter(), collections.Counter(), collections.Counter()
        for f in gate.order():
            c = time.process_time()
            try:
                ds = pydicom.dcmread(io.BytesIO(datas[f]))
                r = deidentify_dataset(ds, key, "bench", policy, series_text=gate.slot(f))
                r.to_bytes()
                gate.record(f, r.text_regions)
                why = next((k for k in r.audit if k.startswith("text_series_")), "text_full" * bool(ocr) or "off")
            except Exception as err:  # noqa: BLE001  a quarantined file counts with its reason
                why = "quarantined:" + str(getattr(err, "reason", type(err).__name__))
            cpu[meta[f][0]] += time.process_time() - c
            n[meta[f][0]] += 1
            out[f"{meta[f][0]}:{why}"] += 1
        return cpu, n, out

    off, on = run(False), run(True)
    print(f"{len(files)} files under {folder}, load {os.getloadavg()[0]:.1f}")
    for m in sorted(off[1]):
        print(
            f"{m}: {off[1][m]} files, OCR off {off[0][m] / off[1][m] * 1000:.1f} ms CPU per file, "
            f"on {on[0][m] / on[1][m] * 1000:.1f} ms"
        )
    print("outcomes with the OCR on:", dict(sorted(on[2].items())))
    total_off, total_on = sum(off[0].values()) / len(files), sum(on[0].values()) / len(files)
    print(
        f"BENCH deid_mix files={len(files)} off_s_per_file={total_off:.4f} on_s_per_file={total_on:.4f} "
        f"ratio={total_on / total_off:.2f} load={os.getloadavg()[0]:.2f} cpu_seconds=process_time"
    )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
