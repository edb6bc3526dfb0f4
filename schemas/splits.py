"""``splits``: patient_key -> train | val | test | external_test (institution held out)."""

import pyarrow as pa

from schemas.base import versioned

SPLITS = ("train", "val", "test", "external_test")

SCHEMA = versioned(
    "splits",
    "1.0.0",
    [
        pa.field("patient_key", pa.string(), nullable=False),
        pa.field("institution", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
        pa.field("shard", pa.int32(), nullable=False),
    ],
    key=["patient_key"],
)
