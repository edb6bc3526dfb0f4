"""The two training tasks on a verified snapshot: what the loop trains, on which rows, and how it evaluates.

:class:`EncoderTask`: entity-aware encoder, graded multi-positive contrastive loss on the retrieval targets of the
``train`` split (negatives all-gathered across processes), evaluated in the paper's cells (modality family x
entity category, :mod:`training.evaluation`) on each evaluation split (queries and gallery from that split and
family; the query patient's studies are never ranked: retrieval is across patients).

:class:`VLMTask`: comparative VLM on the ``vqa`` items of the ``train`` split (each item once per answer
format: multiple choice -> option letter, open -> answer text), evaluated per split, question type and modality
family. :class:`training.qwen_vl.QwenVLTask` does the same with a local Qwen2-VL / Qwen2.5-VL folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch.utils.data import Dataset

from training.config import EncoderJobConfig, VLMJobConfig
from training.data import (
    RetrievalTrainSet,
    SnapshotRef,
    VQAItem,
    image_tensor,
    load_positives,
    load_study_index,
    load_vqa_items,
    pad_slices,
)
from training.encoder import EntityAwareEncoder, graded_contrastive
from training.evaluation import entity_categories, retrieval_cells, vqa_cells
from training.scale import add_lora, enable_gradient_checkpointing, freeze, gather_rows
from training.vlm import (
    LETTERS,
    ComparativeVLM,
    answer_metrics,
    build_language_model,
    build_word_tokenizer,
    prompt,
    words,
)


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if hasattr(model, "module") else model


def scale_backbone(backbone: torch.nn.Module, lora, frozen: bool, checkpointing: bool) -> torch.nn.Module:
    """LoRA adapters / freezing / gradient checkpointing on a token backbone's transformers model (in place)."""
    from training.encoder import hf_model

    inner = hf_model(backbone)
    if frozen:
        freeze(backbone)
    if lora is not None:
        if inner is None:
            raise ValueError("lora needs a transformers backbone (vit or pretrained), not resnet")
        wrapped = add_lora(inner, lora)
        setattr(backbone, "vit" if hasattr(backbone, "vit") else "model", wrapped)
        inner = wrapped
    if checkpointing and inner is not None:
        enable_gradient_checkpointing(inner)
    return backbone


