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
