"""Pairs, retrieval targets, VQA items and splits at MedReCo-DB scale (metadata only, no pixels).

Generates the ``studies`` / ``images`` (view only) / ``study_labels`` / ``entity_mentions`` frames of a synthetic
archive: 8 institutions, 4 modality families, 160,000 patients and about 690,000 images (docs/design.md scale), then
runs the build's own functions on them, in build order: :func:`etl.assemble.splits.assign_splits`,
:func:`etl.assemble.pairs.build_pairs`, :func:`etl.assemble.vqa.build_vqa` (with the mentions and image views, as
``assemble`` passes them), :func:`etl.assemble.retrieval.build_retrieval_targets`,
:func:`etl.assemble.vqa.build_case_comparison_vqa` and :func:`etl.assemble.splits.check_split_integrity`. As in the
build, the VQA items of each stage go to Parquet (a temporary folder, not timed) and are released, and the split check
reads back only the columns it needs. Each patient count (40k, 80k, 160k) runs in its own process so that peak memory is
per size; inside it a thread samples the process RSS every 20 ms (polars allocates in Rust, which tracemalloc does not
see) and each step reports its wall time, the RSS when it starts and its peak RSS (inputs included: the peak is the
process's, not the step's increment).

Synthetic archive (rates chosen to resemble a hospital PACS; every draw from one seeded numpy Generator):

* studies per patient: 1 + Poisson(0.75) (mean 1.75); one family per patient (CXR 55 %, CT 20 %, brain MRI 10 %,
  US 15 %); 5 % of patients also visit a second institution; dates uniform over 5 years, 3 % of follow-ups on the
  same day as the previous study;
* images per study: CXR PA + lateral 60 %, AP only 30 %, lateral only 10 %; CT 3 volumes (one per series), MRI 4,
  US 4;
* 85 % of studies have a report; a report gives a ``study_labels`` row for every concept of the family (as
  :func:`entity_extraction.extract.study_labels` does) with state present 5 %, absent 7 %, uncertain 1 %, else
  not_mentioned; 30 % of present labels state a change; every mentioned label has one ``entity_mentions`` row with
  laterality (30 %), severity (25 %), its ontology anatomy and a text (severity, a type word in 20 %, the name).

Ends with ``BENCH pairs patients=160000 images=... total_s=... peak_gib=... growth_80k_to_160k=...`` where
``growth_80k_to_160k`` is total time at 160k over total time at 80k (linear = 2.0, n log n = 2.1).
Targets: total under 120 s and peak under 6 GiB at 160k patients.
Usage: ``python benchmarks/bench_pairs.py [--patients N]`` (one size; without it, all three in subprocesses).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import polars as pl
import psutil
import pyarrow.dataset as ds
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SIZES = (40_000, 80_000, 160_000)
INSTITUTIONS = (
    "us-bos-general",
    "us-nyc-east",
    "gb-lon-royal",
    "gb-man-north",
    "de-ber-charite",
    "de-muc-sud",
    "au-mel-central",
    "au-syd-west",
)
FAMILIES = ("2D-CXR", "3D-CT", "3D-Brain-MRI", "2D-Ultrasound")
FAMILY_P = (0.55, 0.20, 0.10, 0.15)
MODALITY = {"2D-CXR": "DX", "3D-CT": "CT", "3D-Brain-MRI": "MR", "2D-Ultrasound": "US"}
IMAGES_PER_STUDY = {"3D-CT": 3, "3D-Brain-MRI": 4, "2D-Ultrasound": 4}
STATE_P = {"present": 0.05, "absent": 0.07, "uncertain": 0.01}
TYPE_WORDS = ("patchy", "focal", "linear", "calcified", "interstitial")
T0 = datetime(2030, 1, 1)


class PeakRSS:
    """Samples this process's resident set size in a thread; ``peak()`` since the last ``reset()`` in bytes."""

    def __init__(self, interval_s: float = 0.02) -> None:
        self._proc = psutil.Process()
        self._peak = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, args=(interval_s,), daemon=True)
        self._thread.start()

    def _run(self, interval_s: float) -> None:
        while not self._stop.is_set():
            with self._lock:  # a sample taken before a reset must not land after it
                self._peak = max(self._peak, self._proc.memory_info().rss)
            time.sleep(interval_s)

    def reset(self) -> None:
        with self._lock:
            self._peak = self._proc.memory_info().rss

    def peak(self) -> int:
        return max(self._peak, self._proc.memory_info().rss)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _hex_keys(rng: np.random.Generator, n: int, prefix: str) -> list[str]:
    return [f"{prefix}{v:015x}" for v in rng.integers(0, 2**60, size=n, dtype=np.int64)]


