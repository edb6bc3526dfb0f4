"""Tests for etl.assemble.retrieval: similarity formula, exact top-k targets, split/patient rules, cap, determinism."""

from __future__ import annotations

import polars as pl
import pytest

from etl.assemble.retrieval import (
    RetrievalInputError,
    attribute_distance,
    build_retrieval_targets,
    load_similarity,
    relevance,
    study_hash,
)
from etl.assemble.splits import SplitLeakError, check_split_integrity
from schemas.config import RetrievalConfig
from schemas.retrieval_targets import SCHEMA

SIM = load_similarity()
CFG = RetrievalConfig()
LAB = {
    "study_key": pl.Utf8,
    "patient_key": pl.Utf8,
    "family": pl.Utf8,
    "entity_id": pl.Utf8,
    "state": pl.Utf8,
    "change": pl.Utf8,
    "shard": pl.Int32,
}
MEN = {
    "mention_id": pl.Utf8,
    "study_key": pl.Utf8,
    "entity_id": pl.Utf8,
    "assertion": pl.Utf8,
    "temporality": pl.Utf8,
    "section": pl.Utf8,
    "laterality": pl.Utf8,
    "severity": pl.Utf8,
    "anatomy_id": pl.Utf8,
    "span_start": pl.Int32,
}


def labels(*rows):
    """rows: (study_key, patient_key, state, change); family 2D-CXR, entity F029, shard = patient number."""
    return pl.DataFrame(
        [(s, p, "2D-CXR", "F029", st, ch, int(p[1:])) for s, p, st, ch in rows], schema=LAB, orient="row"
    )


def mentions(*rows):
    """rows: (mention_id, study_key, assertion, section, laterality, severity, span_start)."""
    return pl.DataFrame(
        [(m, s, "F029", a, "current", sec, lat, sev, "A009", pos) for m, s, a, sec, lat, sev, pos in rows],
        schema=MEN,
        orient="row",
    )


def splits(mapping):
    return pl.DataFrame({"patient_key": list(mapping), "split": list(mapping.values())})


def rows(t):
    return [
        (r["query_study_key"], r["candidate_study_key"], r["rank"], round(r["relevance"], 4)) for r in t.to_pylist()
    ]


def test_attribute_distances_follow_the_data_file():
    assert attribute_distance("laterality", "left", "right", SIM) == 1.0
    assert attribute_distance("laterality", "left", "bilateral", SIM) == 0.5
    assert attribute_distance("laterality", None, "left", SIM) == 0.5
    assert attribute_distance("severity", "mild", "small", SIM) == 0.0
    assert attribute_distance("severity", "mild", "severe", SIM) == pytest.approx(2 / 3)
    assert attribute_distance("severity", "trace", "large", SIM) == 1.0
    assert attribute_distance("anatomy", "A009", "A010", SIM) == 1.0
    assert attribute_distance("change", "increased", "worsened", SIM) == 0.5
    assert attribute_distance("change", "increased", "improved", SIM) == 1.0
    assert attribute_distance("change", "none", None, SIM) == 0.0
    assert attribute_distance("change", "none", "new", SIM) == 0.5


def test_relevance_formula():
    q = {"state": "present", "laterality": "left", "severity": "mild", "anatomy": "A009"}
    assert relevance(q, dict(q), CFG, SIM) == 1.0
    assert relevance(q, {**q, "state": "absent"}, CFG, SIM) == 0.0
    # right vs left (0.3 * 1) and moderate vs mild (0.3 * 1/3): 1 - 0.4
    assert relevance(q, {**q, "laterality": "right", "severity": "moderate"}, CFG, SIM) == pytest.approx(0.6)
    # a single smallest difference lands exactly on the default threshold, which is exclusive
    assert relevance(q, {**q, "severity": "moderate"}, CFG, SIM) == pytest.approx(0.9)


def test_exact_targets_small_archive():
    lab = labels(
        ("a1", "p1", "present", "none"),
        ("a2", "p1", "present", "none"),
        ("b1", "p2", "present", "none"),
        ("c1", "p3", "present", "none"),
        ("d1", "p4", "present", "none"),
        ("e1", "p5", "absent", "none"),
        ("t1", "p6", "present", "none"),
    )
    men = mentions(
        ("m1", "a1", "present", "impression", "left", None, 5),
        ("m2", "a2", "present", "findings", "left", None, 5),
        ("m3", "b1", "present", "impression", "left", None, 9),
        ("m4", "b1", "present", "impression", "right", None, 30),  # later in text: left wins
        ("m5", "c1", "present", "findings", "right", None, 3),
        ("m6", "d1", "present", "indication", "left", None, 3),
    )  # indication decides nothing
    sp = splits({"p1": "train", "p2": "train", "p3": "train", "p4": "train", "p5": "train", "p6": "test"})
    t = build_retrieval_targets(lab, men, sp, RetrievalConfig(top_k=3), SIM)
    assert t.schema.equals(SCHEMA, check_metadata=True)
    got = {(q, c): (k, r) for q, c, k, r in rows(t)}
    # left: a1, a2, b1 (identical states); d1: laterality unreported. p1's two studies never retrieve each other
    assert {q for q, _ in got} == {"a1", "a2", "b1"}
    assert set(got) == {("a1", "b1"), ("a2", "b1"), ("b1", "a1"), ("b1", "a2")}
    assert all(r == 1.0 for _, r in got.values())
    assert sorted(got[("b1", "a1")][0:1] + got[("b1", "a2")][0:1]) == [1, 2]
    # t1 is alone in the test split; e1 is absent (not a query state): no targets
    loose = build_retrieval_targets(lab, men, sp, RetrievalConfig(threshold=0.7, top_k=5), SIM)
    lg = {(q, c): r for q, c, _, r in rows(loose)}
    # c1 (right) vs left: 1 - 0.3 = 0.7, not above 0.7; d1 has no deciding mention, so side and anatomy are
    # unreported: 1 - 0.3 * 0.5 - 0.2 * 0.5 = 0.75
    assert lg[("a1", "d1")] == 0.75 and ("a1", "c1") not in lg
    assert lg[("c1", "d1")] == 0.75
    ranks = [k for q, c, k, r in rows(loose) if q == "a1"]
    assert sorted(ranks) == [1, 2] and [c for q, c, k, r in sorted(rows(loose), key=lambda x: x[2]) if q == "a1"] == [
        "b1",
        "d1",
    ]
    assert not any(r["split"] != "train" for r in loose.to_pylist())
    assert all(r["query_patient_key"] != r["candidate_patient_key"] for r in loose.to_pylist())


