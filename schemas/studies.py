"""``studies``: one row per de-identified study (keys are keyed pseudonyms)."""

import pyarrow as pa

from schemas.base import versioned

SCHEMA = versioned(
    "studies",
    "1.0.0",
    [
        pa.field("study_key", pa.string(), nullable=False),
        pa.field("patient_key", pa.string(), nullable=False),
        pa.field("accession_key", pa.string()),
        pa.field("institution", pa.string(), nullable=False),
        pa.field("country", pa.string(), nullable=False),
        pa.field("modality", pa.string(), nullable=False),
        pa.field("body_part", pa.string()),
        pa.field("family", pa.string()),  # MedReCo modality family or null
        pa.field("study_datetime", pa.timestamp("us")),  # shifted, institution-local wall time
        pa.field("study_date_shifted", pa.date32()),
        pa.field("n_series", pa.int32(), nullable=False),
        pa.field("n_images", pa.int32(), nullable=False),
        pa.field("report_id", pa.string()),
        pa.field("shard", pa.int32(), nullable=False),
    ],
    key=["study_key"],
)
