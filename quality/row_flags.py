"""Quality gates at scale: a failing row-level expectation flags its rows; it fails the build only above a rate.

A row-level expectation (a suite or view entry of :data:`quality.gx_suites.ROW_LEVEL_TYPES`: a range, a code
set, a regex, not-null; an implausible date, a spacing out of range) that fails on at most
``row_level.max_failed_rate`` of the values it checked (``quality/expectations.yaml``, default 0.01) does not
stop the release: its result becomes a ``warning`` whose ``observed`` carries ``flagged_rows`` and
``failed_rate``, and the rows are listed with the expectation's name (:data:`FLAGS_SCHEMA`; written by the
quality stage to ``reports/quality/row_flags/<run>.parquet`` and counted on the dashboard). Above the rate the
result keeps its severity (a critical one fails the build); its rows are flagged too. Table-level invariants
(generated key uniqueness / not-null, the PHI scan, foreign keys, split leaks, the ledger balance) are never
row-level, and nor is anything of the restricted ``ledger`` table (whose keys name source files).

The rows are found again here (GE's results carry counts only, :data:`quality.gx_suites.RESULT_FORMAT`, so no
value of the data reaches the reports zone); only the failing expectations are re-evaluated, on their one column.
Flags carry the table's key (pseudonyms and content hashes), never a value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from quality.gx_suites import SuiteSpec
from quality.partitions import PartitionedTable, as_partitioned
from quality.results import CheckResult
from schemas.base import key_columns
from schemas.tables import SCHEMAS

#: default ``row_level.max_failed_rate``: share of checked values (0-1)
DEFAULT_MAX_FAILED_RATE = 0.01
#: tables whose checks are never row-level (restricted, and their balance is an invariant)
NEVER_ROW_LEVEL_TABLES = frozenset({"ledger"})
#: one flagged row: the table, its key (key columns joined by ``|``) and the failed check id
FLAGS_SCHEMA = pa.schema(
    [
        pa.field("table", pa.string(), nullable=False),
        pa.field("key", pa.string(), nullable=False),
        pa.field("check", pa.string(), nullable=False),
    ]
)


def _param(value: Any, params: Mapping[str, Any]) -> Any:
    if isinstance(value, dict) and "$PARAMETER" in value:
        return params[value["$PARAMETER"]]
    return value


def _values(table: pa.Table, spec: SuiteSpec, column: str) -> tuple[pd.Series, np.ndarray | None]:
    """The checked values (pandas, dates as datetime64) and, for an exploded view, each value's row index."""
    if spec.explode is None:
        return pa.table({"v": table.column(column)}).to_pandas(date_as_object=False)["v"], None
    col = table.column(spec.explode).combine_chunks()
    flat = pc.list_flatten(col)
    parents = pc.list_parent_indices(col).to_numpy(zero_copy_only=False)
    if pa.types.is_struct(flat.type):
        flat = flat.field(column)
    return pa.table({"v": flat}).to_pandas(date_as_object=False)["v"], parents


def _as_bound(bound: Any, s: pd.Series) -> Any:
    if bound is None:
        return None
    if pd.api.types.is_datetime64_any_dtype(s):
        return pd.Timestamp(bound)
    return bound


def failing_values(s: pd.Series, etype: str, kwargs: Mapping[str, Any], params: Mapping[str, Any]) -> np.ndarray:
    """Boolean mask of the values that fail one row-level expectation (GE's column-map semantics: a null value
    passes every type but ``expect_column_values_to_not_be_null``).

    Parameters
    ----------
    s : pandas.Series
        the column's values.
    etype : str
        one of :data:`quality.gx_suites.ROW_LEVEL_TYPES`.
    kwargs : mapping
        the expectation's kwargs (``$PARAMETER`` references resolved from ``params``).
    params : mapping
        :func:`quality.gx_suites.suite_parameters`.

    Raises
    ------
    ValueError
        for an expectation type that is not row-level.
    """
    present = s.notna().to_numpy()
    if etype == "expect_column_values_to_not_be_null":
        return ~present
    bad = np.zeros(len(s), dtype=bool)
    v = s[present]
    if etype == "expect_column_values_to_be_between":
        lo, hi = (
            _as_bound(_param(kwargs.get("min_value"), params), s),
            _as_bound(_param(kwargs.get("max_value"), params), s),
        )
        out = np.zeros(len(v), dtype=bool)
        if lo is not None:
            out |= (v <= lo).to_numpy() if kwargs.get("strict_min") else (v < lo).to_numpy()
        if hi is not None:
            out |= (v >= hi).to_numpy() if kwargs.get("strict_max") else (v > hi).to_numpy()
    elif etype == "expect_column_values_to_be_in_set":
        out = ~v.isin(list(_param(kwargs["value_set"], params))).to_numpy()
    elif etype == "expect_column_values_to_match_regex":
        rx = re.compile(_param(kwargs["regex"], params))
        out = np.array([rx.search(str(x)) is None for x in v], dtype=bool)
    else:
        raise ValueError(f"{etype} is not a row-level expectation")
    bad[present] = out
    return bad


