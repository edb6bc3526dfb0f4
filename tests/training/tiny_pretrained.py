"""Tiny randomly initialised pretrained folders, saved the way released checkpoints are laid out.

Each builder makes a model from its class's config with small sizes, ``save_pretrained``s it (and its tokenizer,
image processor config, chat template) into a folder, and returns the folder: tests then load it through the
job config's ``path:`` exactly as a user's downloaded checkpoint would be.
"""

from __future__ import annotations

import json
from pathlib import Path

#: the Qwen2-VL / Qwen2.5-VL chat template as released (chat_template.json of the Qwen2.5-VL-*-Instruct folders)
QWEN_VL_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}"
    "<|im_end|>\n{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in "
    "content or 'image_url' in content %}{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}"
    "Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] "
    "== 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}"
    "Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content "
    "%}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "<|im_start|>assistant\n{% endif %}"
)
QWEN_SPECIAL = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
_CORPUS = (
    "system You are a helpful assistant. user assistant question answer options entity A. B. C. D. "
    "Is there a pleural effusion in the prior study? present absent in both studies in neither study "
    "increased decreased unchanged new resolved Answer with the option letter, then a short reason."
)


def bpe_tokenizer(special: list[str], vocab_size: int = 400, **tokens):
    """A byte-level BPE tokenizer (any text encodes) with ``special`` tokens first (ids 0..)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        [_CORPUS] * 4,
        trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, **tokens)


def vision_folder(root: Path, kind: str, image_size: int = 32) -> Path:
    """A tiny ``vit`` | ``dinov2`` | ``swin`` | ``siglip_vision`` checkpoint with its image processor config."""
    import transformers as tf

    common = {"image_size": image_size, "num_channels": 3}
    if kind == "vit":
        model = tf.ViTModel(
            tf.ViTConfig(
                patch_size=8, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, **common
            ),
            add_pooling_layer=False,
        )
    elif kind == "dinov2":
        model = tf.Dinov2Model(
            tf.Dinov2Config(
                patch_size=8, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, mlp_ratio=2, **common
            )
        )
    elif kind == "swin":
        model = tf.SwinModel(
            tf.SwinConfig(patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4, **common)
        )
    elif kind == "siglip_vision":
        model = tf.SiglipVisionModel(
            tf.SiglipVisionConfig(
                patch_size=8, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, **common
            )
        )
    else:
        raise ValueError(kind)
    out = root / kind
    model.save_pretrained(out)
    (out / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "ViTImageProcessor",
                "do_normalize": True,
                "image_mean": [0.485, 0.456, 0.406],
                "image_std": [0.229, 0.224, 0.225],
                "size": {"height": image_size, "width": image_size},
            }
        )
    )
    return out


def causal_lm_folder(root: Path, kind: str) -> Path:
    """A tiny ``qwen2`` (tokenizer without BOS, pad ``<|endoftext|>``) or ``llama3`` (tokenizer without pad token)
    causal LM folder with its tokenizer; the model's vocabulary is larger than the tokenizer's (as Qwen's is)."""
    import transformers as tf

    if kind == "qwen2":
        tok = bpe_tokenizer(QWEN_SPECIAL, eos_token="<|im_end|>", pad_token="<|endoftext|>")
        cfg = tf.Qwen2Config(
            vocab_size=len(tok) + 16,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            bos_token_id=None,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
        model = tf.Qwen2ForCausalLM(cfg)
    elif kind == "llama3":
        tok = bpe_tokenizer(["<|begin_of_text|>", "<|eot_id|>"], bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
        assert tok.pad_token is None
        cfg = tf.LlamaConfig(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
        )
        model = tf.LlamaForCausalLM(cfg)
    else:
        raise ValueError(kind)
    out = root / kind
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def qwen2_5_vl_folder(root: Path) -> Path:
    """A tiny Qwen2.5-VL folder as released: weights + config, tokenizer files, ``preprocessor_config.json``
    (Qwen2VLImageProcessor) and ``chat_template.json`` side by side (the template is not in the tokenizer config)."""
    import transformers as tf
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tok = bpe_tokenizer(QWEN_SPECIAL, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    ids = {s: tok.convert_tokens_to_ids(s) for s in QWEN_SPECIAL}
    cfg = tf.Qwen2_5_VLConfig(
        text_config={
            "vocab_size": len(tok),
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 1024,
            "bos_token_id": None,
            "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"],
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]},
        },
        vision_config={
            "depth": 1,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 4,
            "patch_size": 4,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "out_hidden_size": 32,
            "window_size": 16,
            "fullatt_block_indexes": [0],
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        bos_token_id=None,
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    )
    out = root / "qwen2_5_vl"
    tf.Qwen2_5_VLForConditionalGeneration(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    Qwen2VLImageProcessorPil(
        patch_size=4, merge_size=2, temporal_patch_size=2, min_pixels=32 * 32, max_pixels=32 * 32
    ).save_pretrained(out)
    (out / "chat_template.json").write_text(json.dumps({"chat_template": QWEN_VL_TEMPLATE}))
    return out
