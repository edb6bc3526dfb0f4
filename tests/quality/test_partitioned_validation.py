"""Issue 20: the quality gates run partition by partition and decide exactly as one whole-table validation does."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from quality.checks import run_checks
from quality.partitions import PartitionedTable
from schemas.base import table_from_rows
from schemas.ontology import load_ontology
from schemas.tables import SCHEMAS

TODAY = dt.date(2025, 6, 1)
N_PARTS = 4


def _tables(n: int, bad_date_rows: list[int]) -> dict[str, pa.Table]:
    """``n`` studies with one series each (shard = i % 4) and planted bad rows in different partitions:
    implausible dates (row-level), a null and an unknown modality, a negative ``n_series``, a study key
    repeated in another partition (a table-level invariant), a series spacing out of range (a view), an orphan
    series (a foreign key)."""
    good = dt.datetime(2020, 3, 1, 9, 30)
    studies, series = [], []
    for i in range(n):
        d = dt.datetime(1850, 1, 1) if i in bad_date_rows else good + dt.timedelta(days=i)
        studies.append(
            dict(
                study_key=f"s{i:05d}",
                patient_key=f"p{i:05d}",
                institution="shared-dicom",
                country="US",
                modality="CT",
                body_part="CHEST",
                family="3D-CT",
                study_datetime=d,
                study_date_shifted=d.date(),
                n_series=1,
                n_images=1,
                report_id=None,
                shard=i % N_PARTS,
            )
        )
        series.append(
            dict(
                series_key=f"x{i:05d}",
                study_key=f"s{i:05d}",
                patient_key=f"p{i:05d}",
                institution="shared-dicom",
                modality="CT",
                orientation="AXIAL",
                spacing_mm=[0.75, 0.75, 1.5],
                n_instances=1,
                shard=i % N_PARTS,
            )
        )
    studies[1]["modality"] = None  # partition 1
    studies[2]["modality"] = "XX"  # partition 2
    studies[3]["n_series"] = -1  # partition 3
    studies[6]["study_key"] = "s00005"  # partition 2 repeats a key of partition 1: only a global check sees it
    series[7]["spacing_mm"] = [0.75, 99.0, 1.5]  # partition 3, exploded view
    series[9]["study_key"] = "s99999"  # partition 1, orphan
    return {
        "studies": table_from_rows(studies, SCHEMAS["studies"]),
        "series": table_from_rows(series, SCHEMAS["series"]),
    }


def _split(t: pa.Table) -> PartitionedTable:
    shard = t.column("shard")
    parts = [t.filter(pa.compute.equal(shard, k)) for k in range(N_PARTS)]
    return PartitionedTable.from_tables(parts, t.schema)


def _decisions(report) -> dict:
    keys = ("element_count", "unexpected_count", "missing_count", "flagged_rows", "orphans", "rows")
    return {(r.table, r.check): (r.severity, r.passed, {k: r.observed.get(k) for k in keys}) for r in report.results}


@pytest.mark.parametrize(
    "bad_date_rows, date_gate", [([40], "warning"), ([8, 13, 22], "critical")], ids=["under_rate", "over_rate"]
)
def test_partitioned_validation_equals_whole_table_validation(bad_date_rows, date_gate):
    """The same failing-row counts, flags and gate outcome, 1% rate over all rows (not per partition)."""
    whole = _tables(200, bad_date_rows)
    parted = {name: _split(t) for name, t in whole.items()}
    assert all(p.n_partitions == N_PARTS for p in parted.values())
    a = run_checks(whole, load_ontology(), today=TODAY, only={"studies", "series"})
    b = run_checks(parted, load_ontology(), today=TODAY, only={"studies", "series"})
    assert _decisions(a) == _decisions(b)
    assert a.flags_table.equals(b.flags_table)
    assert a.row_flags == b.row_flags
    assert [(r.table, r.check) for r in a.critical_failures] == [(r.table, r.check) for r in b.critical_failures]
    found = {(r.table, r.check): r for r in b.results}
    date = found[("studies", "expect_column_values_to_be_between:study_datetime")]
    assert date.observed["unexpected_count"] == len(bad_date_rows) and date.severity == date_gate
    assert date.observed["element_count"] == 200  # summed over the partitions
    unique = found[("studies", "expect_column_values_to_be_unique:study_key")]
    assert not unique.passed and unique.severity == "critical" and unique.observed["unexpected_count"] == 2
    assert found[("series", "foreign_key:study_key")].observed["orphans"] == 2  # x00009 and x00006 (its study renamed)
    spacing = found[("series", "expect_column_values_to_be_between:spacing_mm[]")]
    assert spacing.observed["unexpected_count"] == 1 and spacing.observed["element_count"] == 600
    for check in (
        "expect_column_values_to_not_be_null:modality",
        "expect_column_values_to_be_in_set:modality",
        "expect_column_values_to_be_between:n_series",
    ):
        assert found[("studies", check)].observed["unexpected_count"] == 1, check
    assert b.flags_table.num_rows == a.flags_table.num_rows >= 4
