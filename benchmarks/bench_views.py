"""The release views (``pair_images``, ``vqa_images``) a publish computes: vectorised (polars, what publish runs)
against the reader's per-row rule (``medreco_reader.images``, what the torch datasets run), same synthetic tables,
same process, and N vs 2N for the growth.

Synthetic, metadata only: N studies of 2-3 CR images each (PA and LATERAL), one pair per two studies, ten VQA
items per pair with ``study_keys`` (the shape of bench_pairs' output).

    python benchmarks/bench_views.py [N]      # default 40000 studies
"""

from __future__ import annotations

import sys
import time

import pyarrow as pa

from etl.snapshots.ecosystem import build_views
from medreco_reader.images import index_by_study, pair_images, vqa_images


def tables(n: int) -> dict[str, pa.Table]:
    img: dict[str, list] = {"image_key": [], "study_key": [], "kind": [], "modality": [], "view": []}
    for s in range(n):
        for j in range(2 if s % 2 else 3):
            img["image_key"].append(f"i{s}-{j}")
            img["study_key"].append(f"s{s}")
            img["kind"].append("2d")
            img["modality"].append("CR")
            img["view"].append("PA" if j == 0 else "LATERAL")
    starts = range(0, n - 1, 2)
    pairs = {
        "pair_id": [f"p{s}" for s in starts],
        "patient_key": [f"pt{s}" for s in starts],
        "prior_study_key": [f"s{s}" for s in starts],
        "current_study_key": [f"s{s + 1}" for s in starts],
        "modality": ["CR"] * len(starts),
        "view": ["PA"] * len(starts),
    }
    n_q = 10 * len(starts)
    vqa = {
        "item_id": [f"q{i}" for i in range(n_q)],
        "pair_id": [pairs["pair_id"][i // 10] for i in range(n_q)],
        "study_key": [None] * n_q,
        "study_keys": [[pairs["prior_study_key"][i // 10], pairs["current_study_key"][i // 10]] for i in range(n_q)],
    }
    return {"images": pa.table(img), "pairs": pa.table(pairs), "vqa": pa.table(vqa)}


def per_row(t: dict[str, pa.Table]) -> None:
    by_study = index_by_study(t["images"].to_pylist())
    pairs = sorted(t["pairs"].to_pylist(), key=lambda p: p["pair_id"])
    pair_images(by_study, pairs)
    vqa_images(by_study, {p["pair_id"]: p for p in pairs}, sorted(t["vqa"].to_pylist(), key=lambda q: q["item_id"]))


def timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 40000
    small, large = tables(n), tables(2 * n)
    base = timed(per_row, small)
    vec = [timed(build_views, small), timed(build_views, large)]
    items = small["vqa"].num_rows
    print(f"# {n} studies, {small['images'].num_rows} images, {small['pairs'].num_rows} pairs, {items} VQA items")
    print(
        f"BENCH views studies={n},{2 * n} vectorised_s={vec[0]:.2f},{vec[1]:.2f} per_row_s={base:.2f} "
        f"speedup={base / vec[0]:.1f} growth_2n={vec[1] / vec[0]:.2f} vqa_items_per_s={items / vec[0]:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
