"""Comparative vision-language model (MedReCo-VLM): two images, an entity and a question -> an answer.

Model: the entity-aware vision encoder (``training.encoder``) turns each image into tokens; a resampler
(learned latent queries attending over the image tokens, as in Flamingo's Perceiver resampler, Alayrac et
al. 2022) plus the entity-conditioned pooled token give ``visual_tokens + 1`` vectors per image; a two-layer
MLP projector (LLaVA-1.5, Liu et al. 2023) maps them to the language model's width; a learned role
embedding marks prior and current image; a single-study item gets a learned "no prior" block instead of a
prior image. The sequence is ``[prior block][current block][prompt tokens][answer tokens][EOS]`` and only the
answer tokens and EOS are supervised (labels -100 elsewhere).

The causal LM comes from transformers: GPT-2 or Llama built from a config, or a ``save_pretrained`` folder
loaded with ``local_files_only=True`` together with that folder's own tokenizer (its embeddings are never remapped
to another vocabulary). A config-built LM uses a word-level ``tokenizers`` model trained offline on the snapshot's
VQA texts. The tokenizer is saved beside the checkpoint. A Qwen2-VL / Qwen2.5-VL folder is trained as is
(:mod:`training.qwen_vl`).

Evaluation: multiple-choice accuracy (the option letter with the highest next-token logit after the prompt
with options) and, for open answers (prompt without options, greedy decoding), exact match and corpus BLEU
(Papineni et al. 2002) against ``answer_text``, per split and question type.
"""

from __future__ import annotations

import inspect
import math
from collections import Counter
from pathlib import Path

import torch
from torch import nn

from training.config import LanguageModelConfig, TokenizerConfig, VLMModelConfig
from training.encoder import EntityAwareEncoder

SPECIAL = {"pad_token": "[PAD]", "unk_token": "[UNK]", "bos_token": "[BOS]", "eos_token": "[EOS]"}
LETTERS = "ABCDEF"


# ---- tokenizer ------------------------------------------------------------------------------------------


def build_word_tokenizer(texts: list[str], cfg: TokenizerConfig):
    """Train a word-level tokenizer (``tokenizers`` WordLevel, whitespace/punctuation split) on ``texts``.

    Returns
    -------
    transformers.PreTrainedTokenizerFast
        with ``[PAD]``, ``[UNK]``, ``[BOS]``, ``[EOS]`` (ids 0-3); lower-cased when ``cfg.lowercase``.
    """
    from tokenizers import Tokenizer, normalizers, pre_tokenizers
    from tokenizers.models import WordLevel
    from tokenizers.trainers import WordLevelTrainer
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(WordLevel(unk_token=SPECIAL["unk_token"]))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC()] + ([normalizers.Lowercase()] if cfg.lowercase else []))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = WordLevelTrainer(
        special_tokens=[SPECIAL[k] for k in ("pad_token", "unk_token", "bos_token", "eos_token")],
        min_frequency=cfg.min_frequency,
    )
    tok.train_from_iterator(sorted(texts), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, **SPECIAL)


def load_tokenizer(path: str | Path):
    """A tokenizer saved with ``save_pretrained`` (no download: ``local_files_only=True``)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def words(tokenizer, text: str) -> list[str]:
    """The tokenizer's normalised word sequence of ``text`` (the unit of exact match and BLEU)."""
    return tokenizer.tokenize(text)


# ---- language model ---------------------------------------------------------------------------------------


def build_language_model(cfg: LanguageModelConfig, tokenizer) -> nn.Module:
    """A causal LM: GPT-2 / Llama from a config sized to the tokenizer, or a local pretrained folder.

    Raises
    ------
    OSError
        ``kind: local`` with a folder that holds no model (nothing is downloaded).
    """
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

    ids = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if cfg.kind == "local":
        from training.pretrained import load_language_model

        return load_language_model(cfg.path, tokenizer)
    if cfg.kind == "gpt2":
        conf = GPT2Config(
            vocab_size=len(tokenizer),
            n_positions=cfg.max_positions,
            n_embd=cfg.hidden_size,
            n_layer=cfg.num_layers,
            n_head=cfg.num_heads,
            n_inner=cfg.intermediate_size,
            **ids,
        )
    else:
        conf = LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=cfg.hidden_size,
            num_hidden_layers=cfg.num_layers,
            num_attention_heads=cfg.num_heads,
            num_key_value_heads=cfg.num_heads,
            intermediate_size=cfg.intermediate_size,
            max_position_embeddings=cfg.max_positions,
            **ids,
        )
    return AutoModelForCausalLM.from_config(conf)


# ---- model ------------------------------------------------------------------------------------------------


