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
import pyarrow.dataset as ds

from schemas.base import table_from_rows
from schemas.config import SplitConfig
from schemas.errors import ReasonCodedError
from schemas.splits import SCHEMA

DEFAULT_SALT = "medreco-splits-v1"
_COLUMNS = ("patient_key", "institution", "shard")


class SplitInputError(ReasonCodedError, ValueError):
    """Bad input to :func:`assign_splits`; ``reason`` is a machine-readable code.

    Reason codes: ``missing_column``, ``null_value``, ``patient_in_several_shards``, ``empty_salt``.
    """

    message_format = "[{reason}] {message}"


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


class SplitLeakError(ReasonCodedError, RuntimeError):
    """The built tables link patients or studies across splits; ``counts`` holds every violation count."""

    default_reason = "split_leak"
    message_format = "{message}"

    def __init__(self, counts: dict[str, int]) -> None:
        bad = {k: v for k, v in counts.items() if v}
        super().__init__(f"[split_leak] cross-split links or patients in several splits: {bad}")
        self.counts = counts


def _frame(t: pa.Table | pl.DataFrame | ds.Dataset | None, columns: tuple[str, ...]) -> pl.DataFrame | None:
    """The ``columns`` of ``t`` that exist, as polars: only those are converted (or read, from a dataset)."""
    if t is None:
        return None
    names = t.columns if isinstance(t, pl.DataFrame) else t.schema.names
    keep = [c for c in columns if c in names]
    if isinstance(t, pl.DataFrame):
        return t.select(keep)
    out = pl.from_arrow(t.to_table(columns=keep) if isinstance(t, ds.Dataset) else t.select(keep))
    assert isinstance(out, pl.DataFrame)  # a table converts to a frame, never a series
    return out


def check_split_integrity(
    splits: pa.Table | pl.DataFrame,
    *,
    studies: pa.Table | pl.DataFrame | ds.Dataset | None = None,
    pairs: pa.Table | pl.DataFrame | ds.Dataset | None = None,
    retrieval_targets: pa.Table | pl.DataFrame | ds.Dataset | None = None,
    vqa: pa.Table | pl.DataFrame | ds.Dataset | None = None,
) -> dict[str, int]:
    """Prove that no patient is in two splits and that nothing links two splits; raise otherwise.

    Counts (all must be 0):

    * ``patients_in_several_splits``: patients with more than one distinct split in ``splits``;
    * ``study_patients_without_split``: ``studies`` patients missing from ``splits``;
    * ``pairs_cross_patient``: pairs whose prior or current study belongs to another patient (``studies``);
    * ``pairs_without_split``: pairs whose patient has no split;
    * ``retrieval_same_patient``: retrieval rows whose query and candidate are one patient;
    * ``retrieval_cross_split``: retrieval rows whose query patient, candidate patient and ``split`` column
      do not all agree with ``splits``;
    * ``vqa_split_mismatch``: VQA items whose ``split`` differs from their patient's split (or who have none);
    * ``vqa_cross_split_reference``: VQA items with a ``reference_study_key`` (two-case comparison) whose
      reference study's patient is in another split.

    Parameters
    ----------
    splits : pyarrow.Table or polars.DataFrame
        ``patient_key``, ``split`` (all shards).
    studies, pairs, retrieval_targets, vqa : pyarrow.Table, polars.DataFrame or pyarrow.dataset.Dataset, optional
        the built tables (all shards); a table not given is not checked. Only the key and split columns are
        converted (from a dataset, only they are read).

    Returns
    -------
    dict of str to int
        every count above (0 each).

    Raises
    ------
    SplitLeakError
        when any count is not 0 (the build fails with it).
    """
    frame = _frame(splits, ("patient_key", "split"))
    assert frame is not None  # splits is required
    sp = frame.select("patient_key", "split").unique()
    counts = {"patients_in_several_splits": sp.group_by("patient_key").len().filter(pl.col("len") > 1).height}
    split_of = sp.unique("patient_key", keep="first")
    st = _frame(studies, ("study_key", "patient_key"))
    if st is not None:
        missing = st.select("patient_key").unique().join(split_of, on="patient_key", how="anti")
        counts["study_patients_without_split"] = missing.height
    pr = _frame(pairs, ("patient_key", "prior_study_key", "current_study_key"))
    if pr is not None:
        if st is not None:
            owner = st.select("study_key", pl.col("patient_key").alias("owner"))
            bad = 0
            for col in ("prior_study_key", "current_study_key"):
                j = pr.select("patient_key", col).join(owner, left_on=col, right_on="study_key", how="left")
                bad += j.filter(pl.col("owner").is_null() | (pl.col("owner") != pl.col("patient_key"))).height
            counts["pairs_cross_patient"] = bad
        counts["pairs_without_split"] = pr.select("patient_key").join(split_of, on="patient_key", how="anti").height
    rt = _frame(retrieval_targets, ("query_patient_key", "candidate_patient_key", "split"))
    if rt is not None:
        counts["retrieval_same_patient"] = rt.filter(
            pl.col("query_patient_key") == pl.col("candidate_patient_key")
        ).height
        j = (
            rt.select("query_patient_key", "candidate_patient_key", "split")
            .join(
                split_of.rename({"split": "q_split"}), left_on="query_patient_key", right_on="patient_key", how="left"
            )
            .join(
                split_of.rename({"split": "c_split"}),
                left_on="candidate_patient_key",
                right_on="patient_key",
                how="left",
            )
        )
        counts["retrieval_cross_split"] = j.filter(
            pl.col("q_split").is_null()
            | pl.col("c_split").is_null()
            | (pl.col("q_split") != pl.col("split"))
            | (pl.col("c_split") != pl.col("split"))
        ).height
    vq = _frame(vqa, ("patient_key", "split", "reference_study_key"))
    if vq is not None:
        j = vq.select("patient_key", "split").join(split_of.rename({"split": "p_split"}), on="patient_key", how="left")
        counts["vqa_split_mismatch"] = j.filter(
            pl.col("p_split").is_null() | (pl.col("p_split") != pl.col("split"))
        ).height
        if "reference_study_key" in vq.columns and st is not None:
            ref = (
                vq.filter(pl.col("reference_study_key").is_not_null())
                .select("split", "reference_study_key")
                .join(
                    st.select("study_key", "patient_key"),
                    left_on="reference_study_key",
                    right_on="study_key",
                    how="left",
                )
                .join(split_of.rename({"split": "r_split"}), on="patient_key", how="left")
            )
            counts["vqa_cross_split_reference"] = ref.filter(
                pl.col("r_split").is_null() | (pl.col("r_split") != pl.col("split"))
            ).height
    if any(counts.values()):
        raise SplitLeakError(counts)
    return counts
