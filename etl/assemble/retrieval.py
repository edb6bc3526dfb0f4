"""Entity-conditioned reference-case retrieval targets: for a query study and an entity, the relevant studies
of other patients (MedReCo reference-case retrieval), stored sparse as top-k neighbours.

Entity state of a study
-----------------------
For a (study, entity) the structured state is ``(assertion, laterality, severity, anatomy, change)``:

* ``assertion`` = ``study_labels.state`` (present | absent | uncertain); ``not_mentioned`` never takes part;
* ``change`` = ``study_labels.change`` (``none`` = no change stated, treated as unreported);
* ``laterality``, ``severity``, ``anatomy`` = the first non-null value, in text order (``span_start``), over the
  report's ``entity_mentions`` of that entity that decided the label: not hypothetical, with the label's
  assertion, from IMPRESSION when the impression mentions the entity, else from FINDINGS or unsectioned text
  (the section rule of :func:`entity_extraction.extract.study_labels`). ``mention_ids`` lists those mentions.

Similarity (relevance)
----------------------
Within one modality family and one entity::

    relevance(q, c) = 0                                       if assertion(q) != assertion(c)
                    = 1 - sum_k w_k * d_k(q_k, c_k)           otherwise, k in {laterality, severity, anatomy, change}

with the weights ``w_k`` of :class:`schemas.config.RetrievalConfig` (default 0.3, 0.3, 0.2, 0.2, summing to 1) and
the attribute distances ``d_k`` in ``[0, 1]`` of ``config/retrieval_similarity.yaml`` (:func:`load_similarity`):
an unreported vs a reported value 0.5; laterality left/right 1, one side vs bilateral 0.5; severity
``|grade difference| / grade range`` on trace < mild = small < moderate < severe = large; anatomy: different
concepts 1; change: same direction (new/increased/worsened, decreased/improved/resolved) 0.5, else 1. A
candidate is *relevant* when ``relevance > threshold`` (MedReCo: 0.9). With the default weights the smallest
single difference (one severity grade, a same-direction change, a value reported on one side only) costs exactly
0.1, so at the default threshold only identical states are relevant; a lower threshold admits near matches.

Targets
-------
Per (family, entity) at most ``max_studies_per_entity`` studies take part (MedReCo caps an entity at 30,000): those
with the lowest ``H(study_key)`` (first 8 bytes of sha256(``"retrieval|" + study_key``) as an unsigned integer),
so the choice does not depend on row order or on other entities. Each participating study in a state of
``cfg.states`` is a query; its candidates are the participating studies of the same family, entity and split,
of another patient, with relevance above the threshold. The ``top_k`` kept per (query, entity) are ordered by
relevance (descending), then by ring distance: the candidates of one state signature sorted by ``H``, walked
forward (wrapping) from the query's own ``H``. This is a deterministic pseudo-random tie-break that spreads
queries over the whole pool (every query of a class does not get the same k references) and costs
O(queries x (k + s)) with s the most studies one patient has in a pool, never an N x N matrix.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Literal

import numpy as np
import polars as pl
import pyarrow as pa
import yaml

from etl.assemble.frame_keys import has_duplicate_keys
from schemas.config import CONFIG_DIR, RetrievalConfig
from schemas.errors import ReasonCodedError
from schemas.retrieval_targets import SCHEMA

ATTRIBUTES: tuple[Literal["laterality", "severity", "anatomy", "change"], ...] = (
    "laterality",
    "severity",
    "anatomy",
    "change",
)
DEFAULT_SIMILARITY = CONFIG_DIR / "retrieval_similarity.yaml"
#: sections whose mentions decide a label, in priority order (entity_extraction.extract.LABEL_SECTIONS)
DECIDING_SECTIONS = (("impression",), ("findings", "unsectioned"))
NO_CHANGE = "none"

_LABEL_COLUMNS = ("study_key", "patient_key", "family", "entity_id", "state", "change", "shard")
_MENTION_COLUMNS = (
    "mention_id",
    "study_key",
    "entity_id",
    "assertion",
    "temporality",
    "section",
    "laterality",
    "severity",
    "anatomy_id",
    "span_start",
)
_SPLIT_COLUMNS = ("patient_key", "split")


class RetrievalInputError(ReasonCodedError, ValueError):
    """Bad input to :func:`build_retrieval_targets` or a bad similarity file; ``reason`` is a code.

    Reason codes: ``missing_column``, ``null_value``, ``duplicate_label``, ``patient_without_split``,
    ``patient_in_several_splits``, ``missing_file``, ``bad_similarity``.
    """

    message_format = "[{reason}] {message}"


# ------------------------------------------------------------------------------------------ similarity


def validate_similarity(data: object, source: str = "<dict>") -> dict:
    """Check a parsed similarity mapping (see ``config/retrieval_similarity.yaml``) and return it.

    Raises
    ------
    RetrievalInputError
        ``bad_similarity`` naming the part that is wrong.
    """

    def bad(msg: str) -> RetrievalInputError:
        return RetrievalInputError("bad_similarity", f"{source}: {msg}")

    if not isinstance(data, dict):
        raise bad("top level must be a mapping")
    for k in ("unknown_vs_known", "laterality", "severity", "anatomy", "change"):
        if k not in data:
            raise bad(f"missing {k!r}")

    def dist(v: object, what: str) -> float:
        if not isinstance(v, (int, float)) or not 0 <= float(v) <= 1:
            raise bad(f"{what} must be a number in [0, 1], got {v!r}")
        return float(v)

    dist(data["unknown_vs_known"], "unknown_vs_known")
    pairs = (data["laterality"] or {}).get("pairs") or []
    for p in pairs:
        if not (isinstance(p, list) and len(p) == 3 and all(isinstance(x, str) for x in p[:2])):
            raise bad(f"laterality pair {p!r} must be [value, value, distance]")
        dist(p[2], "laterality distance")
    ordinal = (data["severity"] or {}).get("ordinal")
    if not isinstance(ordinal, dict) or len(set(ordinal.values())) < 2:
        raise bad("severity.ordinal must map values to at least two different grades")
    if not all(isinstance(g, (int, float)) for g in ordinal.values()):
        raise bad("severity grades must be numbers")
    dist((data["anatomy"] or {}).get("different"), "anatomy.different")
    ch = data["change"] or {}
    groups = ch.get("groups")
    if not isinstance(groups, dict) or not all(isinstance(v, list) for v in groups.values()):
        raise bad("change.groups must map group names to lists of changes")
    members = [c for v in groups.values() for c in v]
    if len(members) != len(set(members)):
        raise bad("a change is in two groups")
    dist(ch.get("same_group"), "change.same_group")
    dist(ch.get("different_group"), "change.different_group")
    return data


def load_similarity(path: str | Path = DEFAULT_SIMILARITY) -> dict:
    """Read and validate the attribute distance tables (default ``config/retrieval_similarity.yaml``).

    Raises
    ------
    RetrievalInputError
        ``missing_file``, ``bad_similarity``.
    """
    p = Path(path)
    if not p.is_file():
        raise RetrievalInputError("missing_file", f"similarity file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as err:
        raise RetrievalInputError("bad_similarity", f"{p} is not valid YAML: {err}") from None
    return validate_similarity(data, str(p))


def attribute_distance(attribute: str, a: str | None, b: str | None, similarity: dict) -> float:
    """Distance ``d_k`` in ``[0, 1]`` of two values of one attribute (module docstring; nulls = unreported).

    Parameters
    ----------
    attribute : str
        ``laterality``, ``severity``, ``anatomy`` or ``change`` (``"none"`` counts as unreported).
    a, b : str or None
        the two values.
    similarity : dict
        from :func:`load_similarity`.
    """
    if attribute == "change":
        a = None if a == NO_CHANGE else a
        b = None if b == NO_CHANGE else b
    if a == b:
        return 0.0
    if a is None or b is None:
        return float(similarity["unknown_vs_known"])
    if attribute == "laterality":
        for x, y, d in similarity["laterality"]["pairs"]:
            if {x, y} == {a, b}:
                return float(d)
        return 1.0
    if attribute == "severity":
        grade = similarity["severity"]["ordinal"]
        if a not in grade or b not in grade:
            return 1.0
        span = max(grade.values()) - min(grade.values())
        return abs(float(grade[a]) - float(grade[b])) / span
    if attribute == "anatomy":
        return float(similarity["anatomy"]["different"])
    if attribute == "change":
        group = {c: g for g, cs in similarity["change"]["groups"].items() for c in cs}
        same = a in group and group.get(a) == group.get(b)
        return float(similarity["change"]["same_group" if same else "different_group"])
    raise ValueError(f"unknown attribute {attribute!r}")


def relevance(query: dict, candidate: dict, cfg: RetrievalConfig, similarity: dict) -> float:
    """Per-entity similarity of two structured states (module docstring formula).

    Parameters
    ----------
    query, candidate : dict
        ``state`` and the :data:`ATTRIBUTES` (missing keys = unreported).

    Returns
    -------
    float
        0 when the states differ, else ``1 - sum_k w_k d_k`` in ``[0, 1]``.
    """
    if query["state"] != candidate["state"]:
        return 0.0
    loss = sum(cfg.weights[k] * attribute_distance(k, query.get(k), candidate.get(k), similarity) for k in ATTRIBUTES)
    return max(0.0, 1.0 - loss)


# ------------------------------------------------------------------------------------------ inputs


def study_hash(keys: list[str]) -> np.ndarray:
    """``H(study_key)``: first 8 bytes of sha256(``"retrieval|" + key``), big-endian, as uint64."""
    return np.fromiter(
        (int.from_bytes(hashlib.sha256(f"retrieval|{k}".encode()).digest()[:8], "big") for k in keys),
        dtype=np.uint64,
        count=len(keys),
    )


def _require(df: pl.DataFrame | pl.LazyFrame, columns: tuple[str, ...], name: str) -> None:
    names = df.collect_schema().names() if isinstance(df, pl.LazyFrame) else df.columns
    missing = [c for c in columns if c not in names]
    if missing:
        raise RetrievalInputError("missing_column", f"{name} lacks column(s) {missing}")


def entity_states(study_labels: pl.DataFrame, entity_mentions: pl.DataFrame, states: list[str]) -> pl.DataFrame:
    """Structured entity state per (study, entity) of the given states (module docstring).

    Parameters
    ----------
    study_labels : polars.DataFrame
        ``study_labels`` rows (:mod:`schemas.study_labels`).
    entity_mentions : polars.DataFrame
        ``entity_mentions`` rows (:mod:`schemas.entity_mentions`); may be empty (all attributes unreported).
    states : list of str
        label states to keep.

    Returns
    -------
    polars.DataFrame
        ``study_key``, ``patient_key``, ``family``, ``entity_id``, ``state``, ``change``, ``shard``,
        ``laterality``, ``severity``, ``anatomy`` (str or null) and ``mention_ids`` (list of str, text order).
    """
    labels = study_labels.lazy().select(_LABEL_COLUMNS).filter(pl.col("state").is_in(states))
    if entity_mentions.height == 0:
        return labels.with_columns(
            laterality=pl.lit(None, pl.Utf8),
            severity=pl.lit(None, pl.Utf8),
            anatomy=pl.lit(None, pl.Utf8),
            mention_ids=pl.lit([], pl.List(pl.Utf8)),
        ).collect()
    _require(entity_mentions, _MENTION_COLUMNS, "entity_mentions")
    priority: Any = pl.when(pl.col("section") == "impression").then(0)
    for i, group in enumerate(DECIDING_SECTIONS[1:], start=1):
        priority = priority.when(pl.col("section").is_in(list(group))).then(i)
    m = (
        entity_mentions.lazy()
        .select(_MENTION_COLUMNS)
        .filter(pl.col("study_key").is_not_null() & (pl.col("temporality") != "hypothetical"))
        .with_columns(priority=priority.otherwise(None))
        .filter(pl.col("priority").is_not_null())
        .join(labels.select("study_key", "entity_id", "state"), on=["study_key", "entity_id"], how="inner")
        .filter(pl.col("assertion") == pl.col("state"))
        .filter(pl.col("priority") == pl.col("priority").min().over("study_key", "entity_id"))
        .sort("study_key", "entity_id", "span_start", "mention_id")
        .group_by("study_key", "entity_id", maintain_order=True)
        .agg(
            laterality=pl.col("laterality").drop_nulls().first(),
            severity=pl.col("severity").drop_nulls().first(),
            anatomy=pl.col("anatomy_id").drop_nulls().first(),
            mention_ids=pl.col("mention_id"),
        )
    )
    return (
        labels.join(m, on=["study_key", "entity_id"], how="left")
        .with_columns(pl.col("mention_ids").fill_null(pl.lit([], pl.List(pl.Utf8))))
        .collect()
    )


# ------------------------------------------------------------------------------------------ targets


def _relevant_signature_pairs(sigs: pl.DataFrame, cfg: RetrievalConfig, similarity: dict) -> pl.DataFrame:
    """(family, entity, state, qsig, csig, relevance) for every signature pair of one group above the threshold.

    Vectorised: each attribute's distance is looked up in a table over its (small) value vocabulary built with
    :func:`attribute_distance`, so the formula is the one of :func:`relevance`.
    """
    pair = sigs.join(sigs, on=["family", "entity_id", "state"], suffix="_c")
    loss = pl.lit(0.0)
    for k in ATTRIBUTES:
        values = sorted(set(sigs.get_column(k).drop_nulls().to_list())) + [None]
        table = pl.DataFrame(
            [(a, b, attribute_distance(k, a, b, similarity)) for a in values for b in values],
            schema={k: pl.Utf8, f"{k}_c": pl.Utf8, f"d_{k}": pl.Float64},
            orient="row",
        )
        pair = pair.join(table, on=[k, f"{k}_c"], how="left", nulls_equal=True)
        loss = loss + cfg.weights[k] * pl.col(f"d_{k}")
    return (
        pair.with_columns(relevance=(1.0 - loss).clip(lower_bound=0.0))
        .filter(pl.col("relevance") > cfg.threshold)
        .select("family", "entity_id", "state", pl.col("sig").alias("qsig"), pl.col("sig_c").alias("csig"), "relevance")
    )


def build_retrieval_targets(
    study_labels: pl.DataFrame,
    entity_mentions: pl.DataFrame,
    splits: pl.DataFrame,
    cfg: RetrievalConfig,
    similarity: dict,
) -> pa.Table:
    """Build the ``retrieval_targets`` table over all shards (cross-patient: not shard-local).

    Parameters
    ----------
    study_labels : polars.DataFrame
        all ``study_labels`` rows: ``study_key``, ``patient_key``, ``family``, ``entity_id``, ``state``, ``change``,
        ``shard``; one row per (study, entity).
    entity_mentions : polars.DataFrame
        all ``entity_mentions`` rows (attributes; may be empty).
    splits : polars.DataFrame
        ``patient_key``, ``split``; every patient with a query-state label must have exactly one split.
    cfg : schemas.config.RetrievalConfig
        ``threshold``, ``top_k``, ``max_studies_per_entity``, ``states``, ``weights``.
    similarity : dict
        from :func:`load_similarity`.

    Returns
    -------
    pyarrow.Table
        :data:`schemas.retrieval_targets.SCHEMA`, sorted by its key; ``rank`` 1..k per (query, entity);
        ``relevance`` float32; ``shard`` the query study's shard. At most ``top_k`` rows per (query, entity).

    Raises
    ------
    RetrievalInputError
        ``missing_column``, ``null_value``, ``duplicate_label``, ``patient_without_split``,
        ``patient_in_several_splits``.
    """
    if study_labels.height == 0:
        return SCHEMA.empty_table()
    _require(study_labels, _LABEL_COLUMNS, "study_labels")
    for c in _LABEL_COLUMNS:
        if study_labels.get_column(c).null_count():
            raise RetrievalInputError("null_value", f"study_labels.{c} has null value(s)")
    if has_duplicate_keys(study_labels, ("study_key", "entity_id")):
        raise RetrievalInputError("duplicate_label", "study_labels repeats a (study, entity)")
    _require(splits, _SPLIT_COLUMNS, "splits")
    split_of = splits.select(_SPLIT_COLUMNS).unique()
    if split_of.get_column("patient_key").is_duplicated().any():
        raise RetrievalInputError("patient_in_several_splits", "a patient has rows in two splits")

    st = entity_states(study_labels, entity_mentions, list(cfg.states))
    if st.height == 0:
        return SCHEMA.empty_table()
    st = st.join(split_of, on="patient_key", how="left")
    if st.get_column("split").null_count():
        raise RetrievalInputError("patient_without_split", "a patient with a query-state label has no split")

    # integer ids and the stable hash H of every study
    keys = st.get_column("study_key").unique().sort()
    key_ids = pl.DataFrame(
        {
            "study_key": keys,
            "sid": pl.arange(0, len(keys), eager=True, dtype=pl.UInt32),
            "h": pl.Series(study_hash(keys.to_list()), dtype=pl.UInt64),
        }
    )
    st = st.join(key_ids, on="study_key").with_columns(pid=pl.col("patient_key").rank("dense").cast(pl.UInt32))
    patient_of = st.get_column("patient_key").unique().sort()  # patient_of[pid - 1] = patient_key (dense rank)
    # the cap per (family, entity): lowest H first
    st = st.filter(pl.col("h").rank("ordinal").over("family", "entity_id") <= cfg.max_studies_per_entity)
    # state signatures (distinct attribute tuples per family/entity/state)
    st = st.with_columns(change_attr=pl.when(pl.col("change") == NO_CHANGE).then(None).otherwise(pl.col("change")))
    sig_cols = ["family", "entity_id", "state", "laterality", "severity", "anatomy", "change_attr"]
    sigs = st.select(sig_cols).unique().sort(sig_cols, nulls_last=True)
    sigs = sigs.with_columns(sig=pl.int_range(sigs.height, dtype=pl.UInt32)).rename({"change_attr": "change"})
    st = st.join(sigs.rename({"change": "change_attr"}), on=sig_cols, how="left", nulls_equal=True)
    rel = _relevant_signature_pairs(sigs, cfg, similarity)

    # candidate pools: (family, entity, state, split, signature), ordered by H
    cand = (
        st.select("family", "entity_id", "state", "split", "sig", "sid", "pid", "h")
        .sort("family", "entity_id", "state", "split", "sig", "h", "sid")
        .with_columns(
            pos=pl.int_range(pl.len(), dtype=pl.UInt32).over("family", "entity_id", "state", "split", "sig"),
            n=pl.len().over("family", "entity_id", "state", "split", "sig").cast(pl.UInt32),
        )
    )
    longest: Any = cand.group_by("family", "entity_id", "state", "split", "sig", "pid").len().get_column("len").max()
    slack = int(longest or 0)
    width = cfg.top_k + slack  # enough ring steps to find k studies of other patients
    pools = cand.select("family", "entity_id", "state", "split", "sig", "n").unique()
    queries = st.select("family", "entity_id", "state", "split", "sig", "sid", "pid", "h", "shard")
    out_parts = []
    # one (family, entity) at a time: candidates never cross entities, and the ring expansion of one entity is
    # a bounded slice of the whole (peak memory of the largest entity, not of the archive)
    cand_of = cand.partition_by("family", "entity_id", as_dict=True)
    for (family, entity), q in queries.group_by("family", "entity_id", maintain_order=False):
        q = q.rename({"sig": "qsig", "sid": "q_sid", "pid": "q_pid", "h": "q_h"})
        q = q.join(
            rel.filter((pl.col("family") == family) & (pl.col("entity_id") == entity)),
            on=["family", "entity_id", "state", "qsig"],
            how="inner",
        )
        q = q.join(pools.rename({"sig": "csig"}), on=["family", "entity_id", "state", "split", "csig"], how="inner")
        # start = number of pool members with H < query H (the first member at or after the query on the ring)
        c_f = cand_of[(family, entity)].rename({"sig": "csig"})
        q = q.sort("q_h")
        starts = (
            q.join_asof(
                c_f.select("entity_id", "state", "split", "csig", "h", "pos").sort("h"),
                left_on="q_h",
                right_on="h",
                by=["entity_id", "state", "split", "csig"],
                strategy="forward",
                check_sortedness=False,  # both sides are sorted by H above
            )
            .with_columns(start=pl.col("pos").fill_null(0))
            .drop("pos", "h")
        )
        steps = pl.DataFrame({"step": pl.arange(0, width, eager=True, dtype=pl.UInt32)})
        exp = (
            starts.join(steps, how="cross")
            .filter(pl.col("step") < pl.col("n"))
            .with_columns(pos=((pl.col("start") + pl.col("step")) % pl.col("n")).cast(pl.UInt32))
            .join(
                c_f.select("entity_id", "state", "split", "csig", "pos", "sid", "pid"),
                on=["entity_id", "state", "split", "csig", "pos"],
                how="inner",
            )
            .filter(pl.col("pid") != pl.col("q_pid"))
            .sort(["q_sid", "entity_id", "relevance", "step", "sid"], descending=[False, False, True, False, False])
            .with_columns(rank=pl.int_range(1, pl.len() + 1, dtype=pl.Int32).over("q_sid", "entity_id"))
            .filter(pl.col("rank") <= cfg.top_k)
            .select(
                "q_sid", "entity_id", "sid", "rank", "relevance", "family", "state", "q_pid", "pid", "split", "shard"
            )
        )
        out_parts.append(exp)
    if not out_parts:
        return SCHEMA.empty_table()
    out = pl.concat(out_parts)
    del out_parts
    # sid is the rank of study_key (keys are sorted), so sorting the integer ids sorts the keys: sort the narrow
    # id columns, then look the strings up by position (no hash join, no sort of wide string rows)
    out = out.sort("q_sid", "entity_id", "sid")
    study_of = keys  # study_of[sid] = study_key
    out = out.select(
        query_study_key=study_of.gather(out.get_column("q_sid")),
        entity_id=pl.col("entity_id"),
        candidate_study_key=study_of.gather(out.get_column("sid")),
        rank=pl.col("rank"),
        relevance=pl.col("relevance").cast(pl.Float32),
        family=pl.col("family"),
        state=pl.col("state"),
        query_patient_key=patient_of.gather(out.get_column("q_pid") - 1),
        candidate_patient_key=patient_of.gather(out.get_column("pid") - 1),
        split=pl.col("split"),
        shard=pl.col("shard").cast(pl.Int32),
    )
    return out.to_arrow().cast(SCHEMA)