def _keys(table: pa.Table, name: str, rows: np.ndarray) -> list[str]:
    cols = key_columns(SCHEMAS[name])
    picked = table.select(cols).take(pa.array(rows, type=pa.int64())).to_pydict()
    return ["|".join(str(picked[c][i]) for c in cols) for i in range(len(rows))]


def apply_row_tolerance(
    results: Sequence[CheckResult],
    tables: Mapping[str, pa.Table | PartitionedTable],
    specs: Sequence[SuiteSpec],
    params: Mapping[str, Any],
    max_failed_rate: float = DEFAULT_MAX_FAILED_RATE,
) -> tuple[list[CheckResult], pa.Table]:
    """Flag the rows of failed row-level expectations; downgrade those at or under ``max_failed_rate`` to warnings.

    Parameters
    ----------
    results : sequence of CheckResult
        :func:`quality.gx_suites.run_suites`'s results, in order.
    tables : mapping of str to pyarrow.Table or PartitionedTable
        the tables the suites ran on; read partition by partition, only the key columns and the failing
        expectation's column.
    specs : sequence of SuiteSpec
        :func:`quality.gx_suites.build_suite_specs` (entries carry ``row_level``).
    params : mapping
        :func:`quality.gx_suites.suite_parameters`.
    max_failed_rate : float
        share (0-1) of the checked values that may fail before the expectation fails with its severity.

    Returns
    -------
    (list of CheckResult, pyarrow.Table)
        the results (same order; a downgraded one has severity ``warning`` and ``observed`` with
        ``flagged_rows``, ``failed_rate`` and ``max_failed_rate``), and the flagged rows (:data:`FLAGS_SCHEMA`,
        sorted by table, check, key).

    Raises
    ------
    ValueError
        if ``max_failed_rate`` is outside [0, 1].
    """
    if not 0.0 <= max_failed_rate <= 1.0:
        raise ValueError(f"max_failed_rate must be within [0, 1], got {max_failed_rate}")
    entries = {(spec.table, e["check"]): (spec, e) for spec in specs for e in spec.expectations}
    out: list[CheckResult] = []
    flags: list[dict] = []
    for r in results:
        spec, entry = entries.get((r.table, r.check), (None, None))
        if (
            r.passed
            or entry is None
            or not entry.get("row_level")
            or r.table in NEVER_ROW_LEVEL_TABLES
            or "exception" in r.observed
            or "unexpected_count" not in r.observed
        ):
            out.append(r)
            continue
        column = entry["kwargs"]["column"]
        read = list(dict.fromkeys([*key_columns(SCHEMAS[r.table]), spec.explode or column]))
        n_bad = checked = n_rows = 0
        for part in as_partitioned(tables[r.table]).partitions(read):  # one partition, its keys and one column
            s, parents = _values(part, spec, column)
            bad = failing_values(s, entry["type"], entry["kwargs"], params)
            checked += int(s.notna().sum()) if entry["type"] != "expect_column_values_to_not_be_null" else len(s)
            n_bad += int(bad.sum())
            rows = np.unique(parents[bad]) if parents is not None else np.flatnonzero(bad)
            n_rows += len(rows)
            flags += [{"table": r.table, "key": k, "check": r.check} for k in _keys(part, r.table, rows)]
        rate = float(n_bad) / checked if checked else 0.0
        nulls = entry["type"] != "expect_column_values_to_not_be_null"
        # one denominator, the values checked (GX's: non-null ones unless the check is about nulls)
        what = (
            f"{n_bad} of {checked} {'non-null ' if nulls else ''}values of {r.table}.{column} fail {entry['type']} "
            f"({100 * rate:.2f}%, limit {100 * max_failed_rate:g}%)"
        )
        obs = {
            **r.observed,
            "flagged_rows": int(n_rows),
            "failed_rate": round(rate, 6),
            "max_failed_rate": max_failed_rate,
        }
        if rate <= max_failed_rate:
            out.append(
                CheckResult(
                    r.table,
                    r.check,
                    "warning",
                    False,
                    obs,
                    f"{n_rows} row{'s' if n_rows != 1 else ''} flagged: {what}",
                )
            )
        else:
            out.append(
                CheckResult(
                    r.table,
                    r.check,
                    r.severity,
                    False,
                    obs,
                    f"{what}; {n_rows} row{'s' if n_rows != 1 else ''} flagged",
                )
            )
    flag_table = pa.Table.from_pylist(flags, schema=FLAGS_SCHEMA)
    if flag_table.num_rows:
        flag_table = flag_table.sort_by([("table", "ascending"), ("check", "ascending"), ("key", "ascending")])
    return out, flag_table


def flag_counts(flags: pa.Table) -> dict[str, int]:
    """``"<table>: <check>"`` -> number of flagged rows (for the report and the dashboard)."""
    if not flags.num_rows:
        return {}
    counts = flags.group_by(["table", "check"]).aggregate([("key", "count")]).to_pylist()
    return {
        f"{c['table']}: {c['check']}": int(c["key_count"])
        for c in sorted(counts, key=lambda c: (c["table"], c["check"]))
    }
