"""The comparative VQA task on a local Qwen2-VL / Qwen2.5-VL folder (``model.path``), trained as released.

One conversation per item, rendered with the folder's own chat template: the user turn holds the prior image
(when the item has one), the current image and the question with its lettered options (A-D ...); the assistant
turn, the only supervised part, is the answer letter and a reason (``"B. <answer text>. <reason>"``; open items:
the answer text). Images go through the folder's image processor (``Qwen2VLImageProcessor``: patches of
``patch_size``, merged ``merge_size`` x ``merge_size`` into one LM token), and each ``<|image_pad|>`` of the
template is expanded to ``grid_t * grid_h * grid_w / merge_size**2`` tokens, as the released processor does
(the processor object itself is not built: it also wants a video processor, which needs torchvision).
Volumes are shown as their middle sampled slice. Multiple choice is scored from the next-token logits of the
option letters after the generation prompt; open answers are greedy generations.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from training.data import VQAItem
from training.scale import add_lora, enable_gradient_checkpointing, freeze
from training.tasks import VLMTask, _unwrap
from training.vlm import LETTERS

INSTRUCTION = "Answer with the option letter, then a short reason."


class _QwenWrapper(torch.nn.Module):
    """Holds the Qwen model so that the loop's ``model(batch)`` contract and checkpoints work unchanged."""

    def __init__(self, qwen: torch.nn.Module):
        super().__init__()
        self.qwen = qwen

    def forward(self, batch: dict) -> torch.Tensor:
        return self.qwen(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            pixel_values=batch["pixel_values"],
            image_grid_thw=batch["image_grid_thw"],
            labels=batch["labels"],
        ).loss


