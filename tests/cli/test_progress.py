"""Build progress (per stage: tasks and files done of total, throughput, time left) and the run summary's lines."""

from __future__ import annotations

import io

import pytest

from medreco.cli.app import summary_lines
from medreco.cli.progress import BuildProgress, TaskRow, format_line, stage_progress

T = 1_000_000.0  # an epoch second


def _rows():
    return [
        TaskRow("plan", -1, "success", T, T + 1),
        TaskRow("deidentify", 0, "success", T + 2, T + 12),
        TaskRow("deidentify", 1, "running", T + 2, None),
        TaskRow("deidentify", 2, "queued", None, None),
        TaskRow("normalise", -1, None, None, None),  # mapped, not expanded yet
        TaskRow("institutions", -1, "success", T - 2, T - 1),
    ]


def test_stages_in_dag_order_with_tasks_and_files_of_total():
    files = {("deidentify", 0): 30, ("deidentify", 1): 50, ("deidentify", 2): 20}
    by = {p.stage: p for p in stage_progress(_rows(), files)}
    assert [p.stage for p in stage_progress(_rows(), files)] == ["institutions", "plan", "deidentify", "normalise"]
    d = by["deidentify"]
    assert (d.tasks_done, d.tasks_total, d.files_done, d.files_total) == (1, 3, 30, 100)
    assert not d.done and d.started == T + 2 and d.ended == T + 12
    # 30 files in the 20 s since the stage started: 1.5 files/s, 70 files left: 46.7 s
    assert d.rate(T + 22) == (1.5, "files/s")
    assert d.eta(T + 22) == pytest.approx(70 / 1.5)
    n = by["normalise"]
    assert (n.tasks_done, n.tasks_total, n.files_done, n.files_total, n.done) == (0, 1, 0, None, False)
    assert n.rate(T + 22) is None and n.eta(T + 22) is None
    assert by["plan"].done and by["plan"].files_done is None and by["plan"].rate(T + 5) is None


def test_files_total_unknown_until_every_instance_counted():
    by = {p.stage: p for p in stage_progress(_rows(), {("deidentify", 0): 30})}
    assert by["deidentify"].files_total is None and by["deidentify"].files_done == 30
    assert "30/? files" in format_line(by["deidentify"], T + 22)


def test_line_for_a_finished_stage_and_for_failures():
    rows = [TaskRow("normalise", 0, "success", T, T + 8), TaskRow("normalise", 1, "failed", T + 1, T + 10)]
    p = stage_progress(rows, {("normalise", 0): 40, ("normalise", 1): 60})[0]
    assert p.done and p.failed == 1 and p.eta(T + 99) == 0.0
    assert format_line(p, T + 99) == "stage normalise: 2/2 tasks, 100/100 files in 10.0 s (10 files/s) FAILED 1"
    tasks_only = stage_progress([TaskRow("entities", i, "success", T, T + 4) for i in range(2)], {})[0]
    assert format_line(tasks_only, T + 9) == "stage entities: 2/2 tasks in 4.0 s (0.5 tasks/s)"


def test_log_mode_prints_one_line_per_stage_once_it_finishes():
    out = io.StringIO()
    progress = BuildProgress(mode="auto", stream=out)  # a StringIO is not a terminal: one line per stage
    assert progress.mode == "lines"
    first = stage_progress(_rows(), {})
    progress.show(first, T + 20)
    progress.show(first, T + 21)  # the same state again prints nothing new
    later = stage_progress(
        [
            *_rows()[:1],
            TaskRow("deidentify", 0, "success", T + 2, T + 12),
            TaskRow("deidentify", 1, "success", T + 2, T + 30),
            TaskRow("deidentify", 2, "success", T + 12, T + 31),
        ],
        {("deidentify", i): 10 for i in range(3)},
    )
    progress.show(later, T + 40)
    lines = out.getvalue().splitlines()
    assert [line.split(":")[0] for line in lines] == ["stage institutions", "stage plan", "stage deidentify"]
    assert lines[-1] == "stage deidentify: 3/3 tasks, 30/30 files in 29.0 s (1.03 files/s)"


def test_off_mode_prints_nothing_and_unknown_mode_is_refused():
    out = io.StringIO()
    progress = BuildProgress(mode="off", stream=out)
    progress.poll("medreco_build", "never-read")  # off: does not even look at the database
    progress.show(stage_progress(_rows(), {}), T)
    assert out.getvalue() == ""
    with pytest.raises(ValueError, match="progress mode"):
        BuildProgress(mode="fancy")


def test_terminal_mode_draws_a_rich_table(tmp_path):
    out = io.StringIO()
    progress = BuildProgress(mode="tty", stream=out)

    class _Cfg:
        institutions: list = []

    progress.start(storage=None, cfg=_Cfg())
    progress.show(
        stage_progress(_rows(), {("deidentify", 0): 30, ("deidentify", 1): 50, ("deidentify", 2): 20}), T + 22
    )
    progress.stop()
    text = out.getvalue()
    assert "deidentify" in text and "1/3 tasks" in text and "30/100 files" in text and "1.5 files/s" in text
    assert "0:47 left" in text


def _summary(**extra):
    return {
        "run_id": "r1",
        "tables": {"images": 3},
        "version": "0.1.0",
        "created": True,
        "uri": "/s/0.1.0",
        "content_hash": "ab" * 32,
        "dashboard": "/r/index.html",
        "ledger": {
            "files_seen": 5,
            "ingested": 3,
            "quarantined": 2,
            "duplicate": 0,
            "skipped": 0,
            "balanced": True,
            "withheld_report_records": 2,
        },
        "quarantined_by_reason": {"not_dicom": 2},
        **extra,
    }


def test_summary_names_quarantine_ledger_quality_warnings_and_withheld_reports():
    lines = summary_lines(
        _summary(
            quarantine="/root/quarantine/r1",
            ledger_file="/root/ledger/run_id=r1/ledger.parquet",
            quality_report="/root/reports/quality/r1.json",
            quality_warnings=[
                {"table": "images", "check": "range:rows", "message": "m"},
                {"table": "studies", "check": "not_null:body_part", "message": "m"},
            ],
            withheld_reports_by_reason={"report_too_long": 1, "verification_failed": 1},
        )
    )
    text = "\n".join(lines)
    assert "  ledger file: /root/ledger/run_id=r1/ledger.parquet" in lines
    assert "  quarantine records: /root/quarantine/r1" in lines
    assert (
        "withheld report records: 2 (report_too_long=1, verification_failed=1; listed under the quarantine "
        "records' reports/)"
    ) in lines
    assert "quality warnings: 2 (images/range:rows, studies/not_null:body_part; /root/reports/quality/r1.json)" in lines
    assert lines[-3:] == ["snapshot: 0.1.0 (new) at /s/0.1.0", f"content hash: {'ab' * 32}", "dashboard: /r/index.html"]
    assert text.index("ledger: files_seen=5") < text.index("ledger file:")


def test_summary_with_nothing_to_look_at_says_zero():
    s = _summary(
        quarantine="/q", ledger_file="/l", quality_report="/qr", quality_warnings=[], withheld_reports_by_reason={}
    )
    s["ledger"].update(quarantined=0, withheld_report_records=0, ingested=5)
    lines = summary_lines(s)
    assert "quality warnings: 0" in lines and "withheld report records: 0" in lines
    assert not any("quarantine records" in line for line in lines)
