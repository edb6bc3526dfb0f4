"""``vqa``: comparative (and single-study) multiple-choice VQA items."""

import pyarrow as pa

from schemas.base import versioned

SCHEMA = versioned(
    "vqa",
    "1.1.0",
    [
        pa.field("item_id", pa.string(), nullable=False),
        pa.field("pair_id", pa.string()),
        pa.field("study_key", pa.string()),
        pa.field("patient_key", pa.string(), nullable=False),
        pa.field("question_type", pa.string(), nullable=False),
        pa.field("question", pa.string(), nullable=False),
        pa.field("study_keys", pa.list_(pa.string())),  # the images' studies: [study] or [prior, current]
        pa.field("options", pa.list_(pa.string()), nullable=False),
        pa.field("option_keys", pa.list_(pa.string())),  # option vocabulary keys in shown (seeded) order
        pa.field("answer", pa.string(), nullable=False),  # option letter A-F
        pa.field("answer_text", pa.string(), nullable=False),
        pa.field("entity_ids", pa.list_(pa.string()), nullable=False),
        pa.field("mention_ids", pa.list_(pa.string())),  # entity_mentions the answer rests on
        pa.field("split", pa.string(), nullable=False),
        pa.field("shard", pa.int32(), nullable=False),
    ],
    key=["item_id"],
)
