"""Great Expectations 1.x suites of the curated tables: built from ``quality/expectations.yaml``, run through
Checkpoints in a GE file context (``<root>/reports/gx``), Data Docs as a static site with a cap on retained runs
(the project's own pages of GX's validation results, :mod:`quality.data_docs`: GX's own load from CDNs).

One suite per table of :data:`schemas.tables.SCHEMAS` (key checks and the PHI scan are generated for every
table; the rest is listed in the YAML) plus one per exploded list column (a *view*: ``pairs.change_labels``
gives one row per change label). Each pyarrow table becomes a pandas DataFrame (binary columns dropped,
``list<string>`` columns joined with newlines for the PHI scan, other list columns only in their views) and
is validated by its Checkpoint ``medreco_<suite>`` (one per suite: a DataFrame batch is a Checkpoint run
parameter); the Data Docs site is then rewritten once for the run; each result becomes one
:class:`quality.checks.CheckResult` (check id ``<expectation type>:<column>``, GE's ``severity``).

PHI safety: results are requested in GE's ``SUMMARY`` format with ``partial_unexpected_count: 0``, so neither
the validation results nor Data Docs hold a single value of the data: only counts.
"""

from __future__ import annotations

import datetime as dt
import importlib
import json
import os
import re
import shutil
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import yaml

from quality.partitions import PartitionedTable, as_partitioned
from quality.results import CheckResult, QualityInputError
from schemas.base import key_columns
from schemas.config import PROJECT_ROOT
from schemas.tables import SCHEMAS

os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")  # never phone home (set before GE is imported)

SUITES_FILE = Path(__file__).with_name("expectations.yaml")
DATASOURCE = "medreco"
DEFAULT_KEEP_RUNS = 20
#: GE result format: counts only, never a value of the data (PHI-free results and Data Docs)
RESULT_FORMAT = {"result_format": "SUMMARY", "partial_unexpected_count": 0, "include_unexpected_rows": False}
SEVERITIES = ("critical", "warning")
_OBSERVED_KEYS = ("element_count", "unexpected_count", "missing_count")
_VALIDATIONS_DIR = ("uncommitted", "validations")
#: expectation types that judge each row on its own (a failure is a fact about those rows, not the table): a
#: suite entry of these types fails the build only above ``row_level.max_failed_rate`` (quality/row_flags.py)
ROW_LEVEL_TYPES = frozenset(
    {
        "expect_column_values_to_be_between",
        "expect_column_values_to_be_in_set",
        "expect_column_values_to_match_regex",
        "expect_column_values_to_not_be_null",
    }
)


@dataclass
class SuiteSpec:
    """One GE suite: the table (or view) it validates and its expectation entries.

    Attributes
    ----------
    name : str
        suite, asset, validation definition name (``"pairs"``, ``"pairs__change_labels"``).
    table : str
        the base table of :data:`schemas.tables.SCHEMAS`.
    explode : str or None
        the list column a view explodes (one row per element).
    melt : list of str or None
        the text columns a PHI view stacks into one ``value`` column (one row per non-null value).
    expectations : list of dict
        ``{"type", "kwargs", "severity", "check", "column"}``; ``column`` is the reported column spec
        (``"change_labels[].entity_id"``).
    """

    name: str
    table: str
    explode: str | None = None
    expectations: list[dict] = field(default_factory=list)
    melt: list[str] | None = None


# ------------------------------------------------------------------------------------------ loading


def load_suite_config(path: str | Path | None = None) -> dict:
    """The parsed ``quality/expectations.yaml`` (or ``path``), with ``{from: ...}`` values resolved.

    Raises
    ------
    QualityInputError
        ``bad_rules`` for a file without ``suites``/``phi``/``dates``/``keys``, or an unresolvable ``from``.
    """
    doc = yaml.safe_load(Path(path or SUITES_FILE).read_text(encoding="utf-8"))
    if not isinstance(doc, dict):
        raise QualityInputError("bad_rules", "expectations file must be a mapping")
    missing = [k for k in ("suites", "phi", "dates", "keys") if k not in doc]
    if missing:
        raise QualityInputError("bad_rules", f"expectations file lacks sections {missing}")
    return _resolve(doc)


