"""Tests for etl.sources.reports (JSONL, CSV incl. Open-i layout, plain text; errors name lines, not content)."""

import json

import pytest

from etl.sources.reports import (
    RECORD_FIELDS,
    REPORT_FIELDS,
    ReportSourceError,
    iter_report_source,
    read_report_source,
)
from schemas.config import PROJECT_ROOT

DATA = PROJECT_ROOT.parent / "shared" / "data"


def _rec(**kw):
    base = dict.fromkeys(RECORD_FIELDS)
    base.update(kw)
    return base


def test_jsonl_records_and_blank_lines():
    lines = [
        json.dumps(
            _rec(
                report_id="r1",
                patient_id="P1",
                accession_number="A1",
                study_instance_uid="1.2.3",
                report_datetime="2023-03-14T10:00:00",
                language="en",
                text="FINDINGS: Clear.",
            )
        ),
        "",
        json.dumps({"report_id": "r2", "text": "IMPRESSION: Normal."}),
    ]
    recs = read_report_source("\n".join(lines).encode(), "jsonl", "a.jsonl")
    assert [r["report_id"] for r in recs] == ["r1", "r2"]
    assert recs[0]["patient_id"] == "P1" and recs[0]["report_datetime"] == "2023-03-14T10:00:00"
    assert recs[1]["patient_id"] is None and recs[1]["language"] is None
    assert set(recs[1]) == set(RECORD_FIELDS) == set(REPORT_FIELDS) | {"patient_name"}
    assert recs[0]["patient_name"] is None  # optional PHI key: None when the source does not give it
    named = json.dumps({"report_id": "r3", "patient_name": "Doe^Jane", "text": "Clear."}).encode()
    assert read_report_source(named, "jsonl", "n.jsonl")[0]["patient_name"] == "Doe^Jane"


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
    data = "\n".join(
        json.dumps(r)
        for r in (
            {"report_id": "r1", "text": "a"},
            {"report_id": "r1", "text": "b"},
            {"report_id": "r3"},
            {"report_id": "r4", "text": "d"},
        )
    ).encode()
    items = list(iter_report_source(data, "jsonl", "d.jsonl"))
    kinds = [it.reason if isinstance(it, ReportSourceError) else it["report_id"] for it in items]
    assert kinds == ["r1", "duplicate_report_id", "malformed_report_record", "r4"]
    with pytest.raises(ReportSourceError) as err:
        read_report_source(data, "jsonl", "d.jsonl")
    assert err.value.reason == "duplicate_report_id"


def test_csv_generic_and_row_errors():
    good = 'report_id,patient_id,text\nr1,P1,"FINDINGS: a, b\nIMPRESSION: c"\nr2,,text two\n'
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
    items = list(
        iter_report_source((DATA / "openi" / "indiana_reports.csv").read_bytes(), "csv", "indiana_reports.csv")
    )
    records = [i for i in items if isinstance(i, dict)]
    errors = [i for i in items if isinstance(i, ReportSourceError)]
    # 2,696 rows; 16 have no indication/comparison/findings/impression at all (missing text -> error)
    assert len(records) == 2680 and len(errors) == 16
    assert all(e.reason == "malformed_report_record" for e in errors)
    assert len({r["report_id"] for r in records}) == 2680
    assert all(r["text"].startswith(("INDICATION:", "COMPARISON:", "FINDINGS:", "IMPRESSION:")) for r in records)


