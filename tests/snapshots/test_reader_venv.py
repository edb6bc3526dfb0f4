"""The reader distribution (``reader/``, ``medreco-reader``) in a fresh virtual environment of another Python
(3.12 where there is one) with nothing else installed: it loads the demo build's release (tables, a PNG image,
a NIfTI volume) exactly as the project reads it.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from etl.snapshots import load_snapshot
from schemas.config import PROJECT_ROOT

pytestmark = pytest.mark.slow  # a venv and a pip install (about a minute with a warm cache)


def _other_python() -> str | None:
    """Python 3.12 if found, else the newest 3.1x that is not this interpreter's minor version."""
    found = {}
    for path in [shutil.which(f"python3.{m}") for m in range(10, 15)] + glob.glob(
        os.path.expanduser("~/.pyenv/versions/3.1*/bin/python3")
    ):
        if not path:
            continue
        try:
            out = subprocess.run(
                [path, "-c", "import sys; print(sys.version_info[1])"],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            continue
        if int(out) != sys.version_info[1]:
            found.setdefault(int(out), path)
    return found.get(12) or (found[max(found)] if found else None)


SCRIPT = r"""
import json, sys
import numpy as np
from medreco_reader import load_snapshot
root, png_key, vol_key = sys.argv[1:4]
snap = load_snapshot(root)
rows = {t: snap.table(t).collect().height for t in snap.tables}
views = {v: snap.view(v).num_rows for v in snap.views}
png, png_meta = snap.image(png_key)
vol, vol_meta = snap.image(vol_key)
out = {"python": sys.version.split()[0], "version": snap.version, "rows": rows, "views": views,
       "png": [list(png.shape), str(png.dtype), int(png.astype(np.int64).sum())],
       "vol": [list(vol.shape), str(vol.dtype), float(vol.astype(np.float64).sum()), vol_meta["spacing_mm"]]}
for banned in ("etl", "airflow", "spacy", "great_expectations", "torch"):
    try:
        __import__(banned)
        out.setdefault("importable", []).append(banned)
    except ImportError:
        pass
print(json.dumps(out))
"""


def test_reader_alone_in_a_fresh_venv_loads_the_demo_release(demo_build, tmp_path):
    python = _other_python()
    if python is None:
        pytest.skip("no Python other than the project's found (python3.12 or another 3.1x)")
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=120, env=env)
    pip = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", str(PROJECT_ROOT / "reader")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert pip.returncode == 0, pip.stderr[-2000:]
    snap = load_snapshot(demo_build["storage"])
    images = snap.read("images", columns=["image_key", "payload_format"]).to_pylist()
    png_key = next(r["image_key"] for r in images if r["payload_format"] == "png")
    vol_key = next(r["image_key"] for r in images if r["payload_format"] == "nifti")
    run = subprocess.run(
        [str(venv / "bin" / "python"), "-c", SCRIPT, str(demo_build["root"]), png_key, vol_key],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout)
    print("reader venv: Python", got["python"], "from", python)
    png, _ = snap.image(png_key)
    vol, meta = snap.image(vol_key)
    assert got["version"] == snap.version
    assert got["rows"] == {t: v["rows"] for t, v in snap.manifest["tables"].items()}
    assert got["views"] == {
        "pair_images": snap.manifest["tables"]["pairs"]["rows"],
        "vqa_images": snap.manifest["tables"]["vqa"]["rows"],
    }
    assert got["png"] == [list(png.shape), str(png.dtype), int(png.astype(np.int64).sum())]
    assert got["vol"][:2] == [list(vol.shape), str(vol.dtype)] and vol.ndim == 3
    assert got["vol"][2] == pytest.approx(float(vol.astype(np.float64).sum())) and got["vol"][3] == meta["spacing_mm"]
    assert "importable" not in got, got.get("importable")  # the build stack is not there


TORCH_SCRIPT = r"""
import json, sys
import torch
from medreco_reader import load_snapshot
from medreco_reader.torch_data import ImageDataset, PairDataset, VQADataset
snap = load_snapshot(sys.argv[1])
pairs = PairDataset(snap, split="train", kind=None, fixed_shape=False)
batch = next(iter(torch.utils.data.DataLoader(PairDataset(snap, split="train"), batch_size=2)))
try:
    PairDataset(snap, split="validation")
    refused = False
except ValueError:
    refused = True
banned = [m for m in ("etl", "airflow", "spacy", "torchvision") if m in sys.modules]
print(json.dumps({"pairs": len(pairs), "images": len(ImageDataset(snap, kind="3d")), "vqa": len(VQADataset(snap)),
                  "batch": list(batch["prior"].shape), "refused": refused, "banned": banned}))
"""


def test_reader_with_the_torch_extra_alone_gives_the_datasets(demo_build, tmp_path):
    """`pip install ./reader[torch]` in a fresh venv of the project's Python (the CPU torch wheel on local disk,
    pinned first so no resolver reaches for a CUDA build) is all the torch Datasets need (issue 40, point 2)."""
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120, env=env)
    pip = venv / "bin" / "pip"
    torch_pin = f"torch=={torch_version()}"
    for args in ([torch_pin], [f"{PROJECT_ROOT / 'reader'}[torch]", torch_pin]):
        proc = subprocess.run([str(pip), "install", "-q", *args], capture_output=True, text=True, timeout=900, env=env)
        assert proc.returncode == 0, proc.stderr[-2000:]
    run = subprocess.run(
        [str(venv / "bin" / "python"), "-c", TORCH_SCRIPT, str(demo_build["root"])],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout)
    snap = load_snapshot(demo_build["storage"])
    from medreco_reader.torch_data import ImageDataset, PairDataset

    assert got["pairs"] == len(PairDataset(snap, split="train", kind=None, fixed_shape=False)) > 0
    assert got["images"] == len(ImageDataset(snap, kind="3d")) > 0
    assert got["refused"] and got["banned"] == [] and got["batch"][0] == 2


def torch_version() -> str:
    """The installed torch release without its local tag (``2.13.0`` of ``2.13.0+cpu``)."""
    import torch

    return torch.__version__.split("+", 1)[0]