def _resolve(node: Any) -> Any:
    if isinstance(node, dict):
        if set(node) == {"from"} and isinstance(node["from"], str) and ":" in node["from"]:
            module, _, attr = node["from"].partition(":")
            try:
                return list(getattr(importlib.import_module(module), attr))
            except (ImportError, AttributeError) as exc:
                raise QualityInputError("bad_rules", f"cannot resolve {node['from']}: {exc}") from exc
        return {k: _resolve(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(v) for v in node]
    return node


def phi_patterns(config: dict, table: str) -> list[tuple[str, str]]:
    """``(name, regex)`` of the PHI patterns that apply to ``table`` (Python ``re`` syntax, no capture groups).

    Parameters
    ----------
    config : dict
        from :func:`load_suite_config`.
    table : str
        table name; patterns whose ``skip_tables`` name it are left out.

    Raises
    ------
    QualityInputError
        ``bad_rules`` for an unknown key of the patterns file or a pattern that does not compile.
    """
    phi = config["phi"]
    source = json.loads((PROJECT_ROOT / phi["patterns_file"]).read_text(encoding="utf-8"))
    insensitive = set(source) - set(source.get("case_sensitive", []))

    def key(name: str) -> str:
        if name == "capital":
            return "[A-ZÀ-ÖØ-Þ]"
        if name == "not_stopword":
            words = sorted((re.escape(w) for w in source["name_stopwords"]), key=len, reverse=True)
            return rf"(?!(?i:{'|'.join(words)})\b)"
        if name not in source or not isinstance(source[name], str):
            raise QualityInputError("bad_rules", f"phi pattern key {name!r} is not a regex of {phi['patterns_file']}")
        return f"(?i:{source[name]})" if name in insensitive else f"(?:{source[name]})"

    out = []
    for p in phi["patterns"]:
        if table in p.get("skip_tables", []):
            continue
        if "from" in p:
            value = source.get(p["from"])
            regexes = value if isinstance(value, list) else [value]
            if not all(isinstance(r, str) for r in regexes):
                raise QualityInputError("bad_rules", f"phi pattern {p['name']}: {p['from']!r} is not a regex")
            flag = "(?i)" if p["from"] in insensitive else ""
            found = [flag + r for r in regexes]
        elif "template" in p:
            found = [re.sub(r"<<(\w+)>>", lambda m: key(m.group(1)), p["template"])]
        elif "regex" in p:
            found = [p["regex"]]
        else:
            raise QualityInputError("bad_rules", f"phi pattern {p} needs from, template or regex")
        for r in found:
            r = re.sub(r"\(\?P<\w+>", "(?:", r)  # pandas str.contains warns on capture groups
            try:
                re.compile(r)
            except re.error as exc:
                raise QualityInputError("bad_rules", f"phi pattern {p['name']} does not compile: {exc}") from exc
            out.append((p["name"], r))
    return out


def combined_phi_regex(config: dict, table: str) -> str:
    """The PHI patterns of ``table`` (:func:`phi_patterns`) as one alternation (one scan per value, not one
    per pattern); a leading global ``(?i)`` becomes a scoped ``(?i:...)`` group."""
    parts = []
    for _, r in phi_patterns(config, table):
        parts.append(f"(?i:{r[4:]})" if r.startswith("(?i)") else f"(?:{r})")
    regex = "|".join(parts)
    re.compile(regex)
    return regex


def _entry(raw: dict, suite: str, table: str, label_of) -> dict:
    raw = dict(raw)
    etype = raw.pop("type", None)
    severity = raw.pop("severity", None)
    check = raw.pop("check", None)
    row_level = raw.pop("row_level", None)
    if not isinstance(etype, str) or not etype.startswith("expect_"):
        raise QualityInputError("bad_rules", f"suite {suite}: entry {raw} needs an expectation type")
    if severity not in SEVERITIES:
        raise QualityInputError("bad_rules", f"suite {suite}: {etype} severity must be one of {SEVERITIES}")
    cols = [raw[k] for k in ("column", "column_A", "column_B") if k in raw] or raw.get("column_list", [])
    label = ",".join(label_of(c) for c in cols)
    return {
        "type": etype,
        "kwargs": raw,
        "severity": severity,
        "check": check or f"{etype}:{label}",
        "column": label,
        "columns": cols,
        "row_level": row_level,
    }


def _mark_row_level(entries: list[dict]) -> list[dict]:
    """Suite and view entries: ``row_level`` True for a per-row expectation type (:data:`ROW_LEVEL_TYPES`) unless
    the YAML says ``row_level: false`` (generated key and PHI entries are never row-level: table invariants)."""
    for e in entries:
        e["row_level"] = e["row_level"] is not False and e["type"] in ROW_LEVEL_TYPES
    return entries


def build_suite_specs(config: dict, schemas: dict[str, pa.Schema] | None = None) -> list[SuiteSpec]:
    """Every suite: generated key and PHI checks per table, the YAML's entries, the exploded views.

    Parameters
    ----------
    config : dict
        from :func:`load_suite_config`.
    schemas : dict of str to pyarrow.Schema, optional
        the table registry (default :data:`schemas.tables.SCHEMAS`).

    Returns
    -------
    list of SuiteSpec
        tables in registry order, then the views.

    Raises
    ------
    QualityInputError
        ``bad_rules`` for a suite of an unknown table, an unknown column, an unknown expectation type or
        two entries with the same check id on one table.
    """
    from great_expectations.expectations.registry import get_expectation_impl

    schemas = schemas or SCHEMAS
    views = config.get("views") or {}
    for name in config["suites"]:
        if name not in schemas and name not in views:
            raise QualityInputError("bad_rules", f"suite {name!r} is neither a table nor a view")
    specs: list[SuiteSpec] = []
    key_sev = config["keys"]["severity"]
    phi = config["phi"]
    for table, schema in schemas.items():
        spec = SuiteSpec(table, table)
        keys = key_columns(schema)
        for k in keys:
            spec.expectations.append(
                _entry(
                    {"type": "expect_column_values_to_not_be_null", "column": k, "severity": key_sev}, table, table, str
                )
            )
        if len(keys) == 1:
            spec.expectations.append(
                _entry(
                    {"type": "expect_column_values_to_be_unique", "column": keys[0], "severity": key_sev},
                    table,
                    table,
                    str,
                )
            )
        else:
            spec.expectations.append(
                _entry(
                    {"type": "expect_compound_columns_to_be_unique", "column_list": keys, "severity": key_sev},
                    table,
                    table,
                    str,
                )
            )
        spec.expectations += _mark_row_level([_entry(e, table, table, str) for e in config["suites"].get(table, [])])
        specs.append(spec)
    for table, schema in schemas.items():
        if table in phi.get("skip_tables", []):
            continue
        regex = combined_phi_regex(config, table)
        text_cols = [f.name for f in schema if _is_stringish(f.type)]
        critical = [c for c in phi.get("critical_columns", {}).get(table, []) if c in text_cols]
        groups = [
            ("critical", critical),
            (phi.get("severity_elsewhere", "warning"), [c for c in text_cols if c not in critical]),
        ]
        for severity, cols in groups:
            if not cols:
                continue
            name = f"{table}__phi_{severity}"
            entry = _entry(
                {
                    "type": "expect_column_values_to_not_match_regex_list",
                    "column": "value",
                    "regex_list": [regex],
                    "severity": severity,
                    "check": f"expect_column_values_to_not_match_regex_list:{'|'.join(cols)}",
                },
                name,
                table,
                str,
            )
            entry["column"] = "|".join(cols)
            specs.append(SuiteSpec(name, table, melt=cols, expectations=[entry]))
    for name, view in views.items():
        table, col = view.get("table"), view.get("explode")
        if table not in schemas or col not in schemas[table].names:
            raise QualityInputError("bad_rules", f"view {name}: unknown table/column {table}.{col}")
        vtype = schemas[table].field(col).type
        if not (pa.types.is_list(vtype) or pa.types.is_large_list(vtype)):
            raise QualityInputError("bad_rules", f"view {name}: {table}.{col} is not a list column")
        fields = [f.name for f in vtype.value_type] if pa.types.is_struct(vtype.value_type) else [col]
        label_of = (lambda c, col=col: f"{col}[].{c}") if pa.types.is_struct(vtype.value_type) else (lambda c: f"{c}[]")
        spec = SuiteSpec(
            name,
            table,
            col,
            _mark_row_level([_entry(e, name, table, label_of) for e in config["suites"].get(name, [])]),
        )
        for e in spec.expectations:
            bad = [c for c in e["columns"] if c not in fields]
            if bad:
                raise QualityInputError("bad_rules", f"view {name}: unknown columns {bad}")
        specs.append(spec)
    seen: set[tuple[str, str]] = set()
    for spec in specs:
        names = schemas[spec.table].names
        for e in spec.expectations:
            try:
                get_expectation_impl(e["type"])
            except Exception as exc:  # noqa: BLE001  GE raises its own not-found error types
                raise QualityInputError("bad_rules", f"suite {spec.name}: unknown expectation {e['type']}") from exc
            if spec.explode is None and spec.melt is None and any(c not in names for c in e["columns"]):
                raise QualityInputError("bad_rules", f"suite {spec.name}: unknown column in {e['check']}")
            if (spec.table, e["check"]) in seen:
                raise QualityInputError("bad_rules", f"check {spec.table}:{e['check']} is defined twice")
            seen.add((spec.table, e["check"]))
    return specs


# ------------------------------------------------------------------------------------------ frames


def _is_stringish(t: pa.DataType) -> bool:
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return True
    return (pa.types.is_list(t) or pa.types.is_large_list(t)) and _is_stringish(t.value_type)


def to_frame(table: pa.Table, explode: str | None = None, melt: list[str] | None = None):
    """The pandas DataFrame GE validates for a table or one of its views.

    Parameters
    ----------
    table : pyarrow.Table
    explode : str, optional
        a list column: one row per element (struct elements give one column per field; a list of scalars
        one column named after the list). Null lists give no rows.
    melt : list of str, optional
        text columns stacked into one ``value`` column (``list<string>`` elements joined with newlines),
        with ``column`` naming the source column; nulls dropped.

    Returns
    -------
    pandas.DataFrame
        without ``explode``: binary columns dropped, ``list<string>`` columns joined with ``"\\n"``, other
        list columns dropped; dates and timestamps as ``datetime64``.
    """
    if melt is not None:
        base = to_frame(table.select(melt))
        import pandas as pd

        stacked = [pd.DataFrame({"column": c, "value": base[c].dropna().astype(str)}) for c in melt]
        return pd.concat(stacked, ignore_index=True) if stacked else pd.DataFrame({"column": [], "value": []})
    if explode is not None:
        col = table.column(explode).combine_chunks()
        values = pc.list_flatten(col)
        if pa.types.is_struct(values.type):
            cols = {f.name: values.field(i) for i, f in enumerate(values.type)}
        else:
            cols = {explode: values}
        return pa.table(cols).to_pandas(date_as_object=False)
    keep = {}
    for f in table.schema:
        if pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type):
            continue
        if pa.types.is_list(f.type) or pa.types.is_large_list(f.type):
            if _is_stringish(f.type):
                joined = [
                    None if v is None else "\n".join(x for x in v if x is not None)
                    for v in table.column(f.name).to_pylist()
                ]
                keep[f.name] = pa.array(joined, type=pa.string())
            continue
        keep[f.name] = table.column(f.name)
    return pa.table(keep).to_pandas(date_as_object=False) if keep else pa.table({}).to_pandas()


