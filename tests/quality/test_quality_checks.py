"""Quality gates: each check catches its planted defect with the right count; a clean set passes."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re

import pyarrow as pa
import pytest
import yaml

from quality.checks import (
    QUALITY_SCHEMA,
    RULES_FILE,
    CheckResult,
    QualityInputError,
    QualityReport,
    load_rules,
    run_checks,
)
from quality.gx_suites import SUITES_FILE, load_suite_config, phi_patterns
from schemas.base import table_from_rows
from schemas.ontology import load_ontology
from schemas.tables import SCHEMAS

TODAY = dt.date(2025, 6, 1)
OPTIONS = ["Increased", "Decreased", "Unchanged", "New"]


def _payload(i: int) -> bytes:
    return b"\x89PNG fake payload %d" % i


def clean_rows() -> dict[str, list[dict]]:
    """A small, internally consistent run: 2 patients, 3 studies, 1 pair, 4 VQA items."""
    studies = [
        dict(
            study_key="s1",
            patient_key="p1",
            institution="us-bos",
            country="US",
            modality="CR",
            body_part="CHEST",
            family="2D-CXR",
            study_datetime=dt.datetime(2020, 1, 1, 9, 30),
            study_date_shifted=dt.date(2020, 1, 1),
            n_series=1,
            n_images=1,
            report_id="r1",
            shard=0,
        ),
        dict(
            study_key="s2",
            patient_key="p1",
            institution="us-bos",
            country="US",
            modality="CR",
            body_part="CHEST",
            family="2D-CXR",
            study_datetime=dt.datetime(2020, 3, 1, 9, 30),
            study_date_shifted=dt.date(2020, 3, 1),
            n_series=1,
            n_images=1,
            report_id="r2",
            shard=0,
        ),
        dict(
            study_key="s3",
            patient_key="p2",
            institution="gb-lon",
            country="GB",
            modality="CT",
            body_part="CHEST",
            family="3D-CT",
            study_datetime=dt.datetime(2019, 5, 2, 14, 0),
            study_date_shifted=dt.date(2019, 5, 2),
            n_series=1,
            n_images=1,
            report_id="r3",
            shard=1,
        ),
    ]
    series = [
        dict(
            series_key=f"se{i}",
            study_key=s["study_key"],
            patient_key=s["patient_key"],
            institution=s["institution"],
            modality=s["modality"],
            view_position="PA" if s["modality"] == "CR" else None,
            orientation=None if s["modality"] == "CR" else "AXIAL",
            spacing_mm=[0.14, 0.14] if s["modality"] == "CR" else [0.7, 0.7, 1.25],
            n_instances=1,
            manufacturer="ACME",
            model="X1",
            shard=s["shard"],
        )
        for i, s in enumerate(studies, start=1)
    ]
    images = [
        dict(
            image_key=f"im{i}",
            series_key=se["series_key"],
            study_key=se["study_key"],
            patient_key=se["patient_key"],
            institution=se["institution"],
            modality=se["modality"],
            view=se["view_position"],
            kind="2d" if se["modality"] == "CR" else "3d",
            rows=256,
            cols=256,
            n_slices=1 if se["modality"] == "CR" else 40,
            spacing_mm=se["spacing_mm"],
            payload_format="png" if se["modality"] == "CR" else "npy",
            payload=_payload(i),
            payload_sha256=hashlib.sha256(_payload(i)).hexdigest(),
            recipe=json.dumps({"resize": [256, 256], "window": [-1000, 400]}),
            transfer_syntax="1.2.840.10008.1.2.4.50",
            shard=se["shard"],
        )
        for i, se in enumerate(series, start=1)
    ]
    reports = [
        dict(
            report_id="r1",
            study_key="s1",
            patient_key="p1",
            institution="us-bos",
            language="en",
            link_status="linked",
            indication="Cough.",
            comparison="None.",
            findings="Small left pleural effusion.",
            impression="Left effusion.",
            text="INDICATION: Cough. COMPARISON: None. FINDINGS: Small left pleural effusion. "
            "IMPRESSION: Left effusion. Dictated by [NAME] on [DATE].",
            redactions=2,
            redaction_counts=json.dumps({"NAME": 1, "DATE": 1}),
            report_date_shifted=dt.date(2020, 1, 1),
            shard=0,
        ),
        dict(
            report_id="r2",
            study_key="s2",
            patient_key="p1",
            institution="us-bos",
            language="en",
            link_status="linked",
            indication=None,
            comparison="Prior radiograph.",
            findings="Left pleural effusion has increased, measuring 2.5 cm.",
            impression="Increased effusion.",
            text="COMPARISON: Prior radiograph. FINDINGS: Left pleural effusion has increased, measuring 2.5 cm. "
            "BP 120/80. IMPRESSION: Increased effusion.",
            redactions=0,
            redaction_counts="{}",
            report_date_shifted=dt.date(2020, 3, 1),
            shard=0,
        ),
        dict(
            report_id="r3",
            study_key="s3",
            patient_key="p2",
            institution="gb-lon",
            language="en",
            link_status="linked",
            indication=None,
            comparison=None,
            findings="No pleural effusion.",
            impression="Normal study.",
            text="FINDINGS: No pleural effusion. IMPRESSION: Normal study.",
            redactions=0,
            redaction_counts="{}",
            report_date_shifted=dt.date(2019, 5, 2),
            shard=1,
        ),
    ]
    mentions = [
        dict(
            mention_id="m1",
            report_id="r1",
            study_key="s1",
            patient_key="p1",
            entity_id="F029",
            category="finding",
            span_start=60,
            span_end=75,
            text="pleural effusion",
            section="findings",
            sentence="Small left pleural effusion.",
            assertion="present",
            temporality="current",
            change="none",
            laterality="left",
            severity="small",
            anatomy_id="A009",
            shard=0,
        ),
        dict(
            mention_id="m2",
            report_id="r2",
            study_key="s2",
            patient_key="p1",
            entity_id="F029",
            category="finding",
            span_start=50,
            span_end=66,
            text="pleural effusion",
            section="findings",
            sentence="Left pleural effusion has increased.",
            assertion="present",
            temporality="current",
            change="increased",
            laterality="left",
            severity=None,
            anatomy_id="A009",
            shard=0,
        ),
    ]
    labels = [
        dict(
            study_key="s1", patient_key="p1", family="2D-CXR", entity_id="F029", state="present", change="none", shard=0
        ),
        dict(
            study_key="s2",
            patient_key="p1",
            family="2D-CXR",
            entity_id="F029",
            state="present",
            change="increased",
            shard=0,
        ),
        dict(
            study_key="s3", patient_key="p2", family="3D-CT", entity_id="F029", state="absent", change="none", shard=1
        ),
    ]
    pairs = [
        dict(
            pair_id="pa1",
            patient_key="p1",
            prior_study_key="s1",
            current_study_key="s2",
            family="2D-CXR",
            modality="CR",
            view="PA",
            gap_days=60,
            change_labels=[{"entity_id": "F029", "change": "increased", "source": "stated"}],
            n_conflicts=0,
            shard=0,
        ),
    ]
    vqa = [
        dict(
            item_id=f"q{i}",
            pair_id="pa1",
            study_key=None,
            patient_key="p1",
            question_type="change",
            question="How has the pleural effusion changed?",
            options=OPTIONS,
            answer="ABCD"[i],
            answer_text=OPTIONS[i],
            entity_ids=["F029"],
            split="train",
            shard=0,
        )
        for i in range(4)
    ]
    splits = [
        dict(patient_key="p1", institution="us-bos", split="train", shard=0),
        dict(patient_key="p2", institution="gb-lon", split="test", shard=1),
    ]
    ledger = [
        dict(
            run_id="run-1",
            source_uri=f"sources/us-bos/DOE^JOHN/IM{i}.dcm",
            sha256=f"{i:064x}",
            bytes=1000 + i,
            institution="us-bos",
            kind="dicom",
            shard=0,
            status=st,
            stage=stage,
            reason=reason,
            detail=None,
            duplicate_of=dup,
        )
        for i, (st, stage, reason, dup) in enumerate(
            [
                ("ingested", "normalise", None, None),
                ("ingested", "normalise", None, None),
                ("quarantined", "deidentify", "burned_in_annotation", None),
                ("duplicate", "discover", "same_sha256", "sources/us-bos/DOE^JOHN/IM0.dcm"),
            ]
        )
    ]
    return dict(
        studies=studies,
        series=series,
        images=images,
        reports=reports,
        entity_mentions=mentions,
        study_labels=labels,
        pairs=pairs,
        vqa=vqa,
        splits=splits,
        ledger=ledger,
    )


def build(rows: dict[str, list[dict]]) -> dict[str, pa.Table]:
    return {name: table_from_rows(r, SCHEMAS[name]) for name, r in rows.items()}


def run(rows, only=(), **kw) -> QualityReport:
    """Cross-table checks always; the GE suites of the tables in ``only`` (GE costs ~0.1 s per expectation)."""
    return run_checks(build(rows), load_ontology(), today=TODAY, only=set(only), **kw)


def get(report: QualityReport, table: str, check: str) -> CheckResult:
    found = [r for r in report.results if r.table == table and r.check == check]
    assert len(found) == 1, (table, check, [(r.table, r.check) for r in report.results])
    return found[0]


def phi(report: QualityReport, table: str, severity: str) -> CheckResult:
    found = [
        r
        for r in report.results
        if r.table == table and r.severity == severity and r.observed.get("expectation") == PHI
    ]
    assert len(found) == 1, (table, severity)
    return found[0]


PHI = "expect_column_values_to_not_match_regex_list"
REPORT_TEXT = f"{PHI}:text|indication|comparison|findings|impression"


@pytest.fixture(scope="module")
def clean_report() -> QualityReport:
    return run_checks(build(clean_rows()), load_ontology(), today=TODAY, expected_files={"run-1": 4})


def test_clean_set_passes_everything(clean_report):
    failed = [(r.table, r.check, r.observed) for r in clean_report.results if not r.passed]
    assert failed == []
    assert clean_report.passed and clean_report.critical_failures == [] and clean_report.warnings == []
    # every table's key check ran through GE, and every string column of the de-identified tables was scanned
    for name, schema in SCHEMAS.items():
        keys = schema.metadata[b"medreco.key"].decode().split(",")
        check = (
            f"expect_column_values_to_be_unique:{keys[0]}"
            if len(keys) == 1
            else f"expect_compound_columns_to_be_unique:{','.join(keys)}"
        )
        assert get(clean_report, name, check).severity == "critical"
    r = get(clean_report, "reports", REPORT_TEXT)
    assert (
        r.severity == "critical" and r.observed["element_count"] == 2 + 2 + 1 + 2 + 2 + 3
    )  # non-null values (r3: findings, impression, text)
    # every other string column: warning; vqa.options (list<string>) among them
    w = phi(clean_report, "vqa", "warning")
    cols = w.check.split(":", 1)[1].split("|")
    vqa = build(clean_rows())["vqa"]
    assert "options" in cols and "question" in cols and "split" in cols
    assert w.observed["element_count"] == sum(vqa.num_rows - vqa.column(c).null_count for c in cols)
    assert not [r for r in clean_report.results if r.table == "ledger" and r.observed.get("expectation") == PHI]
    assert get(clean_report, "images", "payload_sha256").observed == {"rows": 3, "rows_sampled": 3, "mismatches": 0}
    assert get(clean_report, "ledger", "curator_rejected_not_ingested").passed


def test_empty_tables_pass_and_key_check_still_runs():
    report = run_checks({}, load_ontology(), today=TODAY, only={"studies", "study_labels"})
    assert report.passed and not report.warnings
    r = get(report, "studies", "expect_column_values_to_be_unique:study_key")
    assert r.observed["element_count"] == 0


def test_duplicate_and_null_keys():
    rows = clean_rows()
    rows["studies"].append(dict(rows["studies"][0]))
    rows["study_labels"].append(dict(rows["study_labels"][0]))  # composite key (study_key, entity_id)
    report = run(rows, only={"studies", "study_labels", "series"})
    r = get(report, "studies", "expect_column_values_to_be_unique:study_key")
    # GE counts every row of a duplicated key as unexpected: the original and its copy
    assert (r.passed, r.severity, r.observed["element_count"], r.observed["unexpected_count"]) == (
        False,
        "critical",
        4,
        2,
    )
    c = get(report, "study_labels", "expect_compound_columns_to_be_unique:study_key,entity_id")
    assert not c.passed and c.observed["unexpected_count"] == 2
    assert get(report, "series", "expect_column_values_to_be_unique:series_key").passed
    # null key: build with a nullable schema variant (the real schema forbids it at construction)
    t = build(clean_rows())
    sk = t["splits"].column("patient_key").to_pylist()
    t["splits"] = t["splits"].set_column(0, pa.field("patient_key", pa.string()), pa.array([sk[0], None]))
    report = run_checks(t, load_ontology(), today=TODAY, only={"splits"})
    r = get(report, "splits", "expect_column_values_to_not_be_null:patient_key")
    assert (r.passed, r.observed["unexpected_count"]) == (False, 1)
    assert get(report, "splits", "expect_column_values_to_be_unique:patient_key").passed  # nulls are not duplicates


def test_unknown_entity_ids_in_all_four_places():
    rows = clean_rows()
    rows["entity_mentions"][1]["entity_id"] = "X999"
    rows["study_labels"][0]["entity_id"] = "F999"
    rows["pairs"][0]["change_labels"].append({"entity_id": "Z001", "change": "new", "source": "stated"})
    rows["vqa"][2]["entity_ids"] = ["F029", "Q123"]
    report = run(rows, only={"entity_mentions", "study_labels", "pairs", "vqa"})
    in_set = "expect_column_values_to_be_in_set"
    r = get(report, "entity_mentions", f"{in_set}:entity_id")
    assert (r.passed, r.severity, r.observed["unexpected_count"]) == (False, "critical", 1)
    assert "X999" not in json.dumps(r.observed)  # counts only
    assert get(report, "study_labels", f"{in_set}:entity_id").observed["unexpected_count"] == 1
    p = get(report, "pairs", f"{in_set}:change_labels[].entity_id").observed
    assert (p["element_count"], p["unexpected_count"]) == (2, 1)
    v = get(report, "vqa", f"{in_set}:entity_ids[]").observed
    assert (v["element_count"], v["unexpected_count"]) == (5, 1)
    assert get(report, "entity_mentions", f"{in_set}:anatomy_id").passed


def test_vqa_answer_not_in_options():
    rows = clean_rows()
    rows["vqa"][1]["answer_text"] = "Resolved"  # B indexes "Decreased"
    rows["vqa"][3]["answer"] = "F"  # only 4 options
    r = get(run(rows), "vqa", "vqa_answer_in_options")
    assert (r.passed, r.severity) == (False, "critical")
    assert r.observed == {
        "rows": 4,
        "multiple_choice": 4,
        "letter_not_an_option": 1,
        "option_text_mismatch": 1,
        "open_ended_malformed": 0,
    }


def test_open_ended_items_need_text_and_no_options_or_letter():
    rows = clean_rows()
    base = rows["vqa"][0]
    good = dict(base, item_id="o1", answer_format="open_ended", options=[], answer=None, answer_text="left lower lobe")
    with_options = dict(good, item_id="o2", options=["a", "b"])
    no_text = dict(good, item_id="o3", answer_text="")
    rows["vqa"] = [*rows["vqa"], good, with_options, no_text]
    r = get(run(rows), "vqa", "vqa_answer_in_options")
    assert (r.passed, r.observed["open_ended_malformed"], r.observed["multiple_choice"]) == (False, 2, 4)
    rows["vqa"] = [*rows["vqa"][:4], good]
    assert get(run(rows), "vqa", "vqa_answer_in_options").passed


def test_vqa_answer_balance_only_from_40_items():
    rows = clean_rows()
    base = rows["vqa"][0]
    skewed = [dict(base, item_id=f"a{i}") for i in range(39)]  # all answer A
    rows["vqa"] = skewed
    r = get(run(rows), "vqa", "vqa_answer_balance")
    assert r.passed and r.observed["evaluated"] is False
    rows["vqa"] = skewed + [dict(base, item_id="a39")]
    r = get(run(rows), "vqa", "vqa_answer_balance")
    assert (r.passed, r.severity) == (False, "warning")
    assert r.observed["share_percent"]["A"] == 100.0 and r.observed["expected_percent"]["A"] == 25.0
    assert r.observed["max_deviation_points"] == 75.0
    # 40 items spread 11/10/10/9 deviate at most 2.5 points: pass
    rows["vqa"] = [dict(base, item_id=f"b{i}", answer="ABCD"[i % 4], answer_text=OPTIONS[i % 4]) for i in range(39)]
    rows["vqa"].append(dict(base, item_id="b39"))
    r = get(run(rows), "vqa", "vqa_answer_balance")
    assert r.passed and r.observed["evaluated"] and r.observed["max_deviation_points"] == 2.5


def test_patient_in_two_splits_and_patient_without_split():
    rows = clean_rows()
    rows["vqa"][0]["split"] = "test"  # p1 is train in the splits table
    report = run(rows)
    r = get(report, "splits", "patient_single_split")
    assert (r.passed, r.severity, r.observed) == (False, "critical", {"patients": 2, "patients_in_multiple_splits": 1})
    rows = clean_rows()
    rows["splits"].append(dict(patient_key="p2", institution="gb-lon", split="val", shard=1))
    rows["splits"] = [s for s in rows["splits"] if s["patient_key"] != "p1"] + rows["splits"][1:]
    report = run(rows)
    assert get(report, "splits", "patient_single_split").observed["patients_in_multiple_splits"] == 1
    r = get(report, "splits", "study_patients_have_split")
    assert (r.passed, r.observed) == (False, {"study_patients": 2, "patients_without_split": 1})


def test_unbalanced_ledger():
    rows = clean_rows()
    rows["ledger"].append(dict(rows["ledger"][0], source_uri="sources/us-bos/x.dcm", status="lost"))
    rows["ledger"].append(dict(rows["ledger"][0], run_id="run-2", source_uri="sources/us-bos/y.dcm"))
    report = run(rows, only={"ledger"}, expected_files={"run-1": 5, "run-2": 2})
    r = get(report, "ledger", "ledger_balance")
    assert (r.passed, r.severity) == (False, "critical")
    assert r.observed["unbalanced_runs"] == ["run-1", "run-2"]
    assert r.observed["runs"]["run-1"] == {
        "rows": 5,
        "ingested": 2,
        "quarantined": 1,
        "duplicate": 1,
        "skipped": 0,
        "expected_files": 5,
        "status_sum": 4,
    }
    assert r.observed["runs"]["run-2"]["rows"] == 1 and r.observed["runs"]["run-2"]["expected_files"] == 2
    bad_status = get(report, "ledger", "expect_column_values_to_be_in_set:status")
    assert not bad_status.passed and bad_status.observed["unexpected_count"] == 1


def test_quarantine_without_reason_and_duplicate_without_first_copy():
    rows = clean_rows()
    rows["ledger"][2]["reason"] = " "
    rows["ledger"][3]["duplicate_of"] = None
    report = run(rows)
    assert get(report, "ledger", "ledger_quarantine_reason").observed == {"quarantined": 1, "without_reason": 1}
    r = get(report, "ledger", "ledger_duplicate_of")
    assert (r.passed, r.severity, r.observed) == (False, "warning", {"duplicates": 1, "without_duplicate_of": 1})
    assert get(report, "ledger", "ledger_balance").passed


def test_phone_left_in_report_text_is_critical():
    rows = clean_rows()
    rows["reports"][1]["text"] += " Results phoned to 617-555-0123."
    report = run(rows, only={"reports"})
    r = get(report, "reports", REPORT_TEXT)
    assert (r.passed, r.severity, r.observed["unexpected_count"]) == (False, "critical", 1)
    assert "617-555-0123" not in r.message and "617-555-0123" not in json.dumps(r.observed)
    assert r in report.critical_failures and not report.passed


def test_shifted_dates_in_report_text_are_not_flagged():
    """Report dates are shifted per patient (113107), not removed; the reports stage verifies that no
    source date survives, so the date patterns skip report-derived text by rule."""
    rows = clean_rows()
    rows["reports"][1]["text"] += " Compared with study of 03/14/2023."
    assert get(run(rows, only={"reports"}), "reports", REPORT_TEXT).passed
    assert "date_numeric" not in [n for n, _ in phi_patterns(load_suite_config(), "reports")]


def _pattern_hits(table: str, text: str) -> list[str]:
    return [n for n, rx in phi_patterns(load_suite_config(), table) if re.search(rx, text)]


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("Seen on 14 March 2023 in clinic.", "date_month_name"),
        ("Seen March 14, 2023.", "date_month_name"),
        ("Seen 14.03.2023.", "date_numeric"),
        ("Seen 2023-03-14.", "date_iso"),
    ],
)
def test_date_patterns_flag_outside_reports(text, pattern):
    assert _pattern_hits("series", text) == [pattern]
    rows = clean_rows()
    rows["series"][0]["manufacturer"] = text
    r = phi(run(rows, only={"series"}), "series", "warning")
    assert (r.passed, r.observed["unexpected_count"]) == (False, 1)


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("Call (617) 555-0123 with results.", "phone"),
        ("MRN: 123456", "labelled_id"),
        ("Results sent to john.doe@hospital.org.", "email"),
        ("Patient DOE^JOHN was scanned.", "dicom_person_name"),
        ("Discussed with Dr. Matilda Walker at the bedside.", "name_after_title"),
        ("Dictated by: Jane Doe", "name_after_label"),
        ("Read by Jane Doe, MD.", "name_before_degree"),
        ("See www.example.org/results for images.", "url"),
    ],
)
def test_phi_patterns_flag_each_kind(text, pattern):
    """Each pattern of the de-identifier's file (and the composed name patterns) catches its kind in report text."""
    assert pattern in _pattern_hits("reports", text)


