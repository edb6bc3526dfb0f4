"""Which patient-hash shards each mapped task of a per-shard stage gets: batches balanced by pending files.

Patient-hash shards are unequal on a small corpus (32 patients over 8 shards: 2 to 6 patients a shard), so the
contiguous split of shard ids (the batches before) can give one mapped task far more files than
another, and with one task per worker the stage ends when the heaviest one does (36 against 28 of 64 files on
the benchmark archive of ``benchmarks/bench_workers.py``: at most 1.78x on two workers however fast they are).
:func:`balanced_shard_batches` keeps the number of mapped tasks (``min(shard_count, max_map_length)``) and
spreads the shards over them by the plan's pending DICOM files, the unit of work of ``deidentify`` and
``normalise``. Which shard lands in which batch never changes an output: every stage writes per shard.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc


def pending_files_per_shard(plan: pa.Table) -> dict[int, int]:
    """Pending DICOM files per shard of a run plan.

    Parameters
    ----------
    plan : pyarrow.Table
        a plan with (at least) the ``kind``, ``status`` and ``shard`` columns of
        :data:`etl.sources.discover.PLAN_SCHEMA` (the merged ``plan.parquet`` of a run).

    Returns
    -------
    dict
        ``{shard: files}`` for the shards with at least one row ``kind == "dicom"`` and ``status == "pending"``
        (rows without a shard are not counted).
    """
    mask = pc.and_(pc.equal(plan["kind"], "dicom"), pc.equal(plan["status"], "pending"))
    counts = pc.value_counts(plan.filter(mask)["shard"].drop_null())
    return dict(zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist(), strict=True))


def balanced_shard_batches(
    files_per_shard: Mapping[int, int], shard_count: int, max_map_length: int
) -> list[list[int]]:
    """Split shard ids ``0..shard_count-1`` into ``min(shard_count, max_map_length)`` batches of near-equal files.

    Longest processing time first (Graham 1969, "Bounds on multiprocessing timing anomalies", SIAM J. Appl.
    Math. 17(2)): shards in decreasing file count (ties: lower id first) each go to the batch with the fewest
    files so far (ties: fewer shards, then lower batch), so no batch has more than 4/3 of the optimal maximum
    and every batch gets at least one shard. Deterministic: the same counts give the same batches.

    Parameters
    ----------
    files_per_shard : mapping of int to int
        pending files per shard (:func:`pending_files_per_shard`); a shard not in it has none.
    shard_count : int
        shards of the run (>= 1).
    max_map_length : int
        the most mapped tasks a stage may have (>= 1; Airflow's ``[core] max_map_length``).

    Returns
    -------
    list of list of int
        each batch's shards in increasing order, the batches ordered by their first shard; together every shard
        exactly once. With ``max_map_length >= shard_count`` one shard per batch.

    Raises
    ------
    ValueError
        when ``shard_count`` or ``max_map_length`` is below 1, a shard id is outside ``0..shard_count-1`` or a
        count is negative.
    """
    if shard_count < 1 or max_map_length < 1:
        raise ValueError(f"shard_count and max_map_length must be >= 1, got {shard_count} and {max_map_length}")
    bad = {s: n for s, n in files_per_shard.items() if not 0 <= s < shard_count or n < 0}
    if bad:
        raise ValueError(f"file counts for shards outside 0..{shard_count - 1} or negative: {sorted(bad.items())}")
    n_batches = min(shard_count, max_map_length)
    batches: list[list[int]] = [[] for _ in range(n_batches)]
    heap = [(0, 0, i) for i in range(n_batches)]  # (files, shards, batch index): the lightest batch on top
    for shard in sorted(range(shard_count), key=lambda s: (-files_per_shard.get(s, 0), s)):
        files, shards, i = heapq.heappop(heap)
        batches[i].append(shard)
        heapq.heappush(heap, (files + files_per_shard.get(shard, 0), shards + 1, i))
    return sorted(sorted(b) for b in batches)