# ------------------------------------------------------------------------------------------ running


def _context(project_dir: Path | None):
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    if project_dir is None:
        ctx = gx.get_context(mode="ephemeral")
    else:
        ctx = gx.get_context(mode="file", project_root_dir=str(project_dir))
        # GE re-reads this (comment-only) YAML on every config lookup: without it, lookups are free
        Path(project_dir, "gx", "uncommitted", "config_variables.yml").unlink(missing_ok=True)
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
    # GX's own Data Docs load Bootstrap, jQuery, Vega and a logo from CDNs: no GX site is configured (one left by an
    # earlier version is removed); the site is the project's own pages (quality/data_docs.py)
    for name in list(ctx.variables.data_docs_sites or {}):
        ctx.delete_data_docs_site(name)
    return ctx


def prune_validation_results(
    project_dir: Path, data_docs_dir: Path | None, keep_runs: int, current_run: str | None = None
) -> list[str]:
    """Delete the validation results (and their Data Docs pages) of all but the newest ``keep_runs`` runs.

    Results live in ``<project_dir>/gx/uncommitted/validations/<suite>/<run_name>/<run_time>/``; a run's age
    is its newest ``run_time`` over all suites. Results of ``current_run`` (a retry of the same run) are
    always deleted, so they are replaced rather than doubled, and do not count against ``keep_runs``.

    Parameters
    ----------
    project_dir : pathlib.Path
        the folder holding the GE project folder ``gx/``.
    data_docs_dir : pathlib.Path or None
        the Data Docs site (its ``validations/<suite>/<run_name>/`` pages are deleted too).
    keep_runs : int
        number of earlier runs to keep (>= 0).
    current_run : str, optional
        the run about to be validated.

    Returns
    -------
    list of str
        the run names deleted, oldest first.

    Raises
    ------
    ValueError
        for a negative ``keep_runs``.
    """
    if keep_runs < 0:
        raise ValueError(f"keep_runs must be >= 0, got {keep_runs}")
    root = Path(project_dir, "gx", *_VALIDATIONS_DIR)
    newest: dict[str, str] = {}
    if root.is_dir():
        for suite in root.iterdir():
            if not suite.is_dir():
                continue
            for run in suite.iterdir():
                if run.is_dir():
                    times = [t.name for t in run.iterdir() if t.is_dir()] or [""]
                    newest[run.name] = max(newest.get(run.name, ""), *times)
    order = sorted((r for r in newest if r != current_run), key=lambda r: (newest[r], r))
    doomed = order[: max(len(order) - keep_runs, 0)] + ([current_run] if current_run in newest else [])
    for run in doomed:
        for base in (root, Path(data_docs_dir, "validations") if data_docs_dir else None):
            if base is None or not base.is_dir():
                continue
            for suite in base.iterdir():
                target = suite / run
                if target.is_dir():
                    shutil.rmtree(target)
    return doomed


