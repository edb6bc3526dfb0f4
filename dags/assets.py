"""The Airflow Assets that connect the MedReCo DAGs (data-aware scheduling). No DAG lives here."""

from __future__ import annotations

from airflow.sdk import Asset, AssetAny

from etl.pipeline.runtime import default_config_path
from schemas.config import ConfigError, load_config

#: emitted by ``medreco_build`` on publish; its event ``extra`` carries version, content_hash and uri
SNAPSHOT_ASSET = Asset("medreco://snapshot")


def source_asset(institution: str) -> Asset:
    """The Asset that stands for one institution's delivery (emitted by its ingestion DAG)."""
    return Asset(f"medreco://sources/{institution}")


def configured_institutions() -> list[str]:
    """Institution ids of the deployment's config (``$MEDRECO_CONFIG``), read at parse time (small YAML).

    A broken config gives an empty list here; the build DAG reports the error when it runs.
    """
    try:
        return [i.id for i in load_config(default_config_path()).institutions]
    except ConfigError:
        return []


def any_delivery() -> AssetAny | None:
    """Schedule of the build DAG: a new delivery from any institution (None when there are none)."""
    ids = configured_institutions()
    return AssetAny(*(source_asset(i) for i in ids)) if ids else None