# ---------------------------------------------------------------- HL7 v2 ORU^R01
# Hand-written messages in the shape RIS/reporting systems send (HL7 v2.5.1, IHE RAD-28); names and numbers
# are fictional.
ORU_FT = (
    "\x0bMSH|^~\\&|RIS|MERCY|PACS|MERCY|20230315103000||ORU^R01^ORU_R01|MSG0001|P|2.5.1\r"
    "PID|1||000123^^^MERCY^PI~4455667^^^MERCY^MR||QUENNEVILLE^MARISOL||19500101|F\r"
    "ORC|RE|PL777|ACC2023-0042\r"
    "OBR|1|PL777|FILL-9^RIS|71046^XR CHEST 2 VIEWS^CPT|||20230314091500|||||||||||ACC2023-0042"
    "||||20230315101500|||F\r"
    "OBX|1|FT|&GDT^Report^L||FINDINGS:\\.br\\Small left pleural effusion \\T\\ basilar atelectasis.\\X0D\\"
    "\\.br\\IMPRESSION: Effusion \\E\\ atelectasis, stable.||||||F\r"
    "OBX|2|TX|&IMP^Impression^L||No pneumothorax.~Heart size normal.||||||F\r"
    "OBX|3|HD|113014^DICOM Study^DCM||1.2.840.113619.2.55.3.4271045733.996.1449464144.595||||||F\r"
    "OBX|4|TX|&GDT||Retracted sentence.||||||D\r"
    "\x1c\r"
)
# two messages in one file, LF line ends; the second links by ZDS-1 and OBR-3 and has only OBR-7 (date only)
TWO_MESSAGES = (
    "MSH|^~\\&|RIS|MERCY|PACS|MERCY|20230401||ORU^R01|MSG0002|P|2.3.1|||||||en\n"
    "PID|1||7788990^^^MERCY^MR||OKAFOR^ADA\n"
    "OBR|1||ACC-77^RIS|CT CHEST|||20230401\n"
    "OBX|1|TX|&GDT||FINDINGS: 4 mm nodule\\S\\right upper lobe \\F\\ unchanged.||||||F\n"
    "OBX|2|ST|&IMP||IMPRESSION: Stable nodule.||||||F\n"
    "\n"
    "MSH|^~\\&|RIS|MERCY|PACS|MERCY|20230402||ORU^R01|MSG0003|P|2.5.1\n"
    "PID|1||5566^^^MERCY^MR\n"
    "OBR|1|PL1||XR CHEST|||202304021130\n"
    "ZDS|1.2.3.4.5^RIS^Application^DICOM\n"
    "OBX|1|FT|&GDT||Lungs clear.\\.sp 1\\Caf\\XC3A9\\-au-lait \\H\\spot\\N\\ \\R\\ none.||||||F\n"
)


def test_hl7_single_message_ft_escapes_multi_obx_and_links():
    recs = read_report_source(ORU_FT.encode(), "hl7", "mercy/2023-03-15.hl7")
    assert len(recs) == 1
    rec = recs[0]
    assert rec["text"] == (
        "FINDINGS:\nSmall left pleural effusion & basilar atelectasis.\n"
        "IMPRESSION: Effusion \\ atelectasis, stable.\nNo pneumothorax.\nHeart size normal."
    )
    assert rec["report_id"] == "MSG0001"
    assert rec["accession_number"] == "ACC2023-0042"  # OBR-18 wins over OBR-3
    assert rec["study_instance_uid"] == "1.2.840.113619.2.55.3.4271045733.996.1449464144.595"
    assert rec["patient_id"] == "4455667"  # the MR repetition of PID-3, not the first
    assert rec["report_datetime"] == "2023-03-15T10:15:00"  # OBR-22
    assert rec["language"] is None and set(rec) == set(RECORD_FIELDS)
    assert rec["patient_name"] == "QUENNEVILLE^MARISOL"  # PID-5, DICOM PN form
    # CRLF segment ends and no MLLP framing give the same record
    plain = ORU_FT.replace("\x0b", "").replace("\x1c\r", "").replace("\r", "\r\n").encode()
    assert read_report_source(plain, "hl7", "b.hl7") == recs


def test_hl7_two_messages_in_one_file():
    recs = read_report_source(TWO_MESSAGES.encode(), "hl7", "two.hl7")
    assert [r["report_id"] for r in recs] == ["MSG0002", "MSG0003"]
    first, second = recs
    assert first["text"] == "FINDINGS: 4 mm nodule^right upper lobe | unchanged.\nIMPRESSION: Stable nodule."
    assert first["accession_number"] == "ACC-77" and first["study_instance_uid"] is None
    assert first["report_datetime"] == "2023-04-01" and first["language"] == "en" and first["patient_id"] == "7788990"
    assert second["accession_number"] is None and second["study_instance_uid"] == "1.2.3.4.5"  # ZDS-1, not OBR-2
    assert second["text"] == "Lungs clear.\n\nCafé-au-lait spot ~ none."
    assert second["report_datetime"] == "2023-04-02T11:30"
    assert first["patient_name"] == "OKAFOR^ADA" and second["patient_name"] is None  # no PID-5: no stale name


