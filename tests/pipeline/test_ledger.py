"""The ledger: one row per input file per run, status precedence, balance; run-wide duplicates and UID
collisions marked at planning time."""

from __future__ import annotations

import pyarrow as pa

from etl.pipeline.batches import balanced_shard_batches
from etl.pipeline.context import EVENT_SCHEMA
from etl.pipeline.ledger import balance, build_ledger
from etl.sources.discover import PLAN_SCHEMA, mark_duplicates


def _plan(rows: list[dict]) -> pa.Table:
    base = {k: None for k in PLAN_SCHEMA.names}
    return pa.Table.from_pylist(
        [{**base, "bytes": 1, "institution": "a", "kind": "dicom", "status": "pending", **r} for r in rows],
        schema=PLAN_SCHEMA,
    )


def test_duplicates_and_uid_collisions():
    plan = mark_duplicates(
        _plan(
            [
                {
                    "source_uri": "/s/1",
                    "sha256": "h1",
                    "patient_key": "p1",
                    "study_uid_key": "st1",
                    "series_uid_key": "se1",
                    "sop_uid_key": "i1",
                },
                {
                    "source_uri": "/s/2",
                    "sha256": "h1",
                    "patient_key": "p1",
                    "study_uid_key": "st1",
                    "series_uid_key": "se1",
                    "sop_uid_key": "i1",
                },
                {
                    "source_uri": "/s/3",
                    "sha256": "h3",
                    "patient_key": "p1",
                    "study_uid_key": "st1",
                    "series_uid_key": "se1",
                    "sop_uid_key": "i1",
                },
                {
                    "source_uri": "/s/4",
                    "sha256": "h4",
                    "patient_key": "p2",
                    "study_uid_key": "st1",
                    "series_uid_key": "se9",
                    "sop_uid_key": "i4",
                },
                {
                    "source_uri": "/s/5",
                    "sha256": "h5",
                    "patient_key": "p1",
                    "study_uid_key": "st2",
                    "series_uid_key": "se1",
                    "sop_uid_key": "i5",
                },
                {"source_uri": "/s/6", "sha256": "h6", "kind": "other", "status": "skipped", "reason": "not_an_input"},
            ]
        )
    ).to_pylist()
    got = {r["source_uri"]: (r["status"], r["reason"]) for r in plan}
    assert got == {
        "/s/1": ("pending", None),
        "/s/2": ("duplicate", "same_content"),
        "/s/3": ("quarantined", "duplicate_sop_instance_uid"),
        "/s/4": ("quarantined", "study_uid_collision"),
        "/s/5": ("quarantined", "series_uid_collision"),
        "/s/6": ("skipped", "not_an_input"),
    }
    assert plan[1]["duplicate_of"] == "/s/1"


def test_status_precedence_and_balance():
    plan = _plan(
        [
            {"source_uri": "/s/a", "sha256": "a"},
            {"source_uri": "/s/b", "sha256": "b"},
            {"source_uri": "/s/c", "sha256": "c"},
            {"source_uri": "/s/d", "sha256": "d", "status": "skipped"},
        ]
    )
    events = pa.Table.from_pylist(
        [
            {"source_uri": "/s/a", "sha256": "a", "stage": "deidentify", "status": "ingested"},
            {
                "source_uri": "/s/a",
                "sha256": "a",
                "stage": "normalise",
                "status": "quarantined",
                "reason": "decode_error",
            },
            {"source_uri": "/s/b", "sha256": "b", "stage": "deidentify", "status": "ingested"},
            {"source_uri": "/s/b", "sha256": "b", "stage": "normalise", "status": "ingested"},
        ],
        schema=EVENT_SCHEMA,
    )
    ledger = build_ledger("r1", plan, events)
    rows = {r["source_uri"]: r for r in ledger.to_pylist()}
    assert (rows["/s/a"]["status"], rows["/s/a"]["stage"], rows["/s/a"]["reason"]) == (
        "quarantined",
        "normalise",
        "decode_error",
    )
    assert rows["/s/b"]["status"] == "ingested"
    # a pending file no stage reported on is never lost: it is visible as a pipeline fault
    assert (rows["/s/c"]["status"], rows["/s/c"]["reason"]) == ("quarantined", "no_outcome_recorded")
    b = balance(ledger)
    assert b == {"files_seen": 4, "ingested": 1, "quarantined": 2, "duplicate": 0, "skipped": 1, "balanced": True}
    doubled = pa.concat_tables([ledger, ledger.slice(0, 1)])
    assert balance(doubled)["balanced"] is False