def generate(n_patients: int, seed: int = 20310304) -> dict[str, pl.DataFrame]:
    """The synthetic archive's metadata frames (module docstring): studies, images, study_labels, mentions."""
    from schemas.ontology import load_ontology

    rng = np.random.default_rng(seed)
    onto = load_ontology()
    patients = _hex_keys(rng, n_patients, "p")
    fam_idx = rng.choice(len(FAMILIES), size=n_patients, p=FAMILY_P)
    n_studies = 1 + rng.poisson(0.75, size=n_patients)
    home = rng.integers(0, len(INSTITUTIONS), size=n_patients)
    second = np.where(rng.random(n_patients) < 0.05, rng.integers(0, len(INSTITUTIONS), size=n_patients), home)
    shard = rng.integers(0, 64, size=n_patients).astype(np.int32)

    pidx = np.repeat(np.arange(n_patients), n_studies)
    n = len(pidx)
    within = np.arange(n) - np.repeat(np.cumsum(n_studies) - n_studies, n_studies)
    days = rng.uniform(0, 5 * 365, size=n)
    same_day = (within > 0) & (rng.random(n) < 0.03)
    order = np.lexsort((days, pidx))
    days = days[order]
    prev_same = np.r_[False, pidx[1:] == pidx[:-1]] & same_day
    days[prev_same] = days[np.nonzero(prev_same)[0] - 1] + rng.uniform(0, 0.3, size=int(prev_same.sum()))
    inst = np.where(rng.random(n) < 0.8, home[pidx], second[pidx])
    family = np.array(FAMILIES)[fam_idx[pidx]]
    study_keys = _hex_keys(rng, n, "s")
    studies = pl.DataFrame(
        {
            "study_key": study_keys,
            "patient_key": np.array(patients)[pidx],
            "institution": np.array(INSTITUTIONS)[inst],
            "family": family,
            "modality": np.vectorize(MODALITY.get)(family),
            "study_datetime": [T0 + timedelta(days=float(d)) for d in days],
            "shard": shard[pidx],
        }
    ).with_columns(pl.col("study_datetime").cast(pl.Datetime("us")), pl.col("shard").cast(pl.Int32))

    # images: CXR views; 3D/US a fixed number of images per study
    cxr = family == "2D-CXR"
    u = rng.random(n)
    img_study = []
    img_view = []
    for mask, vlist in (
        (cxr & (u < 0.6), ("PA", "LATERAL")),
        (cxr & (u >= 0.6) & (u < 0.9), ("AP",)),
        (cxr & (u >= 0.9), ("LATERAL",)),
    ):
        idx = np.nonzero(mask)[0]
        for v in vlist:
            img_study.append(idx)
            img_view.append(np.full(len(idx), v, dtype=object))
    for fam, k in IMAGES_PER_STUDY.items():
        idx = np.nonzero(family == fam)[0]
        img_study.append(np.repeat(idx, k))
        img_view.append(np.full(len(idx) * k, None, dtype=object))
    si = np.concatenate(img_study)
    images = pl.DataFrame(
        {"study_key": np.array(study_keys)[si], "view": np.concatenate(img_view).tolist()},
        schema={"study_key": pl.Utf8, "view": pl.Utf8},
    )

    # study labels: every family concept of each reported study
    reported = np.nonzero(rng.random(n) < 0.85)[0]
    lab_parts, men_parts = [], []
    for fi, fam in enumerate(FAMILIES):
        concepts = onto.family_concepts(fam)
        ids = np.array([c.id for c in concepts])
        anat = np.array(
            [c.anatomy_id if c.anatomy_id else (c.id if c.category == "anatomy" else None) for c in concepts],
            dtype=object,
        )
        rs = reported[fam_idx[pidx[reported]] == fi]
        m = len(rs) * len(ids)
        st_idx = np.repeat(rs, len(ids))
        ent = np.tile(np.arange(len(ids)), len(rs))
        r = rng.random(m)
        state = np.full(m, "not_mentioned", dtype=object)
        edge = 0.0
        for name, p in STATE_P.items():
            state[(r >= edge) & (r < edge + p)] = name
            edge += p
        change = np.full(m, "none", dtype=object)
        stated = (state == "present") & (within[st_idx] > 0) & (rng.random(m) < 0.3)
        change[stated] = rng.choice(
            ["new", "increased", "decreased", "unchanged", "improved", "worsened"], size=int(stated.sum())
        )
        lab_parts.append(
            pl.DataFrame(
                {
                    "study_key": np.array(study_keys)[st_idx],
                    "patient_key": np.array(patients)[pidx[st_idx]],
                    "family": np.full(m, fam),
                    "entity_id": ids[ent],
                    "state": state.tolist(),
                    "change": change.tolist(),
                    "shard": shard[pidx[st_idx]],
                },
                schema={
                    "study_key": pl.Utf8,
                    "patient_key": pl.Utf8,
                    "family": pl.Utf8,
                    "entity_id": pl.Utf8,
                    "state": pl.Utf8,
                    "change": pl.Utf8,
                    "shard": pl.Int32,
                },
            )
        )
        mentioned = np.nonzero(state != "not_mentioned")[0]
        k = len(mentioned)
        lat = np.where(rng.random(k) < 0.3, rng.choice(["left", "right", "bilateral"], size=k), None)
        sev = np.where(rng.random(k) < 0.25, rng.choice(["mild", "moderate", "severe", "small", "large"], size=k), None)
        names = np.array([c.preferred_name.lower() for c in concepts], dtype=object)[ent[mentioned]]
        word = np.where(rng.random(k) < 0.2, rng.choice(TYPE_WORDS, size=k), "")
        text = [
            " ".join(w for w in (s, t, nm) if w)
            for s, t, nm in zip(np.where(sev == None, "", sev), word, names, strict=True)  # noqa: E711 (elementwise)
        ]
        men_parts.append(
            pl.DataFrame(
                {
                    "study_key": np.array(study_keys)[st_idx[mentioned]],
                    "entity_id": ids[ent[mentioned]],
                    "assertion": state[mentioned].tolist(),
                    "temporality": np.full(k, "current"),
                    "section": np.where(rng.random(k) < 0.6, "impression", "findings"),
                    "laterality": lat.tolist(),
                    "severity": sev.tolist(),
                    "anatomy_id": anat[ent[mentioned]].tolist(),
                    "span_start": rng.integers(0, 2000, size=k).astype(np.int32),
                    "text": text,
                },
                schema={
                    "study_key": pl.Utf8,
                    "entity_id": pl.Utf8,
                    "assertion": pl.Utf8,
                    "temporality": pl.Utf8,
                    "section": pl.Utf8,
                    "laterality": pl.Utf8,
                    "severity": pl.Utf8,
                    "anatomy_id": pl.Utf8,
                    "span_start": pl.Int32,
                    "text": pl.Utf8,
                },
            )
        )
    labels = pl.concat(lab_parts)
    mentions = pl.concat(men_parts)
    mentions = mentions.with_columns(mention_id=pl.int_range(pl.len()).cast(pl.Utf8).str.zfill(12))
    return {"studies": studies, "images": images, "study_labels": labels, "entity_mentions": mentions}