class QwenVLTask(VLMTask):
    """VQA on a Qwen2-VL / Qwen2.5-VL folder (see the module docstring); items, splits and metrics as
    :class:`training.tasks.VLMTask`."""

    answer_prefix = ""  # the template's generation prompt ends in a newline

    def __init__(self, job, ref, run_dir: str | Path):
        from training.pretrained import load_qwen_vl

        self.parts = load_qwen_vl(job.model.path)
        super().__init__(job, ref, run_dir)
        self._geom = (self._geom[0], 3, self._geom[2])

    def _tokenizer(self):
        return self.parts.tokenizer

    @property
    def word_level(self) -> bool:
        return False

    def build_model(self) -> torch.nn.Module:
        """The folder's model, with frozen towers / LoRA on the language model / gradient checkpointing."""
        m, qwen = self.job.model, self.parts.model
        base = getattr(qwen, "model", qwen)
        vision = getattr(base, "visual", None) or getattr(qwen, "visual", None)
        if m.freeze_vision and vision is not None:
            freeze(vision)
        if m.freeze_lm:
            lm = getattr(base, "language_model", None)
            freeze(lm if lm is not None else qwen)
            if vision is not None and not m.freeze_vision:
                vision.requires_grad_(True)
        if m.lora is not None:
            qwen = add_lora(qwen, m.lora)
        if m.gradient_checkpointing:
            enable_gradient_checkpointing(qwen)
        return _QwenWrapper(qwen)

    def messages(self, item: VQAItem, fmt: str, with_answer: bool) -> list[dict]:
        """The conversation of an item (chat-template messages)."""
        images = [{"type": "image"}] * (2 if item.prior else 1)
        text = item.question
        if fmt == "mc":
            text += "\n" + "\n".join(f"{LETTERS[i]}. {o}" for i, o in enumerate(item.options)) + "\n" + INSTRUCTION
        msgs = [{"role": "user", "content": [*images, {"type": "text", "text": text}]}]
        if with_answer:
            msgs.append({"role": "assistant", "content": [{"type": "text", "text": self.target(item, fmt)}]})
        return msgs

    @staticmethod
    def target(item: VQAItem, fmt: str) -> str:
        """The supervised answer: ``"<letter>. <answer text>[. <reason>]"`` (multiple choice) or the answer text."""
        if fmt != "mc":
            return item.answer_text
        out = f"{item.answer}. {item.answer_text}"
        return out + (f". {item.reason}" if item.reason else "")

    def pixels(self, study: str) -> np.ndarray:
        """A study's image as ``(H, W, 3)`` float32 in 0..1 (a volume's middle sampled slice)."""
        x = self.image(study)
        return x[x.shape[0] // 2].permute(1, 2, 0).numpy().astype(np.float32)

    def example(self, item: VQAItem, fmt: str, with_answer: bool, extra: list[int] | None = None) -> dict:
        """Token ids of the rendered conversation (image pads expanded), labels on the answer and its end token,
        and the images' patches and grids."""
        tok, p = self.tokenizer, self.parts
        studies = ([item.prior] if item.prior else []) + [item.current]
        enc = p.image_processor(images=[self.pixels(s) for s in studies], do_rescale=False, return_tensors="pt")
        grid = enc["image_grid_thw"]
        text = tok.apply_chat_template(
            self.messages(item, fmt, False), chat_template=p.chat_template, tokenize=False, add_generation_prompt=True
        )
        pieces = text.split(p.image_token)
        if len(pieces) != len(studies) + 1:
            raise ValueError(f"the chat template rendered {len(pieces) - 1} image tokens for {len(studies)} images")
        counts = [int(g.prod()) // p.merge_size**2 for g in grid]
        text = pieces[0] + "".join(p.image_token * n + rest for n, rest in zip(counts, pieces[1:]))
        ids = tok(text, add_special_tokens=False)["input_ids"] + list(extra or [])
        a = (self.answer_ids(self.target(item, fmt)) + [tok.eos_token_id]) if with_answer else []
        return {
            "ids": ids + a,
            "labels": [-100] * len(ids) + a,
            "pixel_values": enc["pixel_values"],
            "image_grid_thw": grid,
            "n_images": len(studies),
        }

    def collate(self, items: list[dict]) -> dict:
        """Left-padded ids/labels/mask, patches of every image concatenated in order, grids stacked."""
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
            "input_ids": ids,
            "labels": labels,
            "attention_mask": attn,
            "pixel_values": torch.cat([it["pixel_values"] for it in items]),
            "image_grid_thw": torch.cat([it["image_grid_thw"] for it in items]),
            "n_images": torch.tensor([it["n_images"] for it in items]),
        }

    def compute_loss(self, model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, int]:
        """Answer-token cross-entropy; returns (loss, images fed)."""
        return model(batch), int(batch["n_images"].sum())

    def _mc_logits(self, model, chunk: list[VQAItem], device):
        from training.loop import to_device

        with_options = [k for k, it in enumerate(chunk) if it.options]
        if not with_options:
            return None, []
        shared, _ = self.letter_choice(max(len(chunk[k].options) for k in with_options))
        batch = to_device(
            self.collate([self.example(chunk[k], "mc", False, extra=shared) for k in with_options]), device
        )
        out = _unwrap(model).qwen(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            pixel_values=batch["pixel_values"],
            image_grid_thw=batch["image_grid_thw"],
            logits_to_keep=1,
        )
        return out.logits[:, -1].float(), with_options

    def _generate(self, model, chunk: list[VQAItem], device) -> list[list[int]]:
        from training.loop import to_device

        batch = to_device(self.collate([self.example(it, "open", False) for it in chunk]), device)
        tok = self.tokenizer
        out = _unwrap(model).qwen.generate(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            pixel_values=batch["pixel_values"],
            image_grid_thw=batch["image_grid_thw"],
            max_new_tokens=self.job.model.max_new_tokens,
            do_sample=False,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
        gen = out[:, batch["input_ids"].shape[1] :].tolist()
        return [g[: g.index(tok.eos_token_id)] if tok.eos_token_id in g else g for g in gen]

    def save_artifacts(self, run_dir: Path) -> None:
        """Tokenizer, chat template and image processor config beside the checkpoint (a released folder's parts)."""
        super().save_artifacts(run_dir)
        (Path(run_dir) / "chat_template.jinja").write_text(self.parts.chat_template)
        self.parts.image_processor.save_pretrained(str(Path(run_dir) / "tokenizer"))
