"""Fitting big models: LoRA adapters, frozen towers, gradient checkpointing, FSDP, cross-process negatives.

* :func:`add_lora`: LoRA (Hu et al. 2021, arXiv:2106.09685) through ``peft``'s ``get_peft_model`` on a
  transformers model: the base weights are frozen, only the adapters (and whatever lies outside that model)
  train;
* :func:`freeze`: ``requires_grad_(False)`` on a tower;
* :func:`enable_gradient_checkpointing`: transformers' non-reentrant checkpointing (recomputes each layer's
  activations in backward);
* :func:`shard_fsdp`: torch FSDP2 ``fully_shard`` on every transformer block (the classes a transformers model
  names in ``_no_split_modules``) and then on the root;
* :func:`gather_rows`: all-gather a batch's rows from every process with the gradient kept on this process's part
  (the remote parts are constants here; each process back-propagates its own rows, and DDP/FSDP averages).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from training.config import LoRAConfig


def add_lora(model: nn.Module, cfg: LoRAConfig) -> nn.Module:
    """Wrap a transformers model with LoRA adapters on the modules whose name ends in one of
    ``cfg.target_modules`` (those present in the model).

    Returns
    -------
    peft.PeftModel
        base weights frozen, adapters trainable.

    Raises
    ------
    ValueError
        no target module present in the model.
    """
    from peft import LoraConfig, get_peft_model

    names = {
        n.rsplit(".", 1)[-1]
        for n, m in model.named_modules()
        if isinstance(m, nn.Linear | nn.Conv1d) or type(m).__name__ == "Conv1D"
    }
    targets = sorted(t for t in cfg.target_modules if t in names)
    if not targets:
        raise ValueError(f"lora.target_modules {cfg.target_modules} match no linear layer of {type(model).__name__}")
    return get_peft_model(
        model, LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=targets, bias="none")
    )


def freeze(module: nn.Module) -> nn.Module:
    """Stop gradients to every parameter of ``module`` (returned for chaining)."""
    module.requires_grad_(False)
    return module


def enable_gradient_checkpointing(model: nn.Module) -> bool:
    """Non-reentrant gradient checkpointing on a transformers model (through a peft wrapper too); False when the
    model does not support it."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not getattr(base, "supports_gradient_checkpointing", False):
        return False
    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if hasattr(base, "enable_input_require_grads"):
        base.enable_input_require_grads()
    return True


def count_parameters(model: nn.Module) -> dict[str, int]:
    """``{"total": n, "trainable": n}`` (elements)."""
    return {
        "total": sum(p.numel() for p in model.parameters()),
        "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
    }


def shard_fsdp(model: nn.Module, device: torch.device) -> nn.Module:
    """FSDP2: ``fully_shard`` every transformer block (classes in a submodule's ``_no_split_modules``), then
    the root, on a 1-D mesh over all processes (``cpu`` mesh on gloo, ``cuda`` on nccl). bf16 autocast is
    applied by the loop around the forward (parameters stay float32 in the optimizer). The root's methods named in
    its ``fsdp_forward_methods`` (entry points other than ``forward``, such as the VLM's evaluation methods) gather
    the root's parameters like ``forward`` does (``register_fsdp_forward_method``).

    Returns
    -------
    torch.nn.Module
        the same module, sharded in place.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    block_names: set[str] = set()
    for m in model.modules():
        block_names |= set(getattr(m, "_no_split_modules", None) or [])
    for m in list(model.modules()):
        if m is not model and type(m).__name__ in block_names:
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for name in getattr(model, "fsdp_forward_methods", ()):
        register_fsdp_forward_method(model, name)
    return model


def gather_rows(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """All-gather ``x (B, ...)`` from every process (equal B everywhere) -> ``(world*B, ...)`` and the offset of
    this process's rows; those rows are ``x`` itself (gradient flows), the others are detached copies. Without
    a process group: ``(x, 0)``."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return x, 0
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.detach().contiguous())
    rank = dist.get_rank()
    parts[rank] = x
    return torch.cat(parts), rank * x.shape[0]
