"""The shared training loop: devices, DDP under torchrun, bf16 autocast, accumulation, checkpoints, metrics.

A *task* (``training.tasks``) supplies the model, the training dataset, the collate function, the loss of a
batch and the evaluation; this module runs it the same way on a laptop CPU and on GPU nodes:

* distributed: ``torchrun`` sets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``; the process group is initialised
  from them (``nccl`` on CUDA, ``gloo`` on CPU), the model wrapped in ``DistributedDataParallel`` and the
  data sharded by ``DistributedSampler``; gradients are synchronised only on the last micro-batch of an
  accumulation window (``no_sync``);
* precision: ``bf16`` autocast on CUDA by default (``precision: auto``), or forced (``bf16``, CPU too);
* input pipeline: DataLoader workers (persistent) and pinned memory with non-blocking copies on CUDA;
* distributed: ``optim.parallel: fsdp`` shards instead with FSDP2 ``fully_shard`` (:func:`training.scale.shard_fsdp`);
* checkpoints: ``<run_dir>/checkpoints/last.pt`` (model, optimizer, scheduler, step, epoch, task state),
  written atomically by rank 0 every ``checkpoint_every`` steps and at the end; a run started on a
  run folder that has one resumes from it and continues the step count; ``checkpoints/best.pt`` holds the
  evaluation with the best ``best_metric`` (evaluated every ``eval_every`` steps and at the end);
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
BEST_CHECKPOINT = "checkpoints/best.pt"
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


def _is_fsdp(cfg: OptimConfig, rt: Runtime) -> bool:
    return rt.world_size > 1 and cfg.parallel == "fsdp"


def _state_dicts(model: nn.Module, opt, fsdp: bool) -> tuple[dict, dict]:
    """Full (unsharded, CPU) model and optimizer state dicts; collective under FSDP (every rank must call)."""
    if not fsdp:
        return model.state_dict(), opt.state_dict()
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    o = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=o), get_optimizer_state_dict(model, opt, options=o)


def _load_state(model: nn.Module, opt, state: dict, fsdp: bool) -> None:
    if not fsdp:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        return
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    o = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, state["model"], options=o)
    set_optimizer_state_dict(model, opt, state["optimizer"], options=o)


def train(task: TrainTask, cfg: OptimConfig, run_dir: str | Path, runtime: Runtime | None = None) -> dict:
    """Train ``task`` for ``cfg.max_steps`` optimizer steps in total, evaluate, write metrics.

    Several processes (torchrun) train under DDP, or FSDP2 (``optim.parallel: fsdp``: parameters, gradients and
    optimizer state sharded; checkpoints hold full state dicts, gathered collectively). Every ``eval_every`` steps
    (and at the end) the task is evaluated; with ``best_metric`` the checkpoint of the best value so far is kept as
    ``checkpoints/best.pt``.

    Parameters
    ----------
    task : TrainTask
    cfg : OptimConfig
    run_dir : str or Path
        run folder (local path); an existing ``checkpoints/last.pt`` is resumed (same ``parallel`` mode).
    runtime : Runtime, optional
        default :func:`setup_runtime`.

    Returns
    -------
    dict
        the metrics written to ``metrics.json``: ``start_step``, ``step``, ``losses`` (one float per
        optimizer step of this invocation, mean over its micro-batches and processes), ``images_per_s``,
        ``loader_wait_share`` (fraction of the loop's wall time spent waiting for the next batch),
        ``peak_memory_bytes`` (CUDA only, else null), ``parameters`` (total / trainable), ``eval`` (the task's
        final evaluation), ``eval_history`` (``[{step, eval}]``), ``best`` (``{metric, value, step, checkpoint}``
        or null), ``checkpoint``.

    Raises
    ------
    ValueError
        an empty training split, or a checkpoint written under another ``parallel`` mode.
    """
    from training.evaluation import metric_at

    rt = runtime or setup_runtime(cfg)
    run_dir = Path(run_dir)
    torch.manual_seed(cfg.seed + rt.rank)
    fsdp = _is_fsdp(cfg, rt)
    model = task.build_model()
    ckpt_path = run_dir / CHECKPOINT
    state = torch.load(ckpt_path, map_location="cpu", weights_only=False) if ckpt_path.is_file() else None
    if state is not None and state.get("parallel", "ddp") != ("fsdp" if fsdp else "ddp"):
        raise ValueError(f"{ckpt_path} was written under parallel={state.get('parallel', 'ddp')}; resume with it")
    model = model.to(rt.device)
    if fsdp:
        from training.scale import shard_fsdp

        shard_fsdp(model, rt.device)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, cfg.warmup_steps, cfg.max_steps))
    step, epoch, best = 0, 0, None
    if state is not None:
        _load_state(model, opt, state, fsdp)
        sched.load_state_dict(state["scheduler"])
        step, epoch = state["step"], state["epoch"] + 1  # a resumed run starts a fresh epoch
        best = state.get("best")
    start_step = step
    ddp = rt.world_size > 1 and not fsdp
    wrapped = (
        nn.parallel.DistributedDataParallel(model, device_ids=[rt.device.index] if rt.device.type == "cuda" else None)
        if ddp
        else model
    )

    data = task.train_dataset()
    if len(data) == 0:
        raise ValueError("the training split has no examples")
    cuda = rt.device.type == "cuda"
    multi = rt.world_size > 1
    sampler = (
        DistributedSampler(data, num_replicas=rt.world_size, rank=rt.rank, seed=cfg.seed, drop_last=True)
        if multi
        else RandomSampler(data, generator=torch.Generator().manual_seed(cfg.seed))
    )
    loader = DataLoader(
        data,
        batch_size=cfg.batch_size,
        sampler=sampler,
        collate_fn=task.collate,
        num_workers=cfg.num_workers,
        pin_memory=cuda,
        drop_last=len(data) >= cfg.batch_size * 2,
        persistent_workers=cfg.num_workers > 0,
    )

    def evaluate_now() -> dict:
        model.eval()
        ev = task.evaluate(model, rt.device) if (rt.is_main or fsdp) else {}
        model.train()
        return ev if rt.is_main else {}

    def save(path: Path) -> None:
        msd, osd = _state_dicts(model, opt, fsdp)
        if rt.is_main:
            _save_atomic(
                {
                    "model": msd,
                    "optimizer": osd,
                    "scheduler": sched.state_dict(),
                    "step": step,
                    "epoch": epoch,
                    "task": task.state(),
                    "best": best,
                    "parallel": "fsdp" if fsdp else "ddp",
                },
                path,
            )

    def after_eval(ev: dict) -> None:
        nonlocal best
        history.append({"step": step, "eval": ev})
        value = metric_at(ev, cfg.best_metric) if cfg.best_metric and rt.is_main else None
        improved = value is not None and (best is None or value > best["value"])
        if improved:
            best = {
                "metric": cfg.best_metric,
                "value": value,
                "step": step,
                "checkpoint": str(run_dir / BEST_CHECKPOINT),
            }
        if multi:
            flag = [improved, best]
            dist.broadcast_object_list(flag, src=0)
            improved, best = flag
        if improved:
            save(run_dir / BEST_CHECKPOINT)

    losses: list[float] = []
    history: list[dict] = []
    n_images, wait, t0 = 0, 0.0, time.perf_counter()
    if cuda:
        torch.cuda.reset_peak_memory_stats(rt.device)
    model.train()
    while step < cfg.max_steps:
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        if hasattr(data, "set_epoch"):
            data.set_epoch(epoch)
        if not multi:  # a fresh, epoch-dependent order (same on resume)
            sampler.generator = torch.Generator().manual_seed(cfg.seed * 100003 + epoch)
        micro: list[float] = []
        it = iter(loader)
        i = -1
        while True:
            t_wait = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            wait += time.perf_counter() - t_wait
            i += 1
            batch = to_device(batch, rt.device)
            last_micro = (i + 1) % cfg.grad_accum_steps == 0
            if fsdp:
                model.set_requires_gradient_sync(last_micro)
            sync = wrapped.no_sync() if (ddp and not last_micro) else contextlib.nullcontext()
            with sync:
                with rt.autocast():
                    loss, n = task.compute_loss(wrapped, batch)
                (loss / cfg.grad_accum_steps).backward()
            micro.append(float(loss.detach()))
            n_images += n
            if not last_micro:
                continue
            nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            mean = torch.tensor(sum(micro) / len(micro), device=rt.device)
            if multi:
                dist.all_reduce(mean)
                mean /= rt.world_size
            losses.append(float(mean))
            micro = []
            if step % cfg.checkpoint_every == 0 or step == cfg.max_steps:
                save(ckpt_path)
                if rt.is_main:
                    task.save_artifacts(run_dir)
            if cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.max_steps:
                after_eval(evaluate_now())
            if step >= cfg.max_steps:
                break
        epoch += 1
    elapsed = time.perf_counter() - t0
    evaluation = evaluate_now()
    after_eval(evaluation)
    if best is not None and best["step"] == step:
        save(ckpt_path)  # last.pt records the final best too
    metrics = {
        "start_step": start_step,
        "step": step,
        "losses": losses,
        "images_per_s": n_images * rt.world_size / elapsed if elapsed > 0 and n_images else None,
        "loader_wait_share": wait / elapsed if elapsed > 0 else None,
        "peak_memory_bytes": torch.cuda.max_memory_allocated(rt.device) if cuda else None,
        "device": str(rt.device),
        "world_size": rt.world_size,
        "parallel": ("fsdp" if fsdp else "ddp") if multi else None,
        "autocast": str(rt.autocast_dtype) if rt.autocast_dtype else None,
        "parameters": count_parameters(model),
        "eval": evaluation,
        "eval_history": history,
        "best": best,
        "checkpoint": str(ckpt_path),
    }
    if rt.is_main:
        task.save_artifacts(run_dir)
        write_json_atomic(run_dir / METRICS, metrics)
    if multi:
        dist.barrier()
    return metrics


def count_parameters(model: nn.Module) -> dict[str, int]:
    """``{"total": n, "trainable": n}`` elements (sharded parameters counted in full)."""
    from training.scale import count_parameters as count

    return count(model)


def load_checkpoint(path: str | Path) -> dict:
    """A checkpoint written by :func:`train` (CPU tensors): model, optimizer, scheduler, step, epoch, task."""
    return torch.load(path, map_location="cpu", weights_only=False)