def test_hl7_patient_name_legal_repetition_components_and_escapes():
    """PID-5 (XPN): the legal-name repetition (XPN-7 'L') wins; FN subcomponents, prefix/suffix in PN order."""

    def name(pid5: str) -> str | None:
        msg = (
            "MSH|^~\\&|RIS|H|||20230101||ORU^R01|N1|P|2.5.1\r"
            f"PID|1||42^^^H^MR||{pid5}\r"
            "OBR|1||A-9|XR CHEST\rOBX|1|TX|&GDT||Clear.\r"
        )
        return read_report_source(msg.encode(), "hl7", "n.hl7")[0]["patient_name"]

    assert name("SMITH^JOHN^Q^JR^DR") == "SMITH^JOHN^Q^DR^JR"
    assert name("JONES^MARY^^^^^M~SMITH&VAN&DER^MARY^ANN^^^^L") == "SMITH^MARY^ANN"
    assert name("O\\T\\BRIEN^SEAN") == "O&BRIEN^SEAN"
    assert name("^^^^^^L~DOE^JANE") == "DOE^JANE"  # an empty legal repetition is skipped
    assert name("") is None


def test_hl7_several_obr_groups_and_duplicate_ids():
    msg = (
        "MSH|^~\\&|RIS|H|||20230101||ORU^R01|M9|P|2.5.1\r"
        "PID|1||111^^^H^MR\r"
        "OBR|1||A-1|XR CHEST\rOBX|1|TX|&GDT||Right rib fracture.\r"
        "OBR|2||A-2|XR CHEST\rOBX|1|TX|&GDT||No pneumothorax.\r"
    )
    recs = read_report_source(msg.encode(), "hl7", "g.hl7")
    assert [(r["report_id"], r["accession_number"], r["text"]) for r in recs] == [
        ("M9-1", "A-1", "Right rib fracture."),
        ("M9-2", "A-2", "No pneumothorax."),
    ]
    items = list(iter_report_source((msg + msg).encode(), "hl7", "g2.hl7"))
    assert [it.reason if isinstance(it, ReportSourceError) else it["report_id"] for it in items] == [
        "M9-1",
        "M9-2",
        "duplicate_report_id",
        "duplicate_report_id",
    ]


BAD_MESSAGES = [
    # (message, words of the expected error message)
    ("PID|1||99^^^H^MR||SECRETNAME^ANN\rOBX|1|TX|||SECRETNAME text\r", "before any MSH"),
    (
        "MSH|^~\\&|ADT|H|||20230101||ADT^A08|M1|P|2.5.1\rPID|1||99^^^H^MR||SECRETNAME^ANN\r",
        "not an ORU^R01 message (MSH-9 ADT^A08)",
    ),
    (
        "MSH|^~\\&|RIS|H|||20230101||ORU^R01|M2|P|2.5.1\rPID|1||99^^^H^MR\rOBR|1||A-1\r"
        "OBX|1|CE|RID5350^pleural effusion^RADLEX||Y||||||F\r",
        "no OBX text",
    ),
    (
        "MSH|^~\\&|RIS|H|||20230101||ORU^R01|M3|P|2.5.1\rPID|1||99^^^H^MR\rOBR|1|PL-5\r"
        "OBX|1|TX|&GDT||SECRETNAME has no effusion.||||||F\r",
        "no study link",
    ),
    (
        "MSH|^~\\&|RIS|H|||20230101||ORU^R01|M4|P|2.5.1\rOBR|1||A-4||||2023-01-01\rOBX|1|TX|&GDT||Clear.||||||F\r",
        "OBR-7 is not an HL7 date/time",
    ),
    (
        "MSH|^~\\&|RIS|H|||20230101||ORU^R01|M5|P|2.5.1\rOBR|1||A-5\r"
        "OBX|1|HD|StudyInstanceUID||1.2.SECRET||||||F\rOBX|2|TX|&GDT||Clear.\r",
        "not a valid DICOM UID",
    ),
    ("MSH|^~\\&|RIS|H|||20230101||ORU^R01||P|2.5.1\rOBR|1||A-6\rOBX|1|TX|&GDT||Clear.\r", "MSH-10"),
    (
        "MSH|^~\\&|RIS|H|||20230101||ORU^R01|M7|P|2.5.1\rOBX|1|TX|&GDT||Clear.\rOBR|1||A-7\r",
        "OBX segment before any OBR",
    ),
    (
        "MSH|^~\\&|RIS|H|||20230101||ORU^R01|M8|P|2.5.1\rOBR|1||A-8\rthis line SECRETNAME is not a segment\r",
        "does not start with a segment ID",
    ),
    ("MSH|^|RIS|H|||20230101||ORU^R01|M10|P|2.5.1\rOBR|1||A-10\rOBX|1|TX|&GDT||Clear.\r", "separators are malformed"),
]