def test_leaked_name_in_report_fails_the_report_text_expectation():
    rows = clean_rows()
    rows["reports"][0]["findings"] = "Small effusion. Discussed with Dr. Matilda Walker."
    report = run(rows, only={"reports"})
    r = get(report, "reports", REPORT_TEXT)
    assert (r.passed, r.severity, r.observed["unexpected_count"]) == (False, "critical", 1)
    assert "Walker" not in r.message and "Walker" not in json.dumps(r.observed)


def test_phi_outside_report_text_is_a_warning():
    rows = clean_rows()
    rows["series"][0]["manufacturer"] = "Call 617-555-0123"
    r = phi(run(rows, only={"series"}), "series", "warning")
    assert (r.passed, r.severity, r.observed["unexpected_count"]) == (False, "warning", 1)


def test_prior_after_current_and_negative_gap():
    rows = clean_rows()
    rows["pairs"][0]["prior_study_key"], rows["pairs"][0]["current_study_key"] = "s2", "s1"
    rows["pairs"][0]["gap_days"] = -60
    report = run(rows, only={"pairs"})
    r = get(report, "pairs", "pair_order")
    assert (r.passed, r.severity) == (False, "critical")
    assert r.observed == {"rows": 1, "prior_not_before_current": 1, "unresolved_datetimes": 0}
    assert get(report, "pairs", "expect_column_values_to_be_between:gap_days").observed["unexpected_count"] == 1
    assert get(report, "pairs", "gap_days_consistent").passed  # -60 is consistent with the swapped order


