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
        self.skip = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

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
        self.stem = nn.Sequential(
            nn.Conv2d(cfg.in_channels, w[0], 3, 2, 1, bias=False), nn.BatchNorm2d(w[0]), nn.ReLU()
        )
        self.stages = nn.Sequential(*[_BasicBlock(w[max(i - 1, 0)], w[i], 1 if i == 0 else 2) for i in range(len(w))])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stages(self.stem(x)).flatten(2).transpose(1, 2)


class ViTTokens(nn.Module):
    """transformers ``ViTModel`` built from a ``ViTConfig`` (random initialisation, no download).

    ``forward``: images ``(N, C, H, W)`` -> last hidden states ``(N, 1 + (H/p)*(W/p), hidden_size)``. With
    ``patch_depth`` t > 1 the patch embedding is 3D: inputs are tubelets of t slices stacked on the channel axis
    ``(N, t*C, H, W)``, and the patch convolution over ``t*C`` channels is a Conv3d with kernel and stride
    ``(t, p, p)`` over the tubelet (the tubelet embedding of ViViT, Arnab et al. 2021).
    """

    def __init__(self, cfg: BackboneConfig, patch_depth: int = 1):
        super().__init__()
        from transformers import ViTConfig, ViTModel

        vc = ViTConfig(
            image_size=cfg.image_size,
            patch_size=cfg.patch_size,
            num_channels=cfg.in_channels * patch_depth,
            hidden_size=cfg.hidden_size,
            num_hidden_layers=cfg.num_layers,
            num_attention_heads=cfg.num_heads,
            intermediate_size=cfg.intermediate_size,
        )
        self.vit = ViTModel(vc, add_pooling_layer=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.vit(pixel_values=x).last_hidden_state


def build_backbone(cfg: BackboneConfig, patch_depth: int = 1) -> nn.Module:
    """The 2D token backbone of ``cfg.kind``: ``vit`` | ``resnet`` (random initialisation) or ``pretrained`` (a local
    transformers vision checkpoint, :class:`training.pretrained.PretrainedVisionTokens`). The module's
    ``hidden_size`` attribute is its token width. ``patch_depth`` > 1 (``vit`` only): a 3D patch embedding over
    tubelets of that many slices (:class:`ViTTokens`).

    Raises
    ------
    ValueError
        ``patch_depth`` > 1 with a backbone other than ``vit``.
    """
    if patch_depth > 1 and cfg.kind != "vit":
        raise ValueError(f"patch_depth {patch_depth} needs backbone.kind vit, not {cfg.kind}")
    if cfg.kind == "pretrained":
        from training.pretrained import PretrainedVisionTokens

        return PretrainedVisionTokens(cfg.path)
    m = ViTTokens(cfg, patch_depth) if cfg.kind == "vit" else ResNetTokens(cfg)
    m.hidden_size = cfg.hidden_size
    return m


def hf_model(backbone: nn.Module) -> nn.Module | None:
    """The transformers model inside a backbone (None for the ResNet)."""
    return getattr(backbone, "vit", None) or getattr(backbone, "model", None)


def tubelets(images: torch.Tensor, slice_mask: torch.Tensor, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Group each image's real slices into tubelets of ``depth`` consecutive slices, stacked on the channel axis.

    Parameters
    ----------
    images : torch.Tensor
        ``(B, S, C, H, W)``; the real slices of a row come first (``slice_mask`` is a prefix).
    slice_mask : torch.Tensor
        ``(B, S)`` bool.
    depth : int
        slices per tubelet.

    Returns
    -------
    tuple
        ``units (B, U, depth*C, H, W)`` with ``U = ceil(S / depth)`` (channel ``k*C + c`` is slice ``k`` of the
        tubelet) and ``unit_mask (B, U)`` bool. A row with n real slices has ``ceil(n / depth)`` real tubelets; the
        last one repeats the row's last real slice, so a 2D image (n = 1) is one tubelet of ``depth`` copies of
        itself (how I3D, Carreira & Zisserman 2017, feeds a still image to 3D filters).
    """
    b, s, c, h, w = images.shape
    u = -(-s // depth)
    n = slice_mask.sum(1)
    last = (n - 1).clamp(min=0)
    idx = torch.arange(u * depth, device=images.device).view(u, depth)
    idx = torch.minimum(idx[None], last[:, None, None])  # (B, U, depth)
    rows = torch.arange(b, device=images.device)[:, None, None]
    units = images[rows, idx].reshape(b, u, depth * c, h, w)
    unit_mask = torch.arange(u, device=images.device)[None] < (-(-n // depth))[:, None]
    return units, unit_mask


class SliceTokens(nn.Module):
    """Backbone over every real slice, tokens concatenated per image (3D variant by slice aggregation).

    ``forward(images (B, S, C, H, W), slice_mask (B, S) bool)`` -> ``tokens (B, S*T, D)`` with a learned
    slice-position embedding added, and ``pad (B, S*T)`` bool, True for tokens of absent slices. Only the slices
    the mask marks real go through the backbone (absent ones are zero tokens, masked in every attention).

    With ``patch_depth`` t > 1 (``EncoderModelConfig.patch_depth``, ViT only) the units are tubelets of t slices
    (:func:`tubelets`) through a 3D patch embedding instead of single slices: ``tokens (B, U*T, D)``, ``U =
    ceil(S / t)``, the position embedding per tubelet; a volume costs t times fewer backbone passes.
    """

    def __init__(self, cfg: EncoderModelConfig):
        super().__init__()
        self.patch_depth = cfg.patch_depth
        self.backbone = build_backbone(cfg.backbone, cfg.patch_depth)
        self.hidden_size = int(self.backbone.hidden_size)
        self.slice_pos = nn.Parameter(torch.zeros(cfg.max_slices, self.hidden_size))
        nn.init.normal_(self.slice_pos, std=0.02)

    def forward(self, images: torch.Tensor, slice_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.patch_depth > 1:
            images, slice_mask = tubelets(images, slice_mask, self.patch_depth)
        b, s = images.shape[:2]
        flat = slice_mask.reshape(-1)
        real = self.backbone(images.flatten(0, 1)[flat])  # (n_real, T, D)
        t, d = real.shape[1:]
        tok = real.new_zeros((b * s, t, d)).index_put((flat.nonzero()[:, 0],), real)
        tok = tok.view(b, s, t, d) + self.slice_pos[:s].to(tok.dtype)[None, :, None, :]
        pad = (~slice_mask)[:, :, None].expand(b, s, t).reshape(b, s * t)
        return tok.reshape(b, s * t, d), pad


class EntityAttentionPool(nn.Module):
    """Entity-conditioned attention pooling: entity query embeddings attend over image tokens.

    ``forward(tokens (B, N, D), pad (B, N), entity (B,) or (B, K) long)`` -> ``(B, D)`` or ``(B, K, D)``.
    """

    def __init__(self, n_entities: int, dim: int, heads: int, init: torch.Tensor | None = None):
        super().__init__()
        self.queries = nn.Embedding(n_entities, dim)
        nn.init.normal_(self.queries.weight, std=0.02)
        if init is not None:
            with torch.no_grad():
                self.queries.weight.copy_(init)
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
    entity_init : torch.Tensor, optional
        ``(n_entities, D)`` initial entity queries (:func:`training.pretrained.project_to` of text embeddings).
    with_heads : bool
        False: no projection heads and temperatures (the VLM's vision tower, which uses tokens and pooling only;
        parameters that never get a gradient would break DDP).
    """

    def __init__(
        self,
        cfg: EncoderModelConfig,
        n_entities: int,
        n_families: int,
        entity_init: torch.Tensor | None = None,
        with_heads: bool = True,
    ):
        super().__init__()
        self.cfg = cfg
        self.tokens = SliceTokens(cfg)
        d, e = self.tokens.hidden_size, cfg.embed_dim
        if d % cfg.pool_heads:
            raise ValueError(f"pool_heads {cfg.pool_heads} must divide the backbone width {d}")
        self.pool = EntityAttentionPool(n_entities, d, cfg.pool_heads, entity_init)
        if not with_heads:
            return
        heads = n_families + 1 if cfg.modality_heads else 1
        self.head_w = nn.Parameter(torch.randn(heads, d, e) / d**0.5)
        self.head_b = nn.Parameter(torch.zeros(heads, e))
        self.log_tau = nn.Parameter(torch.full((n_families + 1,), float(torch.tensor(cfg.temperature).log())))

    def project(self, pooled: torch.Tensor, family: torch.Tensor) -> torch.Tensor:
        """Modality-aware head: ``pooled (B, D)`` or ``(B, K, D)``, ``family (B,)`` -> unit vectors of embed_dim."""
        h = family if self.cfg.modality_heads else torch.zeros_like(family)
        w, b = self.head_w[h].to(pooled.dtype), self.head_b[h].to(pooled.dtype)
        z = (
            torch.einsum("bd,bde->be", pooled, w) + b
            if pooled.dim() == 2
            else torch.einsum("bkd,bde->bke", pooled, w) + b[:, None]
        )
        return F.normalize(z.float(), dim=-1)

    def temperature(self, family: torch.Tensor) -> torch.Tensor:
        """Per-row InfoNCE temperature of each row's modality family, clamped to >= 0.01, shape (B,)."""
        return self.log_tau[family].exp().clamp(min=0.01)

    def forward(
        self, images: torch.Tensor, slice_mask: torch.Tensor, entity: torch.Tensor, family: torch.Tensor
    ) -> torch.Tensor:
        """Embeddings ``(B, embed_dim)`` (``entity (B,)``) or ``(B, K, embed_dim)`` (``entity (B, K)``), float32,
        L2-normalised."""
        tok, pad = self.tokens(images, slice_mask)
        return self.project(self.pool(tok, pad, entity), family)


def info_nce(
    anchor: torch.Tensor,
    positive: torch.Tensor,
    tau_anchor: torch.Tensor,
    tau_positive: torch.Tensor,
    false_negative: torch.Tensor | None = None,
) -> torch.Tensor:
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


def recall_at_k(
    sim: torch.Tensor, relevant: torch.Tensor, ks: list[int], exclude: torch.Tensor | None = None
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
    return {f"R@{k}": float(hits[:, : min(k, sim.shape[1])].any(1).float().mean()) if sim.shape[0] else 0.0 for k in ks}


def graded_contrastive(
    anchor: torch.Tensor,
    positive: torch.Tensor,
    all_anchor: torch.Tensor,
    all_positive: torch.Tensor,
    tau_anchor: torch.Tensor,
    tau_positive: torch.Tensor,
    rel_a2p: torch.Tensor,
    rel_p2a: torch.Tensor,
    ignore_a2p: torch.Tensor | None = None,
    ignore_p2a: torch.Tensor | None = None,
) -> torch.Tensor:
    """Multi-positive contrastive loss with graded targets (symmetric).

    Each local row is scored against every column of the (all-gathered) batch; its target distribution puts
    mass on every relevant column in proportion to the relevance (``q_ij = r_ij / sum_j r_ij``), and the loss is
    the cross-entropy ``-sum_j q_ij log softmax_j(s_ij / tau_i)`` (the soft-target form of InfoNCE, van den Oord et
    al. 2018, with several positives as in SupCon, Khosla et al. 2020, weighted by MedReCo's graded relevance).
    With one positive of relevance 1 per row (the diagonal) it equals :func:`info_nce`. Ignored columns
    (the query patient's own studies) are neither positives nor negatives (-inf before the softmax).

    Parameters
    ----------
    anchor, positive : torch.Tensor
        (B, E) float, L2-normalised: this process's rows.
    all_anchor, all_positive : torch.Tensor
        (M, E): the columns, every process's rows (M = world x B; this process's rows carry the gradient).
    tau_anchor, tau_positive : torch.Tensor
        (B,) temperatures of the local rows.
    rel_a2p, rel_p2a : torch.Tensor
        (B, M) float >= 0: relevance of positive column j to local anchor i, and of anchor column j to local
        positive i; every row needs one entry > 0 (its own pair).
    ignore_a2p, ignore_p2a : torch.Tensor, optional
        (B, M) bool, columns left out of the row's softmax (never set on an entry with relevance > 0).

    Returns
    -------
    torch.Tensor
        scalar float32 (nats).

    Raises
    ------
    ValueError
        a row without any relevant column.
    """

    def one(rows, cols, tau, rel, ignore):
        logits = (rows.float() @ cols.float().T) / tau[:, None]
        if ignore is not None:
            logits = logits.masked_fill(ignore & (rel <= 0), float("-inf"))
        total = rel.sum(1, keepdim=True)
        if bool((total <= 0).any()):
            raise ValueError("graded_contrastive: a row has no relevant column")
        logp = torch.log_softmax(logits, dim=1)
        q = rel / total
        return -(q * logp.masked_fill(q == 0, 0.0)).sum(1).mean()

    return 0.5 * (
        one(anchor, all_positive, tau_anchor, rel_a2p, ignore_a2p)
        + one(positive, all_anchor, tau_positive, rel_p2a, ignore_p2a)
    )


def ndcg_at_k(sim: torch.Tensor, gain: torch.Tensor, k: int, exclude: torch.Tensor | None = None) -> torch.Tensor:
    """NDCG@k per query with graded gains (Jarvelin & Kekalainen 2002; linear gain, ``log2(rank + 1)`` discount).

    Parameters
    ----------
    sim : torch.Tensor
        (Q, G) similarity, higher = closer.
    gain : torch.Tensor
        (Q, G) float relevance >= 0 (0: not relevant).
    k : int
    exclude : torch.Tensor, optional
        (Q, G) bool, candidates never ranked (their gain counts neither in DCG nor in the ideal DCG).

    Returns
    -------
    torch.Tensor
        (Q,) float in 0..1; NaN for a query without any relevant candidate.
    """
    gain = gain.float()
    if exclude is not None:
        sim, gain = sim.masked_fill(exclude, float("-inf")), gain.masked_fill(exclude, 0.0)
    k = min(k, sim.shape[1])
    disc = 1.0 / torch.log2(torch.arange(2, k + 2, dtype=torch.float32))
    top = sim.topk(k, dim=1).indices
    dcg = (gain.gather(1, top) * disc).sum(1)
    ideal = (gain.sort(dim=1, descending=True).values[:, :k] * disc).sum(1)
    return torch.where(ideal > 0, dcg / ideal.clamp(min=1e-12), torch.full_like(dcg, float("nan")))
