"""Patient-level train / val / test splits with institution-held-out external test.

Every patient lands in exactly one split, so no patient's images leak between train and evaluation:

1. a patient seen at any institution listed in ``SplitConfig.external_test_institutions`` is
   ``external_test`` (external wins: a patient who also visited a training institution is held out
   entirely, never split across the boundary);
2. every other patient gets ``u = H(salt, patient_key)`` in ``[0, 1)`` (first 64 bits of
   sha256(``salt|patient_key``) / 2**64) and goes to ``train`` if ``u < train``, to ``val`` if
   ``u < train + val``, else to ``test``.

The hash depends on nothing but the salt and the pseudonym, so the assignment is the same whatever
the shard layout, row order, or the other patients in the input, and it is stable across re-runs and
across snapshots as long as the salt is kept.
"""

from __future__ import annotations

import hashlib

import polars as pl
import pyarrow as pa

from schemas.base import table_from_rows
from schemas.config import SplitConfig
from schemas.splits import SCHEMA

DEFAULT_SALT = "medreco-splits-v1"
_COLUMNS = ("patient_key", "institution", "shard")


class SplitInputError(ValueError):
    """Bad input to :func:`assign_splits`; ``reason`` is a machine-readable code.

    Reason codes: ``missing_column``, ``null_value``, ``patient_in_several_shards``, ``empty_salt``.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"[{reason}] {message}")
        self.reason = reason


def split_fraction(patient_key: str, salt: str = DEFAULT_SALT) -> float:
    """Stable position of a patient in ``[0, 1)``: first 8 bytes of sha256(``salt|patient_key``) / 2**64."""
    digest = hashlib.sha256(f"{salt}|{patient_key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def hashed_split(patient_key: str, cfg: SplitConfig, salt: str = DEFAULT_SALT) -> str:
    """``train``, ``val`` or ``test`` for a patient outside the external-test institutions."""
    u = split_fraction(patient_key, salt)
    if u < cfg.train:
        return "train"
    if u < cfg.train + cfg.val:
        return "val"
    return "test"


def assign_splits(patients: pl.DataFrame, cfg: SplitConfig, salt: str = DEFAULT_SALT) -> pa.Table:
    """Assign each patient of one shard to one split.

    Parameters
    ----------
    patients : polars.DataFrame
        columns ``patient_key`` (str), ``institution`` (str), ``shard`` (int); one row per (patient,
        institution) visit, repeats allowed (e.g. the ``studies`` table's columns).
    cfg : schemas.config.SplitConfig
        ``train``/``val``/``test`` fractions (summing to 1) and ``external_test_institutions``.
    salt : str
        domain separator of the hash; changing it reshuffles every non-external patient.

    Returns
    -------
    pyarrow.Table
        :data:`schemas.splits.SCHEMA`, one row per ``patient_key``, sorted by it. ``institution`` is the
        institution that decided the split: for ``external_test`` the alphabetically first external
        institution the patient visited, otherwise the alphabetically first institution.

    Raises
    ------
    SplitInputError
        on a missing column, a null value, an empty salt, or a patient whose rows carry different shards.
    """
    if not salt:
        raise SplitInputError("empty_salt", "the split salt must be a non-empty string")
    if patients.height == 0:
        return SCHEMA.empty_table()
    missing = [c for c in _COLUMNS if c not in patients.columns]
    if missing:
        raise SplitInputError("missing_column", f"patients lacks column(s) {missing}")
    for c in _COLUMNS:
        n = patients.get_column(c).null_count()
        if n:
            raise SplitInputError("null_value", f"patients.{c} has {n} null value(s)")

    external = set(cfg.external_test_institutions)
    institutions: dict[str, set[str]] = {}
    shards: dict[str, int] = {}
    for patient_key, institution, shard in patients.select(_COLUMNS).iter_rows():
        institutions.setdefault(patient_key, set()).add(institution)
        if shards.setdefault(patient_key, shard) != shard:
            raise SplitInputError("patient_in_several_shards", "a patient's rows carry different shards")

    rows = []
    for patient_key in sorted(institutions):
        visited = institutions[patient_key]
        held_out = sorted(visited & external)
        if held_out:
            split, institution = "external_test", held_out[0]
        else:
            split, institution = hashed_split(patient_key, cfg, salt), min(visited)
        rows.append(
            {
                "patient_key": patient_key,
                "institution": institution,
                "split": split,
                "shard": shards[patient_key],
            }
        )
    return table_from_rows(rows, SCHEMA)
