"""Helper of ``training/gpu_check.sh``: publish a synthetic snapshot, train ``--steps`` steps, print
``GPUCHECK device=... steps=... images_per_s=... peak_memory_gib=... autocast=...``.

The snapshot (radiograph-like PNGs at the config's image size, 64 patients, three findings painted as
bright squares) is generated here so the check needs no data; it is published with
``etl.snapshots.publish`` exactly like a real release.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import random
from pathlib import Path

import numpy as np
import yaml
from PIL import Image

from etl import zones
from etl.snapshots import publish
from etl.storage import Storage
from schemas.base import table_from_rows
from schemas.tables import SCHEMAS


def synthetic_snapshot(root: Path, n_patients: int = 64, size: int = 224, seed: int = 0) -> Storage:
    """Publish a synthetic release (studies, images, study_labels, splits; other tables empty)."""
    rng, pick = np.random.default_rng(seed), random.Random(seed)
    t = {k: [] for k in SCHEMAS}
    for p in range(n_patients):
        pk, split = f"p{p:04d}", "train" if p < n_patients * 3 // 4 else "val"
        t["splits"].append({"patient_key": pk, "institution": "synthetic", "split": split, "shard": 0})
        for s in range(2):
            sk = f"{pk}-s{s}"
            img = rng.integers(0, 60, (size, size)).astype(np.uint8)
            for i, e in enumerate(("F001", "F002", "F003")):
                st = pick.choice(["present", "absent"])
                if st == "present":
                    img[size // 8 + i * size // 4: size // 8 + i * size // 4 + size // 5, size // 3: size // 3 + size // 5] = 230
                t["study_labels"].append({"study_key": sk, "patient_key": pk, "family": "2D-CXR", "entity_id": e,
                                          "state": st, "change": "none", "shard": 0})
            buf = io.BytesIO()
            Image.fromarray(img).save(buf, format="PNG", compress_level=1)
            t["studies"].append({"study_key": sk, "patient_key": pk, "institution": "synthetic", "country": "US",
                                 "modality": "CR", "family": "2D-CXR", "n_series": 1, "n_images": 1, "shard": 0})
            t["images"].append({"image_key": f"{sk}-i", "series_key": f"{sk}-se", "study_key": sk, "patient_key": pk,
                                "institution": "synthetic", "modality": "CR", "view": "PA", "kind": "2d", "rows": size,
                                "cols": size, "n_slices": 1, "payload_format": "png", "payload": buf.getvalue(),
                                "payload_sha256": hashlib.sha256(buf.getvalue()).hexdigest(), "recipe": "[]",
                                "transfer_syntax": "1.2.840.10008.1.2.1", "shard": 0})
    st = Storage.open(str(root))
    for name, rows in t.items():
        st.write_table(zones.curated_partition(name, 0), table_from_rows(rows, SCHEMAS[name]))
    publish(st, config_hash="gpu-check", ontology_version="synthetic", run_id="gpu-check", key_fingerprint="none")
    return st


def main() -> None:
    """Parse the arguments of gpu_check.sh, build the snapshot, train, print the GPUCHECK line."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--config", required=True)
    ap.add_argument("--nproc", type=int, default=1)
    a = ap.parse_args()
    work = Path(a.work)
    job = yaml.safe_load(Path(a.config).read_text())
    size = job["model"]["backbone"]["image_size"]
    synthetic_snapshot(work / "root", size=size)
    job["optim"].update(max_steps=a.steps, device=a.device, checkpoint_every=max(a.steps, 1))
    job["data"]["eval_splits"] = ["val"]
    job["launch"] = {"launcher": "local", "nproc_per_node": a.nproc}
    cfg = work / "job.yaml"
    cfg.write_text(yaml.safe_dump(job))
    if a.nproc > 1:
        import subprocess
        import sys

        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={a.nproc}",
                        "-m", "training.jobs", "encoder", "--config", str(cfg), "--root", str(work / "root"),
                        "--output", str(work / "models")], check=True)
        import json

        m = json.loads(next((work / "models").rglob("metrics.json")).read_text())
    else:
        from training.jobs import run_job

        m = run_job("encoder", None, cfg, root=str(work / "root"), output=str(work / "models"))["metrics"]
    peak = m["peak_memory_bytes"]
    print(f"GPUCHECK device={m['device']} world_size={m['world_size']} steps={m['step']} "
          f"images_per_s={m['images_per_s']:.1f} peak_memory_gib={peak / 2**30 if peak else 0:.2f} "
          f"autocast={m['autocast']} loss_first={m['losses'][0]:.3f} loss_last={m['losses'][-1]:.3f}")


if __name__ == "__main__":
    main()
