"""``reports``: de-identified report text, its sections and redaction counts."""

import pyarrow as pa

from schemas.base import versioned

SCHEMA = versioned(
    "reports",
    "1.0.0",
    [
        pa.field("report_id", pa.string(), nullable=False),  # pseudonym of the source report id
        pa.field("study_key", pa.string()),  # null when no study links
        pa.field("patient_key", pa.string()),
        pa.field("institution", pa.string(), nullable=False),
        pa.field("language", pa.string(), nullable=False),
        pa.field("link_status", pa.string(), nullable=False),  # linked | no_study | report_only_source
        pa.field("indication", pa.string()),
        pa.field("comparison", pa.string()),
        pa.field("findings", pa.string()),
        pa.field("impression", pa.string()),
        pa.field("text", pa.string(), nullable=False),  # whole de-identified text
        pa.field("redactions", pa.int32(), nullable=False),
        pa.field("redaction_counts", pa.string(), nullable=False),  # JSON {PHI type: count}
        pa.field("report_date_shifted", pa.date32()),
        pa.field("shard", pa.int32(), nullable=False),
    ],
    key=["report_id"],
)