def test_gap_days_inconsistent_and_pair_to_unknown_study():
    rows = clean_rows()
    rows["pairs"][0]["gap_days"] = 90
    r = get(run(rows), "pairs", "gap_days_consistent")
    assert (r.passed, r.severity, r.observed["inconsistent"]) == (False, "warning", 1)
    rows = clean_rows()
    rows["pairs"][0]["current_study_key"] = "s404"
    report = run(rows)
    assert get(report, "pairs", "pair_order").observed["unresolved_datetimes"] == 1
    assert get(report, "pairs", "foreign_key:current_study_key").observed["orphans"] == 1


def test_codes_sizes_spacing_and_dates():
    rows = clean_rows()
    rows["images"][0]["modality"] = "XR"
    rows["images"][1]["view"] = "FRONTAL"
    rows["images"][2]["rows"] = 8
    rows["images"][2]["cols"] = 5000
    rows["series"][0]["spacing_mm"] = [0.0, 0.14]
    rows["series"][1]["spacing_mm"] = None  # unknown spacing is allowed (a null list has no elements)
    rows["series"][2]["spacing_mm"] = [0.7, 0.7, 60.0]
    # before dates.earliest minus the largest date shift (1900-01-01 - 365 days): no shift explains it (issue 20)
    rows["studies"][2]["study_datetime"] = dt.datetime(1898, 12, 31)
    rows["studies"][1]["study_date_shifted"] = TODAY + dt.timedelta(days=400)
    report = run(rows, only={"images", "series", "studies", "reports"})
    in_set, between = "expect_column_values_to_be_in_set", "expect_column_values_to_be_between"
    r = get(report, "images", f"{in_set}:modality")
    assert (r.passed, r.severity, r.observed["unexpected_count"]) == (False, "critical", 1)
    r = get(report, "images", f"{in_set}:view")
    assert (r.passed, r.severity, r.observed["unexpected_count"]) == (False, "warning", 1)
    assert get(report, "images", f"{between}:rows").observed["unexpected_count"] == 1
    assert get(report, "images", f"{between}:cols").observed["unexpected_count"] == 1
    r = get(report, "series", f"{between}:spacing_mm[]")  # 0.0 (strict minimum) and 60.0 (> 50 mm)
    assert (r.passed, r.severity, r.observed["element_count"], r.observed["unexpected_count"]) == (
        False,
        "warning",
        5,
        2,
    )
    assert get(report, "studies", f"{between}:study_datetime").observed["unexpected_count"] == 1
    assert get(report, "studies", f"{between}:study_date_shifted").observed["unexpected_count"] == 1
    assert get(report, "reports", f"{between}:report_date_shifted").passed


