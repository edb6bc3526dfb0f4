"""A synthetic release for the GPU check and the data benchmark (no patient data, no download).

Patients get two chest radiographs (a longitudinal pair) and every sixth a CT volume; three findings paint a
bright square at a finding-specific place when ``present``. The release has ``studies``, ``images``,
``study_labels``, ``splits``, ``pairs``, ``vqa`` (presence and comparison items, options A-D, a reason) and
``retrieval_targets`` (same split and family, other patients, same state; relevance graded by how many of the
three findings the two studies share), published with ``etl.snapshots.publish`` like a real release.
"""

from __future__ import annotations

import hashlib
import io
import random
from pathlib import Path

import numpy as np
from PIL import Image

from etl.storage import Storage
from schemas.base import table_from_rows
from schemas.tables import SCHEMAS

ENTITIES = ("F001", "F002", "F003")
_OPTIONS = ["in the prior study only", "in the current study only", "in both studies", "in neither study"]


def _png(states: dict[str, str], rng: np.random.Generator, size: int) -> bytes:
    img = rng.integers(0, 60, (size, size)).astype(np.uint8)
    for i, e in enumerate(ENTITIES):
        if states[e] == "present":
            r0, c0 = size // 16 + i * size // 3, size // 4 + (i % 2) * size // 3
            img[r0 : r0 + size // 4, c0 : c0 + size // 4] = 230
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def _npy(states: dict[str, str], rng: np.random.Generator, size: int, slices: int) -> bytes:
    vol = rng.normal(-800, 50, (slices, size, size)).astype(np.float32)
    for i, e in enumerate(ENTITIES):
        if states[e] == "present":
            r0 = size // 16 + i * size // 3
            vol[1 : slices - 1, r0 : r0 + size // 4, size // 4 : size // 2] = 200.0
    buf = io.BytesIO()
    np.save(buf, vol)
    return buf.getvalue()


def synthetic_release(
    root: str | Path, n_patients: int = 64, size: int = 32, ct_slices: int = 6, seed: int = 0
) -> Storage:
    """Publish the synthetic release (version 0.1.0) under ``root`` and return its storage.

    Splits: 70% train, 15% val, 15% test by patient (at least one patient each)."""
    rng, pick = np.random.default_rng(seed), random.Random(seed)
    t: dict[str, list[dict]] = {k: [] for k in SCHEMAS}
    n_val = max(1, n_patients * 15 // 100)
    states_of: dict[str, dict[str, str]] = {}
    split_of: dict[str, str] = {}
    fam_of: dict[str, str] = {}
    for p in range(n_patients):
        pk = f"p{p:05d}"
        split = "train" if p < n_patients - 2 * n_val else ("val" if p < n_patients - n_val else "test")
        split_of[pk] = split
        t["splits"].append({"patient_key": pk, "institution": "synthetic", "split": split, "shard": 0})
        studies = [(f"{pk}-s{s}", "CR", "2D-CXR") for s in range(2)] + (
            [(f"{pk}-ct", "CT", "3D-CT")] if p % 6 == 0 else []
        )
        for sk, mod, fam in studies:
            st = {e: pick.choice(["present", "absent"]) for e in ENTITIES}
            states_of[sk], fam_of[sk] = st, fam
            payload = _png(st, rng, size) if mod == "CR" else _npy(st, rng, size // 2, ct_slices)
            t["studies"].append(
                {
                    "study_key": sk,
                    "patient_key": pk,
                    "institution": "synthetic",
                    "country": "US",
                    "modality": mod,
                    "family": fam,
                    "n_series": 1,
                    "n_images": 1,
                    "shard": 0,
                }
            )
            t["images"].append(
                {
                    "image_key": f"{sk}-i",
                    "series_key": f"{sk}-se",
                    "study_key": sk,
                    "patient_key": pk,
                    "institution": "synthetic",
                    "modality": mod,
                    "view": "PA" if mod == "CR" else "AXIAL",
                    "kind": "2d" if mod == "CR" else "3d",
                    "rows": size if mod == "CR" else size // 2,
                    "cols": size if mod == "CR" else size // 2,
                    "n_slices": 1 if mod == "CR" else ct_slices,
                    "payload_format": "png" if mod == "CR" else "npy",
                    "payload": payload,
                    "spacing_mm": [0.5, 0.5] if mod == "CR" else [1.0, 1.0, 2.5],
                    "payload_sha256": hashlib.sha256(payload).hexdigest(),
                    "recipe": "[]",
                    "transfer_syntax": "1.2.840.10008.1.2.1",
                    "shard": 0,
                }
            )
            for e, s in st.items():
                t["study_labels"].append(
                    {
                        "study_key": sk,
                        "patient_key": pk,
                        "family": fam,
                        "entity_id": e,
                        "state": s,
                        "change": "none",
                        "shard": 0,
                    }
                )
                ans = "A" if s == "present" else "B"
                t["vqa"].append(
                    {
                        "item_id": f"{sk}-{e}-presence",
                        "study_key": sk,
                        "patient_key": pk,
                        "question_type": "presence",
                        "question": f"Is there {e.lower()} in this image?",
                        "options": ["present", "absent", "uncertain", "not assessable"],
                        "answer": ans,
                        "answer_text": "present" if ans == "A" else "absent",
                        "reason": f"the report states {e.lower()} is {s}",
                        "entity_ids": [e],
                        "split": split,
                        "shard": 0,
                    }
                )
        prior, cur = states_of[f"{pk}-s0"], states_of[f"{pk}-s1"]
        pid = f"{pk}-pair"
        t["pairs"].append(
            {
                "pair_id": pid,
                "patient_key": pk,
                "prior_study_key": f"{pk}-s0",
                "current_study_key": f"{pk}-s1",
                "family": "2D-CXR",
                "modality": "CR",
                "view": "PA",
                "gap_days": 30,
                "change_labels": [],
                "n_conflicts": 0,
                "shard": 0,
            }
        )
        for e in ENTITIES:
            key = {
                ("present", "absent"): 0,
                ("absent", "present"): 1,
                ("present", "present"): 2,
                ("absent", "absent"): 3,
            }[(prior[e], cur[e])]
            t["vqa"].append(
                {
                    "item_id": f"{pid}-{e}-change",
                    "pair_id": pid,
                    "patient_key": pk,
                    "question_type": "change",
                    "question": f"In which of the two studies is there {e.lower()}?",
                    "options": _OPTIONS,
                    "answer": "ABCD"[key],
                    "answer_text": _OPTIONS[key],
                    "reason": "compared with the prior report",
                    "entity_ids": [e],
                    "split": split,
                    "shard": 0,
                }
            )
    present: dict[tuple[str, str], list[str]] = {}
    for sk, st in states_of.items():
        for e, s in st.items():
            if s == "present":
                present.setdefault((fam_of[sk], e), []).append(sk)
    for (fam, e), studies in present.items():
        for q in studies:
            qp = q.rsplit("-", 1)[0]
            cands = [c for c in studies if c.rsplit("-", 1)[0] != qp and split_of[c.rsplit("-", 1)[0]] == split_of[qp]]
            shared = {c: sum(states_of[c][x] == states_of[q][x] for x in ENTITIES) / len(ENTITIES) for c in cands}
            for rank, c in enumerate(sorted(cands, key=lambda c: (-shared[c], c))[:10]):
                t["retrieval_targets"].append(
                    {
                        "query_study_key": q,
                        "entity_id": e,
                        "candidate_study_key": c,
                        "rank": rank + 1,
                        "relevance": shared[c],
                        "family": fam,
                        "state": "present",
                        "query_patient_key": qp,
                        "candidate_patient_key": c.rsplit("-", 1)[0],
                        "split": split_of[qp],
                        "shard": 0,
                    }
                )
    st = Storage.open(str(root))
    for name, rows in t.items():
        st.write_table(
            f"curated/{name}/shard=00000/part-0.parquet",
            table_from_rows(rows, SCHEMAS[name]),
            row_group_size=64 if name == "images" else None,
        )
    from etl.snapshots import publish

    publish(st, config_hash="synthetic", ontology_version="synthetic", run_id="synthetic", key_fingerprint="none")
    return st


#: Qwen2-0.5B's shape (config.json of Qwen/Qwen2-0.5B): 24 layers, width 896, 14 heads (2 key/value), MLP 4864
QWEN2_0_5B = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
}
QWEN2_TINY = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "tie_word_embeddings": True,
}


def qwen2_lm_folder(root: str | Path, shape: dict, texts: list[str]) -> Path:
    """A randomly initialised ``Qwen2ForCausalLM`` of ``shape`` saved with a byte-level BPE tokenizer trained on
    ``texts`` (Qwen's special tokens; no BOS, pad ``<|endoftext|>``, EOS ``<|im_end|>``): a stand-in for a
    downloaded Qwen2 folder of the same size where no weights can be fetched."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=min(shape["vocab_size"], 2000),
            special_tokens=special,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    cfg = Qwen2Config(
        max_position_embeddings=4096,
        bos_token_id=None,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        **{**shape, "vocab_size": max(shape["vocab_size"], len(fast))},
    )
    out = Path(root) / "qwen2-lm"
    Qwen2ForCausalLM(cfg).save_pretrained(out)
    fast.save_pretrained(out)
    return out
