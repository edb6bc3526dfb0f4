"""Bounded-memory processing of per-patient work in groups of whole patient-hash shards.

Every study of a patient lies in one shard (:meth:`etl.keys.PseudonymKey.shard`), so anything computed per
patient (pairs, pair and study VQA items, per-shard yes/no balancing) gives the same rows whether it runs on all
shards at once or on groups of whole shards one after another. The build calls such functions one shard at a
time; a caller holding a whole archive (a backfill, ``benchmarks/bench_pairs.py``) gets the same result with the
peak memory of one group instead of one that grows with the archive.
"""

from __future__ import annotations

from typing import overload

import polars as pl

#: default bound on the studies of one group (about 1.3 M ``study_labels`` rows for a 2D-CXR archive)
DEFAULT_MAX_STUDIES = 20_000


def shard_groups(shards: pl.Series, max_rows: int = DEFAULT_MAX_STUDIES) -> list[list[int]]:
    """Consecutive groups of shard numbers (ascending) holding at most ``max_rows`` rows each.

    Parameters
    ----------
    shards : polars.Series
        one shard number (integer) per row, e.g. ``studies["shard"]``; nulls are not allowed.
    max_rows : int
        bound on the rows of one group (>= 1); a shard with more rows than this forms a group of its own.

    Returns
    -------
    list of list of int
        every distinct shard exactly once, in ascending order; an empty list for an empty series.

    Raises
    ------
    ValueError
        when ``max_rows < 1`` or ``shards`` has a null.
    """
    if max_rows < 1:
        raise ValueError(f"max_rows must be at least 1, got {max_rows}")
    if shards.null_count():
        raise ValueError("shard numbers must not be null")
    counts = shards.value_counts(name="n").sort(shards.name)
    groups: list[list[int]] = []
    size = 0
    for shard, n in counts.iter_rows():
        if groups and size + n <= max_rows:
            groups[-1].append(int(shard))
            size += n
        else:
            groups.append([int(shard)])
            size = n
    return groups


def study_keys_of(studies: pl.DataFrame, group: list[int]) -> pl.Series:
    """The ``study_key`` values of ``studies`` whose ``shard`` is in ``group``."""
    return studies.filter(pl.col("shard").is_in(group)).get_column("study_key")


@overload
def rows_of(df: pl.DataFrame, column: str, keys: pl.Series) -> pl.DataFrame: ...
@overload
def rows_of(df: None, column: str, keys: pl.Series) -> None: ...
def rows_of(df: pl.DataFrame | None, column: str, keys: pl.Series) -> pl.DataFrame | None:
    """Rows of ``df`` whose ``column`` is in ``keys`` (``df`` unchanged when None, empty or without the column)."""
    if df is None or df.height == 0 or column not in df.columns:
        return df
    return df.filter(pl.col(column).is_in(keys.implode()))