def test_payload_hash_mismatch_and_sampling_is_capped():
    rows = clean_rows()
    rows["images"][1]["payload"] = b"tampered"
    r = get(run(rows), "images", "payload_sha256")
    assert (r.passed, r.observed) == (False, {"rows": 3, "rows_sampled": 3, "mismatches": 1})
    rules = load_rules()
    rules["payload_sha256"]["sample_rows"] = 2
    r = get(run(rows, rules=rules), "images", "payload_sha256")
    assert r.observed["rows_sampled"] == 2  # rows 0 and 2: the tampered middle row is not sampled
    assert r.passed


def test_foreign_keys():
    rows = clean_rows()
    rows["series"][0]["study_key"] = "s404"
    rows["images"][0]["series_key"] = "se404"
    rows["reports"][0]["study_key"] = "s404"
    rows["reports"][1]["study_key"] = None  # null is allowed (report without a study)
    report = run(rows)
    for table, col in [("series", "study_key"), ("images", "series_key"), ("reports", "study_key")]:
        r = get(report, table, f"foreign_key:{col}")
        assert (r.passed, r.severity, r.observed["orphans"]) == (False, "critical", 1), (table, col)
    assert get(report, "reports", "foreign_key:study_key").observed["null_skipped"] == 1


def test_redaction_counts():
    rows = clean_rows()
    rows["reports"][0]["redaction_counts"] = json.dumps({"NAME": -1, "DATE": 3})
    rows["reports"][1]["redaction_counts"] = "not json"
    report = run(rows)
    assert get(report, "reports", "redaction_counts_valid").observed == {
        "rows": 3,
        "invalid_json": 1,
        "negative_counts": 1,
    }
    rows = clean_rows()
    rows["reports"][0]["redactions"] = -1
    report = run(rows, only={"reports"})
    assert get(report, "reports", "expect_column_values_to_be_between:redactions").observed["unexpected_count"] == 1
    assert get(report, "reports", "redaction_counts_sum").observed["sum_differs_from_redactions"] == 1


