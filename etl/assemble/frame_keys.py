"""Key checks on polars frames that stay cheap at archive scale (10 M ``study_labels`` rows and more)."""

from __future__ import annotations

import polars as pl


def has_duplicate_keys(df: pl.DataFrame, columns: list[str] | tuple[str, ...]) -> bool:
    """True when two rows of ``df`` share the values of ``columns`` (nulls compare equal).

    One 64-bit hash per row (polars ``struct.hash``) is checked first, 8 bytes a row instead of a row encoding of
    every key; only when two hashes collide is the exact check on the key values run, so a hash collision can
    never report a duplicate that is not there.

    Parameters
    ----------
    df : polars.DataFrame
        any frame holding ``columns``.
    columns : list or tuple of str
        the key columns.

    Returns
    -------
    bool
    """
    if df.height < 2:
        return False
    suspects = df.select(pl.struct(list(columns)).hash().is_duplicated()).to_series()
    if not suspects.any():
        return False
    return bool(df.filter(suspects).select(pl.struct(list(columns)).is_duplicated().any()).item())
