"""GPU check: train both jobs for a fixed number of steps on a synthetic release and assert they really train.

``python training/gpu_check.py --size real --device cuda --out DIR`` (where a GPU is lent) or ``--size tiny
--device cpu`` (the suite). For each job it publishes nothing but a synthetic release (:mod:`training.synthetic`),
then:

* encoder: ``config/training/encoder-gpu.yaml`` (ViT-B/16 at 224 px, bf16) or the tiny config, ``--steps`` steps;
* VLM: ``config/training/vlm-gpu.yaml``'s vision tower with a Qwen2-0.5B-shaped language model (random weights
  saved as a local folder with its own tokenizer, loaded through ``lm.path``) or the tiny equivalents;
* asserts every loss is finite and the mean of the last tenth of the steps is below that of the first tenth;
* resumes each job from its checkpoint for ``--resume-steps`` more steps on the same device (the step count
  continues, the loss stays finite);
* reports images/s, peak GPU memory (GiB), the data loader's wait share and the parameter counts, one
  ``GPUCHECK job=...`` line per job and all figures as JSON (``--out DIR/gpu_check.json``).

Exit status 0 when every assertion holds, 1 otherwise (the failed assertion is printed).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "reader" / "src")]  # run as a script from anywhere

from schemas.errors import ReasonCodedError  # noqa: E402


class CheckFailed(ReasonCodedError, AssertionError):
    """A gpu check assertion that did not hold."""

    default_reason = "gpu_check_failed"
    message_format = "{message}"


def _job_yaml(
    base: str,
    work: Path,
    name: str,
    device: str,
    steps: int,
    size: str,
    model: dict | None = None,
    data: dict | None = None,
) -> Path:
    d = yaml.safe_load((ROOT / "config" / "training" / base).read_text())
    d["name"] = name
    d["optim"].update(
        {
            "max_steps": steps,
            "device": device,
            "checkpoint_every": steps,
            "warmup_steps": min(d["optim"].get("warmup_steps", 0), max(1, steps // 10)),
            "num_workers": 0 if size == "tiny" else min(8, d["optim"].get("num_workers", 0)),
            "precision": "bf16" if device == "cuda" else "fp32",
        }
    )
    if size == "real":
        d["optim"]["batch_size"] = min(d["optim"]["batch_size"], 32)
        d["optim"]["grad_accum_steps"] = 1
    for k, v in (model or {}).items():
        d["model"][k] = {**d["model"][k], **v} if isinstance(v, dict) and isinstance(d["model"].get(k), dict) else v
    d["data"] = {**d["data"], "eval_splits": ["val"], **(data or {})}
    d["launch"] = {"launcher": "local", "nproc_per_node": 1}
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(d))
    return path


def _check_run(kind: str, m: dict, steps: int) -> dict:
    losses = m["losses"]
    if len(losses) != steps or not all(math.isfinite(x) for x in losses):
        raise CheckFailed(f"{kind}: {len(losses)} losses, finite: {all(math.isfinite(x) for x in losses)}")
    k = max(1, steps // 10)
    first, last = sum(losses[:k]) / k, sum(losses[-k:]) / k
    if not last < first:
        raise CheckFailed(f"{kind}: loss did not fall (first {k} steps {first:.4f}, last {k} steps {last:.4f})")
    peak = m["peak_memory_bytes"]
    return {
        "job": kind,
        "device": m["device"],
        "autocast": m["autocast"],
        "steps": m["step"],
        "loss_first": round(first, 4),
        "loss_last": round(last, 4),
        "images_per_s": round(m["images_per_s"] or 0.0, 1),
        "peak_memory_gib": round(peak / 2**30, 2) if peak else None,
        "loader_wait_share": round(m["loader_wait_share"], 3),
        "parameters": m["parameters"],
    }


def _resume(kind: str, cfg: Path, work: Path, root: str, out: Path, steps: int, more: int, device: str) -> dict:
    import torch

    from training.jobs import run_job

    d = yaml.safe_load(cfg.read_text())
    d["optim"]["max_steps"] = steps + more
    again = cfg.with_name(cfg.stem + "-resume.yaml")
    again.write_text(yaml.safe_dump(d))
    m = run_job(kind, None, again, root=root, output=str(out))["metrics"]
    if (m["start_step"], m["step"]) != (steps, steps + more):
        raise CheckFailed(f"{kind} resume: started at {m['start_step']}, ended at {m['step']}")
    if not all(math.isfinite(x) for x in m["losses"]):
        raise CheckFailed(f"{kind} resume: non-finite loss")
    ckpt = next(out.rglob("last.pt"))
    state = torch.load(ckpt, map_location=device, weights_only=False)
    on = {str(v.device.type) for v in state["model"].values() if hasattr(v, "device")}
    return {"resumed_from": steps, "resumed_to": m["step"], "checkpoint_loads_on": sorted(on)}


def run(size: str, device: str, steps: int, resume_steps: int, work: Path) -> list[dict]:
    """Both jobs, checked (see the module docstring); returns one figure dict per job.

    Raises
    ------
    CheckFailed
        an assertion that did not hold.
    """
    from training.jobs import run_job
    from training.synthetic import QWEN2_0_5B, QWEN2_TINY, qwen2_lm_folder, synthetic_release

    real = size == "real"
    t0 = time.perf_counter()
    store = synthetic_release(work / "root", n_patients=256 if real else 24, size=224 if real else 32)
    results = []
    enc = _job_yaml(
        "encoder-gpu.yaml" if real else "encoder-tiny-cpu.yaml",
        work,
        "check-encoder",
        device,
        steps,
        size,
        data={"ndcg_k": 10, "recall_ks": [1, 5, 10]},
    )
    m = run_job("encoder", None, enc, root=store.root, output=str(work / "enc"))["metrics"]
    results.append(
        {
            **_check_run("encoder", m, steps),
            **_resume("encoder", enc, work, store.root, work / "enc", steps, resume_steps, device),
            "eval_val": m["eval"]["val"].get("cells_mean"),
        }
    )
    texts = [
        r["question"] + " " + " ".join(r["options"]) + " " + r["answer_text"]
        for r in store.read_table("curated/vqa/shard=00000/part-0.parquet").to_pylist()
    ]
    lm = qwen2_lm_folder(work, QWEN2_0_5B if real else QWEN2_TINY, texts)
    vlm = _job_yaml(
        "vlm-gpu.yaml" if real else "vlm-tiny-cpu.yaml",
        work,
        "check-vlm",
        device,
        steps,
        size,
        model={"lm": {"path": str(lm)}, "tokenizer": {"kind": "auto"}, "max_text_tokens": 128, "max_new_tokens": 8},
        data={"max_eval_items": 64},
    )
    m = run_job("vlm", None, vlm, root=store.root, output=str(work / "vlm"))["metrics"]
    results.append(
        {
            **_check_run("vlm", m, steps),
            **_resume("vlm", vlm, work, store.root, work / "vlm", steps, resume_steps, device),
            "eval_val_mc_accuracy": m["eval"]["val"].get("mc_accuracy"),
        }
    )
    for r in results:
        r["wall_s_total"] = round(time.perf_counter() - t0, 1)
    return results


def main(argv: list[str] | None = None) -> int:
    """Command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=["real", "tiny"], default="real")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--steps", type=int, default=None, help="steps per job (default: real 150, tiny 24)")
    ap.add_argument("--resume-steps", type=int, default=None, help="steps after the resume (default: real 10, tiny 2)")
    ap.add_argument("--work", default=None, help="scratch folder (default: a temporary one)")
    ap.add_argument("--out", default=None, help="folder for gpu_check.json")
    a = ap.parse_args(argv)
    steps = a.steps or (150 if a.size == "real" else 24)
    more = a.resume_steps or (10 if a.size == "real" else 2)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(a.work or tmp)
        try:
            results = run(a.size, a.device, steps, more, work)
        except CheckFailed as err:
            print(f"GPUCHECK FAILED {err}", flush=True)
            return 1
    for r in results:
        print("GPUCHECK " + " ".join(f"{k}={v}" for k, v in r.items() if not isinstance(v, dict)), flush=True)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "gpu_check.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