def run_size(n_patients: int) -> dict:
    """Generate one archive and time each build step on it; returns the figures as a dict."""
    tmp = Path(tempfile.mkdtemp(prefix="bench_pairs_"))
    try:
        return _run_size(n_patients, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run_size(n_patients: int, tmp: Path) -> dict:
    from etl.assemble.pairs import build_pairs
    from etl.assemble.retrieval import build_retrieval_targets, load_similarity
    from etl.assemble.splits import assign_splits, check_split_integrity
    from etl.assemble.vqa import build_case_comparison_vqa, build_vqa, load_templates
    from schemas.config import PairingConfig, RetrievalConfig, SplitConfig, VQAConfig
    from schemas.ontology import load_ontology

    rss = PeakRSS()
    t0 = time.perf_counter()
    data = generate(n_patients)
    gen_s = time.perf_counter() - t0
    studies, images, labels, mentions = (data[k] for k in ("studies", "images", "study_labels", "entity_mentions"))
    steps: dict[str, dict] = {}
    out: dict = {}

    def step(name, fn):
        rss.reset()
        start = rss.peak()
        t, c = time.perf_counter(), time.process_time()
        result = fn()
        steps[name] = {
            "s": time.perf_counter() - t,
            "cpu_s": time.process_time() - c,
            "peak_gib": rss.peak() / 2**30,
            "start_gib": start / 2**30,
        }
        return result

    split_cfg = SplitConfig(train=0.8, val=0.1, test=0.1, external_test_institutions=["au-syd-west"])
    splits = step(
        "splits", lambda: assign_splits(studies.select("patient_key", "institution", "shard").unique(), split_cfg)
    )
    pairs = step("pairs", lambda: build_pairs(studies, labels, images, PairingConfig()))
    templates, onto = load_templates(), load_ontology()
    splits_df = pl.from_arrow(splits)
    vqa = step(
        "vqa",
        lambda: build_vqa(
            pl.from_arrow(pairs),
            labels,
            studies,
            splits_df,
            VQAConfig(),
            templates,
            onto,
            entity_mentions=mentions,
            images=images,
        ),
    )
    # as the build does, each stage's output goes to Parquet and is released; the split check reads it back
    vqa_rows = vqa.num_rows
    pq.write_table(vqa, tmp / "vqa-0.parquet")
    del vqa
    similarity = load_similarity()
    # as etl/pipeline/stages.py's retrieval stage: the targets as a polars frame, read by the two-case VQA items
    targets = step(
        "retrieval",
        lambda: pl.from_arrow(build_retrieval_targets(labels, mentions, splits_df, RetrievalConfig(), similarity)),
    )
    case_vqa = step(
        "case_vqa",
        lambda: build_case_comparison_vqa(
            targets, labels, mentions, VQAConfig(), templates, onto, similarity["severity"]["ordinal"]
        ),
    )
    case_rows = case_vqa.num_rows
    pq.write_table(case_vqa, tmp / "vqa-1.parquet")
    del case_vqa
    step(
        "split_check",
        lambda: check_split_integrity(
            splits_df, studies=studies, pairs=pairs, retrieval_targets=targets, vqa=ds.dataset(tmp, format="parquet")
        ),
    )
    rss.stop()
    out.update(
        patients=n_patients,
        studies=studies.height,
        images=images.height,
        study_labels=labels.height,
        mentions=mentions.height,
        pairs=pairs.num_rows,
        vqa=vqa_rows,
        case_vqa=case_rows,
        retrieval=targets.height,
        generate_s=gen_s,
        steps=steps,
        total_s=sum(s["s"] for s in steps.values()),
        peak_gib=max(s["peak_gib"] for s in steps.values()),
    )
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--patients", type=int, default=None)
    args = ap.parse_args()
    if args.patients:
        print(json.dumps(run_size(args.patients)))
        return 0
    results = {}
    for n in SIZES:
        proc = subprocess.run([sys.executable, __file__, "--patients", str(n)], capture_output=True, text=True)
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr[-3000:])
            return 1
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        results[n] = r
        print(
            f"patients={n} studies={r['studies']} images={r['images']} study_labels={r['study_labels']} "
            f"mentions={r['mentions']} -> pairs={r['pairs']} vqa={r['vqa']} case_vqa={r['case_vqa']} "
            f"retrieval={r['retrieval']} "
            f"(generate {r['generate_s']:.1f} s)"
        )
        for name, s in r["steps"].items():
            print(
                f"  {name:<12} {s['s']:7.2f} s wall {s['cpu_s']:7.2f} s CPU  RSS {s['start_gib']:.2f} GiB at start, "
                f"peak {s['peak_gib']:.2f} GiB"
            )
        print(f"  {'total':<12} {r['total_s']:7.2f} s  peak RSS {r['peak_gib']:.2f} GiB")
    big, mid = results[SIZES[-1]], results[SIZES[-2]]
    growth = big["total_s"] / mid["total_s"]
    per_step = " ".join(f"{k}_s={v['s']:.2f}" for k, v in big["steps"].items())
    step_growth = " ".join(
        f"{k}_growth={big['steps'][k]['s'] / max(mid['steps'][k]['s'], 1e-9):.2f}" for k in big["steps"]
    )
    print(
        f"BENCH pairs patients={big['patients']} images={big['images']} studies={big['studies']} "
        f"total_s={big['total_s']:.1f} peak_gib={big['peak_gib']:.2f} growth_80k_to_160k={growth:.2f} "
        f"{per_step} {step_growth} target_s=120 target_gib=6"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
