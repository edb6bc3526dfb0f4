"""The shared training loop: devices, DDP under torchrun, bf16 autocast, accumulation, checkpoints, metrics.

A *task* (``training.tasks``) supplies the model, the training dataset, the collate function, the loss of a
batch and the evaluation; this module runs it the same way on a laptop CPU and on GPU nodes:

* distributed: ``torchrun`` sets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``; the process group is initialised
  from them (``nccl`` on CUDA, ``gloo`` on CPU), the model wrapped in ``DistributedDataParallel`` and the
  data sharded by ``DistributedSampler``; gradients are synchronised only on the last micro-batch of an
  accumulation window (``no_sync``);
* precision: ``bf16`` autocast on CUDA by default (``precision: auto``), or forced (``bf16``, CPU too);
* input pipeline: DataLoader workers (persistent) and pinned memory with non-blocking copies on CUDA;
* checkpoints: ``<run_dir>/checkpoints/last.pt`` (model, optimizer, scheduler, step, epoch, task state),
  written atomically by rank 0 every ``checkpoint_every`` steps and at the end; a run started on a
  run folder that has one resumes from it and continues the step count;
* metrics: ``<run_dir>/metrics.json`` (losses per step, throughput, peak memory, evaluation).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, RandomSampler

from training.config import OptimConfig

CHECKPOINT = "checkpoints/last.pt"
METRICS = "metrics.json"


class TrainTask(Protocol):
    """What the loop needs from a job (see ``training.tasks``)."""

    def build_model(self) -> nn.Module: ...
    def train_dataset(self) -> Dataset: ...
    def collate(self, items: list[dict]) -> dict: ...
    def compute_loss(self, model: nn.Module, batch: dict) -> tuple[torch.Tensor, int]: ...
    def evaluate(self, model: nn.Module, device: torch.device) -> dict: ...
    def state(self) -> dict: ...
    def save_artifacts(self, run_dir: Path) -> None: ...


@dataclass
class Runtime:
    """Where this process runs: device, distributed rank/world size, autocast settings."""

    device: torch.device
    rank: int
    world_size: int
    local_rank: int
    autocast_dtype: torch.dtype | None

    @property
    def is_main(self) -> bool:
        """Rank 0 writes checkpoints and metrics."""
        return self.rank == 0

    def autocast(self):
        """bf16 autocast context (a no-op context when disabled)."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)


def setup_runtime(cfg: OptimConfig) -> Runtime:
    """Pick the device and precision, and join the process group when launched by torchrun.

    ``WORLD_SIZE`` > 1 in the environment initialises ``torch.distributed`` from the env:// variables
    (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``) with ``nccl`` on CUDA, ``gloo`` on CPU.

    Raises
    ------
    RuntimeError
        ``device: cuda`` without CUDA.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    want = cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if want == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("optim.device is cuda but CUDA is not available")
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", init_method="env://")
    bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and device.type == "cuda")
    return Runtime(device, rank, world, local_rank, torch.bfloat16 if bf16 else None)


def to_device(batch: Any, device: torch.device) -> Any:
    """Move every tensor of a (nested) batch to ``device`` (non-blocking: pinned host memory on CUDA)."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def lr_factor(step: int, warmup: int, total: int) -> float:
    """Linear warm-up then cosine decay to 0 (Loshchilov & Hutter 2017, SGDR without restarts)."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def _save_atomic(obj: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def write_json_atomic(path: Path, data: dict) -> None:
    """Write JSON through a temporary file and ``os.replace`` (readers never see half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)


