"""``entity_mentions``: one row per entity mention in a report."""

import pyarrow as pa

from schemas.base import versioned

ASSERTIONS = ("present", "absent", "uncertain")
TEMPORALITIES = ("current", "historical", "hypothetical")
CHANGES = ("new", "increased", "decreased", "unchanged", "resolved", "improved", "worsened", "none")

SCHEMA = versioned(
    "entity_mentions",
    "1.0.0",
    [
        pa.field("mention_id", pa.string(), nullable=False),
        pa.field("report_id", pa.string(), nullable=False),
        pa.field("study_key", pa.string()),
        pa.field("patient_key", pa.string()),
        pa.field("entity_id", pa.string(), nullable=False),
        pa.field("category", pa.string(), nullable=False),  # anatomy | finding | condition
        pa.field("span_start", pa.int32(), nullable=False),  # character offsets in reports.text
        pa.field("span_end", pa.int32(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("section", pa.string()),
        pa.field("sentence", pa.string()),
        pa.field("assertion", pa.string(), nullable=False),
        pa.field("temporality", pa.string(), nullable=False),
        pa.field("change", pa.string(), nullable=False),
        pa.field("laterality", pa.string()),  # left | right | bilateral | null
        pa.field("severity", pa.string()),  # mild | moderate | severe | small | large | null
        pa.field("anatomy_id", pa.string()),
        pa.field("shard", pa.int32(), nullable=False),
    ],
    key=["mention_id"],
)
