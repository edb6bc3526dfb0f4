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
from datetime import date, datetime, time, timedelta

import polars as pl
import pyarrow as pa

from schemas.base import table_from_rows
from schemas.config import PairingConfig
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


class PairingInputError(ValueError):
    """Bad input to :func:`build_pairs`; ``reason`` is a machine-readable code.

    Reason codes: ``missing_column``, ``null_key``, ``duplicate_study_key``, ``duplicate_label``,
    ``unknown_state``, ``unknown_change``, ``bad_datetime_type``, ``patient_in_several_shards``.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"[{reason}] {message}")
        self.reason = reason


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


def _study_times(studies: pl.DataFrame) -> list[datetime | None]:
    dt = studies.get_column("study_datetime")
    if not (dt.dtype == pl.Date or isinstance(dt.dtype, pl.Datetime) or dt.dtype == pl.Null):
        raise PairingInputError(
            "bad_datetime_type", f"studies.study_datetime must be Datetime, got {dt.dtype}"
        )
    fallback = studies.get_column("study_date_shifted") if "study_date_shifted" in studies.columns else None
    out: list[datetime | None] = []
    for i, v in enumerate(dt.to_list()):
        if v is None and fallback is not None:
            v = fallback[i]
        if isinstance(v, datetime):
            out.append(v.replace(tzinfo=None))
        elif isinstance(v, date):
            out.append(datetime.combine(v, time()))
        else:
            out.append(None)
    return out


def _frontal_view(views: set[str]) -> str | None:
    for v in FRONTAL_VIEWS:
        if v in views:
            return v
    return None


def _preferred_view(views: set[str]) -> str | None:
    """PA, then AP, then the alphabetically first other view; None when the study has no view."""
    return _frontal_view(views) or (min(views) if views else None)


def _change_labels(
    prior: dict[str, tuple[str, str]] | None, current: dict[str, tuple[str, str]] | None
) -> tuple[list[dict], int]:
    """Per-entity change labels of one pair and the number of stated/state contradictions."""
    if not current:
        return [], 0
    labels: list[dict] = []
    conflicts = 0
    for entity_id in sorted(current):
        cur_state, stated = current[entity_id]
        prior_state = None
        if prior is not None:
            prior_state = prior.get(entity_id, ("not_mentioned", NO_CHANGE))[0]
        if stated != NO_CHANGE:
            labels.append({"entity_id": entity_id, "change": stated, "source": "stated"})
            sides = {("current", cur_state)} | ({("prior", prior_state)} if prior_state else set())
            if sides & CONTRADICTIONS[stated]:
                conflicts += 1
            continue
        if prior_state is None:
            continue
        derived = None
        if cur_state == "present" and prior_state in ("absent", "not_mentioned"):
            derived = "new"
        elif cur_state == "absent" and prior_state == "present":
            derived = "resolved"
        elif cur_state == "present" and prior_state == "present":
            derived = "unchanged"
        if derived:
            labels.append({"entity_id": entity_id, "change": derived, "source": "state_difference"})
    return labels, conflicts


def _labels_by_study(study_labels: pl.DataFrame) -> dict[str, dict[str, tuple[str, str]]]:
    if study_labels.height == 0:
        return {}
    _require(study_labels, _LABEL_COLUMNS, "study_labels")
    _no_null(study_labels, _LABEL_COLUMNS, "study_labels")
    bad_state = sorted(set(study_labels.get_column("state").to_list()) - set(STATES))
    if bad_state:
        raise PairingInputError("unknown_state", f"study_labels.state has unknown value(s) {bad_state}")
    bad_change = sorted(set(study_labels.get_column("change").to_list()) - set(CHANGES) - {NO_CHANGE})
    if bad_change:
        raise PairingInputError("unknown_change", f"study_labels.change has unknown value(s) {bad_change}")
    out: dict[str, dict[str, tuple[str, str]]] = {}
    for row in study_labels.select(_LABEL_COLUMNS).iter_rows():
        study_key, entity_id, state, change = row
        per = out.setdefault(study_key, {})
        if entity_id in per:
            raise PairingInputError("duplicate_label", f"study_labels repeats entity {entity_id} of a study")
        per[entity_id] = (state, change)
    return out


def _views_by_study(images: pl.DataFrame) -> dict[str, set[str]]:
    if images.height == 0:
        return {}
    _require(images, _IMAGE_COLUMNS, "images")
    _no_null(images, ("study_key",), "images")
    out: dict[str, set[str]] = {}
    for study_key, view in images.select(_IMAGE_COLUMNS).iter_rows():
        views = out.setdefault(study_key, set())
        if view is not None and str(view).strip():
            views.add(str(view).strip().upper())
    return out


def build_pairs(
    studies: pl.DataFrame, study_labels: pl.DataFrame, images: pl.DataFrame, cfg: PairingConfig
) -> pa.Table:
    """Build the ``pairs`` table of one shard.

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
    labels = _labels_by_study(study_labels)
    views = _views_by_study(images)
    times = _study_times(studies)

    by_patient: dict[tuple[str, str], list[dict]] = {}
    shard_of: dict[str, int] = {}
    for row, when in zip(studies.select(_STUDY_COLUMNS).to_dicts(), times, strict=True):
        pk = row["patient_key"]
        if shard_of.setdefault(pk, row["shard"]) != row["shard"]:
            raise PairingInputError("patient_in_several_shards", "a patient's studies carry different shards")
        if row["family"] is None or when is None:
            continue
        row["when"] = when
        row["views"] = views.get(row["study_key"], set())
        by_patient.setdefault((pk, row["family"]), []).append(row)

    n_priors = cfg.max_priors if cfg.all_priors else 1
    rows: list[dict] = []
    for (patient_key, family), group in by_patient.items():
        needs_frontal = family == CXR_FAMILY and cfg.frontal_only_cxr
        if needs_frontal:
            group = [s for s in group if _frontal_view(s["views"])]
        group.sort(key=lambda s: (s["when"], s["study_key"]))
        for i, cur in enumerate(group):
            taken = 0
            for prior in reversed(group[:i]):
                if taken == n_priors:
                    break
                delta = cur["when"] - prior["when"]
                if delta <= timedelta(0):
                    continue
                gap = delta.days  # timedelta.days is the floor for positive deltas
                if gap < cfg.min_gap_days:
                    continue
                if gap > cfg.max_gap_days:
                    break
                changes, conflicts = _change_labels(
                    labels.get(prior["study_key"]), labels.get(cur["study_key"])
                )
                rows.append(
                    {
                        "pair_id": pair_id(prior["study_key"], cur["study_key"]),
                        "patient_key": patient_key,
                        "prior_study_key": prior["study_key"],
                        "current_study_key": cur["study_key"],
                        "family": family,
                        "modality": cur["modality"],
                        "view": _preferred_view(cur["views"]),
                        "gap_days": gap,
                        "change_labels": changes,
                        "n_conflicts": conflicts,
                        "shard": cur["shard"],
                    }
                )
                taken += 1
    rows.sort(key=lambda r: r["pair_id"])
    return table_from_rows(rows, SCHEMA)