class EncoderTask:
    """Entity-aware encoder on a snapshot (see the module docstring)."""

    def __init__(self, job: EncoderJobConfig, ref: SnapshotRef):
        self.job, self.ref = job, ref
        self.index = load_study_index(ref)
        self.positives = load_positives(ref, self.index, list(job.data.positive_states))
        self.entity_ids = self.positives.entities()
        self.families = sorted({self.index.family[s] for s in self.index.image_row})
        self.category = entity_categories(self.entity_ids)
        bb, m = job.model.backbone, job.model
        self._geom = (bb.image_size, bb.in_channels, m.max_slices)
        self._image = {"window": dict(m.window), "slice_spacing_mm": m.slice_spacing_mm}
        self.studies = sorted(self.index.patient)

    def entity_init(self, dim: int) -> torch.Tensor | None:
        """Initial entity queries from the text encoder folder (``model.entity_text_encoder``), or None."""
        if not self.job.model.entity_text_encoder or not self.entity_ids:
            return None
        from schemas.ontology import load_ontology
        from training.pretrained import entity_text_embeddings, project_to

        concepts = load_ontology().concepts
        names = [concepts[e].preferred_name if e in concepts else e for e in self.entity_ids]
        return project_to(
            entity_text_embeddings(self.job.model.entity_text_encoder, names), dim, seed=self.job.optim.seed
        )

    def build_model(self) -> EntityAwareEncoder:
        """A fresh encoder sized to the snapshot's entity and family vocabularies (backbone from its folder when
        ``backbone.path`` is set; entity queries from text embeddings when ``entity_text_encoder`` is set)."""
        m = self.job.model
        model = EntityAwareEncoder(m, max(1, len(self.entity_ids)), len(self.families))
        init = self.entity_init(model.tokens.hidden_size)
        if init is not None:
            with torch.no_grad():
                model.pool.queries.weight.copy_(init)
        scale_backbone(model.tokens.backbone, m.lora, m.freeze_backbone, m.gradient_checkpointing)
        return model

    def train_dataset(self) -> RetrievalTrainSet:
        """Training queries of the ``train`` split."""
        return RetrievalTrainSet(
            self.index,
            self.positives,
            "train",
            self.entity_ids,
            self.families,
            *self._geom,
            seed=self.job.optim.seed,
            **self._image,
        )

    def collate(self, items: list[dict]) -> dict:
        """Anchors and positives padded together to ``(2B, S, C, H, W)`` with the slice mask, entity and family
        indices, and the integer codes of studies and patients (relevance across processes is looked up from
        them in :meth:`compute_loss`)."""
        images, mask = pad_slices([it["anchor"] for it in items] + [it["positive"] for it in items])
        codes = torch.tensor(
            [[it["anchor_code"], it["positive_code"], it["anchor_patient"], it["positive_patient"]] for it in items]
        )
        entity = torch.tensor([it["entity"] for it in items])
        family = torch.tensor([it["anchor_family"] for it in items] + [it["positive_family"] for it in items])
        return {"images": images, "slice_mask": mask, "entity": entity, "family": family, "codes": codes}

    def relevance_matrices(
        self, entity: torch.Tensor, codes: torch.Tensor, all_entity: torch.Tensor, all_codes: torch.Tensor, offset: int
    ) -> tuple[torch.Tensor, ...]:
        """``(rel_a2p, rel_p2a, ignore_a2p, ignore_p2a)``, each ``(B, M)``, for local rows against all columns.

        ``rel_a2p[i, j]``: relevance of column j's positive study to local query i (same entity); ``rel_p2a[i, j]``:
        relevance of local positive i to column j's query. Columns of the row's own patient (other than its own
        pair) are ignored. With ``data.loss: infonce`` the targets are the own pair only and every other relevant
        column is ignored (false negatives out of the denominator).
        """
        b, m = entity.shape[0], all_entity.shape[0]
        st, ent = self.studies, self.entity_ids
        rel_a2p, rel_p2a = torch.zeros((b, m)), torch.zeros((b, m))
        ac, pc, ap, pp = codes.tolist(), all_codes[:, 1].tolist(), codes[:, 2], codes[:, 3]
        aq = all_codes[:, 0].tolist()
        for i in range(b):
            qi, ei = st[ac[i][0]], ent[int(entity[i])]
            for j in range(m):
                if int(all_entity[j]) != int(entity[i]):
                    continue
                rel_a2p[i, j] = self.positives.relevance(qi, ei, st[pc[j]])
                rel_p2a[i, j] = self.positives.relevance(st[aq[j]], ei, st[ac[i][1]])
        own = torch.zeros((b, m), dtype=torch.bool)
        own[torch.arange(b), offset + torch.arange(b)] = True
        rel_a2p[own], rel_p2a[own] = rel_a2p[own].clamp(min=1e-6), rel_p2a[own].clamp(min=1e-6)
        ignore_a2p = (ap[:, None] == all_codes[:, 3][None, :]) & ~own
        ignore_p2a = (pp[:, None] == all_codes[:, 2][None, :]) & ~own
        if self.job.data.loss == "infonce":
            ignore_a2p, ignore_p2a = ignore_a2p | ((rel_a2p > 0) & ~own), ignore_p2a | ((rel_p2a > 0) & ~own)
            rel_a2p, rel_p2a = own.float(), own.float()
        return rel_a2p, rel_p2a, ignore_a2p, ignore_p2a

    def compute_loss(self, model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, int]:
        """Graded contrastive loss of a batch (one encoder pass over anchors and positives; the other processes'
        rows gathered as extra columns when ``data.gather_negatives``); returns (loss, images)."""
        b = batch["entity"].shape[0]
        z = model(batch["images"], batch["slice_mask"], batch["entity"].repeat(2), batch["family"])
        tau = _unwrap(model).temperature(batch["family"])
        za, zp = z[:b], z[b:]
        if self.job.data.gather_negatives:
            all_a, offset = gather_rows(za)
            all_p, _ = gather_rows(zp)
            all_e, _ = gather_rows(batch["entity"])
            all_c, _ = gather_rows(batch["codes"])
        else:
            all_a, all_p, offset, all_e, all_c = za, zp, 0, batch["entity"], batch["codes"]
        rel = self.relevance_matrices(batch["entity"].cpu(), batch["codes"].cpu(), all_e.cpu(), all_c.cpu(), offset)
        rel = [r.to(z.device) for r in rel]
        return graded_contrastive(za, zp, all_a, all_p, tau[:b], tau[b:], *rel), 2 * b

    @torch.no_grad()
    def embed_split(self, model: EntityAwareEncoder, device: torch.device, studies: list[str]) -> torch.Tensor:
        """Embeddings of ``studies`` for every entity: ``(G, n_entities, embed_dim)`` float32 on CPU."""
        fam = {f: i for i, f in enumerate(self.families)}
        ents = torch.arange(len(self.entity_ids), device=device)
        out = []
        for i in range(0, len(studies), self.job.optim.batch_size):
            chunk = studies[i : i + self.job.optim.batch_size]
            images, mask = pad_slices(
                [
                    image_tensor(self.index.image_record(s), *self._geom, self.index.storage, **self._image)
                    for s in chunk
                ]
            )
            family = torch.tensor([fam.get(self.index.family[s], len(fam)) for s in chunk], device=device)
            z = model(images.to(device), mask.to(device), ents[None].expand(len(chunk), -1), family)
            out.append(z.float().cpu())
        return torch.cat(out) if out else torch.zeros((0, len(self.entity_ids), self.job.model.embed_dim))

    def evaluate(self, model: torch.nn.Module, device: torch.device) -> dict:
        """Per evaluation split: Recall@k and NDCG@k in the paper's cells (family x entity category), overall
        (``micro``) and the mean of the cells (:func:`training.evaluation.retrieval_cells`)."""
        model = _unwrap(model)
        result: dict = {"positives_source": self.positives.source}
        for split in self.job.data.eval_splits:
            gallery = self.index.studies(split)
            pos = set(gallery)
            queries = [
                (s, e)
                for (s, e) in sorted(self.positives.query_group)
                if s in pos and self.positives.relevant(s, e, self.index)
            ]
            emb = self.embed_split(model, device, gallery) if queries else torch.zeros((0, 0, 0))
            pos_rel = self.positives

            def relevance(s: str, e: str, _p=pos_rel) -> dict[str, float]:
                return {t: _p.relevance(s, e, t) for t in _p.relevant(s, e, self.index)}

            result[split] = retrieval_cells(
                emb,
                gallery,
                self.entity_ids,
                self.index.family,
                self.index.patient,
                queries,
                relevance,
                list(self.job.data.recall_ks),
                self.job.data.ndcg_k,
                self.category,
            )
        return result

    def state(self) -> dict:
        """Vocabularies stored in the checkpoint (entity and family order = embedding rows)."""
        return {"entity_ids": self.entity_ids, "families": self.families, "positives_source": self.positives.source}

    def save_artifacts(self, run_dir: Path) -> None:
        """``vocab.json`` beside the checkpoint."""
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        (Path(run_dir) / "vocab.json").write_text(json.dumps({**self.state(), "note": self.positives.note}, indent=1))


