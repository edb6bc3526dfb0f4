"""``series``: one row per de-identified series. ``spacing_mm`` is [row, col, slice] in mm."""

import pyarrow as pa

from schemas.base import versioned

SCHEMA = versioned(
    "series",
    "1.0.0",
    [
        pa.field("series_key", pa.string(), nullable=False),
        pa.field("study_key", pa.string(), nullable=False),
        pa.field("patient_key", pa.string(), nullable=False),
        pa.field("institution", pa.string(), nullable=False),
        pa.field("modality", pa.string(), nullable=False),
        pa.field("view_position", pa.string()),
        pa.field("orientation", pa.string()),  # AXIAL | CORONAL | SAGITTAL | OBLIQUE | null
        pa.field("spacing_mm", pa.list_(pa.float64())),
        pa.field("n_instances", pa.int32(), nullable=False),
        pa.field("manufacturer", pa.string()),
        pa.field("model", pa.string()),
        pa.field("shard", pa.int32(), nullable=False),
    ],
    key=["series_key"],
)
