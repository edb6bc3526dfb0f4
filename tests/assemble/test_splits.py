"""Tests for etl.assemble.splits.assign_splits: fractions, external test, order independence, errors."""

from __future__ import annotations

import hashlib

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from etl.assemble.splits import SplitInputError, assign_splits, hashed_split, split_fraction
from schemas.config import SplitConfig
from schemas.splits import SCHEMA

CFG = SplitConfig(train=0.7, val=0.15, test=0.15, external_test_institutions=["au-mel-central"])
PATIENT_SCHEMA = {"patient_key": pl.Utf8, "institution": pl.Utf8, "shard": pl.Int32}


def patients(rows: list[tuple[str, str, int]]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=PATIENT_SCHEMA, orient="row")


def synthetic(n: int) -> pl.DataFrame:
    insts = ["us-bos-general", "gb-lon-royal", "ie-dub-stjames"]
    return patients([(hashlib.sha256(f"p{i}".encode()).hexdigest()[:16], insts[i % 3], i % 4) for i in range(n)])


def test_fractions_on_2000_patients_within_3_points():
    t = assign_splits(synthetic(2000), CFG)
    assert t.num_rows == 2000 and t.schema.equals(SCHEMA, check_metadata=True)
    splits = t["split"].to_pylist()
    for name, frac in (("train", 0.7), ("val", 0.15), ("test", 0.15)):
        assert abs(splits.count(name) / 2000 - frac) <= 0.03, name
    assert "external_test" not in splits


def test_hash_rule_matches_definition():
    key = "0123456789abcdef"
    u = int.from_bytes(hashlib.sha256(f"medreco-splits-v1|{key}".encode()).digest()[:8], "big") / 2**64
    assert split_fraction(key) == u
    expected = "train" if u < 0.7 else ("val" if u < 0.85 else "test")
    assert hashed_split(key, CFG) == expected
    (row,) = assign_splits(patients([(key, "gb-lon-royal", 1)]), CFG).to_pylist()
    assert row == {"patient_key": key, "institution": "gb-lon-royal", "split": expected, "shard": 1}


def test_external_institution_wins_for_patient_seen_at_two():
    df = patients(
        [
            ("pa", "us-bos-general", 0),
            ("pa", "au-mel-central", 0),
            ("pb", "au-mel-central", 1),
            ("pc", "us-bos-general", 2),
            ("pc", "gb-lon-royal", 2),
        ]
    )
    rows = {r["patient_key"]: r for r in assign_splits(df, CFG).to_pylist()}
    assert len(rows) == 3
    assert rows["pa"]["split"] == "external_test" and rows["pa"]["institution"] == "au-mel-central"
    assert rows["pb"]["split"] == "external_test"
    assert rows["pc"]["split"] == hashed_split("pc", CFG) and rows["pc"]["institution"] == "gb-lon-royal"


def test_repeated_rows_collapse_to_one_patient():
    df = patients([("pz", "gb-lon-royal", 3)] * 5)
    t = assign_splits(df, CFG)
    assert t["patient_key"].to_pylist() == ["pz"]


def test_empty_input_gives_empty_table():
    for df in (pl.DataFrame(), pl.DataFrame(schema=PATIENT_SCHEMA)):
        t = assign_splits(df, CFG)
        assert t.num_rows == 0 and t.schema.equals(SCHEMA, check_metadata=True)


def test_salt_changes_assignment():
    a = assign_splits(synthetic(300), CFG)["split"].to_pylist()
    b = assign_splits(synthetic(300), CFG, salt="another-salt")["split"].to_pylist()
    assert a != b


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(min_value=0, max_value=2**31), cut=st.integers(min_value=1, max_value=199))
def test_independent_of_row_order_and_of_other_patients(seed, cut):
    df = synthetic(200).vstack(patients([("pa", "au-mel-central", 0), ("pa", "us-bos-general", 0)]))
    expected = assign_splits(df, CFG)
    shuffled = df.sample(fraction=1.0, shuffle=True, seed=seed)
    assert assign_splits(shuffled, CFG).equals(expected)
    # a subset of whole patients (as a shard holds) gets the same split per patient as the whole
    chosen = shuffled["patient_key"].unique(maintain_order=True).head(cut)
    part = assign_splits(shuffled.filter(pl.col("patient_key").is_in(chosen)), CFG).to_pylist()
    assert len(part) == cut
    whole = {r["patient_key"]: r["split"] for r in expected.to_pylist()}
    assert all(whole[r["patient_key"]] == r["split"] for r in part)


@pytest.mark.parametrize(
    ("df", "reason"),
    [
        (patients([("pa", "gb-lon-royal", 0)]).drop("shard"), "missing_column"),
        (patients([(None, "gb-lon-royal", 0)]), "null_value"),
        (patients([("pa", "gb-lon-royal", 0), ("pa", "us-bos-general", 1)]), "patient_in_several_shards"),
    ],
)
def test_bad_input_raises_with_reason(df, reason):
    with pytest.raises(SplitInputError) as err:
        assign_splits(df, CFG)
    assert err.value.reason == reason


def test_empty_salt_rejected():
    with pytest.raises(SplitInputError) as err:
        assign_splits(synthetic(3), CFG, salt="")
    assert err.value.reason == "empty_salt"
