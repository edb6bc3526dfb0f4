"""``instances``: internal table of de-identified DICOM instances (one row per SOP instance).

Written by the de-identification stage, read by normalisation, reports linking and study assembly.
Not published in snapshots. ``study_datetime`` is the shifted StudyDate + StudyTime (institution wall time).
"""

import pyarrow as pa

from schemas.base import versioned

SCHEMA = versioned(
    "instances",
    "1.0.0",
    [
        pa.field("sop_key", pa.string(), nullable=False),
        pa.field("series_key", pa.string(), nullable=False),
        pa.field("study_key", pa.string(), nullable=False),
        pa.field("patient_key", pa.string(), nullable=False),
        pa.field("accession_key", pa.string()),
        pa.field("institution", pa.string(), nullable=False),
        pa.field("country", pa.string(), nullable=False),
        pa.field("modality", pa.string(), nullable=False),
        pa.field("body_part", pa.string()),
        pa.field("family", pa.string()),
        pa.field("view_position", pa.string()),
        pa.field("study_datetime", pa.timestamp("us")),
        pa.field("instance_number", pa.int32()),
        pa.field("manufacturer", pa.string()),
        pa.field("model", pa.string()),
        pa.field("transfer_syntax", pa.string(), nullable=False),
        pa.field("dicom_path", pa.string(), nullable=False),  # root-relative path of the de-identified file
        pa.field("shard", pa.int32(), nullable=False),
    ],
    key=["sop_key"],
)
