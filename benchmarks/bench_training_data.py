"""Peak memory of the training data path per process, at two release sizes (N and 2N patients).

Each measurement runs in a fresh process (one rank): it opens the release, builds the encoder's study index and
training set (:mod:`training.data`: ``images`` metadata once, payloads one Parquet row group at a time) and draws
every item of one epoch through a ``DataLoader``; its peak RSS (``ru_maxrss``) is compared with a baseline in the
same run: reading the whole ``images`` table with its payloads into memory (what every rank did before the
streaming reader). Synthetic release (:func:`training.synthetic.synthetic_release`) with incompressible noise
images, so payload bytes dominate the release.

    python benchmarks/bench_training_data.py [N] [SIZE]      # default 300 patients, 256 px images
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(root: str, mode: str) -> dict:
    """In this process: ``stream`` (the training set over one epoch) or ``table`` (the whole images table)."""
    from etl.storage import Storage
    from training.data import open_snapshot

    ref = open_snapshot(Storage.open(root))
    t0 = time.perf_counter()
    if mode == "table":
        t = ref.table("images")
        n = t.num_rows
        payload = sum(len(b) for b in t["payload"].to_pylist() if b)
    else:
        import torch

        from training.config import EncoderJobConfig
        from training.tasks import EncoderTask

        job = EncoderJobConfig.model_validate({"name": "bench", "model": {"backbone": {"image_size": 64}}})
        task = EncoderTask(job, ref)
        data = task.train_dataset()
        loader = torch.utils.data.DataLoader(data, batch_size=16, collate_fn=task.collate)
        n = sum(b["entity"].shape[0] for b in loader)
        payload = None
    return {
        "mode": mode,
        "items": n,
        "payload_bytes": payload,
        "s": round(time.perf_counter() - t0, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def _run(root: str, mode: str) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--measure", root, mode], capture_output=True, text=True, cwd=ROOT, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--measure":
        print(json.dumps(measure(sys.argv[2], sys.argv[3])))
        return 0
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    size = int(sys.argv[2]) if len(sys.argv) > 2 else 256
    import numpy as np

    import training.synthetic as syn

    def noisy_png(states, rng, s):  # incompressible pixels: payload bytes dominate the release
        import io

        from PIL import Image

        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (s, s)).astype(np.uint8)).save(buf, format="PNG", compress_level=1)
        return buf.getvalue()

    syn._png = noisy_png
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        for k, patients in (("n", n), ("2n", 2 * n)):
            root = str(Path(tmp) / k)
            syn.synthetic_release(root, n_patients=patients, size=size)
            res[k] = {"stream": _run(root, "stream"), "table": _run(root, "table")}
            print(k, patients, json.dumps(res[k]))
    s1, s2 = res["n"]["stream"]["peak_rss_mb"], res["2n"]["stream"]["peak_rss_mb"]
    t1, t2 = res["n"]["table"]["peak_rss_mb"], res["2n"]["table"]["peak_rss_mb"]
    pay1, pay2 = res["n"]["table"]["payload_bytes"] / 2**20, res["2n"]["table"]["payload_bytes"] / 2**20
    print(
        f"BENCH training_data patients={n},{2 * n} payload_mb={pay1:.0f},{pay2:.0f} "
        f"stream_rss_mb={s1},{s2} stream_growth_mb={s2 - s1:.1f} table_rss_mb={t1},{t2} "
        f"table_growth_mb={t2 - t1:.1f} growth_ratio_vs_table={(s2 - s1) / max(t2 - t1, 1e-9):.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
