"""Longitudinal (prior, current) study pairs of one patient and their per-entity change labels.

One call handles one shard (every study of a patient lies in one shard, :meth:`etl.keys.PseudonymKey.shard`).

Pairing rule
------------
A pair is ``(prior, current)`` of one ``patient_key`` where

* both studies have the same, non-null MedReCo modality ``family`` (studies without a family never pair);
* the prior is strictly earlier (``study_datetime``; ``study_date_shifted`` at midnight when the
  timestamp is null; a study with neither cannot be ordered and takes no part in pairing);
* ``gap_days`` = floor((current - prior) / 1 day) lies in ``[min_gap_days, max_gap_days]``;
* for ``2D-CXR`` with ``frontal_only_cxr``: both studies hold a frontal (``PA`` or ``AP``) image.

Each study pairs with its nearest eligible prior; with ``all_priors`` with up to ``max_priors``
eligible priors, nearest first. Ties in time are broken by ``study_key`` so the result is deterministic.

Change labels
-------------
Per entity of the current study: a change stated in the current report (``change != "none"``) is the
label (``source="stated"``); otherwise the label is derived from the two studies' states
(``source="state_difference"``): absent/not_mentioned -> present = ``new``, present -> absent =
``resolved``, present -> present = ``unchanged``; any other combination (uncertain on either side,
absent -> absent, present -> not_mentioned ...) gives no label. A state difference needs both studies
to have labels at all: a prior without any label (no report) says nothing about absence.

``n_conflicts`` counts entities whose stated change contradicts the two states (:data:`CONTRADICTIONS`),
e.g. stated ``new`` while the prior report says present. The stated label is kept.
"""

from __future__ import annotations

import hashlib

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from etl.assemble.frame_keys import has_duplicate_keys
from etl.assemble.shard_groups import DEFAULT_MAX_STUDIES, rows_of, shard_groups, study_keys_of
from schemas.config import PairingConfig
from schemas.errors import ReasonCodedError
from schemas.pairs import SCHEMA
from schemas.study_labels import STATES

#: change values a report may state (``study_labels.change``); ``none`` = no change stated.
CHANGES = ("new", "increased", "decreased", "unchanged", "resolved", "improved", "worsened")
NO_CHANGE = "none"
#: view codes that count as frontal chest radiographs (DICOM ViewPosition, PS3.3 C.8.11.5).
FRONTAL_VIEWS = ("PA", "AP")
CXR_FAMILY = "2D-CXR"

#: stated change -> (side, state) combinations that contradict it; side is "prior" or "current".
CONTRADICTIONS: dict[str, frozenset[tuple[str, str]]] = {
    "new": frozenset({("prior", "present"), ("current", "absent")}),
    "resolved": frozenset({("prior", "absent"), ("current", "present")}),
    "unchanged": frozenset({("prior", "absent"), ("current", "absent")}),
    "increased": frozenset({("prior", "absent"), ("current", "absent")}),
    "worsened": frozenset({("prior", "absent"), ("current", "absent")}),
    "decreased": frozenset({("prior", "absent")}),
    "improved": frozenset({("prior", "absent")}),
}

_STUDY_COLUMNS = ("study_key", "patient_key", "family", "modality", "study_datetime", "shard")
_LABEL_COLUMNS = ("study_key", "entity_id", "state", "change")
_IMAGE_COLUMNS = ("study_key", "view")


class PairingInputError(ReasonCodedError, ValueError):
    """Bad input to :func:`build_pairs`; ``reason`` is a machine-readable code.

    Reason codes: ``missing_column``, ``null_key``, ``duplicate_study_key``, ``duplicate_label``,
    ``unknown_state``, ``unknown_change``, ``bad_datetime_type``, ``patient_in_several_shards``.
    """

    message_format = "[{reason}] {message}"


def pair_id(prior_study_key: str, current_study_key: str) -> str:
    """Stable pair id: sha256 of ``"prior_study_key|current_study_key"``, first 16 hex characters."""
    return hashlib.sha256(f"{prior_study_key}|{current_study_key}".encode()).hexdigest()[:16]