def _observed(result: dict, etype: str) -> dict:
    obs: dict[str, Any] = {"expectation": etype}
    for k in _OBSERVED_KEYS:
        if isinstance(result.get(k), int):
            obs[k] = result[k]
    if isinstance(result.get("unexpected_percent"), (int, float)):
        obs["unexpected_percent"] = round(float(result["unexpected_percent"]), 4)
    ov = result.get("observed_value")
    if isinstance(ov, (int, float)) and not isinstance(ov, bool):
        obs["observed_value"] = ov
    return obs


def count_phrase(obs: dict, etype: str) -> str:
    """How many values failed, over the one denominator GX's ``unexpected_percent`` uses: the non-null values
    (``element_count - missing_count``), or every value for ``expect_column_values_to_not_be_null``; the nulls
    left out are said. ``"1 of 11 non-null values (9.09%; 79 null of 90 not checked)"``."""
    n, bad = int(obs.get("element_count", 0)), int(obs.get("unexpected_count", 0))
    missing = int(obs.get("missing_count", 0))
    if etype == "expect_column_values_to_not_be_null" or not missing:
        return f"{bad} of {n} values ({100 * bad / n if n else 0:.2f}%)"
    checked = n - missing
    return (
        f"{bad} of {checked} non-null values ({100 * bad / checked if checked else 0:.2f}%; "
        f"{missing} null of {n} not checked)"
    )