@pytest.mark.parametrize(("message", "expected"), BAD_MESSAGES)
def test_hl7_malformed_messages_are_reported_specifically(message, expected):
    good = TWO_MESSAGES.split("\n\n")[1]  # one well-formed message after the bad one
    items = list(iter_report_source((message + good).encode(), "hl7", "bad.hl7"))
    errors = [it for it in items if isinstance(it, ReportSourceError)]
    assert len(errors) == 1, items
    err = errors[0]
    assert err.reason == "malformed_report_record" and expected in err.message
    assert err.message.startswith("bad.hl7 ") and "line 1" in err.message
    assert "SECRETNAME" not in str(err) and "99" not in str(err)
    assert [it["report_id"] for it in items if isinstance(it, dict)] == ["MSG0003"]
    with pytest.raises(ReportSourceError):
        read_report_source((message + good).encode(), "hl7", "bad.hl7")


def test_hl7_error_names_message_number_and_line_and_non_utf8_message():
    bad = b"MSH|^~\\&|RIS|H|||20230101||ORU^R01|M1|P|2.5.1\rOBR|1||A-1\rOBX|1|TX|&GDT||Caf\xe9\r"
    items = list(iter_report_source(TWO_MESSAGES.encode() + bad, "hl7", "c.hl7"))
    assert [it["report_id"] for it in items if isinstance(it, dict)] == ["MSG0002", "MSG0003"]
    err = items[-1]
    assert isinstance(err, ReportSourceError)
    assert "message 3 line 12" in err.message and "not UTF-8" in err.message
    assert list(iter_report_source(b"\x0b\x1c\r\n", "hl7", "empty.hl7")) == []


def test_hl7_patient_name_is_a_known_value_for_text_deid():
    """The name from PID-5 reaches text de-identification as a known value (as etl.pipeline.stages.reports passes the
    record's patient_id, patient_name and accession_number), in every spelling order and case."""
    from entity_extraction.text_deid import deidentify_text

    msg = (
        "MSH|^~\\&|RIS|H|||20230101||ORU^R01|N2|P|2.5.1\r"
        "PID|1||4455667^^^H^MR||QUENNEVILLE^MARISOL\r"
        "OBR|1||ACC-5|XR CHEST\r"
        "OBX|1|TX|&GDT||Discussed with Marisol Quenneville. QUENNEVILLE, MARISOL: no effusion.||||||F\r"
    )
    rec = read_report_source(msg.encode(), "hl7", "p.hl7")[0]
    known = [rec[k] for k in ("patient_id", "patient_name", "accession_number") if rec.get(k)]
    text, counts = deidentify_text(rec["text"], known_phi=known, date_shift_days=0)
    assert "quenneville" not in text.lower() and "marisol" not in text.lower()
    assert text == "Discussed with [NAME]. [NAME]: no effusion." and counts == {"NAME": 2}
