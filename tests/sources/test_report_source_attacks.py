"""Issue 19, item 2d: a CSV row with an unbalanced quote is a withheld record, not a silent merge of two reports;
the JSONL "unknown field" message never quotes the field name (it can carry PHI)."""

from __future__ import annotations

from etl.sources.reports import ReportSourceError, iter_report_source

HEADER = "report_id,patient_id,accession_number,text\n"


def _split(data: str, fmt: str):
    items = list(iter_report_source(data.encode(), fmt, "r.csv" if fmt == "csv" else "r.jsonl"))
    return [r for r in items if not isinstance(r, ReportSourceError)], [
        r for r in items if isinstance(r, ReportSourceError)
    ]


def test_unbalanced_quote_withholds_the_merged_rows():
    data = (
        HEADER + 'r1,P1,ACC1111,"Findings: clear lungs, no effusion\n'  # the quote is never closed
        'r2,P2,ACC2222,"Impression: normal, ACC2222 seen"\n'
        'r3,P3,ACC3333,"Impression: stable"\n'
    )
    records, errors = _split(data, "csv")
    assert [r["report_id"] for r in records] == ["r3"]
    assert len(errors) == 1 and errors[0].reason == "malformed_report_record"
    assert "lines 2-3" in str(errors[0]) and "unbalanced quote" in str(errors[0])
    assert all("ACC2222" not in r["text"] for r in records)  # r2's accession is in no published text
    assert "ACC" not in str(errors[0]) and "Findings" not in str(errors[0])


def test_unbalanced_quote_at_the_end_of_the_file():
    data = HEADER + 'r1,P1,ACC1,"ok"\nr2,P2,ACC2,"never closed\nr3,P3,ACC3,more text\n'
    records, errors = _split(data, "csv")
    assert [r["report_id"] for r in records] == ["r1"]
    assert len(errors) == 1 and "lines 3-4" in str(errors[0])


def test_quoted_text_over_several_lines_is_still_one_report():
    data = HEADER + 'r1,P1,ACC1,"FINDINGS: clear.\nIMPRESSION: no change, stable.\n"\nr2,P2,ACC2,"x"\n'
    records, errors = _split(data, "csv")
    assert [r["report_id"] for r in records] == ["r1", "r2"] and not errors
    assert records[0]["text"].startswith("FINDINGS: clear.\nIMPRESSION")


def test_jsonl_unknown_field_message_does_not_quote_the_field_name():
    data = '{"report_id": "r1", "text": "x", "John Smith MRN 4455": "y", "other": 1}\n'
    records, errors = _split(data, "jsonl")
    assert not records and len(errors) == 1
    msg = str(errors[0])
    assert "John" not in msg and "4455" not in msg and "other" not in msg
    assert "2 unknown field(s)" in msg


def test_jsonl_near_miss_field_is_named_by_the_known_field_it_resembles():
    data = '{"report_id": "r1", "text": "x", "patiend_id": "4455"}\n'
    records, errors = _split(data, "jsonl")
    msg = str(errors[0])
    assert "did you mean `patient_id`?" in msg and "patiend" not in msg and "4455" not in msg