def _to_check_result(spec: SuiteSpec, entry: dict, r) -> CheckResult:
    result = r.result or {}
    etype = entry["type"]
    obs = _observed(result, etype)
    exc = getattr(r, "exception_info", None) or {}
    raised = bool(exc.get("raised_exception")) if isinstance(exc, dict) else False
    if raised:
        obs["exception"] = str(exc.get("exception_message", ""))[:200]
        message = f"{spec.table}.{entry['column']}: {etype} could not be evaluated ({obs['exception']})"
    elif "unexpected_count" in obs:
        message = f"{count_phrase(obs, etype)} of {spec.table}.{entry['column']} fail {etype}"
    else:
        message = f"{spec.table}.{entry['column']}: {etype} {'passed' if r.success else 'failed'}"
    return CheckResult(spec.table, entry["check"], entry["severity"], bool(r.success) and not raised, obs, message)


#: column-map expectation types whose per-partition results add up (counts of failing rows summed): run
#: partition by partition; every other type (uniqueness across the table) runs once on its own columns
PARTITION_TYPES = ROW_LEVEL_TYPES | frozenset(
    {
        "expect_column_values_to_not_match_regex_list",
        "expect_column_values_to_not_match_regex",
        "expect_column_pair_values_a_to_be_greater_than_b",
    }
)
_SUMMED_KEYS = ("element_count", "unexpected_count", "missing_count")