class ComparativeVLM(nn.Module):
    """Vision encoder + resampler + projector + causal LM (see the module docstring).

    Parameters
    ----------
    cfg : VLMModelConfig
    lm : transformers causal LM
    n_entities, n_families : int
        vocabulary sizes of the vision encoder's entity queries and modality heads.
    """

    #: entry points besides ``forward`` (evaluation): under FSDP2 they gather the root's parameters too
    fsdp_forward_methods = ("next_token_logits", "generate_greedy")

    def __init__(self, cfg: VLMModelConfig, lm: nn.Module, n_entities: int, n_families: int):
        super().__init__()
        h = lm.get_input_embeddings().embedding_dim
        self.cfg, self.lm = cfg, lm
        # tokens and entity pooling only: heads/temperatures would get no gradient (DDP refuses those)
        self.vision = EntityAwareEncoder(cfg.vision, n_entities, n_families, with_heads=False)
        d = self.vision.tokens.hidden_size
        self.latents = nn.Parameter(torch.randn(cfg.visual_tokens, d) * 0.02)
        self.resampler = nn.MultiheadAttention(d, cfg.vision.pool_heads, batch_first=True)
        self.projector = nn.Sequential(nn.Linear(d, h), nn.GELU(), nn.Linear(h, h))
        self.role = nn.Parameter(torch.zeros(2, h))
        self.no_prior = nn.Parameter(torch.randn(cfg.visual_tokens + 1, h) * 0.02)

    @property
    def block(self) -> int:
        """Vectors per image in the LM sequence."""
        return self.cfg.visual_tokens + 1

    def image_block(self, images: torch.Tensor, slice_mask: torch.Tensor, entity: torch.Tensor) -> torch.Tensor:
        """``(B, S, C, H, W)`` images -> ``(B, visual_tokens + 1, lm width)``."""
        tok, pad = self.vision.tokens(images, slice_mask)
        lat = self.latents.to(tok.dtype)[None].expand(tok.shape[0], -1, -1)
        res, _ = self.resampler(lat, tok, tok, key_padding_mask=pad, need_weights=False)
        ent = self.vision.pool(tok, pad, entity)[:, None]
        return self.projector(torch.cat([ent, res], 1))

    def embed(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Input embeddings, attention mask and position ids of a collated batch.

        Prior and current images go through the encoder in one pass; rows without a prior
        (``has_prior`` False) get the "no prior" block. Position ids count only attended positions, so
        the left padding of the text is invisible.
        """
        b = batch["input_ids"].shape[0]
        images = torch.cat([batch["prior"], batch["current"]])
        masks = torch.cat([batch["prior_mask"], batch["current_mask"]])
        blocks = self.image_block(images, masks, batch["entity"].repeat(2))
        prior, current = blocks[:b], blocks[b:]
        prior = torch.where(batch["has_prior"][:, None, None], prior, self.no_prior.to(prior.dtype)[None])
        text = self.lm.get_input_embeddings()(batch["input_ids"])
        embeds = torch.cat(
            [prior + self.role[0].to(prior.dtype), current + self.role[1].to(prior.dtype), text.to(prior.dtype)], 1
        )
        vis = torch.ones((b, 2 * self.block), dtype=batch["attention_mask"].dtype, device=embeds.device)
        mask = torch.cat([vis, batch["attention_mask"]], 1)
        pos = (mask.long().cumsum(1) - 1).clamp(min=0)
        return embeds, mask, pos

    def forward(self, batch: dict) -> torch.Tensor:
        """The LM loss (mean cross-entropy over supervised answer tokens, nats)."""
        embeds, mask, pos = self.embed(batch)
        ignore = torch.full((embeds.shape[0], 2 * self.block), -100, dtype=torch.long, device=embeds.device)
        labels = torch.cat([ignore, batch["labels"]], 1)
        return self.lm(inputs_embeds=embeds, attention_mask=mask, position_ids=pos, labels=labels).loss

    @torch.no_grad()
    def next_token_logits(self, batch: dict) -> torch.Tensor:
        """Logits ``(B, vocab)`` of the token after the (left-padded) prompt."""
        embeds, mask, pos = self.embed(batch)
        out = self.lm(inputs_embeds=embeds, attention_mask=mask, position_ids=pos, logits_to_keep=1)
        return out.logits[:, -1].float()

    @torch.no_grad()
    def generate_greedy(self, batch: dict, max_new_tokens: int, eos_id: int) -> list[list[int]]:
        """Greedy decoding with the KV cache; per row the ids generated before EOS."""
        embeds, mask, pos = self.embed(batch)
        out = self.lm(inputs_embeds=embeds, attention_mask=mask, position_ids=pos, use_cache=True)
        # transformers >= 5.2x names the KV cache ``cache``, earlier releases ``past_key_values``
        base = self.lm.get_base_model() if hasattr(self.lm, "get_base_model") else self.lm
        key = "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"
        past, b = getattr(out, key), embeds.shape[0]
        done = torch.zeros(b, dtype=torch.bool, device=embeds.device)
        result: list[list[int]] = [[] for _ in range(b)]
        nxt = out.logits[:, -1].argmax(-1)
        emb = self.lm.get_input_embeddings()
        for _ in range(max_new_tokens):
            for i in range(b):
                if not done[i] and int(nxt[i]) != eos_id:
                    result[i].append(int(nxt[i]))
            done |= nxt == eos_id
            if bool(done.all()):
                break
            mask = torch.cat([mask, torch.ones((b, 1), dtype=mask.dtype, device=mask.device)], 1)
            pos = pos[:, -1:] + 1
            out = self.lm(
                inputs_embeds=emb(nxt[:, None]).to(embeds.dtype),
                attention_mask=mask,
                position_ids=pos,
                use_cache=True,
                **{key: past},
            )
            past = getattr(out, key)
            nxt = out.logits[:, -1].argmax(-1)
        return result


# ---- prompts and metrics ---------------------------------------------------------------------------------


def prompt(entity_ids: list[str], question: str, options: list[str] | None) -> str:
    """The text prompt: entity, question and (multiple choice) the lettered options, ending in ``answer :``."""
    text = f"entity : {' '.join(entity_ids)} question : {question}"
    if options is not None:
        text += " options : " + " ".join(f"{LETTERS[i]} ) {o}" for i, o in enumerate(options))
    return text + " answer :"


def corpus_bleu(references: list[list[str]], hypotheses: list[list[str]], max_n: int = 4) -> float:
    """Corpus BLEU with one reference per hypothesis (Papineni et al. 2002), uniform weights up to ``max_n``.

    ``BLEU = BP * exp(mean_n log p_n)``, ``p_n`` the clipped n-gram precision summed over the corpus,
    ``BP = exp(1 - r/c)`` when the total hypothesis length ``c`` is shorter than the reference length ``r``.
    Unsmoothed: 0 when some order has no match. A hypothesis shorter than ``n`` adds no ``n``-grams to the
    denominator (as in Papineni et al. and sacrebleu; nltk's ``corpus_bleu`` counts one there).

    Returns
    -------
    float
        in 0..1 (0 for an empty corpus).
    """
    matches, totals = [0] * max_n, [0] * max_n
    r = c = 0
    for ref, hyp in zip(references, hypotheses):
        r, c = r + len(ref), c + len(hyp)
        for n in range(1, max_n + 1):
            h = Counter(tuple(hyp[i : i + n]) for i in range(len(hyp) - n + 1))
            g = Counter(tuple(ref[i : i + n]) for i in range(len(ref) - n + 1))
            matches[n - 1] += sum(min(v, g[k]) for k, v in h.items())
            totals[n - 1] += max(len(hyp) - n + 1, 0)
    if c == 0 or any(m == 0 for m in matches):
        return 0.0
    log_p = sum(math.log(m / t) for m, t in zip(matches, totals)) / max_n
    bp = 1.0 if c > r else math.exp(1 - r / c)
    return bp * math.exp(log_p)


def answer_metrics(rows: list[dict]) -> dict:
    """Aggregate per-item results ``{question_type, mc_correct, ref_words, hyp_words}`` overall and per type.

    ``mc_correct`` is None for open-ended items (no options): they count in ``n_items`` and the open-answer
    figures, not in ``mc_accuracy`` (whose denominator is ``n_mc``).

    Returns
    -------
    dict
        ``n_items``, ``n_mc``, ``mc_accuracy``, ``open_exact_match`` (fractions), ``bleu1``, ``bleu4`` (0..1) and
        ``by_question_type`` with the same keys per type.
    """

    def agg(rs: list[dict]) -> dict:
        n = len(rs)
        refs, hyps = [r["ref_words"] for r in rs], [r["hyp_words"] for r in rs]
        mc = [r["mc_correct"] for r in rs if r["mc_correct"] is not None]
        return {
            "n_items": n,
            "n_mc": len(mc),
            "mc_accuracy": sum(mc) / len(mc) if mc else None,
            "open_exact_match": sum(r["ref_words"] == r["hyp_words"] for r in rs) / n if n else None,
            "bleu1": corpus_bleu(refs, hyps, 1),
            "bleu4": corpus_bleu(refs, hyps, 4),
        }

    out = agg(rows)
    out["by_question_type"] = {
        t: agg([r for r in rows if r["question_type"] == t]) for t in sorted({r["question_type"] for r in rows})
    }
    return out
