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

#: the ledger of ``medreco deid SRC OUT`` (medreco/cli/deid_folder.py): the build's columns and, per row, where its
#: result lies under OUT, so a curator can trace each input to what it became
FOLDER_SCHEMA = versioned(
    "deid_folder_ledger",
    "1.0.0",
    [
        *SCHEMA,
        pa.field("output", pa.string()),  # ingested: the de-identified file, relative to OUT (files/<sop_key>.dcm)
        pa.field("quarantine_record", pa.string()),  # quarantined: its record, relative to OUT (quarantine/<sha>.json)
    ],
    key=["run_id", "source_uri"],
)