def test_top_k_ring_order_is_deterministic_and_spread():
    n = 40
    lab = labels(*[(f"s{i:02d}", f"p{i}", "present", "none") for i in range(n)])
    sp = splits({f"p{i}": "train" for i in range(n)})
    t = build_retrieval_targets(lab, pl.DataFrame(), sp, RetrievalConfig(top_k=3), SIM)
    assert t.num_rows == 3 * n
    again = build_retrieval_targets(
        lab.sample(fraction=1.0, shuffle=True, seed=5), pl.DataFrame(), sp, RetrievalConfig(top_k=3), SIM
    )
    assert t.equals(again)
    # the ring: candidates are the next 3 studies after the query in H order (wrapping)
    keys = [f"s{i:02d}" for i in range(n)]
    ring = [k for _, k in sorted(zip(study_hash(keys).tolist(), keys))]
    q = ring[7]
    got = sorted((r["rank"], r["candidate_study_key"]) for r in t.to_pylist() if r["query_study_key"] == q)
    assert [c for _, c in got] == ring[8:11]
    # spread: the most retrieved study is retrieved by at most 3 queries
    counts = pl.from_arrow(t).group_by("candidate_study_key").len()["len"]
    assert counts.max() == 3


def test_cap_keeps_lowest_hash_studies():
    n = 12
    lab = labels(*[(f"s{i:02d}", f"p{i}", "present", "none") for i in range(n)])
    sp = splits({f"p{i}": "val" for i in range(n)})
    t = build_retrieval_targets(lab, pl.DataFrame(), sp, RetrievalConfig(max_studies_per_entity=5, top_k=10), SIM)
    keys = [f"s{i:02d}" for i in range(n)]
    kept = {k for _, k in sorted(zip(study_hash(keys).tolist(), keys))[:5]}
    assert set(t["query_study_key"].to_pylist()) == kept == set(t["candidate_study_key"].to_pylist())
    assert t.num_rows == 5 * 4


def test_bad_inputs():
    lab = labels(("a1", "p1", "present", "none"), ("b1", "p2", "present", "none"))
    with pytest.raises(RetrievalInputError) as err:
        build_retrieval_targets(lab, pl.DataFrame(), splits({"p1": "train"}), CFG, SIM)
    assert err.value.reason == "patient_without_split"
    with pytest.raises(RetrievalInputError) as err:
        build_retrieval_targets(pl.concat([lab, lab]), pl.DataFrame(), splits({"p1": "a", "p2": "a"}), CFG, SIM)
    assert err.value.reason == "duplicate_label"
    with pytest.raises(RetrievalInputError) as err:
        build_retrieval_targets(lab.drop("shard"), pl.DataFrame(), splits({"p1": "a", "p2": "a"}), CFG, SIM)
    assert err.value.reason == "missing_column"
    assert build_retrieval_targets(lab.head(0), pl.DataFrame(), splits({}), CFG, SIM).num_rows == 0


def test_split_check_passes_clean_tables_and_raises_on_leaks():
    lab = labels(*[(f"s{i}", f"p{i}", "present", "none") for i in range(6)])
    sp = splits({f"p{i}": ("train" if i < 3 else "test") for i in range(6)})
    t = build_retrieval_targets(lab, pl.DataFrame(), sp, CFG, SIM)
    studies = lab.select("study_key", "patient_key").unique()
    counts = check_split_integrity(sp, studies=studies, retrieval_targets=t)
    assert counts == {
        "patients_in_several_splits": 0,
        "study_patients_without_split": 0,
        "retrieval_same_patient": 0,
        "retrieval_cross_split": 0,
    }
    leak = pl.from_arrow(t).with_columns(candidate_patient_key=pl.lit("p5"))  # a test patient behind train queries
    with pytest.raises(SplitLeakError) as err:
        check_split_integrity(sp, retrieval_targets=leak)
    assert err.value.counts["retrieval_cross_split"] >= 4
    with pytest.raises(SplitLeakError) as err:
        check_split_integrity(pl.concat([sp, splits({"p0": "val"})]))
    assert err.value.counts["patients_in_several_splits"] == 1
    pairs = pl.DataFrame(
        {"pair_id": ["x"], "patient_key": ["p0"], "prior_study_key": ["s0"], "current_study_key": ["s4"]}
    )
    with pytest.raises(SplitLeakError) as err:
        check_split_integrity(sp, studies=studies, pairs=pairs)
    assert err.value.counts["pairs_cross_patient"] == 1
    vqa = pl.DataFrame({"patient_key": ["p0", "p4"], "split": ["train", "train"]})
    with pytest.raises(SplitLeakError) as err:
        check_split_integrity(sp, vqa=vqa)
    assert err.value.counts["vqa_split_mismatch"] == 1