def test_report_serialisation(clean_report):
    t = clean_report.to_table()
    assert t.schema.equals(QUALITY_SCHEMA) and t.num_rows == len(clean_report.results)
    doc = json.loads(clean_report.to_json())
    assert doc["passed"] is True and len(doc["results"]) == len(clean_report.results)
    assert QualityReport.from_json(clean_report.to_json()).results == clean_report.results


def test_bad_input_raises_with_reason(tmp_path):
    with pytest.raises(QualityInputError) as e:
        run_checks({"patients": SCHEMAS["studies"].empty_table()}, load_ontology())
    assert e.value.reason == "unknown_table"
    with pytest.raises(QualityInputError) as e:
        run_checks({"studies": build(clean_rows())["studies"].drop_columns(["modality"])}, load_ontology())
    assert e.value.reason == "schema_mismatch" and "modality" in str(e.value)
    with pytest.raises(QualityInputError) as e:
        CheckResult("images", "x", "fatal", False, {}, "")
    assert e.value.reason == "bad_observed"
    rules = yaml.safe_load(RULES_FILE.read_text())
    rules["foreign_keys"].append(
        {"table": "images", "column": "nope", "ref_table": "studies", "ref_column": "study_key", "severity": "critical"}
    )
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    with pytest.raises(QualityInputError) as e:
        run_checks({}, load_ontology(), rules=tmp_path / "rules.yaml")
    assert e.value.reason == "bad_rules" and "nope" in str(e.value)
    suites = yaml.safe_load(SUITES_FILE.read_text())
    suites["suites"]["images"].append(
        {"type": "expect_column_values_to_be_between", "column": "nope", "min_value": 0, "severity": "critical"}
    )
    with pytest.raises(QualityInputError) as e:
        run_checks({}, load_ontology(), suites=suites)
    assert e.value.reason == "bad_rules" and "nope" in str(e.value)
    suites = load_suite_config()
    suites["suites"]["images"].append(
        {"type": "expect_column_values_to_be_ok", "column": "rows", "severity": "critical"}
    )
    with pytest.raises(QualityInputError) as e:
        run_checks({}, load_ontology(), suites=suites)
    assert e.value.reason == "bad_rules" and "expect_column_values_to_be_ok" in str(e.value)


