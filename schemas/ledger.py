"""``ledger``: one row per input file per run (restricted zone: names source paths, never copies values).

Statuses: ``ingested`` | ``quarantined`` (with a reason code) | ``duplicate`` (same sha256 earlier in
the run) | ``skipped`` (not an input kind, e.g. a README beside the DICOM files).
"""

import pyarrow as pa

from schemas.base import versioned

STATUSES = ("ingested", "quarantined", "duplicate", "skipped")

SCHEMA = versioned(
    "ledger",
    "1.0.0",
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("source_uri", pa.string(), nullable=False),
        pa.field("sha256", pa.string(), nullable=False),
        pa.field("bytes", pa.int64(), nullable=False),
        pa.field("institution", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),  # dicom | report | other
        pa.field("shard", pa.int32()),
        pa.field("status", pa.string(), nullable=False),
        pa.field("stage", pa.string()),  # stage that set the status (discover, deidentify, normalise, reports)
        pa.field("reason", pa.string()),  # reason code, never a value from the file
        pa.field("detail", pa.string()),  # human-readable, PHI-free explanation
        pa.field("duplicate_of", pa.string()),  # source_uri of the first copy
    ],
    key=["run_id", "source_uri"],
)