def suite_columns(spec: SuiteSpec, entries: list[dict] | None = None) -> list[str]:
    """The base-table columns a suite (or some of its entries) reads: a view's list column, a PHI view's text
    columns, else the entries' columns (schema order not kept: first use first)."""
    if spec.melt is not None:
        return list(spec.melt)
    if spec.explode is not None:
        return [spec.explode]
    cols: list[str] = []
    for e in spec.expectations if entries is None else entries:
        cols += [c for c in e["columns"] if c not in cols]
    return cols


def _pct(num: int, den: int) -> float | None:
    return 100.0 * num / den if den else None


def merge_partition_results(entry: dict, parts: list) -> Any:
    """One column-map expectation's result over all partitions, from its per-partition results.

    Counts (``element_count``, ``unexpected_count``, ``missing_count``) are summed and the percentages recomputed
    from the sums as GE computes them (``unexpected_percent`` over the non-missing values where GE counts missing
    ones, over all values for ``expect_column_values_to_not_be_null``); success is GE's rule (no value fails, or
    at least ``mostly`` of the non-missing values pass). A partition whose evaluation raised gives its result as
    the merged one (the exception is reported, never hidden by the others).

    Parameters
    ----------
    entry : dict
        the suite entry (``type``, ``kwargs``).
    parts : list of great_expectations ExpectationValidationResult
        one per partition, in partition order (at least one).

    Returns
    -------
    great_expectations ExpectationValidationResult
    """
    from great_expectations.core.expectation_validation_result import ExpectationValidationResult

    for r in parts:
        exc = getattr(r, "exception_info", None) or {}
        if isinstance(exc, dict) and exc.get("raised_exception"):
            return r
    first = parts[0]
    res = dict(first.result or {})
    for k in _SUMMED_KEYS:
        if k in res:
            res[k] = int(sum(int((r.result or {}).get(k) or 0) for r in parts))
    n, bad, missing = res.get("element_count", 0), res.get("unexpected_count", 0), res.get("missing_count")
    if missing is not None:
        res["missing_percent"] = _pct(missing, n)
        res["unexpected_percent_total"] = _pct(bad, n)
        res["unexpected_percent_nonmissing"] = _pct(bad, n - missing)
        res["unexpected_percent"] = res["unexpected_percent_nonmissing"]
        den = n - missing
    else:
        res["unexpected_percent"] = _pct(bad, n)
        den = n
    mostly = float(entry["kwargs"].get("mostly", 1.0))
    success = bad == 0 if mostly >= 1.0 else (den == 0 or (den - bad) / den >= mostly)
    return ExpectationValidationResult(
        success=success,
        expectation_config=first.expectation_config,
        result=res,
        meta=first.meta,
        exception_info=first.exception_info,
    )