def _require(df: pl.DataFrame, columns: tuple[str, ...], name: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise PairingInputError("missing_column", f"{name} lacks column(s) {missing}")


def _no_null(df: pl.DataFrame, columns: tuple[str, ...], name: str) -> None:
    for c in columns:
        n = df.get_column(c).null_count()
        if n:
            raise PairingInputError("null_key", f"{name}.{c} has {n} null value(s)")


def _study_times(studies: pl.DataFrame) -> pl.Expr:
    """Expression of each study's naive wall time: ``study_datetime``, else ``study_date_shifted`` at midnight."""
    dt = studies.schema["study_datetime"]
    if not (dt == pl.Date or isinstance(dt, pl.Datetime) or dt == pl.Null):
        raise PairingInputError("bad_datetime_type", f"studies.study_datetime must be Datetime, got {dt}")
    when = pl.col("study_datetime")
    if isinstance(dt, pl.Datetime) and dt.time_zone is not None:
        when = when.dt.replace_time_zone(None)  # wall time in the study's zone, as the shifted dates are
    when = when.cast(pl.Datetime("us"))
    if "study_date_shifted" in studies.columns:
        when = pl.coalesce(when, pl.col("study_date_shifted").cast(pl.Date).cast(pl.Datetime("us")))
    return when


def _views(images: pl.DataFrame) -> pl.DataFrame:
    """Per study: ``frontal`` (has a PA or AP image) and ``view`` (PA, then AP, then the first other view)."""
    if images.height == 0:
        return pl.DataFrame(schema={"study_key": pl.Utf8, "frontal": pl.Boolean, "view": pl.Utf8})
    _require(images, _IMAGE_COLUMNS, "images")
    _no_null(images, ("study_key",), "images")
    v = (
        images.lazy()
        .select("study_key", view=pl.col("view").cast(pl.Utf8).str.strip_chars().str.to_uppercase())
        .filter(pl.col("view").is_not_null() & (pl.col("view") != ""))
        .with_columns(
            order=pl.col("view").replace_strict(
                {v: i for i, v in enumerate(FRONTAL_VIEWS)}, default=len(FRONTAL_VIEWS), return_dtype=pl.Int32
            )
        )
        .sort("study_key", "order", "view")
        .group_by("study_key", maintain_order=True)
        .agg(view=pl.col("view").first(), frontal=pl.col("order").min() < len(FRONTAL_VIEWS))
    )
    return v.collect()


def _labels(study_labels: pl.DataFrame) -> pl.DataFrame:
    """Validated ``study_labels`` columns (:data:`_LABEL_COLUMNS`)."""
    if study_labels.height == 0:
        return pl.DataFrame(schema={"study_key": pl.Utf8, "entity_id": pl.Utf8, "state": pl.Utf8, "change": pl.Utf8})
    _require(study_labels, _LABEL_COLUMNS, "study_labels")
    _no_null(study_labels, _LABEL_COLUMNS, "study_labels")
    bad_state = sorted(set(study_labels.get_column("state").unique().to_list()) - set(STATES))
    if bad_state:
        raise PairingInputError("unknown_state", f"study_labels.state has unknown value(s) {bad_state}")
    bad_change = sorted(set(study_labels.get_column("change").unique().to_list()) - set(CHANGES) - {NO_CHANGE})
    if bad_change:
        raise PairingInputError("unknown_change", f"study_labels.change has unknown value(s) {bad_change}")
    lab = study_labels.select(_LABEL_COLUMNS)
    if has_duplicate_keys(lab, ("study_key", "entity_id")):
        raise PairingInputError("duplicate_label", "study_labels repeats an entity of a study")
    return lab


def _change_labels(pairs: pl.DataFrame, labels: pl.DataFrame) -> pl.DataFrame:
    """Per pair: ``change_labels`` (list of structs, entity order) and ``n_conflicts`` (module docstring)."""
    if pairs.height == 0 or labels.height == 0:
        return pairs.select("pair_id").with_columns(
            change_labels=pl.lit([], pl.List(pl.Struct({"entity_id": pl.Utf8, "change": pl.Utf8, "source": pl.Utf8}))),
            n_conflicts=pl.lit(0, pl.Int32),
        )
    labelled = labels.select("study_key").unique().with_columns(has=pl.lit(True))
    cur = pairs.select("pair_id", "prior_study_key", "current_study_key").join(
        labels.rename({"study_key": "current_study_key", "state": "cur_state", "change": "stated"}),
        on="current_study_key",
        how="inner",
    )
    cur = (
        cur.join(
            labels.select(pl.col("study_key").alias("prior_study_key"), "entity_id", pl.col("state").alias("p_state")),
            on=["prior_study_key", "entity_id"],
            how="left",
        )
        .join(labelled.rename({"study_key": "prior_study_key"}), on="prior_study_key", how="left")
        .with_columns(prior_state=pl.when(pl.col("has")).then(pl.col("p_state").fill_null("not_mentioned")))
    )
    contradictions = pl.DataFrame(
        [(c, side, state) for c, combos in CONTRADICTIONS.items() for side, state in combos],
        schema={"stated": pl.Utf8, "side": pl.Utf8, "bad_state": pl.Utf8},
        orient="row",
    )
    cur_bad = contradictions.filter(pl.col("side") == "current").select(
        "stated", pl.col("bad_state").alias("cur_state"), cur_conflict=pl.lit(True)
    )
    prior_bad = contradictions.filter(pl.col("side") == "prior").select(
        "stated", pl.col("bad_state").alias("prior_state"), prior_conflict=pl.lit(True)
    )
    cur = cur.join(cur_bad, on=["stated", "cur_state"], how="left").join(
        prior_bad, on=["stated", "prior_state"], how="left"
    )
    is_stated = pl.col("stated") != NO_CHANGE
    derived = (
        pl.when(pl.col("prior_state").is_null())
        .then(None)
        .when((pl.col("cur_state") == "present") & pl.col("prior_state").is_in(["absent", "not_mentioned"]))
        .then(pl.lit("new"))
        .when((pl.col("cur_state") == "absent") & (pl.col("prior_state") == "present"))
        .then(pl.lit("resolved"))
        .when((pl.col("cur_state") == "present") & (pl.col("prior_state") == "present"))
        .then(pl.lit("unchanged"))
    )
    cur = cur.with_columns(
        change=pl.when(is_stated).then(pl.col("stated")).otherwise(derived),
        source=pl.when(is_stated).then(pl.lit("stated")).otherwise(pl.lit("state_difference")),
        conflict=is_stated & (pl.col("cur_conflict").fill_null(False) | pl.col("prior_conflict").fill_null(False)),
    )
    conflicts = cur.group_by("pair_id").agg(n_conflicts=pl.col("conflict").sum().cast(pl.Int32))
    lab = (
        cur.filter(pl.col("change").is_not_null())
        .sort("pair_id", "entity_id")
        .group_by("pair_id", maintain_order=True)
        .agg(change_labels=pl.struct("entity_id", "change", "source"))
    )
    return (
        pairs.select("pair_id")
        .join(lab, on="pair_id", how="left")
        .join(conflicts, on="pair_id", how="left")
        .with_columns(
            pl.col("change_labels").fill_null(
                pl.lit([], pl.List(pl.Struct({"entity_id": pl.Utf8, "change": pl.Utf8, "source": pl.Utf8})))
            ),
            pl.col("n_conflicts").fill_null(0),
        )
    )


def build_pairs(
    studies: pl.DataFrame,
    study_labels: pl.DataFrame,
    images: pl.DataFrame,
    cfg: PairingConfig,
    max_studies: int = DEFAULT_MAX_STUDIES,
) -> pa.Table:
    """Build the ``pairs`` table of one shard or many.

    Parameters
    ----------
    studies : polars.DataFrame
        ``studies`` rows (:mod:`schemas.studies`); needs ``study_key``, ``patient_key``, ``family``,
        ``modality``, ``study_datetime`` (Datetime, date-shifted wall time; ``study_date_shifted`` is used
        where it is null) and ``shard`` (Int). One row per ``study_key``.
    study_labels : polars.DataFrame
        ``study_labels`` rows (:mod:`schemas.study_labels`): ``study_key``, ``entity_id``, ``state``
        (present|absent|uncertain|not_mentioned), ``change`` (:data:`CHANGES` or ``none``). May be empty.
    images : polars.DataFrame
        ``images`` rows with ``study_key`` and ``view`` (PA|AP|LATERAL|... or null). May be empty; then no
        ``2D-CXR`` study has a frontal image.
    cfg : schemas.config.PairingConfig
        gap window in days (``min_gap_days``, ``max_gap_days``), ``frontal_only_cxr``, ``all_priors``,
        ``max_priors``.
    max_studies : int
        with more ``studies`` rows than this, pairs are built group by group of whole shards
        (:func:`etl.assemble.shard_groups.shard_groups`): the same rows, with the peak memory of one group.

    Returns
    -------
    pyarrow.Table
        :data:`schemas.pairs.SCHEMA`, one row per pair, sorted by ``pair_id``. ``modality`` is the current
        study's modality; ``view`` is the current study's preferred view (PA, then AP, then the first other
        view alphabetically; null when it has none); ``gap_days`` is int32 days; ``shard`` is the studies'
        shard. Pairs whose studies have no labels exist with an empty ``change_labels`` list.

    Raises
    ------
    PairingInputError
        on a missing column, a null key, a repeated ``study_key`` or (study, entity) label, an unknown
        state or change value, a non-temporal ``study_datetime`` or a patient spread over several shards.
    """
    if studies.height == 0:
        return SCHEMA.empty_table()
    _require(studies, _STUDY_COLUMNS, "studies")
    _no_null(studies, ("study_key", "patient_key", "modality", "shard"), "studies")
    if studies.get_column("study_key").n_unique() != studies.height:
        raise PairingInputError("duplicate_study_key", "studies repeats a study_key")
    if studies.select(pl.col("shard").n_unique().over("patient_key").max()).item() > 1:
        raise PairingInputError("patient_in_several_shards", "a patient's studies carry different shards")
    groups = shard_groups(studies.get_column("shard").cast(pl.Int64), max_studies)
    if len(groups) > 1:  # every patient lies in one shard: pairs and their labels are per shard
        tables = []
        for group in groups:
            keys = study_keys_of(studies, group)
            tables.append(
                build_pairs(
                    studies.filter(pl.col("shard").is_in(group)),
                    rows_of(study_labels, "study_key", keys),
                    rows_of(images, "study_key", keys),
                    cfg,
                    max_studies=studies.height,
                )
            )
        out = pa.concat_tables(tables)
        return out.take(pc.sort_indices(out.column("pair_id")))
    labels = _labels(study_labels)
    views = _views(images)
    when = _study_times(studies)

    st = (
        studies.lazy()
        .select("study_key", "patient_key", "family", "modality", "shard", when=when)
        .filter(pl.col("family").is_not_null() & pl.col("when").is_not_null())
        .join(views.lazy(), on="study_key", how="left")
        .with_columns(pl.col("frontal").fill_null(False))
    )
    if cfg.frontal_only_cxr:
        st = st.filter((pl.col("family") != CXR_FAMILY) | pl.col("frontal"))
    st = st.sort("patient_key", "family", "when", "study_key").with_columns(
        i=pl.int_range(pl.len(), dtype=pl.Int64).over("patient_key", "family")
    )
    n_priors = cfg.max_priors if cfg.all_priors else 1
    day_us = 86_400_000_000
    prior = st.select(
        "patient_key",
        "family",
        pl.col("study_key").alias("prior_study_key"),
        pl.col("when").alias("prior_when"),
        pl.col("i").alias("j"),
    )
    pairs = (
        st.join(prior, on=["patient_key", "family"], how="inner")
        .filter(pl.col("j") < pl.col("i"))
        .with_columns(delta=(pl.col("when") - pl.col("prior_when")).dt.total_microseconds())
        .filter(pl.col("delta") > 0)
        .with_columns(gap=pl.col("delta") // day_us)
        .filter((pl.col("gap") >= cfg.min_gap_days) & (pl.col("gap") <= cfg.max_gap_days))
        .sort("study_key", "j", descending=[False, True])
        .filter(pl.int_range(pl.len()).over("study_key") < n_priors)
        .select(
            "patient_key",
            "prior_study_key",
            pl.col("study_key").alias("current_study_key"),
            "family",
            "modality",
            "view",
            pl.col("gap").cast(pl.Int32).alias("gap_days"),
            pl.col("shard").cast(pl.Int32),
        )
        .collect()
    )
    if pairs.height == 0:
        return SCHEMA.empty_table()
    ids = [
        pair_id(a, b)
        for a, b in zip(pairs["prior_study_key"].to_list(), pairs["current_study_key"].to_list(), strict=True)
    ]
    pairs = pairs.with_columns(pair_id=pl.Series(ids, dtype=pl.Utf8))
    pairs = pairs.join(_change_labels(pairs, labels), on="pair_id", how="left").sort("pair_id")
    return pairs.select(SCHEMA.names).to_arrow().cast(SCHEMA)
