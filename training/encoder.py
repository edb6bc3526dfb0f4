"""Entity-aware image encoder (MedReCo) with an InfoNCE objective and entity-conditioned Recall@k.

Architecture (after the MedReCo entity-conditioned retrieval design):

1. a 2D backbone (:func:`build_backbone`: transformers ViT or a small ResNet) turns every image, and every
   sampled slice of a volume, into tokens ``(T, D)``;
2. volumes (3D variant by slice aggregation): the tokens of all slices are concatenated and a learned
   slice-position embedding is added, padded slices are masked;
3. entity-conditioned attention pooling: a learnable query embedding per entity attends over the tokens
   (``nn.MultiheadAttention``), giving one embedding per (image, entity);
4. a modality-aware projection head and temperature per modality family (one extra slot for families not
   seen in training), then L2 normalisation.

Loss: InfoNCE (van den Oord, Li & Vinyals 2018, "Representation Learning with Contrastive Predictive
Coding", arXiv:1807.03748), symmetric over the two directions as in CLIP (Radford et al. 2021), with
in-batch negatives; in-batch candidates that are themselves relevant to the anchor (same entity, a
relevant study) are removed from the denominator instead of being pushed away.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from training.config import BackboneConfig, EncoderModelConfig


class _BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.skip = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                     if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.skip(x))


class ResNetTokens(nn.Module):
    """Small ResNet (He et al. 2016, basic blocks, one per stage; stride 2 from the second stage on).

    ``forward``: images ``(N, C, H, W)`` -> tokens ``(N, h*w, widths[-1])``, one per cell of the last
    feature map.
    """

    def __init__(self, cfg: BackboneConfig):
        super().__init__()
        w = cfg.resnet_widths
        self.stem = nn.Sequential(nn.Conv2d(cfg.in_channels, w[0], 3, 2, 1, bias=False), nn.BatchNorm2d(w[0]),
                                  nn.ReLU())
        self.stages = nn.Sequential(*[_BasicBlock(w[max(i - 1, 0)], w[i], 1 if i == 0 else 2) for i in range(len(w))])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stages(self.stem(x)).flatten(2).transpose(1, 2)


class ViTTokens(nn.Module):
    """transformers ``ViTModel`` built from a ``ViTConfig`` (random initialisation, no download).

    ``forward``: images ``(N, C, H, W)`` -> last hidden states ``(N, 1 + (H/p)*(W/p), hidden_size)``.
    """

    def __init__(self, cfg: BackboneConfig):
        super().__init__()
        from transformers import ViTConfig, ViTModel

        vc = ViTConfig(image_size=cfg.image_size, patch_size=cfg.patch_size, num_channels=cfg.in_channels,
                       hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
                       num_attention_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size)
        self.vit = ViTModel(vc, add_pooling_layer=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.vit(pixel_values=x).last_hidden_state


def build_backbone(cfg: BackboneConfig) -> nn.Module:
    """The 2D token backbone of ``cfg.kind`` (``vit`` | ``resnet``)."""
    return ViTTokens(cfg) if cfg.kind == "vit" else ResNetTokens(cfg)


class SliceTokens(nn.Module):
    """Backbone over every slice, tokens concatenated per image (3D variant by slice aggregation).

    ``forward(images (B, S, C, H, W), slice_mask (B, S) bool)`` -> ``tokens (B, S*T, D)`` with a learned
    slice-position embedding added, and ``pad (B, S*T)`` bool, True for tokens of padded slices.
    """

    def __init__(self, cfg: EncoderModelConfig):
        super().__init__()
        self.backbone = build_backbone(cfg.backbone)
        self.slice_pos = nn.Parameter(torch.zeros(cfg.max_slices, cfg.backbone.hidden_size))
        nn.init.normal_(self.slice_pos, std=0.02)

    def forward(self, images: torch.Tensor, slice_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, s = images.shape[:2]
        tok = self.backbone(images.flatten(0, 1))  # (B*S, T, D)
        t, d = tok.shape[1:]
        tok = tok.view(b, s, t, d) + self.slice_pos[:s].to(tok.dtype)[None, :, None, :]
        pad = (~slice_mask)[:, :, None].expand(b, s, t).reshape(b, s * t)
        return tok.reshape(b, s * t, d), pad


class EntityAttentionPool(nn.Module):
    """Entity-conditioned attention pooling: entity query embeddings attend over image tokens.

    ``forward(tokens (B, N, D), pad (B, N), entity (B,) or (B, K) long)`` -> ``(B, D)`` or ``(B, K, D)``.
    """

    def __init__(self, n_entities: int, dim: int, heads: int):
        super().__init__()
        self.queries = nn.Embedding(n_entities, dim)
        nn.init.normal_(self.queries.weight, std=0.02)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm = nn.LayerNorm(dim)

    def forward(self, tokens: torch.Tensor, pad: torch.Tensor, entity: torch.Tensor) -> torch.Tensor:
        single = entity.dim() == 1
        q = self.queries(entity[:, None] if single else entity).to(tokens.dtype)
        out, _ = self.attn(q, tokens, tokens, key_padding_mask=pad, need_weights=False)
        out = self.norm(out + q)
        return out[:, 0] if single else out


class EntityAwareEncoder(nn.Module):
    """The MedReCo entity-aware encoder (see the module docstring).

    Parameters
    ----------
    cfg : EncoderModelConfig
    n_entities : int
        size of the entity vocabulary (entity index = position in the job's sorted entity list).
    n_families : int
        modality families seen in training; index ``n_families`` is the "other" slot.
    """

    def __init__(self, cfg: EncoderModelConfig, n_entities: int, n_families: int):
        super().__init__()
        d, e = cfg.backbone.hidden_size, cfg.embed_dim
        self.cfg = cfg
        self.tokens = SliceTokens(cfg)
        self.pool = EntityAttentionPool(n_entities, d, cfg.pool_heads)
        heads = n_families + 1 if cfg.modality_heads else 1
        self.head_w = nn.Parameter(torch.randn(heads, d, e) / d**0.5)
        self.head_b = nn.Parameter(torch.zeros(heads, e))
        self.log_tau = nn.Parameter(torch.full((n_families + 1,), float(torch.tensor(cfg.temperature).log())))

    def project(self, pooled: torch.Tensor, family: torch.Tensor) -> torch.Tensor:
        """Modality-aware head: ``pooled (B, D)`` or ``(B, K, D)``, ``family (B,)`` -> unit vectors of embed_dim."""
        h = family if self.cfg.modality_heads else torch.zeros_like(family)
        w, b = self.head_w[h].to(pooled.dtype), self.head_b[h].to(pooled.dtype)
        z = torch.einsum("bd,bde->be", pooled, w) + b if pooled.dim() == 2 else \
            torch.einsum("bkd,bde->bke", pooled, w) + b[:, None]
        return F.normalize(z.float(), dim=-1)

    def temperature(self, family: torch.Tensor) -> torch.Tensor:
        """Per-row InfoNCE temperature of each row's modality family, clamped to >= 0.01, shape (B,)."""
        return self.log_tau[family].exp().clamp(min=0.01)

    def forward(self, images: torch.Tensor, slice_mask: torch.Tensor, entity: torch.Tensor,
                family: torch.Tensor) -> torch.Tensor:
        """Embeddings ``(B, embed_dim)`` (``entity (B,)``) or ``(B, K, embed_dim)`` (``entity (B, K)``), float32,
        L2-normalised."""
        tok, pad = self.tokens(images, slice_mask)
        return self.project(self.pool(tok, pad, entity), family)


def info_nce(anchor: torch.Tensor, positive: torch.Tensor, tau_anchor: torch.Tensor, tau_positive: torch.Tensor,
             false_negative: torch.Tensor | None = None) -> torch.Tensor:
    """Symmetric InfoNCE with in-batch negatives (van den Oord et al. 2018; CLIP-style symmetry).

    ``L = 1/2 [CE(a p^T / tau_a, diag) + CE(p a^T / tau_p, diag)]``, where entries flagged in
    ``false_negative`` (relevant pairs off the diagonal) are set to -inf before the softmax.

    Parameters
    ----------
    anchor, positive : torch.Tensor
        (B, E) float, L2-normalised; row i of ``positive`` is relevant to row i of ``anchor``.
    tau_anchor, tau_positive : torch.Tensor
        (B,) temperatures of each row's modality.
    false_negative : torch.Tensor, optional
        (B, B) bool, ``[i, j]`` True when positive j is also relevant to anchor i (diagonal ignored).

    Returns
    -------
    torch.Tensor
        scalar float32 loss (nats).
    """
    sim = anchor.float() @ positive.float().T
    target = torch.arange(sim.shape[0], device=sim.device)
    off = torch.zeros_like(sim, dtype=torch.bool)
    if false_negative is not None:
        off = false_negative & ~torch.eye(sim.shape[0], dtype=torch.bool, device=sim.device)
    a2p = (sim / tau_anchor[:, None]).masked_fill(off, float("-inf"))
    p2a = (sim.T / tau_positive[:, None]).masked_fill(off.T, float("-inf"))
    return 0.5 * (F.cross_entropy(a2p, target) + F.cross_entropy(p2a, target))


def recall_at_k(sim: torch.Tensor, relevant: torch.Tensor, ks: list[int], exclude: torch.Tensor | None = None
                ) -> dict[str, float]:
    """Recall@k of a retrieval: the fraction of queries with at least one relevant item in the top k.

    Parameters
    ----------
    sim : torch.Tensor
        (Q, G) similarity, higher = closer.
    relevant : torch.Tensor
        (Q, G) bool.
    ks : list of int
    exclude : torch.Tensor, optional
        (Q, G) bool, candidates never ranked (the query itself, the query patient's studies).

    Returns
    -------
    dict
        ``{"R@k": float in 0..1}`` per k (k capped at G).
    """
    if exclude is not None:
        sim = sim.masked_fill(exclude, float("-inf"))
    order = sim.argsort(dim=1, descending=True)
    hits = relevant.gather(1, order)
    if exclude is not None:
        hits &= ~exclude.gather(1, order)
    return {f"R@{k}": float(hits[:, : min(k, sim.shape[1])].any(1).float().mean()) if sim.shape[0] else 0.0
            for k in ks}