def _validate_partitioned(gx, ctx, spec: SuiteSpec, suite, batch_def, table: PartitionedTable, params: dict):
    """Validate ``suite`` partition by partition (column-map entries, :data:`PARTITION_TYPES`, on the columns they
    read) and once on the whole table's columns for the other entries (uniqueness: the key columns only); one
    ExpectationSuiteValidationResult with the merged results in suite order (not stored)."""
    from great_expectations.core.expectation_validation_result import ExpectationSuiteValidationResult
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

    def sub_suite(entries: list[dict]):
        sub = gx.ExpectationSuite(name=spec.name, meta=suite.meta)
        for e in entries:
            sub.add_expectation_configuration(
                ExpectationConfiguration(
                    type=e["type"],
                    kwargs=e["kwargs"],
                    severity=e["severity"],
                    meta={"severity": e["severity"], "check": e["check"], "table": spec.table},
                )
            )
        return sub

    def run(frame, sub):
        batch = batch_def.get_batch(batch_parameters={"dataframe": frame})
        return batch.validate(sub, result_format=RESULT_FORMAT, expectation_parameters=params)

    per_part = [e for e in spec.expectations if e["type"] in PARTITION_TYPES]
    whole = [e for e in spec.expectations if e["type"] not in PARTITION_TYPES]
    by_check: dict[str, Any] = {}
    template = None
    if per_part:
        sub, collected = sub_suite(per_part), {e["check"]: [] for e in per_part}
        for part in table.partitions(suite_columns(spec, per_part)):
            vr = run(to_frame(part, spec.explode, spec.melt), sub)
            template = template or vr
            for r in vr.results:
                collected[r.expectation_config.meta.get("check")].append(r)
        for e in per_part:
            by_check[e["check"]] = merge_partition_results(e, collected[e["check"]])
    if whole:
        vr = run(to_frame(table.select(suite_columns(spec, whole)), spec.explode, spec.melt), sub_suite(whole))
        template = template or vr
        by_check.update({r.expectation_config.meta.get("check"): r for r in vr.results})
    results = [by_check[e["check"]] for e in spec.expectations]
    ok = sum(bool(r.success) for r in results)
    stats = {
        "evaluated_expectations": len(results),
        "successful_expectations": ok,
        "unsuccessful_expectations": len(results) - ok,
        "success_percent": 100.0 * ok / len(results) if results else None,
    }
    meta = dict(template.meta) if template is not None else {}
    meta["partitions"] = table.n_partitions
    return ExpectationSuiteValidationResult(
        success=ok == len(results),
        results=results,
        suite_name=spec.name,
        suite_parameters=getattr(template, "suite_parameters", None),
        statistics=stats,
        meta=meta,
        batch_id=getattr(template, "batch_id", None),
    )


def suite_parameters(config: dict, ontology: Any, today: dt.date | None = None) -> dict[str, Any]:
    """The GE run-time parameters (``$PARAMETER``) of the suites.

    ``earliest_plausible_date`` is ``dates.earliest`` moved back by the largest date shift de-identification
    applies (:data:`etl.keys.MAX_DATE_SHIFT_DAYS`, 365 days): the bound judges *shifted* dates, so a source date on
    ``dates.earliest`` (TCIA's already-shifted 1900 dates) passes whatever the key. ``latest_plausible_date`` is the
    end of ``today + dates.max_days_after_today`` (a shift of +365 days of today's date stays inside it with the
    default 365).

    Returns
    -------
    dict
        ``ontology_concept_ids`` (sorted list of str), ``earliest_plausible_date``, ``latest_plausible_date``
        (naive ``datetime.datetime``).
    """
    from etl.keys import MAX_DATE_SHIFT_DAYS

    today = today or dt.date.today()
    earliest = dt.datetime.fromisoformat(str(config["dates"]["earliest"])) - dt.timedelta(days=MAX_DATE_SHIFT_DAYS)
    latest = dt.datetime.combine(today + dt.timedelta(days=int(config["dates"]["max_days_after_today"])), dt.time.max)
    return {
        "ontology_concept_ids": sorted(ontology.concepts),
        "earliest_plausible_date": earliest,
        "latest_plausible_date": latest,
    }


