"""``vqa``: comparative (and single-study) VQA items: multiple choice and open-ended.

2.0.0: open-ended items (``answer_format`` ``open_ended``: ``options`` and ``option_keys`` empty, ``answer`` null,
the free-text answer in ``answer_text``), two-case comparison items (``reference_study_key``) and ``reason``.
"""

import pyarrow as pa

from schemas.base import versioned

ANSWER_FORMATS = ("multiple_choice", "open_ended")

SCHEMA = versioned(
    "vqa",
    "2.0.0",
    [
        pa.field("item_id", pa.string(), nullable=False),
        pa.field("pair_id", pa.string()),
        pa.field("study_key", pa.string()),  # the study of a single-study item; the query study of a two-case item
        pa.field("reference_study_key", pa.string()),  # two-case items: the reference case (another patient)
        pa.field("patient_key", pa.string(), nullable=False),
        pa.field("question_type", pa.string(), nullable=False),
        pa.field("answer_format", pa.string()),  # multiple_choice | open_ended (null read as multiple_choice)
        pa.field("question", pa.string(), nullable=False),
        # the images' studies: [study], [prior, current] or [reference, query]
        pa.field("study_keys", pa.list_(pa.string())),
        pa.field("options", pa.list_(pa.string()), nullable=False),  # empty for open-ended items
        pa.field("option_keys", pa.list_(pa.string())),  # option vocabulary keys in shown (seeded) order
        pa.field("answer", pa.string()),  # option letter A-F; null for open-ended items
        pa.field("answer_text", pa.string(), nullable=False),  # the right option's text, or the free-text answer
        pa.field("reason", pa.string()),  # short reason from the report evidence (two-case items)
        pa.field("entity_ids", pa.list_(pa.string()), nullable=False),
        pa.field("mention_ids", pa.list_(pa.string())),  # entity_mentions the answer rests on
        pa.field("split", pa.string(), nullable=False),
        pa.field("shard", pa.int32(), nullable=False),
    ],
    key=["item_id"],
)