class _VQAExamples(Dataset):
    """(item, format) examples; tokenised and decoded lazily in the DataLoader workers."""

    def __init__(self, task: VLMTask, examples: list[tuple[VQAItem, str]], with_answer: bool):
        self.task, self.examples, self.with_answer = task, examples, with_answer

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> dict:
        return self.task.example(*self.examples[i], with_answer=self.with_answer)


def load_vision_init(vision: EntityAwareEncoder, path: str | Path, entity_ids: list[str]) -> dict:
    """Start a VLM's vision tower from an encoder job's checkpoint: backbone, slice embedding and entity pooling
    weights are copied; entity queries by entity id (ids the encoder did not know keep their initialisation).

    Returns
    -------
    dict
        ``{"copied": n tensors, "entities": n entity queries copied}``.

    Raises
    ------
    FileNotFoundError, ValueError
        no checkpoint, or a backbone of another shape.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"vision_init: no encoder checkpoint at {p}")
    ckpt = torch.load(p, map_location="cpu", weights_only=False)
    state, old_ids = ckpt["model"], ckpt.get("task", {}).get("entity_ids", [])
    own = vision.state_dict()
    copy = {k: v for k, v in state.items() if k in own and not k.startswith("pool.queries")}
    bad = [k for k, v in copy.items() if v.shape != own[k].shape]
    if bad:
        raise ValueError(f"vision_init: {p} has another backbone shape ({bad[:3]})")
    vision.load_state_dict(copy, strict=False)
    n = 0
    if "pool.queries.weight" in state:
        with torch.no_grad():
            for i, e in enumerate(entity_ids):
                if e in old_ids:
                    vision.pool.queries.weight[i] = state["pool.queries.weight"][old_ids.index(e)]
                    n += 1
    return {"copied": len(copy), "entities": n}


class VLMTask:
    """Comparative VLM on a snapshot's VQA items (see the module docstring)."""

    #: text put before an answer (the prompt ends in ``answer :``; BPE tokenizers then see `` A`` as one word)
    answer_prefix = " "

    def __init__(self, job: VLMJobConfig, ref: SnapshotRef, run_dir: str | Path):
        self.job, self.ref, self.run_dir = job, ref, Path(run_dir)
        self.index = load_study_index(ref)
        self.items, self.skipped = load_vqa_items(ref, self.index)
        self.train_items = [it for it in self.items if it.split == "train"]
        self.entity_ids = sorted({e for it in self.items for e in it.entity_ids})
        self.families = sorted({self.index.family[s] for s in self.index.image_row})
        self.tokenizer = self._tokenizer()
        m = job.model
        self._geom = (m.vision.backbone.image_size, m.vision.backbone.in_channels, m.vision.max_slices)
        self._image = {"window": dict(m.vision.window), "slice_spacing_mm": m.vision.slice_spacing_mm}
        need = 2 * (m.visual_tokens + 1) + m.max_text_tokens + m.max_new_tokens
        if m.path is None and m.lm.kind != "local" and m.lm.max_positions < need:
            raise ValueError(f"lm.max_positions {m.lm.max_positions} < {need} (images + text + answer)")

    @property
    def word_level(self) -> bool:
        """Whether the tokenizer is the snapshot's word-level one (its tokens are the words)."""
        return self.job.model.path is None and self._tokenizer_kind() == "word"

    def _tokenizer_kind(self) -> str:
        cfg = self.job.model.tokenizer
        if cfg.kind == "auto":
            return "lm" if self.job.model.lm.kind == "local" else "word"
        return cfg.kind

    def _tokenizer(self):
        from training.pretrained import load_lm_tokenizer

        saved = self.run_dir / "tokenizer"
        if saved.is_dir():  # a resumed run keeps its vocabulary
            return load_lm_tokenizer(saved)
        kind = self._tokenizer_kind()
        if kind == "lm":
            return load_lm_tokenizer(self.job.model.lm.path)
        if kind == "local":
            return load_lm_tokenizer(self.job.model.tokenizer.path)
        if self.job.model.lm.kind == "local":
            raise ValueError(
                "tokenizer.kind word with a pretrained lm.path would remap the model's embeddings to "
                "another vocabulary: use tokenizer.kind auto (the model's own tokenizer)"
            )
        texts = [prompt(it.entity_ids, it.question, it.options) + " " + it.answer_text for it in self.train_items]
        return build_word_tokenizer(texts + [" ".join(LETTERS)], self.job.model.tokenizer)

    def build_model(self) -> ComparativeVLM:
        """Vision encoder + projector + LM (from its folder or a config), with the configured vision start,
        frozen towers, LoRA adapters on the LM and gradient checkpointing."""
        m = self.job.model
        lm = build_language_model(m.lm, self.tokenizer)
        if m.freeze_lm:
            freeze(lm)
        if m.lora is not None:
            lm = add_lora(lm, m.lora)
        if m.gradient_checkpointing:
            enable_gradient_checkpointing(lm)
        model = ComparativeVLM(m, lm, max(1, len(self.entity_ids)), len(self.families))
        if m.vision_init:
            load_vision_init(model.vision, m.vision_init, self.entity_ids)
        scale_backbone(
            model.vision.tokens.backbone,
            m.vision.lora,
            m.vision.freeze_backbone,
            m.gradient_checkpointing or m.vision.gradient_checkpointing,
        )
        if m.freeze_vision:
            freeze(model.vision)
        return model

    def examples(self, items: list[VQAItem], formats: list[str]) -> list[tuple[VQAItem, str]]:
        """Items crossed with answer formats, in item order; open-ended items (no options) only as "open"."""
        return [(it, f) for it in items for f in formats if f != "mc" or it.options]

    def train_dataset(self) -> Dataset:
        """Training examples of the ``train`` split."""
        return _VQAExamples(self, self.examples(self.train_items, list(self.job.data.formats)), with_answer=True)

    def answer_ids(self, text: str) -> list[int]:
        """Token ids of an answer as it follows the prompt (``answer_prefix`` + text), without special tokens."""
        return self.tokenizer(self.answer_prefix + text, add_special_tokens=False)["input_ids"]

    def letter_choice(self, n: int) -> tuple[list[int], list[int]]:
        """How the option letters A.. are told apart after the prompt: the ids they share first (appended to the
        prompt; often none) and the id of each letter at the first position where they differ.

        Raises
        ------
        ValueError
            a tokenizer that cannot tell the letters apart.
        """
        seqs = [self.answer_ids(x) for x in LETTERS[:n]]
        k = 0
        while all(len(q) > k for q in seqs) and len({q[k] for q in seqs}) == 1:
            k += 1
        if any(len(q) <= k for q in seqs) or len({q[k] for q in seqs}) != n:
            raise ValueError(f"the tokenizer does not tell the option letters apart: {seqs}")
        return seqs[0][:k], [q[k] for q in seqs]

    def image(self, study: str) -> torch.Tensor:
        """A study's image tensor ``(S, C, size, size)``."""
        return image_tensor(self.index.image_record(study), *self._geom, self.index.storage, **self._image)

    def example(self, item: VQAItem, fmt: str, with_answer: bool, extra: list[int] | None = None) -> dict:
        """One example: images, token ids ([BOS] + prompt [+ answer + EOS]) and labels (answer + EOS only). The BOS
        is left out for tokenizers without one (Qwen); ``extra`` ids are appended to the prompt."""
        tok = self.tokenizer
        text = prompt(item.entity_ids, item.question, item.options if fmt == "mc" else None)
        p = tok(text, add_special_tokens=False)["input_ids"] + list(extra or [])
        a = (
            (self.answer_ids(item.answer if fmt == "mc" else item.answer_text) + [tok.eos_token_id])
            if with_answer
            else []
        )
        bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
        budget = self.job.model.max_text_tokens - len(a) - len(bos)
        ids = bos + p[-budget:] + a
        labels = [-100] * (len(ids) - len(a)) + a
        current = self.image(item.current)
        prior = self.image(item.prior) if item.prior else torch.zeros_like(current[:1])
        ent = {e: i for i, e in enumerate(self.entity_ids)}
        return {
            "ids": ids,
            "labels": labels,
            "prior": prior,
            "current": current,
            "has_prior": item.prior is not None,
            "entity": ent.get(item.entity_ids[0], 0) if item.entity_ids else 0,
        }

    def collate(self, items: list[dict]) -> dict:
        """Images padded to common slices; text left-padded (so every row's prompt ends at the last column)."""
        images, masks = pad_slices([it["prior"] for it in items] + [it["current"] for it in items])
        b, n = len(items), max(len(it["ids"]) for it in items)
        ids = torch.full((b, n), self.tokenizer.pad_token_id, dtype=torch.long)
        labels = torch.full((b, n), -100, dtype=torch.long)
        attn = torch.zeros((b, n), dtype=torch.long)
        for i, it in enumerate(items):
            k = len(it["ids"])
            ids[i, n - k :] = torch.tensor(it["ids"])
            labels[i, n - k :] = torch.tensor(it["labels"])
            attn[i, n - k :] = 1
        return {
            "prior": images[:b],
            "prior_mask": masks[:b],
            "current": images[b:],
            "current_mask": masks[b:],
            "has_prior": torch.tensor([it["has_prior"] for it in items]),
            "entity": torch.tensor([it["entity"] for it in items]),
            "input_ids": ids,
            "labels": labels,
            "attention_mask": attn,
        }

    def compute_loss(self, model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, int]:
        """Answer-token cross-entropy; returns (loss, images fed)."""
        return model(batch), int(batch["has_prior"].sum()) + batch["has_prior"].shape[0]

    def words(self, text: str) -> list[str]:
        """The normalised word sequence of an answer (exact match and BLEU unit): the word tokenizer's tokens, else
        lower-cased words and punctuation."""
        import re

        if self.word_level:
            return words(self.tokenizer, text)
        return re.findall(r"\w+|[^\w\s]", text.lower())

    def _mc_logits(self, model, chunk: list[VQAItem], device) -> tuple[torch.Tensor | None, list[int]]:
        from training.loop import to_device

        with_options = [k for k, it in enumerate(chunk) if it.options]
        if not with_options:
            return None, []
        n = max(len(chunk[k].options) for k in with_options)
        shared, _ = self.letter_choice(n)
        batch = self.collate([self.example(chunk[k], "mc", False, extra=shared) for k in with_options])
        return model.next_token_logits(to_device(batch, device)), with_options

    def _generate(self, model, chunk: list[VQAItem], device) -> list[list[int]]:
        from training.loop import to_device

        opn = to_device(self.collate([self.example(it, "open", False) for it in chunk]), device)
        return model.generate_greedy(opn, self.job.model.max_new_tokens, self.tokenizer.eos_token_id)

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, device: torch.device) -> dict:
        """Per evaluation split: MC accuracy, open-answer exact match and BLEU, overall and per question type, and
        the accuracy cells per modality family (``2D-CXR``, ``3D-CT`` ...) with longitudinal change separately."""
        model = _unwrap(model)
        tok = self.tokenizer
        result: dict = {"skipped_items_without_images": self.skipped}
        bs = self.job.optim.batch_size
        for split in self.job.data.eval_splits:
            items = [it for it in self.items if it.split == split][: self.job.data.max_eval_items]
            if not items:
                result[split] = {"n_items": 0}
                continue
            rows = []
            for i in range(0, len(items), bs):
                chunk = items[i : i + bs]
                logits, with_options = self._mc_logits(model, chunk, device)
                row_of = {k: j for j, k in enumerate(with_options)}
                gen = self._generate(model, chunk, device)
                for r, it in enumerate(chunk):
                    correct = None
                    if r in row_of:
                        _, letter_ids = self.letter_choice(len(it.options))
                        pred = LETTERS[int(logits[row_of[r], letter_ids].argmax())]
                        correct = pred == it.answer
                    rows.append(
                        {
                            "question_type": it.question_type,
                            "mc_correct": correct,
                            "family": self.index.family.get(it.current, "?"),
                            "ref_words": self.words(it.answer_text),
                            "hyp_words": self.words(tok.decode(gen[r], skip_special_tokens=True)),
                        }
                    )
            result[split] = {**answer_metrics(rows), **vqa_cells(rows)}
        return result

    def state(self) -> dict:
        """Vocabularies stored in the checkpoint."""
        return {"entity_ids": self.entity_ids, "families": self.families, "vocab_size": len(self.tokenizer)}

    def save_artifacts(self, run_dir: Path) -> None:
        """The tokenizer (``tokenizer/``) and vocabularies (``vocab.json``) beside the checkpoint."""
        run_dir = Path(run_dir)
        self.tokenizer.save_pretrained(str(run_dir / "tokenizer"))
        (run_dir / "vocab.json").write_text(json.dumps(self.state(), indent=1))
