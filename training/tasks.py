"""The two training tasks on a verified snapshot: what the loop trains, on which rows, and how it evaluates.

:class:`EncoderTask`: entity-aware encoder, InfoNCE on retrieval positives of the ``train`` split,
entity-conditioned Recall@k on each evaluation split (queries and gallery from that split only; the
query itself and the query patient's other studies are never ranked: retrieval is across patients).

:class:`VLMTask`: comparative VLM on the ``vqa`` items of the ``train`` split (each item once per answer
format: multiple choice -> option letter, open -> answer text), evaluated per split and question type.
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
from training.encoder import EntityAwareEncoder, info_nce, recall_at_k
from training.vlm import (
    LETTERS,
    ComparativeVLM,
    answer_metrics,
    build_language_model,
    build_word_tokenizer,
    load_tokenizer,
    prompt,
    words,
)


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if hasattr(model, "module") else model


class EncoderTask:
    """Entity-aware encoder on a snapshot (see the module docstring)."""

    def __init__(self, job: EncoderJobConfig, ref: SnapshotRef):
        self.job, self.ref = job, ref
        self.index = load_study_index(ref)
        self.positives = load_positives(ref, self.index, list(job.data.positive_states))
        self.entity_ids = self.positives.entities()
        self.families = sorted({self.index.family[s] for s in self.index.image_row})
        bb = job.model.backbone
        self._geom = (bb.image_size, bb.in_channels, job.model.max_slices)

    def build_model(self) -> EntityAwareEncoder:
        """A freshly initialised encoder sized to the snapshot's entity and family vocabularies."""
        return EntityAwareEncoder(self.job.model, max(1, len(self.entity_ids)), len(self.families))

    def train_dataset(self) -> RetrievalTrainSet:
        """Training queries of the ``train`` split."""
        return RetrievalTrainSet(self.index, self.positives, "train", self.entity_ids, self.families,
                                 *self._geom, seed=self.job.optim.seed)

    def collate(self, items: list[dict]) -> dict:
        """Anchors and positives padded together to ``(2B, S, C, H, W)``, entity and family indices, and the
        false-negative mask ``(B, B)``: positive j is relevant to anchor i (same entity, in i's group)."""
        images, mask = pad_slices([it["anchor"] for it in items] + [it["positive"] for it in items])
        fn = torch.zeros((len(items), len(items)), dtype=torch.bool)
        for i, a in enumerate(items):
            group = self.positives.groups[self.positives.query_group[(a["anchor_study"], a["entity_id"])]]
            for j, p in enumerate(items):
                fn[i, j] = p["entity_id"] == a["entity_id"] and (p["positive_study"] in group
                                                                 or p["positive_study"] == a["anchor_study"])
        entity = torch.tensor([it["entity"] for it in items])
        family = torch.tensor([it["anchor_family"] for it in items] + [it["positive_family"] for it in items])
        return {"images": images, "slice_mask": mask, "entity": entity, "family": family, "false_negative": fn}

    def compute_loss(self, model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, int]:
        """InfoNCE of a batch (one encoder pass over anchors and positives); returns (loss, images)."""
        b = batch["entity"].shape[0]
        z = model(batch["images"], batch["slice_mask"], batch["entity"].repeat(2), batch["family"])
        tau = _unwrap(model).temperature(batch["family"])
        return info_nce(z[:b], z[b:], tau[:b], tau[b:], batch["false_negative"]), 2 * b

    @torch.no_grad()
    def embed_split(self, model: EntityAwareEncoder, device: torch.device, studies: list[str]) -> torch.Tensor:
        """Embeddings of ``studies`` for every entity: ``(G, n_entities, embed_dim)`` float32 on CPU."""
        fam = {f: i for i, f in enumerate(self.families)}
        ents = torch.arange(len(self.entity_ids), device=device)
        out = []
        for i in range(0, len(studies), self.job.optim.batch_size):
            chunk = studies[i:i + self.job.optim.batch_size]
            images, mask = pad_slices([image_tensor(self.index.image_record(s), *self._geom, self.index.storage) for s in chunk])
            family = torch.tensor([fam.get(self.index.family[s], len(fam)) for s in chunk], device=device)
            z = model(images.to(device), mask.to(device), ents[None].expand(len(chunk), -1), family)
            out.append(z.float().cpu())
        return torch.cat(out) if out else torch.zeros((0, len(self.entity_ids), self.job.model.embed_dim))

    def evaluate(self, model: torch.nn.Module, device: torch.device) -> dict:
        """Entity-conditioned Recall@k per evaluation split: micro (over all queries) and macro (over
        entities), with the number of queries and the gallery size."""
        model = _unwrap(model)
        result = {"positives_source": self.positives.source}
        for split in self.job.data.eval_splits:
            gallery = self.index.studies(split)
            pos = {s: i for i, s in enumerate(gallery)}
            queries = [(s, e) for (s, e) in sorted(self.positives.query_group)
                       if s in pos and self.positives.relevant(s, e, self.index)]
            if not queries:
                result[split] = {"n_queries": 0, "gallery": len(gallery)}
                continue
            emb = self.embed_split(model, device, gallery)
            patients = [self.index.patient[s] for s in gallery]
            ks = self.job.data.recall_ks
            micro = {f"R@{k}": 0.0 for k in ks}
            per_entity = {}
            for e in sorted({e for _, e in queries}):
                qs = [s for s, qe in queries if qe == e]
                ei = self.entity_ids.index(e)
                q, g = emb[[pos[s] for s in qs], ei], emb[:, ei]
                rel = torch.zeros((len(qs), len(gallery)), dtype=torch.bool)
                excl = torch.zeros_like(rel)
                for r, s in enumerate(qs):
                    rel[r, [pos[t] for t in self.positives.relevant(s, e, self.index)]] = True
                    excl[r] = torch.tensor([p == self.index.patient[s] for p in patients])
                rk = recall_at_k(q @ g.T, rel, ks, exclude=excl)
                per_entity[e] = {"n_queries": len(qs), **rk}
                for k in micro:
                    micro[k] += rk[k] * len(qs)
            n = len(queries)
            result[split] = {"n_queries": n, "gallery": len(gallery),
                             "micro": {k: v / n for k, v in micro.items()},
                             "macro": {k: sum(v[k] for v in per_entity.values()) / len(per_entity) for k in micro},
                             "by_entity": per_entity}
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


