"""Issue 20 item 4: row-level expectations flag rows and fail only above a rate; a date shift never fails a gate."""

from __future__ import annotations

import datetime as dt
import io
import warnings

import pyarrow as pa
import pytest

from quality.checks import run_checks
from quality.gx_suites import load_suite_config, run_suites, suite_parameters
from quality.row_flags import FLAGS_SCHEMA, failing_values
from schemas.base import table_from_rows
from schemas.ontology import load_ontology
from schemas.tables import SCHEMAS

TODAY = dt.date(2025, 6, 1)
DATE_CHECKS = (
    "expect_column_values_to_be_between:study_datetime",
    "expect_column_values_to_be_between:study_date_shifted",
)


def _studies(dates: list[dt.datetime | None], modality: str = "CT") -> pa.Table:
    rows = [
        dict(
            study_key=f"s{i:05d}",
            patient_key=f"p{i:05d}",
            institution="shared-dicom",
            country="US",
            modality=modality,
            body_part="CHEST",
            family="3D-CT",
            study_datetime=d,
            study_date_shifted=d.date() if d else None,
            n_series=1,
            n_images=1,
            report_id=None,
            shard=i % 4,
        )
        for i, d in enumerate(dates)
    ]
    return table_from_rows(rows, SCHEMAS["studies"])


def _date_results(studies: pa.Table) -> dict:
    tables = {t: s.empty_table() for t, s in SCHEMAS.items()}
    tables["studies"] = studies
    res = run_suites(tables, load_ontology(), today=TODAY, only={"studies"})
    return {r.check: r for r in res if r.check in DATE_CHECKS}


def test_1900_dates_shifted_by_any_key_pass_the_plausible_date_gate():
    """TCIA's already-shifted 1900 dates, moved by every offset a key can give ([-365, 365] days, 0 included)."""
    from etl.keys import MAX_DATE_SHIFT_DAYS

    assert MAX_DATE_SHIFT_DAYS == 365
    base = dt.datetime(1900, 1, 1, 0, 0)
    dates = [base + dt.timedelta(days=d) for d in range(-MAX_DATE_SHIFT_DAYS, MAX_DATE_SHIFT_DAYS + 1)]
    found = _date_results(_studies(dates))
    assert set(found) == set(DATE_CHECKS)
    for r in found.values():
        assert r.passed and r.observed["unexpected_count"] == 0, r
    # and the bound still means something: a date a shift cannot explain is implausible
    params = suite_parameters(load_suite_config(), load_ontology(), TODAY)
    assert params["earliest_plausible_date"] == dt.datetime(1899, 1, 1)
    found = _date_results(_studies([dt.datetime(1898, 12, 31)] + dates[:10]))
    assert all(not r.passed for r in found.values())


def _real_study_dates(shared: object, secret: str) -> list[dt.datetime]:
    """The shifted StudyDate of every de-identifiable file of ../shared/data/dicom*, through the pipeline's
    own de-identification with ``secret`` as the key. The burned-in text pass is off: it never touches a date, and
    it was 50 of the 67 s of one key."""
    import pydicom

    from etl.deid.dicom import deidentify_dataset
    from etl.deid.policy import build_policy
    from etl.keys import PseudonymKey
    from schemas.config import BurnedInTextConfig, DeidConfig

    key = PseudonymKey(secret.encode())
    policy = build_policy(DeidConfig(burned_in_text=BurnedInTextConfig(ocr=False)))
    out = []
    for inst in ("dicom", "dicom-edge"):
        for f in sorted(p for p in (shared / inst).rglob("*") if p.is_file()):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    ds = pydicom.dcmread(io.BytesIO(f.read_bytes()), force=True)
                    res = deidentify_dataset(ds, key, f"shared-{inst}", policy)
            except Exception:  # noqa: BLE001  files the pipeline quarantines
                continue
            d = str(res.dataset.get("StudyDate", "") or "").strip()
            if len(d) == 8 and d.isdigit():
                out.append(dt.datetime.strptime(d, "%Y%m%d"))
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    "secret",
    ["cd" * 64, "cd" * 32, "medreco-test-secret-0123456789abcdef0123456789abcdef", "00" * 32, "f7" * 32, "key-" * 16],
)
def test_shared_real_dates_pass_the_gate_whatever_the_key(shared_data, secret):
    """The real public data under several keys (64 x 'cd' failed 2 of 69 studies before issue 20: it shifts 3 of
    the 123 dated files' 1900 StudyDates before 1900-01-01)."""
    dates = _real_study_dates(shared_data, secret)
    assert len(dates) > 50
    found = _date_results(_studies(dates))
    for r in found.values():
        assert r.passed and r.observed["unexpected_count"] == 0, (secret[:4], r)
    if secret == "cd" * 64:  # the key of the issue moves real 1900 dates before 1900-01-01: the old bound failed
        assert min(dates) < dt.datetime(1900, 1, 1)