def test_shard_batches_respect_max_map_length():
    assert balanced_shard_batches({}, 8, 1024) == [[i] for i in range(8)]
    batches = balanced_shard_batches({}, 5000, 1024)
    assert len(batches) <= 1024 and sorted(s for b in batches for s in b) == list(range(5000))


def test_seen_content_is_a_duplicate_in_the_run_ledger_and_keeps_its_outcome_in_the_clean_view():
    from etl.sources.discover import SEEN_SCHEMA, mark_seen, update_seen_index

    run1 = _plan([{"source_uri": "/s/a", "sha256": "a"}, {"source_uri": "/s/q", "sha256": "q"}])
    ev1 = pa.Table.from_pylist(
        [
            {"source_uri": "/s/a", "sha256": "a", "stage": "deidentify", "status": "ingested"},
            {
                "source_uri": "/s/q",
                "sha256": "q",
                "stage": "deidentify",
                "status": "quarantined",
                "reason": "burned_in_text",
            },
        ],
        schema=EVENT_SCHEMA,
    )
    seen = update_seen_index(SEEN_SCHEMA.empty_table(), build_ledger("r1", run1, ev1, clean_view=True), "r1")
    assert [(r["source_uri"], r["status"], r["seq"]) for r in seen.to_pylist()] == [
        ("/s/a", "ingested", 1),
        ("/s/q", "quarantined", 1),
    ]
    # run 2: the same files, the content of /s/a again at /s/b, and a new file /s/n
    run2 = mark_seen(
        mark_duplicates(
            _plan(
                [
                    {"source_uri": u, "sha256": h}
                    for u, h in (("/s/a", "a"), ("/s/b", "a"), ("/s/q", "q"), ("/s/n", "n"))
                ]
            )
        ),
        seen,
    )
    ev2 = pa.Table.from_pylist(
        [
            {**e, "source_uri": u, "sha256": h}
            for e, (u, h) in zip(ev1.to_pylist() + [ev1.to_pylist()[0]], (("/s/a", "a"), ("/s/q", "q"), ("/s/n", "n")))
        ],
        schema=EVENT_SCHEMA,
    )
    led = {r["source_uri"]: r for r in build_ledger("r2", run2, ev2).to_pylist()}
    assert {u: (r["status"], r["reason"]) for u, r in led.items()} == {
        "/s/a": ("duplicate", "seen_in_earlier_run"),
        "/s/b": ("duplicate", "seen_in_earlier_run"),
        "/s/q": ("quarantined", "burned_in_text"),
        "/s/n": ("ingested", None),
    }
    assert led["/s/b"]["duplicate_of"] == "/s/a" and led["/s/a"]["duplicate_of"] == "/s/a"
    assert led["/s/b"]["detail"] == "same sha256 as a file recorded in run r1"
    assert balance(build_ledger("r2", run2, ev2))["balanced"]
    clean = {
        r["source_uri"]: (r["status"], r["reason"]) for r in build_ledger("r2", run2, ev2, clean_view=True).to_pylist()
    }
    assert clean == {
        "/s/a": ("ingested", None),
        "/s/b": ("duplicate", "same_content"),
        "/s/q": ("quarantined", "burned_in_text"),
        "/s/n": ("ingested", None),
    }
    seen2 = update_seen_index(seen, build_ledger("r2", run2, ev2, clean_view=True), "r2")
    assert {r["source_uri"]: (r["first_run_id"], r["seq"], r["last_run_id"]) for r in seen2.to_pylist()} == {
        "/s/a": ("r1", 1, "r2"),
        "/s/b": ("r2", 2, "r2"),
        "/s/q": ("r1", 1, "r2"),
        "/s/n": ("r2", 2, "r2"),
    }
    # a file released by a fix: ingested now after an earlier quarantine is recorded as ingested
    ev3 = pa.Table.from_pylist([{**ev1.to_pylist()[0], "source_uri": "/s/q", "sha256": "q"}], schema=EVENT_SCHEMA)
    q = [
        r for r in build_ledger("r3", mark_seen(_plan([{"source_uri": "/s/q", "sha256": "q"}]), seen2), ev3).to_pylist()
    ]
    assert (q[0]["status"], q[0]["reason"]) == ("ingested", None)
