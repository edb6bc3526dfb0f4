"""``retrieval_targets``: per (query study, entity), its top-k relevant studies of other patients (sparse).

Built by :func:`etl.assemble.retrieval.build_retrieval_targets` across all shards; stored in the query study's shard.
Query and candidate are in the same split and the same modality family, never of the same patient.
"""

import pyarrow as pa

from schemas.base import versioned

SCHEMA = versioned(
    "retrieval_targets",
    "1.0.0",
    [
        pa.field("query_study_key", pa.string(), nullable=False),
        pa.field("entity_id", pa.string(), nullable=False),
        pa.field("candidate_study_key", pa.string(), nullable=False),
        pa.field("rank", pa.int32(), nullable=False),  # 1 = most relevant
        pa.field("relevance", pa.float32(), nullable=False),  # per-entity similarity in (threshold, 1]
        pa.field("family", pa.string(), nullable=False),
        pa.field("state", pa.string(), nullable=False),  # the query's (and candidate's) entity state
        pa.field("query_patient_key", pa.string(), nullable=False),
        pa.field("candidate_patient_key", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),  # query and candidate share it
        pa.field("shard", pa.int32(), nullable=False),  # the query study's shard
    ],
    key=["query_study_key", "entity_id", "candidate_study_key"],
)
