"""Tests for etl.report_sources (JSONL, CSV incl. Open-i layout, plain text; errors name lines, not content)."""

import json
from pathlib import Path

import pytest

from etl.report_sources import REPORT_FIELDS, ReportSourceError, iter_report_source, read_report_source

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def _rec(**kw):
    base = dict.fromkeys(REPORT_FIELDS)
    base.update(kw)
    return base


def test_jsonl_records_and_blank_lines():
    lines = [
        json.dumps(_rec(report_id="r1", patient_id="P1", accession_number="A1", study_instance_uid="1.2.3",
                        report_datetime="2023-03-14T10:00:00", language="en", text="FINDINGS: Clear.")),
        "",
        json.dumps({"report_id": "r2", "text": "IMPRESSION: Normal."}),
    ]
    recs = read_report_source("\n".join(lines).encode(), "jsonl", "a.jsonl")
    assert [r["report_id"] for r in recs] == ["r1", "r2"]
    assert recs[0]["patient_id"] == "P1" and recs[0]["report_datetime"] == "2023-03-14T10:00:00"
    assert recs[1]["patient_id"] is None and recs[1]["language"] is None
    assert set(recs[1]) == set(REPORT_FIELDS)


def test_jsonl_malformed_line_names_line_not_content():
    secret = "DOE^JOHN"
    data = (json.dumps({"report_id": "r1", "text": "ok"}) + "\n" + '{"report_id": "r2", "text": "' + secret).encode()
    with pytest.raises(ReportSourceError) as err:
        read_report_source(data, "jsonl", "b.jsonl")
    assert err.value.reason == "malformed_report_record"
    assert "line 2" in str(err.value) and secret not in str(err.value)


@pytest.mark.parametrize(
    "line",
    [
        {"report_id": "r1", "text": "   "},
        {"report_id": "r1"},
        {"text": "hello"},
        {"report_id": "r1", "text": ["not", "a", "string"]},
        {"report_id": "r1", "text": "x", "surprise": "y"},
        ["not", "an", "object"],
    ],
)
def test_jsonl_invalid_records(line):
    with pytest.raises(ReportSourceError) as err:
        read_report_source(json.dumps(line).encode(), "jsonl", "c.jsonl")
    assert err.value.reason == "malformed_report_record" and "line 1" in err.value.message


def test_duplicate_ids_and_iter_keeps_good_records():
    data = "\n".join(json.dumps(r) for r in (
        {"report_id": "r1", "text": "a"}, {"report_id": "r1", "text": "b"}, {"report_id": "r3"},
        {"report_id": "r4", "text": "d"})).encode()
    items = list(iter_report_source(data, "jsonl", "d.jsonl"))
    kinds = [it.reason if isinstance(it, ReportSourceError) else it["report_id"] for it in items]
    assert kinds == ["r1", "duplicate_report_id", "malformed_report_record", "r4"]
    with pytest.raises(ReportSourceError) as err:
        read_report_source(data, "jsonl", "d.jsonl")
    assert err.value.reason == "duplicate_report_id"


def test_csv_generic_and_row_errors():
    good = "report_id,patient_id,text\nr1,P1,\"FINDINGS: a, b\nIMPRESSION: c\"\nr2,,text two\n"
    recs = read_report_source(good.encode("utf-8-sig"), "csv", "e.csv")
    assert recs[0]["text"] == "FINDINGS: a, b\nIMPRESSION: c" and recs[0]["patient_id"] == "P1"
    assert recs[1]["patient_id"] is None and recs[1]["accession_number"] is None
    with pytest.raises(ReportSourceError) as err:
        read_report_source(b"report_id,text\nr1,a\nr2,b,EXTRA\n", "csv", "f.csv")
    assert err.value.reason == "malformed_report_record" and "line 3" in str(err.value)
    assert "EXTRA" not in str(err.value)
    with pytest.raises(ReportSourceError) as err:
        read_report_source(b"report_id,text\nr1,\n", "csv", "g.csv")
    assert "line 2" in str(err.value)
    with pytest.raises(ReportSourceError):
        read_report_source(b"id,body\n1,x\n", "csv", "h.csv")


def test_openi_layout():
    data = (
        b"uid,MeSH,Problems,image,indication,comparison,findings,impression\n"
        b"7,normal,normal,Xray,Preop,,The lungs are clear.,No acute disease.\n"
        b"8,normal,normal,Xray,,,,\n"
    )
    items = list(iter_report_source(data, "csv", "indiana_reports.csv"))
    assert items[0]["report_id"] == "7"
    assert items[0]["text"] == "INDICATION: Preop\nFINDINGS: The lungs are clear.\nIMPRESSION: No acute disease."
    assert items[0]["patient_id"] is None and items[0]["study_instance_uid"] is None
    assert isinstance(items[1], ReportSourceError) and "line 3" in items[1].message


def test_text_format_and_bad_inputs():
    recs = read_report_source(b"FINDINGS: Clear.\n", "text", "reports/ACC123.txt")
    assert recs == [_rec(report_id="ACC123", text="FINDINGS: Clear.\n")]
    with pytest.raises(ReportSourceError) as err:
        read_report_source(b"  \n", "text", "empty.txt")
    assert err.value.reason == "malformed_report_record"
    with pytest.raises(ReportSourceError) as err:
        read_report_source(b"\xff\xfe\x00bad", "text", "x.txt")
    assert err.value.reason == "undecodable_report_file"
    with pytest.raises(ReportSourceError) as err:
        read_report_source(b"x", "xml", "x.xml")
    assert err.value.reason == "unsupported_report_format"


@pytest.mark.skipif(not (DATA / "openi" / "indiana_reports.csv").exists(), reason="shared Open-i data absent")
def test_real_openi_file():
    items = list(iter_report_source((DATA / "openi" / "indiana_reports.csv").read_bytes(), "csv", "indiana_reports.csv"))
    records = [i for i in items if isinstance(i, dict)]
    errors = [i for i in items if isinstance(i, ReportSourceError)]
    # 2,696 rows; 16 have no indication/comparison/findings/impression at all (missing text -> error)
    assert len(records) == 2680 and len(errors) == 16
    assert all(e.reason == "malformed_report_record" for e in errors)
    assert len({r["report_id"] for r in records}) == 2680
    assert all(r["text"].startswith(("INDICATION:", "COMPARISON:", "FINDINGS:", "IMPRESSION:")) for r in records)
