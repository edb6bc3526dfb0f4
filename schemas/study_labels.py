"""``study_labels``: per study and entity, the state used for entity-conditioned retrieval."""

import pyarrow as pa

from schemas.base import versioned

STATES = ("present", "absent", "uncertain", "not_mentioned")

SCHEMA = versioned(
    "study_labels",
    "1.0.0",
    [
        pa.field("study_key", pa.string(), nullable=False),
        pa.field("patient_key", pa.string(), nullable=False),
        pa.field("family", pa.string(), nullable=False),
        pa.field("entity_id", pa.string(), nullable=False),
        pa.field("state", pa.string(), nullable=False),
        pa.field("change", pa.string(), nullable=False),  # change stated in the report, or none
        pa.field("shard", pa.int32(), nullable=False),
    ],
    key=["study_key", "entity_id"],
)
