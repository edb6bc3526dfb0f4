"""``deid_audit``: per de-identified file, how many elements each action touched (PHI-free counts)."""

import pyarrow as pa

from schemas.base import versioned

COUNTS = ("removed", "emptied", "replaced", "shifted", "remapped", "cleaned", "kept", "walked",
          "removed_undecodable", "pixel_regions_cleaned")

SCHEMA = versioned(
    "deid_audit",
    "1.0.0",
    [
        pa.field("sop_key", pa.string(), nullable=False),
        pa.field("study_key", pa.string(), nullable=False),
        pa.field("institution", pa.string(), nullable=False),
        *[pa.field(c, pa.int32(), nullable=False) for c in COUNTS],
        pa.field("shard", pa.int32(), nullable=False),
    ],
    key=["sop_key"],
)
