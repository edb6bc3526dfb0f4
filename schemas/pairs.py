"""``pairs``: longitudinal (prior, current) study pairs and their per-entity change labels."""

import pyarrow as pa

from schemas.base import versioned

CHANGE_LABEL = pa.struct(
    [
        pa.field("entity_id", pa.string()),
        pa.field("change", pa.string()),  # new | increased | decreased | unchanged | resolved | improved | worsened
        pa.field("source", pa.string()),  # stated | state_difference
    ]
)

SCHEMA = versioned(
    "pairs",
    "1.0.0",
    [
        pa.field("pair_id", pa.string(), nullable=False),
        pa.field("patient_key", pa.string(), nullable=False),
        pa.field("prior_study_key", pa.string(), nullable=False),
        pa.field("current_study_key", pa.string(), nullable=False),
        pa.field("family", pa.string(), nullable=False),
        pa.field("modality", pa.string(), nullable=False),
        pa.field("view", pa.string()),
        pa.field("gap_days", pa.int32(), nullable=False),
        pa.field("change_labels", pa.list_(CHANGE_LABEL), nullable=False),
        pa.field("n_conflicts", pa.int32(), nullable=False),
        pa.field("shard", pa.int32(), nullable=False),
    ],
    key=["pair_id"],
)
