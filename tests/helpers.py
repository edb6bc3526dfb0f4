"""Small helpers shared by several test modules (imported as ``helpers``; pytest puts tests/ on sys.path)."""

from __future__ import annotations

from datetime import datetime

import polars as pl
from pydicom import config
from pydicom.dataset import Dataset

#: a fixed reference time for hand-built study frames
T0 = datetime(2031, 3, 4, 9, 30)
#: the studies columns pairs/VQA read, in the order the tests build their rows
STUDY_SCHEMA = {
    "study_key": pl.Utf8,
    "patient_key": pl.Utf8,
    "family": pl.Utf8,
    "modality": pl.Utf8,
    "study_datetime": pl.Datetime("us"),
    "shard": pl.Int32,
}
#: the study_labels columns pairs/VQA read
LABEL_SCHEMA = {
    "study_key": pl.Utf8,
    "entity_id": pl.Utf8,
    "state": pl.Utf8,
    "change": pl.Utf8,
    "shard": pl.Int32,
}


def decode_strictly(ds: Dataset) -> None:
    """Decode every text value under the dataset's declared character set; raise on any mismatch."""
    old = config.settings.reading_validation_mode
    config.settings.reading_validation_mode = config.RAISE
    try:
        ds.decode()
    finally:
        config.settings.reading_validation_mode = old


def run_pixel_stages(base, source, institution: str, key, shard_count: int = 1, run_id: str = "test-run"):
    """Discover, de-identify and normalise one DICOM folder through the build stages (no Airflow).

    ``base`` holds the storage root (``base/root``); ``source`` is the institution's source folder. Returns the
    :class:`etl.pipeline.context.BuildContext` of the run (reports, ledger and later stages are the caller's).
    """
    import yaml

    from etl.pipeline import stages
    from etl.pipeline.context import BuildContext
    from schemas.config import parse_config

    cfg = parse_config(
        yaml.safe_load(f"""
storage: {{root: {base / "root"}}}
shard_count: {shard_count}
institutions: [{{id: {institution}, country: US, language: en, timezone: America/New_York, source_uri: {source},
                report_format: none}}]
""")
    )
    ctx = BuildContext.from_config(cfg, run_id, key)
    stages.discover(ctx, institution)
    for batch in stages.plan(ctx):
        for shard in batch:
            stages.deidentify_shard(ctx, shard)
            stages.normalise_shard(ctx, shard)
    return ctx


def demo_sources(base, seed: int = 11, n_patients: int = 8):
    """Generate a small demo corpus under ``base/template`` once (a module fixture's work); returns ``base``."""
    from etl.demo.corpus import generate_corpus

    generate_corpus(base / "template", seed=seed, n_patients=n_patients)
    return base


def fresh_root(base, name: str):
    """A new storage root ``base/name`` holding a copy of the template corpus's ``sources/``."""
    import shutil

    root = base / name
    shutil.copytree(base / "template" / "sources", root / "sources")
    return root


def demo_config_with_empty_sources(tmp_path):
    """``config/demo.yaml`` with its storage root in ``tmp_path`` and every institution's source folder there,
    empty: a run on it gets past the source checks (``etl.sources.source_access``) on a clean clone too."""
    import yaml

    from schemas.config import PROJECT_ROOT

    data = yaml.safe_load((PROJECT_ROOT / "config" / "demo.yaml").read_text())
    root = tmp_path / "root"
    data["storage"]["root"] = str(root)
    for inst in data["institutions"]:
        (root / inst["source_uri"]).mkdir(parents=True, exist_ok=True)
    path = tmp_path / "demo-empty-sources.yaml"
    path.write_text(yaml.safe_dump(data))
    return path
