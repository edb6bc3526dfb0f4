"""Shard batches of the mapped per-shard stages, balanced by the plan's pending DICOM files."""

import pyarrow as pa
import pytest

from etl.pipeline.batches import balanced_shard_batches, pending_files_per_shard

#: pending files per shard of the bench_workers archive (32 patients x 2 radiographs, 8 shards), read from a run
BENCH_ARCHIVE = {0: 6, 1: 12, 2: 10, 3: 8, 4: 6, 5: 4, 6: 12, 7: 6}


def _weights(batches, files):
    return [sum(files.get(s, 0) for s in b) for b in batches]


def test_the_bench_archive_splits_evenly_where_contiguous_batches_do_not():
    assert _weights([[0, 1, 2, 3], [4, 5, 6, 7]], BENCH_ARCHIVE) == [36, 28]  # contiguous, as before
    batches = balanced_shard_batches(BENCH_ARCHIVE, 8, 2)
    # LPT by hand: s1 12 -> A, s6 12 -> B, s2 10 -> A 22, s3 8 -> B 20, s0 6 -> B 26, s4 6 -> A 28,
    # s7 6 -> B 32, s5 4 -> A 32
    assert batches == [[0, 3, 6, 7], [1, 2, 4, 5]]
    assert _weights(batches, BENCH_ARCHIVE) == [32, 32]


def test_every_shard_once_every_batch_nonempty_even_with_empty_shards():
    files = {0: 50}  # one heavy shard, nine empty ones
    batches = balanced_shard_batches(files, 10, 4)
    assert len(batches) == 4 and all(batches)
    assert sorted(s for b in batches for s in b) == list(range(10))
    assert batches == [[0], [1, 4, 7], [2, 5, 8], [3, 6, 9]]  # the empty ones dealt out by shard count


def test_one_shard_per_batch_when_the_map_length_allows_it():
    assert balanced_shard_batches(BENCH_ARCHIVE, 8, 1024) == [[i] for i in range(8)]
    assert balanced_shard_batches({}, 5000, 1024)[0] == [0, 1024, 2048, 3072, 4096]
    assert len(balanced_shard_batches({}, 5000, 1024)) == 1024


def test_lpt_stays_within_four_thirds_of_the_optimum():
    # Graham's worst case for m=2: 3,3,2,2,2 -> LPT 7 against the optimum 6 (3+3 | 2+2+2); bound 4/3 - 1/6
    files = {0: 3, 1: 3, 2: 2, 3: 2, 4: 2}
    assert max(_weights(balanced_shard_batches(files, 5, 2), files)) == 7


@pytest.mark.parametrize(
    "files,shards,width,match",
    [
        ({8: 1}, 8, 2, "outside 0..7"),
        ({0: -1}, 8, 2, "negative"),
        ({}, 0, 2, ">= 1"),
        ({}, 8, 0, ">= 1"),
    ],
)
def test_bad_counts_are_refused(files, shards, width, match):
    with pytest.raises(ValueError, match=match):
        balanced_shard_batches(files, shards, width)


def test_pending_files_per_shard_counts_pending_dicom_only():
    plan = pa.table(
        {
            "kind": ["dicom", "dicom", "dicom", "report", "dicom", "dicom"],
            "status": ["pending", "pending", "quarantined", "pending", "pending", "pending"],
            "shard": pa.array([3, 3, 3, 1, 0, None], pa.int32()),
        }
    )
    assert pending_files_per_shard(plan) == {3: 2, 0: 1}