class VLMTask:
    """Comparative VLM on a snapshot's VQA items (see the module docstring)."""

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
        need = 2 * (m.visual_tokens + 1) + m.max_text_tokens + m.max_new_tokens
        if m.lm.kind != "local" and m.lm.max_positions < need:
            raise ValueError(f"lm.max_positions {m.lm.max_positions} < {need} (images + text + answer)")

    def _tokenizer(self):
        saved = self.run_dir / "tokenizer"
        if saved.is_dir():  # a resumed run keeps its vocabulary
            return load_tokenizer(saved)
        cfg = self.job.model.tokenizer
        if cfg.kind == "local":
            return load_tokenizer(cfg.path)
        texts = [prompt(it.entity_ids, it.question, it.options) + " " + it.answer_text for it in self.train_items]
        return build_word_tokenizer(texts + [" ".join(LETTERS)], cfg)

    def build_model(self) -> ComparativeVLM:
        """Vision encoder + projector + LM sized to the tokenizer."""
        lm = build_language_model(self.job.model.lm, self.tokenizer)
        return ComparativeVLM(self.job.model, lm, max(1, len(self.entity_ids)), len(self.families))

    def examples(self, items: list[VQAItem], formats: list[str]) -> list[tuple[VQAItem, str]]:
        """Items crossed with answer formats, in item order; open-ended items (no options) only as "open"."""
        return [(it, f) for it in items for f in formats if f != "mc" or it.options]

    def train_dataset(self) -> Dataset:
        """Training examples of the ``train`` split."""
        return _VQAExamples(self, self.examples(self.train_items, list(self.job.data.formats)), with_answer=True)

    def example(self, item: VQAItem, fmt: str, with_answer: bool) -> dict:
        """One example: images, token ids (BOS + prompt [+ answer + EOS]) and labels (answer + EOS only)."""
        tok = self.tokenizer
        text = prompt(item.entity_ids, item.question, item.options if fmt == "mc" else None)
        p = tok(text, add_special_tokens=False)["input_ids"]
        a = (tok(item.answer if fmt == "mc" else item.answer_text, add_special_tokens=False)["input_ids"]
             + [tok.eos_token_id]) if with_answer else []
        budget = self.job.model.max_text_tokens - len(a) - 1
        ids = [tok.bos_token_id] + p[-budget:] + a
        labels = [-100] * (len(ids) - len(a)) + a
        current = image_tensor(self.index.image_record(item.current), *self._geom, self.index.storage)
        prior = image_tensor(self.index.image_record(item.prior), *self._geom, self.index.storage) if item.prior else torch.zeros_like(current[:1])
        ent = {e: i for i, e in enumerate(self.entity_ids)}
        return {"ids": ids, "labels": labels, "prior": prior, "current": current, "has_prior": item.prior is not None,
                "entity": ent.get(item.entity_ids[0], 0) if item.entity_ids else 0}

    def collate(self, items: list[dict]) -> dict:
        """Images padded to common slices; text left-padded (so every row's prompt ends at the last column)."""
        images, masks = pad_slices([it["prior"] for it in items] + [it["current"] for it in items])
        b, n = len(items), max(len(it["ids"]) for it in items)
        ids = torch.full((b, n), self.tokenizer.pad_token_id, dtype=torch.long)
        labels = torch.full((b, n), -100, dtype=torch.long)
        attn = torch.zeros((b, n), dtype=torch.long)
        for i, it in enumerate(items):
            k = len(it["ids"])
            ids[i, n - k:] = torch.tensor(it["ids"])
            labels[i, n - k:] = torch.tensor(it["labels"])
            attn[i, n - k:] = 1
        return {"prior": images[:b], "prior_mask": masks[:b], "current": images[b:], "current_mask": masks[b:],
                "has_prior": torch.tensor([it["has_prior"] for it in items]),
                "entity": torch.tensor([it["entity"] for it in items]),
                "input_ids": ids, "labels": labels, "attention_mask": attn}

    def compute_loss(self, model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, int]:
        """Answer-token cross-entropy; returns (loss, images fed)."""
        return model(batch), int(batch["has_prior"].sum()) + batch["has_prior"].shape[0]

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, device: torch.device) -> dict:
        """Per evaluation split: MC accuracy, open-answer exact match and BLEU, overall and per question type."""
        from training.loop import to_device

        model = _unwrap(model)
        tok = self.tokenizer
        letter_ids = [tok.convert_tokens_to_ids(tok.tokenize(x))[0] for x in LETTERS]
        result: dict = {"skipped_items_without_images": self.skipped}
        bs = self.job.optim.batch_size
        for split in self.job.data.eval_splits:
            items = [it for it in self.items if it.split == split][: self.job.data.max_eval_items]
            rows = []
            for i in range(0, len(items), bs):
                chunk = items[i:i + bs]
                with_options = [k for k, it in enumerate(chunk) if it.options]
                logits = (model.next_token_logits(to_device(self.collate(
                    [self.example(chunk[k], "mc", False) for k in with_options]), device)) if with_options else None)
                row_of = {k: j for j, k in enumerate(with_options)}
                opn = to_device(self.collate([self.example(it, "open", False) for it in chunk]), device)
                gen = model.generate_greedy(opn, self.job.model.max_new_tokens, tok.eos_token_id)
                for r, it in enumerate(chunk):
                    correct = None
                    if r in row_of:
                        pred = LETTERS[int(logits[row_of[r], letter_ids[:len(it.options)]].argmax())]
                        correct = pred == it.answer
                    rows.append({"question_type": it.question_type, "mc_correct": correct,
                                 "ref_words": words(tok, it.answer_text),
                                 "hyp_words": tok.convert_ids_to_tokens(gen[r])})
            result[split] = answer_metrics(rows)
        return result

    def state(self) -> dict:
        """Vocabularies stored in the checkpoint."""
        return {"entity_ids": self.entity_ids, "families": self.families, "vocab_size": len(self.tokenizer)}

    def save_artifacts(self, run_dir: Path) -> None:
        """The tokenizer (``tokenizer/``) and vocabularies (``vocab.json``) beside the checkpoint."""
        run_dir = Path(run_dir)
        self.tokenizer.save_pretrained(str(run_dir / "tokenizer"))
        (run_dir / "vocab.json").write_text(json.dumps(self.state(), indent=1))