def _rows_with_bad_modality(n: int, bad: int) -> pa.Table:
    t = _studies([dt.datetime(2020, 1, 1)] * n)
    modality = ["XX"] * bad + ["CT"] * (n - bad)
    return t.set_column(t.schema.get_field_index("modality"), "modality", pa.array(modality))


def _run(studies: pa.Table, **kw):
    return run_checks({"studies": studies}, load_ontology(), today=TODAY, only={"studies"}, **kw)


def test_row_level_failures_under_the_rate_flag_rows_and_warn():
    check = "expect_column_values_to_be_in_set:modality"
    rep = _run(_rows_with_bad_modality(300, 2))  # 0.67% <= 1%
    (r,) = [x for x in rep.results if x.table == "studies" and x.check == check]
    assert (r.severity, r.passed) == ("warning", False)
    assert r.observed["flagged_rows"] == 2 and r.observed["max_failed_rate"] == 0.01
    assert not [x for x in rep.critical_failures if x.table == "studies"]
    assert rep.row_flags == {f"studies: {check}": 2}
    assert rep.flags_table.schema.equals(FLAGS_SCHEMA)
    assert rep.flags_table.to_pylist() == [
        {"table": "studies", "key": "s00000", "check": check},
        {"table": "studies", "key": "s00001", "check": check},
    ]
    assert '"row_flags"' in rep.to_json()


def test_row_level_failures_above_the_rate_fail_the_build():
    check = "expect_column_values_to_be_in_set:modality"
    rep = _run(_rows_with_bad_modality(100, 2))  # 2% > 1%
    (r,) = [x for x in rep.results if x.table == "studies" and x.check == check]
    assert (r.severity, r.passed) == ("critical", False) and r in rep.critical_failures
    assert r.observed["flagged_rows"] == 2  # flagged all the same
    # the rate is configurable
    suites = load_suite_config()
    suites["row_level"] = {"max_failed_rate": 0.05}
    rep = _run(_rows_with_bad_modality(100, 2), suites=suites)
    (r,) = [x for x in rep.results if x.table == "studies" and x.check == check]
    assert r.severity == "warning"


def test_table_level_invariants_fail_at_any_rate():
    t = _studies([dt.datetime(2020, 1, 1)] * 500)
    keys = t.column("study_key").to_pylist()
    keys[1] = keys[0]  # one duplicate key in 500 rows (0.2%)
    t = t.set_column(0, "study_key", pa.array(keys))
    rep = _run(t)
    failed = {r.check for r in rep.critical_failures if r.table == "studies"}
    assert "expect_column_values_to_be_unique:study_key" in failed
    assert rep.row_flags == {}


def test_failing_values_follows_ge_semantics():
    import pandas as pd

    s = pd.Series([1.0, None, 5.0, 10.0])
    assert failing_values(s, "expect_column_values_to_be_between", {"min_value": 2, "max_value": 9}, {}).tolist() == [
        True,
        False,
        False,
        True,
    ]
    assert failing_values(s, "expect_column_values_to_not_be_null", {}, {}).tolist() == [False, True, False, False]
    c = pd.Series(["ab12", None, "zz"])
    assert failing_values(c, "expect_column_values_to_match_regex", {"regex": "[0-9]"}, {}).tolist() == [
        False,
        False,
        True,
    ]
    with pytest.raises(ValueError):
        failing_values(c, "expect_column_values_to_be_unique", {}, {})


def test_a_row_level_message_states_one_denominator_the_values_checked():
    """Issue 40, a new user's trial: "1 of 90 values" stood beside GX's 9.09% of 11 non-null values. 90 studies,
    79 without a date, one of the 11 dates implausible: the message counts 1 of 11 non-null values (9.09%), says
    the 79 nulls were not checked, and matches GX's own unexpected_percent and the failed rate."""
    check = "expect_column_values_to_be_between:study_datetime"
    dates = [dt.datetime(1898, 12, 31)] + [dt.datetime(2020, 1, 1)] * 10 + [None] * 79
    rep = _run(_studies(dates))
    (r,) = [x for x in rep.results if x.table == "studies" and x.check == check]
    assert r.observed["element_count"] == 90 and r.observed["missing_count"] == 79
    assert r.observed["unexpected_percent"] == pytest.approx(100 / 11, abs=1e-3)
    assert r.observed["failed_rate"] == pytest.approx(1 / 11, abs=1e-6)
    assert r.message == (
        "1 of 11 non-null values of studies.study_datetime fail expect_column_values_to_be_between "
        "(9.09%, limit 1%); 1 row flagged"
    )
    assert " of 90 " not in r.message
    from quality.gx_suites import count_phrase

    assert count_phrase(r.observed, "expect_column_values_to_be_between") == (
        "1 of 11 non-null values (9.09%; 79 null of 90 not checked)"
    )
    assert (
        count_phrase(
            {"element_count": 90, "unexpected_count": 79, "missing_count": 79}, "expect_column_values_to_not_be_null"
        )
        == "79 of 90 values (87.78%)"
    )
