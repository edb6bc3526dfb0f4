"""Curated partitions: one per shard; images further by institution and modality; re-runs replace exactly."""

from __future__ import annotations

import pyarrow.parquet as pq
import yaml

from etl.pipeline.context import BuildContext
from etl.pipeline.stages import _shard_table, write_partition
from schemas import images as images_schema
from schemas.config import parse_config


def _img(key: str, inst: str, modality: str) -> dict:
    return {
        "image_key": key,
        "series_key": "se",
        "study_key": "st",
        "patient_key": "p",
        "institution": inst,
        "modality": modality,
        "kind": "2d",
        "rows": 16,
        "cols": 16,
        "n_slices": 1,
        "payload_format": "png",
        "payload": b"x" * 10,
        "payload_sha256": "0" * 64,
        "recipe": "{}",
        "transfer_syntax": "1.2.840.10008.1.2.1",
        "shard": 3,
    }


def test_images_partitioned_by_institution_and_modality_and_rewritten_exactly(tmp_path, key):
    cfg = parse_config(
        yaml.safe_load(f"""
storage: {{root: {tmp_path / "root"}}}
institutions: [{{id: us-a, country: US, language: en, timezone: America/New_York, source_uri: sources/us-a}}]
""")
    )
    ctx = BuildContext.from_config(cfg, "r", key)
    write_partition(
        ctx,
        "images",
        images_schema.SCHEMA,
        3,
        [_img("b", "us-a", "CR"), _img("a", "us-a", "CR"), _img("c", "gb-b", "CT")],
    )
    files = ctx.storage.list_files("curated/images")
    assert files == [
        "curated/images/institution=gb-b/modality=CT/shard=00003.parquet",
        "curated/images/institution=us-a/modality=CR/shard=00003.parquet",
    ]
    meta = pq.ParquetFile(ctx.storage.path(files[1])).metadata
    assert meta.num_rows == 2 and meta.row_group(0).num_rows == 2
    assert _shard_table(ctx, "images", images_schema.SCHEMA, 3)["image_key"].to_pylist() == ["c", "a", "b"]
    # a re-run of shard 3 whose content moved: the old partition files of that shard are gone
    write_partition(ctx, "images", images_schema.SCHEMA, 3, [_img("d", "us-a", "DX")])
    assert ctx.storage.list_files("curated/images") == [
        "curated/images/institution=us-a/modality=DX/shard=00003.parquet"
    ]
    assert _shard_table(ctx, "images", images_schema.SCHEMA, 4).num_rows == 0