def run_suites(
    tables: dict[str, pa.Table],
    ontology: Any,
    *,
    today: dt.date | None = None,
    config: dict | None = None,
    project_dir: str | Path | None = None,
    data_docs_dir: str | Path | None = None,
    run_name: str | None = None,
    keep_runs: int | None = None,
    only: Collection[str] | None = None,
) -> list[CheckResult]:
    """Validate every table with its GE suite through its Checkpoint; one CheckResult per expectation.

    Parameters
    ----------
    tables : dict of str to pyarrow.Table
        every table of :data:`schemas.tables.SCHEMAS` (checked by the caller).
    ontology : schemas.ontology.Ontology
        anything with a ``concepts`` mapping keyed by concept id (the ``ontology_concept_ids`` parameter).
    today : datetime.date, optional
        the day the plausible-date window ends from (default: today).
    config : dict, optional
        from :func:`load_suite_config` (default: ``quality/expectations.yaml``).
    project_dir : path, optional
        folder of a GE *file* context (``<project_dir>/gx``, created on first use): suites, validation
        definitions, checkpoints and validation results persist there. Default: an ephemeral context.
    data_docs_dir : path, optional
        with ``project_dir``: the static Data Docs site, rewritten after the Checkpoints from every stored
        validation result (:func:`quality.data_docs.write_data_docs`: the project's own pages, no CDN).
    run_name : str, optional
        GE run name (the build's run id).
    keep_runs : int, optional
        with ``project_dir``: validation results kept, in runs, this one included (default: the YAML's
        ``data_docs.keep_runs``, else :data:`DEFAULT_KEEP_RUNS`); older results and pages are deleted.
    only : collection of str, optional
        validate only the suites of these tables (their views included); default: every table.

    Returns
    -------
    list of CheckResult
        suites in :func:`build_suite_specs` order, expectations in suite order.
    """
    import great_expectations as gx
    from great_expectations.core.run_identifier import RunIdentifier
    from great_expectations.data_context.types.resource_identifiers import (
        ExpectationSuiteIdentifier,
        ValidationResultIdentifier,
    )
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

    config = config or load_suite_config()
    specs = [s for s in build_suite_specs(config) if only is None or s.table in only]
    params = suite_parameters(config, ontology, today)
    project = Path(project_dir) if project_dir is not None else None
    docs = Path(data_docs_dir) if (data_docs_dir is not None and project is not None) else None
    if project is not None:
        keep = (
            keep_runs
            if keep_runs is not None
            else int((config.get("data_docs") or {}).get("keep_runs", DEFAULT_KEEP_RUNS))
        )
        if keep < 1:
            raise ValueError(f"keep_runs must be >= 1, got {keep}")
        prune_validation_results(project, docs, keep - 1, current_run=run_name)
    ctx = _context(project)
    try:  # a file context keeps the datasource and its assets: re-adding them rewrites the project YAML each time
        ds = ctx.data_sources.get(DATASOURCE)
    except (KeyError, ValueError, LookupError):
        ds = ctx.data_sources.add_pandas(DATASOURCE)
    existing = {a.name for a in ds.assets}
    run_id = RunIdentifier(run_name=run_name or "adhoc", run_time=dt.datetime.now(dt.UTC))
    out: list[CheckResult] = []
    for spec in specs:
        if spec.name in existing:
            batch_def = ds.get_asset(spec.name).get_batch_definition("whole_table")
        else:
            batch_def = ds.add_dataframe_asset(spec.name).add_batch_definition_whole_dataframe("whole_table")
        suite = gx.ExpectationSuite(name=spec.name, meta={"table": spec.table, "view_of": spec.explode})
        for e in spec.expectations:
            suite.add_expectation_configuration(
                ExpectationConfiguration(
                    type=e["type"],
                    kwargs=e["kwargs"],
                    severity=e["severity"],
                    meta={"severity": e["severity"], "check": e["check"], "table": spec.table},
                )
            )
        suite = ctx.suites.add_or_update(suite)
        vd = ctx.validation_definitions.add_or_update(
            gx.ValidationDefinition(name=spec.name, data=batch_def, suite=suite)
        )
        ctx.checkpoints.add_or_update(
            gx.Checkpoint(
                name=f"medreco_{spec.name}", validation_definitions=[vd], actions=[], result_format=RESULT_FORMAT
            )
        )
        merged = _validate_partitioned(gx, ctx, spec, suite, batch_def, as_partitioned(tables[spec.table]), params)
        merged.meta.update(
            {
                "validation_id": vd.id,
                "checkpoint_id": None,
                "run_id": run_id,
                "validation_time": run_id.run_time,
                "batch_parameters": {"dataframe": "<partitions>"},
            }
        )
        suite_id = ExpectationSuiteIdentifier(name=suite.name)
        ctx.validation_results_store.store_validation_results(
            suite_validation_result=merged,
            expectation_suite_identifier=suite_id,
            suite_validation_result_identifier=ValidationResultIdentifier(
                batch_identifier=merged.batch_id or spec.name, expectation_suite_identifier=suite_id, run_id=run_id
            ),
        )
        by_check = {r.expectation_config.meta.get("check"): r for r in merged.results}
        for e in spec.expectations:
            out.append(_to_check_result(spec, e, by_check[e["check"]]))
    if docs is not None and project is not None:
        from quality.data_docs import write_data_docs

        write_data_docs(project.joinpath("gx", *_VALIDATIONS_DIR), docs)
    return out