def train(task: TrainTask, cfg: OptimConfig, run_dir: str | Path, runtime: Runtime | None = None) -> dict:
    """Train ``task`` for ``cfg.max_steps`` optimizer steps in total, evaluate, write metrics.

    Parameters
    ----------
    task : TrainTask
    cfg : OptimConfig
    run_dir : str or Path
        run folder (local path); an existing ``checkpoints/last.pt`` is resumed.
    runtime : Runtime, optional
        default :func:`setup_runtime`.

    Returns
    -------
    dict
        the metrics written to ``metrics.json``: ``start_step``, ``step``, ``losses`` (one float per
        optimizer step of this invocation, mean over its micro-batches and processes), ``images_per_s``,
        ``peak_memory_bytes`` (CUDA only, else null), ``eval`` (the task's evaluation), ``checkpoint``.
    """
    rt = runtime or setup_runtime(cfg)
    run_dir = Path(run_dir)
    torch.manual_seed(cfg.seed + rt.rank)
    model = task.build_model().to(rt.device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, cfg.warmup_steps, cfg.max_steps))
    step, epoch = 0, 0
    ckpt_path = run_dir / CHECKPOINT
    if ckpt_path.is_file():
        state = torch.load(ckpt_path, map_location=rt.device, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        step, epoch = state["step"], state["epoch"] + 1  # a resumed run starts a fresh epoch
    start_step = step
    ddp = rt.world_size > 1
    wrapped = nn.parallel.DistributedDataParallel(
        model, device_ids=[rt.device.index] if rt.device.type == "cuda" else None) if ddp else model

    data = task.train_dataset()
    if len(data) == 0:
        raise ValueError("the training split has no examples")
    cuda = rt.device.type == "cuda"
    sampler = (DistributedSampler(data, num_replicas=rt.world_size, rank=rt.rank, seed=cfg.seed, drop_last=True)
               if ddp else RandomSampler(data, generator=torch.Generator().manual_seed(cfg.seed)))
    loader = DataLoader(data, batch_size=cfg.batch_size, sampler=sampler, collate_fn=task.collate,
                        num_workers=cfg.num_workers, pin_memory=cuda, drop_last=len(data) >= cfg.batch_size * 2,
                        persistent_workers=cfg.num_workers > 0)

    losses: list[float] = []
    n_images, t0 = 0, time.perf_counter()
    if cuda:
        torch.cuda.reset_peak_memory_stats(rt.device)
    model.train()
    while step < cfg.max_steps:
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        if hasattr(data, "set_epoch"):
            data.set_epoch(epoch)
        if not ddp:  # a fresh, epoch-dependent order (same on resume)
            sampler.generator = torch.Generator().manual_seed(cfg.seed * 100003 + epoch)
        micro: list[float] = []
        for i, batch in enumerate(loader):
            batch = to_device(batch, rt.device)
            last_micro = (i + 1) % cfg.grad_accum_steps == 0
            sync = contextlib.nullcontext() if (not ddp or last_micro) else wrapped.no_sync()
            with sync:
                with rt.autocast():
                    loss, n = task.compute_loss(wrapped, batch)
                (loss / cfg.grad_accum_steps).backward()
            micro.append(float(loss.detach()))
            n_images += n
            if not last_micro:
                continue
            nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            mean = torch.tensor(sum(micro) / len(micro), device=rt.device)
            if ddp:
                dist.all_reduce(mean)
                mean /= rt.world_size
            losses.append(float(mean))
            micro = []
            if rt.is_main and (step % cfg.checkpoint_every == 0 or step == cfg.max_steps):
                _checkpoint(model, opt, sched, step, epoch, task, ckpt_path)
                task.save_artifacts(run_dir)
            if step >= cfg.max_steps:
                break
        epoch += 1
    elapsed = time.perf_counter() - t0
    model.eval()
    evaluation = task.evaluate(model, rt.device) if rt.is_main else {}
    metrics = {
        "start_step": start_step,
        "step": step,
        "losses": losses,
        "images_per_s": n_images * rt.world_size / elapsed if elapsed > 0 and n_images else None,
        "peak_memory_bytes": torch.cuda.max_memory_allocated(rt.device) if cuda else None,
        "device": str(rt.device),
        "world_size": rt.world_size,
        "autocast": str(rt.autocast_dtype) if rt.autocast_dtype else None,
        "eval": evaluation,
        "checkpoint": str(ckpt_path),
    }
    if rt.is_main:
        task.save_artifacts(run_dir)
        write_json_atomic(run_dir / METRICS, metrics)
    if ddp:
        dist.barrier()
    return metrics


def _checkpoint(model, opt, sched, step, epoch, task, path: Path) -> None:
    _save_atomic({"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                  "step": step, "epoch": epoch, "task": task.state()}, path)


def load_checkpoint(path: str | Path) -> dict:
    """A checkpoint written by :func:`train` (CPU tensors): model, optimizer, scheduler, step, epoch, task."""
    return torch.load(path, map_location="cpu", weights_only=False)
