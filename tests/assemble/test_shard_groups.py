"""Group-by-shard processing (etl.assemble.shard_groups) gives exactly the one-pass result; cheap key checks; the VQA
answer-in-question check equals its regex definition; the split check reads datasets column by column."""

from __future__ import annotations

import importlib.util
import re

import polars as pl
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from etl.assemble.frame_keys import has_duplicate_keys
from etl.assemble.pairs import build_pairs
from etl.assemble.retrieval import build_retrieval_targets, load_similarity
from etl.assemble.shard_groups import rows_of, shard_groups
from etl.assemble.splits import SplitLeakError, assign_splits, check_split_integrity
from etl.assemble.vqa import _has_phrase, build_case_comparison_vqa, build_vqa, load_templates
from schemas.config import PROJECT_ROOT, PairingConfig, RetrievalConfig, SplitConfig, VQAConfig
from schemas.ontology import load_ontology

BENCH = PROJECT_ROOT / "benchmarks" / "bench_pairs.py"


@pytest.fixture(scope="module")
def archive():
    """A synthetic 600-patient archive over 64 shards (the benchmark's generator) with splits and pairs."""
    spec = importlib.util.spec_from_file_location("bench_pairs", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    data = bench.generate(600, seed=7)
    studies = data["studies"]
    splits = pl.from_arrow(
        assign_splits(
            studies.select("patient_key", "institution", "shard").unique(), SplitConfig(train=0.8, val=0.1, test=0.1)
        )
    )
    pairs = build_pairs(studies, data["study_labels"], data["images"], PairingConfig(), max_studies=10**9)
    return data, splits, pairs


def test_shard_groups_are_consecutive_and_bounded():
    shards = pl.Series("shard", [3, 1, 1, 2, 2, 2, 5, 7, 7, 7, 7, 0])
    assert shard_groups(shards, 3) == [[0, 1], [2], [3, 5], [7]]  # 7 alone: larger than the bound
    assert shard_groups(shards, 100) == [[0, 1, 2, 3, 5, 7]]
    assert shard_groups(pl.Series("shard", [], dtype=pl.Int32), 5) == []
    with pytest.raises(ValueError, match="at least 1"):
        shard_groups(shards, 0)
    with pytest.raises(ValueError, match="null"):
        shard_groups(pl.Series("shard", [1, None]), 5)


def test_rows_of_keeps_frames_without_the_column():
    df = pl.DataFrame({"study_key": ["a", "b", "c"], "x": [1, 2, 3]})
    assert rows_of(df, "study_key", pl.Series(["c", "a"])).get_column("x").to_list() == [1, 3]
    assert rows_of(None, "study_key", pl.Series(["a"])) is None
    empty = pl.DataFrame()
    assert rows_of(empty, "study_key", pl.Series(["a"])) is empty


def test_pairs_in_shard_groups_equal_one_pass(archive):
    data, _, pairs = archive
    assert pairs.num_rows > 50
    grouped = build_pairs(data["studies"], data["study_labels"], data["images"], PairingConfig(), max_studies=40)
    assert len(shard_groups(data["studies"]["shard"], 40)) > 10
    assert grouped.equals(pairs)


def test_vqa_in_shard_groups_equal_one_pass(archive):
    data, splits, pairs = archive
    args = (
        pl.from_arrow(pairs),
        data["study_labels"],
        data["studies"],
        splits,
        VQAConfig(),
        load_templates(),
        load_ontology(),
    )
    kw = dict(entity_mentions=data["entity_mentions"], images=data["images"])
    one = build_vqa(*args, **kw, max_studies=10**9)
    grouped = build_vqa(*args, **kw, max_studies=60)
    assert one.num_rows > 1000
    assert grouped.equals(one)
    keys = pl.from_arrow(one.select(["shard", "item_id"]))
    assert keys.equals(keys.sort("shard", "item_id"))  # sorted by shard, then item_id
    assert set(one.column("question_type").unique().to_pylist()) >= {"presence", "change", "open_view"}


def test_case_vqa_in_query_shard_groups_equal_one_pass(archive):
    data, splits, _ = archive
    sim = load_similarity()
    targets = pl.from_arrow(
        build_retrieval_targets(data["study_labels"], data["entity_mentions"], splits, RetrievalConfig(), sim)
    )
    args = (
        targets,
        data["study_labels"],
        data["entity_mentions"],
        VQAConfig(),
        load_templates(),
        load_ontology(),
        sim["severity"]["ordinal"],
    )
    one = build_case_comparison_vqa(*args, max_queries=10**9)
    grouped = build_case_comparison_vqa(*args, max_queries=25)
    assert one.num_rows > 100
    assert grouped.equals(one)


def test_vqa_duplicate_label_and_unknown_study_still_raise_when_grouped(archive):
    data, splits, pairs = archive
    from etl.assemble.vqa import VQAInputError

    lab = data["study_labels"]
    args = (pl.from_arrow(pairs), None, data["studies"], splits, VQAConfig(), load_templates(), load_ontology())
    stray = lab.head(1).with_columns(study_key=pl.lit("not-a-study"))
    with pytest.raises(VQAInputError, match="unknown_study"):
        build_vqa(args[0], pl.concat([lab, stray]), *args[2:], max_studies=60)
    with pytest.raises(VQAInputError, match="duplicate_label"):
        build_vqa(args[0], pl.concat([lab, lab.head(1)]), *args[2:], max_studies=60)


def test_has_duplicate_keys():
    df = pl.DataFrame({"a": ["x", "x", "y", None, None], "b": ["1", "2", "1", "3", "4"]})
    assert not has_duplicate_keys(df, ("a", "b"))
    assert has_duplicate_keys(df, ("a",))
    assert has_duplicate_keys(pl.concat([df, df.slice(3, 1)]), ("a", "b"))  # nulls compare equal
    assert not has_duplicate_keys(df.head(1), ("a", "b"))


_ALPHABET = hs.sampled_from(["a", "b", "A", "é", "É", "1", "_", " ", "-", "(", ")", ".", "?", "x-ray", "no"])


@settings(max_examples=400, deadline=None)
@given(
    text=hs.lists(_ALPHABET, max_size=12).map("".join), phrase=hs.lists(_ALPHABET, min_size=1, max_size=4).map("".join)
)
def test_has_phrase_equals_its_regex_definition(text, phrase):
    expected = bool(re.search(r"(?i)\b" + re.escape(phrase) + r"\b", text))
    assert _has_phrase(text, phrase) is expected


def test_has_phrase_examples():
    assert _has_phrase("Is there a pleural effusion?", "pleural effusion")
    assert not _has_phrase("Is there a pleural effusion?", "effusio")
    assert _has_phrase("What changed in the RIGHT lung?", "right")
    assert not _has_phrase("upright view", "right")


def test_split_check_reads_datasets_column_by_column(tmp_path, archive):
    data, splits, pairs = archive
    sp = splits.to_arrow()
    pq.write_table(pairs, tmp_path / "pairs.parquet")
    counts = check_split_integrity(sp, studies=data["studies"], pairs=ds.dataset(tmp_path / "pairs.parquet"))
    assert counts["pairs_cross_patient"] == 0 and counts["pairs_without_split"] == 0
    moved = pl.from_arrow(pairs).with_columns(patient_key=pl.lit("someone-else"))
    pq.write_table(moved.to_arrow(), tmp_path / "bad.parquet")
    with pytest.raises(SplitLeakError):
        check_split_integrity(sp, studies=data["studies"], pairs=ds.dataset(tmp_path / "bad.parquet"))