def test_phi_patterns_leave_ordinary_deidentified_values_alone():
    rows = clean_rows()
    benign = [
        "Nodule 3.2 x 1.5 cm in segment 6, previously 2.8 x 1.4 cm. Disc bulge at C5-6 and L4-5.",
        "Grade 2/4 stenosis; BP 120/80; 10-12 mm nodes; T2/3 level; ratio 1/2; at 10:30 hours.",
        "UID 2.25.301234567890123456789012345678901234567 and 1.2.840.10008.1.2.4.50; 1.2.40.0.13.1.1.",
        "key 9f86d081884c7d65 and [DATE] / [NAME] / [PHONE] placeholders; dose 2023 mGy cm.",
        "Compared with the study of March. Follow-up in 6 months. Patient number of lesions: 3.",
        "Dictated by: [NAME]. Discussed with Dr. [NAME] at 10:30. [NAME], MD. Reported by radiology resident.",
    ]
    rows["reports"] = [
        dict(rows["reports"][0], report_id=f"r{i}", text=t, findings=t, study_key=None, link_status="no_study")
        for i, t in enumerate(benign, start=10)
    ]
    report = run(rows, only={"reports"})
    r = get(report, "reports", REPORT_TEXT)
    assert r.passed, r.observed
    assert r.observed["element_count"] == 2 * len(benign) + 3 * len(benign)  # text+findings, 3 more sections


def test_an_institution_with_images_but_no_reports_or_labels_is_a_warning_naming_it(clean_report):
    assert get(clean_report, "reports", "reports_per_institution").passed
    assert get(clean_report, "study_labels", "labels_per_institution").passed
    rows = clean_rows()
    quiet = rows["studies"][0]["institution"]
    rows["reports"] = [r for r in rows["reports"] if r["institution"] != quiet]
    keys = {s["study_key"] for s in rows["studies"] if s["institution"] == quiet}
    rows["study_labels"] = [r for r in rows["study_labels"] if r["study_key"] not in keys]
    report = run(rows, only={"reports"})
    for table, check in (("reports", "reports_per_institution"), ("study_labels", "labels_per_institution")):
        result = get(report, table, check)
        assert not result.passed and result.severity == "warning" and quiet in result.message
    assert {w.check for w in report.warnings} >= {"reports_per_institution", "labels_per_institution"}
