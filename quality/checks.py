"""Quality gates over the curated tables: one :class:`CheckResult` per (table, check).

The checks that are data (allowed codes, numeric ranges, date ranges, foreign keys, ontology references,
PHI patterns) live in ``quality/rules.yaml``; the checks that are logic (key uniqueness, payload hashes,
pair order, VQA answers and balance, split leakage, ledger balance, redaction counts) are below.

Every ``observed`` value is JSON-able and PHI-free: counts, code values of enumerated columns (after a
code-shape filter), never a value from a free-text column. A ``critical`` failure blocks a snapshot; a
``warning`` is shown to the curator.

Tables absent from the ``tables`` argument are checked as empty tables (fail-closed: a series table with
no studies table fails its foreign keys). Empty tables pass every check except where another table
refers to them.
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import importlib
import json
import re
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import yaml

from schemas.base import key_columns
from schemas.ledger import STATUSES
from schemas.tables import SCHEMAS

RULES_FILE = Path(__file__).with_name("rules.yaml")
SEVERITIES = ("critical", "warning")
#: code values shown in ``observed`` must look like codes (no free text, no names with separators)
_CODE_SHAPE = re.compile(r"^[A-Za-z0-9_.\-]{1,24}$")
_MAX_LISTED_CODES = 20

QUALITY_SCHEMA = pa.schema(
    [
        pa.field("table", pa.string(), nullable=False),
        pa.field("check", pa.string(), nullable=False),
        pa.field("severity", pa.string(), nullable=False),
        pa.field("passed", pa.bool_(), nullable=False),
        pa.field("observed", pa.string(), nullable=False),  # JSON
        pa.field("message", pa.string(), nullable=False),
    ]
)


class QualityInputError(ValueError):
    """Bad input to :func:`run_checks`; ``reason`` is a machine-readable code.

    Reason codes: ``unknown_table``, ``schema_mismatch``, ``bad_rules``, ``bad_observed``.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason


@dataclass(frozen=True)
class CheckResult:
    """Outcome of one check on one table.

    Attributes
    ----------
    table : str
        table name (``"images"``); ``"*"`` for checks spanning tables.
    check : str
        check name, e.g. ``"key_unique_non_null"``, ``"range:rows"``, ``"phi_patterns:text"``.
    severity : {"critical", "warning"}
    passed : bool
    observed : dict
        JSON-able, PHI-free counts (never values from text columns).
    message : str
        one line for the curator.

    Raises
    ------
    QualityInputError
        ``bad_observed`` if ``severity`` is unknown or ``observed`` is not JSON-serialisable.
    """

    table: str
    check: str
    severity: str
    passed: bool
    observed: dict
    message: str

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise QualityInputError("bad_observed", f"severity {self.severity!r} not in {SEVERITIES}")
        try:
            json.dumps(self.observed, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise QualityInputError("bad_observed", f"{self.table}/{self.check}: {exc}") from exc


@dataclass
class QualityReport:
    """All check results of one run, in check order."""

    results: list[CheckResult] = field(default_factory=list)
    rules_version: int | None = None

    @property
    def critical_failures(self) -> list[CheckResult]:
        """Failed checks of severity ``critical`` (a snapshot must not be published while non-empty)."""
        return [r for r in self.results if r.severity == "critical" and not r.passed]

    @property
    def warnings(self) -> list[CheckResult]:
        """Failed checks of severity ``warning``."""
        return [r for r in self.results if r.severity == "warning" and not r.passed]

    @property
    def passed(self) -> bool:
        """True when no critical check failed."""
        return not self.critical_failures

    def to_table(self) -> pa.Table:
        """The results as a table of :data:`QUALITY_SCHEMA` (``observed`` as a JSON string)."""
        rows = [{**asdict(r), "observed": json.dumps(r.observed, sort_keys=True)} for r in self.results]
        return pa.Table.from_pylist(rows, schema=QUALITY_SCHEMA)

    def to_json(self, indent: int | None = 2) -> str:
        """JSON document ``{"rules_version", "passed", "n_critical_failures", "n_warnings", "results"}``."""
        doc = {
            "rules_version": self.rules_version,
            "passed": self.passed,
            "n_critical_failures": len(self.critical_failures),
            "n_warnings": len(self.warnings),
            "results": [asdict(r) for r in self.results],
        }
        return json.dumps(doc, indent=indent, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> QualityReport:
        """Inverse of :meth:`to_json`."""
        doc = json.loads(text)
        return cls(results=[CheckResult(**r) for r in doc["results"]], rules_version=doc.get("rules_version"))


# ----------------------------------------------------------------------------------------------- rules


def load_rules(path: str | Path | None = None) -> dict:
    """Load and validate the rules YAML (default ``quality/rules.yaml``).

    Resolves ``values_from: "module:ATTRIBUTE"`` entries of ``allowed_values`` into ``values``.

    Raises
    ------
    QualityInputError
        ``bad_rules`` when a section is missing, a severity is unknown or ``values_from`` cannot be resolved.
    """
    return validate_rules(yaml.safe_load(Path(path or RULES_FILE).read_text(encoding="utf-8")))


def validate_rules(rules: dict) -> dict:
    """Validate a rules mapping (the parsed YAML) and return a resolved deep copy.

    Raises
    ------
    QualityInputError
        ``bad_rules``, as for :func:`load_rules`.
    """
    if not isinstance(rules, dict):
        raise QualityInputError("bad_rules", "rules must be a mapping")
    rules = copy.deepcopy(rules)
    required = ("allowed_values", "ranges", "date_ranges", "foreign_keys", "entity_refs", "payload_sha256",
                "pairs", "vqa_balance", "phi")
    missing = [k for k in required if k not in (rules or {})]
    if missing:
        raise QualityInputError("bad_rules", f"rules file lacks sections {missing}")
    for section in ("allowed_values", "ranges", "foreign_keys", "entity_refs"):
        for rule in rules[section]:
            _validate_rule(section, rule)
    for rule in rules["date_ranges"]["columns"]:
        _validate_rule("date_ranges", rule)
    for rule in rules["allowed_values"]:
        if "values_from" in rule:
            module, _, attr = rule["values_from"].partition(":")
            try:
                rule["values"] = list(getattr(importlib.import_module(module), attr))
            except (ImportError, AttributeError) as exc:
                raise QualityInputError("bad_rules", f"cannot resolve {rule['values_from']}: {exc}") from exc
        if not rule.get("values"):
            raise QualityInputError("bad_rules", f"allowed_values rule {rule} has no values")
    for p in rules["phi"]["patterns"]:
        if not {"name", "regex"} <= set(p):
            raise QualityInputError("bad_rules", f"phi pattern {p} needs name and regex")
        try:
            pc.match_substring_regex(pa.array([""]), "(?i)" + p["regex"])
        except pa.ArrowInvalid as exc:
            raise QualityInputError("bad_rules", f"phi pattern {p['name']} is not valid RE2: {exc}") from exc
    return rules


def _validate_rule(section: str, rule: dict) -> None:
    if rule.get("table") not in SCHEMAS:
        raise QualityInputError("bad_rules", f"{section}: unknown table in {rule}")
    base = rule.get("column", "").split("[")[0]
    if base not in SCHEMAS[rule["table"]].names:
        raise QualityInputError("bad_rules", f"{section}: unknown column in {rule}")
    if rule.get("severity") not in SEVERITIES:
        raise QualityInputError("bad_rules", f"{section}: severity must be one of {SEVERITIES} in {rule}")


# ------------------------------------------------------------------------------------------- helpers


def _prepare_tables(tables: Mapping[str, pa.Table]) -> dict[str, pa.Table]:
    unknown = sorted(set(tables) - set(SCHEMAS))
    if unknown:
        raise QualityInputError("unknown_table", f"tables {unknown} are not in schemas.tables.SCHEMAS")
    out = {}
    for name, schema in SCHEMAS.items():
        t = tables.get(name)
        if t is None:
            out[name] = schema.empty_table()
            continue
        problems = []
        for f in schema:
            if f.name not in t.schema.names:
                problems.append(f"missing column {f.name}")
            elif not t.schema.field(f.name).type.equals(f.type):
                problems.append(f"column {f.name} is {t.schema.field(f.name).type}, expected {f.type}")
        if problems:
            raise QualityInputError("schema_mismatch", f"table {name}: " + "; ".join(problems))
        out[name] = t
    return out


def _flatten(table: pa.Table, spec: str) -> tuple[pa.Array, np.ndarray]:
    """Values of a column spec (``col``, ``col[]``, ``col[].field``) and the row index of each value."""
    base, is_list, rest = spec.partition("[]")
    col = table.column(base).combine_chunks()
    if not is_list:
        return col, np.arange(len(col))
    values = pc.list_flatten(col)
    parents = pc.list_parent_indices(col).to_numpy(zero_copy_only=False)
    if rest.startswith("."):
        values = pc.struct_field(values, rest[1:])
    return values, parents


def _n_rows_failing(parents: np.ndarray, bad: pa.Array) -> int:
    mask = np.asarray(bad.to_numpy(zero_copy_only=False), dtype=bool)
    return int(len(np.unique(parents[mask])))


def _codes(values: pa.Array) -> list[str]:
    """Distinct code-shaped values (for ``observed``), sorted; free text is never listed."""
    seen = sorted({v for v in pc.unique(values).to_pylist() if isinstance(v, str) and _CODE_SHAPE.match(v)})
    return seen[:_MAX_LISTED_CODES]


def _result(table, check, severity, passed, observed, message) -> CheckResult:
    return CheckResult(table, check, severity, bool(passed), observed, message)


# ------------------------------------------------------------------------------------- check kinds


def check_keys(name: str, table: pa.Table) -> CheckResult:
    """Key columns (``medreco.key`` schema metadata) are non-null and unique (critical).

    ``observed``: ``rows``, ``null_keys`` (rows with a null in any key column), ``duplicate_keys`` (rows
    beyond the first of each non-null key).
    """
    keys = key_columns(SCHEMAS[name])
    n = table.num_rows
    valid = pa.array(np.ones(n, dtype=bool))
    for k in keys:
        valid = pc.and_(valid, pc.is_valid(table.column(k)))
    non_null = table.select(keys).filter(valid)
    nulls = n - non_null.num_rows
    distinct = non_null.group_by(keys).aggregate([]).num_rows if non_null.num_rows else 0
    dups = non_null.num_rows - distinct
    obs = {"rows": n, "null_keys": nulls, "duplicate_keys": dups}
    return _result(name, "key_unique_non_null", "critical", nulls == 0 and dups == 0, obs,
                   f"key {keys}: {nulls} null, {dups} duplicate of {n} rows")


def check_allowed_values(rule: dict, tables: dict[str, pa.Table]) -> CheckResult:
    """Values of ``rule['column']`` are in ``rule['values']`` (nulls allowed only with ``allow_null``)."""
    table = tables[rule["table"]]
    values, parents = _flatten(table, rule["column"])
    allowed = pa.array(rule["values"], type=pa.string())
    in_set = pc.fill_null(pc.is_in(values, value_set=allowed, skip_nulls=True), False)
    nulls = pc.is_null(values)
    ok = pc.or_(in_set, nulls) if rule.get("allow_null") else in_set
    bad = pc.invert(ok)
    n_bad = _n_rows_failing(parents, bad)
    obs = {"rows": table.num_rows, "values_checked": len(values), "rows_failing": n_bad,
           "null_values": pc.sum(nulls).as_py() or 0}
    if rule.get("report_values") and n_bad:
        obs["unexpected_codes"] = _codes(pc.filter(values, pc.fill_null(bad, False)))
    return _result(rule["table"], rule.get("check", f"allowed_values:{rule['column']}"), rule["severity"],
                   n_bad == 0, obs, f"{n_bad} of {table.num_rows} rows have {rule['column']} outside the "
                   f"{len(rule['values'])} allowed codes")


def check_range(rule: dict, tables: dict[str, pa.Table]) -> CheckResult:
    """Numeric values within ``[min, max]`` (``min_inclusive``/``max_inclusive`` default true).

    List columns (``spacing_mm[]``) fail a row when any element is out of range or null.
    """
    table = tables[rule["table"]]
    values, parents = _flatten(table, rule["column"])
    is_list = "[]" in rule["column"]
    base = table.column(rule["column"].split("[")[0])
    ok = pa.array(np.ones(len(values), dtype=bool))
    if "min" in rule:
        cmp = pc.greater_equal if rule.get("min_inclusive", True) else pc.greater
        ok = pc.and_(ok, cmp(values, rule["min"]))
    if "max" in rule:
        cmp = pc.less_equal if rule.get("max_inclusive", True) else pc.less
        ok = pc.and_(ok, cmp(values, rule["max"]))
    bad = pc.invert(pc.fill_null(ok, False))  # null values fail, except null scalars with allow_null
    if rule.get("allow_null") and not is_list:
        bad = pc.and_(bad, pc.is_valid(values))
    n_bad = _n_rows_failing(parents, bad)
    null_rows = pc.sum(pc.is_null(base)).as_py() or 0
    if is_list and not rule.get("allow_null"):
        n_bad += null_rows  # a null list has no elements to fail above
    lo = "(" if not rule.get("min_inclusive", True) else "["
    hi = ")" if not rule.get("max_inclusive", True) else "]"
    interval = f"{lo}{rule.get('min', '-inf')}, {rule.get('max', 'inf')}{hi} {rule.get('unit', '')}".strip()
    obs = {"rows": table.num_rows, "values_checked": len(values), "rows_failing": n_bad, "null_rows": null_rows,
           "interval": interval}
    if len(values) and pc.count(values).as_py():
        mm = pc.min_max(values)
        obs["min"], obs["max"] = float(mm["min"].as_py()), float(mm["max"].as_py())
    return _result(rule["table"], rule.get("check", f"range:{rule['column']}"), rule["severity"], n_bad == 0,
                   obs, f"{n_bad} of {table.num_rows} rows have {rule['column']} outside {interval}")


def check_date_range(rule: dict, tables: dict[str, pa.Table], lo: dt.date, hi: dt.date) -> CheckResult:
    """Shifted dates/timestamps lie in ``[lo, hi]`` (nulls pass and are counted)."""
    table = tables[rule["table"]]
    col = table.column(rule["column"])
    if pa.types.is_timestamp(col.type):
        lo_s = pa.scalar(dt.datetime.combine(lo, dt.time()), type=col.type)
        hi_s = pa.scalar(dt.datetime.combine(hi, dt.time.max), type=col.type)
    elif pa.types.is_date(col.type):
        lo_s, hi_s = pa.scalar(lo, type=col.type), pa.scalar(hi, type=col.type)
    else:
        raise QualityInputError("bad_rules", f"{rule['table']}.{rule['column']} is not a date/timestamp")
    bad = pc.or_(pc.less(col, lo_s), pc.greater(col, hi_s))
    n_bad = pc.sum(pc.fill_null(bad, False)).as_py() or 0
    nulls = pc.sum(pc.is_null(col)).as_py() or 0
    obs = {"rows": table.num_rows, "rows_failing": n_bad, "null_rows": nulls,
           "lower": lo.isoformat(), "upper": hi.isoformat()}
    return _result(rule["table"], rule.get("check", f"date_range:{rule['column']}"), rule["severity"], n_bad == 0,
                   obs, f"{n_bad} of {table.num_rows} rows have {rule['column']} outside {lo} .. {hi}")


def check_foreign_key(rule: dict, tables: dict[str, pa.Table]) -> CheckResult:
    """Non-null ``table.column`` values exist in ``ref_table.ref_column``."""
    table = tables[rule["table"]]
    col = table.column(rule["column"])
    ref = tables[rule["ref_table"]].column(rule["ref_column"]).combine_chunks()
    present = pc.is_in(col, value_set=ref, skip_nulls=True)
    valid = pc.is_valid(col)
    orphans = pc.sum(pc.and_(valid, pc.invert(pc.fill_null(present, False)))).as_py() or 0
    nulls = table.num_rows - (pc.sum(valid).as_py() or 0)
    target = f"{rule['ref_table']}.{rule['ref_column']}"
    obs = {"rows": table.num_rows, "orphans": orphans, "null_skipped": nulls, "references": target}
    return _result(rule["table"], rule.get("check", f"foreign_key:{rule['column']}"), rule["severity"],
                   orphans == 0, obs, f"{orphans} of {table.num_rows} rows have {rule['column']} not in {target}")


def check_entity_refs(rule: dict, tables: dict[str, pa.Table], concept_ids: pa.Array) -> CheckResult:
    """Entity ids (scalar, list or list-of-struct field) are ontology concept ids."""
    table = tables[rule["table"]]
    values, parents = _flatten(table, rule["column"])
    known = pc.fill_null(pc.is_in(values, value_set=concept_ids, skip_nulls=True), False)
    ok = pc.or_(known, pc.is_null(values)) if rule.get("allow_null") else known
    bad = pc.invert(ok)
    n_bad = _n_rows_failing(parents, bad)
    bad_values = pc.filter(values, bad)
    obs = {"rows": table.num_rows, "ids_checked": len(values), "rows_failing": n_bad,
           "unknown_ids": int(len(bad_values)), "unknown_id_values": _codes(bad_values)}
    return _result(rule["table"], rule.get("check", f"entity_ids:{rule['column']}"), rule["severity"], n_bad == 0,
                   obs, f"{n_bad} of {table.num_rows} rows refer to {len(bad_values)} ids not in the ontology")


def check_payload_sha256(images: pa.Table, sample_rows: int) -> CheckResult:
    """``payload_sha256 == sha256(payload)`` on at most ``sample_rows`` evenly spaced rows (critical)."""
    n = images.num_rows
    idx = np.unique(np.linspace(0, n - 1, num=min(n, sample_rows)).astype(np.int64)) if n else np.array([], int)
    sample = images.select(["payload", "payload_sha256"]).take(pa.array(idx, type=pa.int64()))
    mismatches = 0
    for payload, digest in zip(sample.column("payload").to_pylist(), sample.column("payload_sha256").to_pylist(),
                               strict=True):
        if hashlib.sha256(payload or b"").hexdigest() != (digest or "").lower():
            mismatches += 1
    obs = {"rows": n, "rows_sampled": int(len(idx)), "mismatches": mismatches}
    return _result("images", "payload_sha256", "critical", mismatches == 0, obs,
                   f"{mismatches} of {len(idx)} sampled payloads do not hash to payload_sha256")


def check_pairs(pairs: pa.Table, studies: pa.Table, tolerance_days: float) -> list[CheckResult]:
    """Prior study strictly before current (critical) and ``gap_days`` equal to their gap (warning).

    Study datetimes come from ``studies.study_datetime`` (joined on the study keys); a pair whose study
    or datetime is missing cannot be ordered and fails.
    """
    keys = studies.column("study_key").combine_chunks()
    when = studies.column("study_datetime").combine_chunks()
    prior = when.take(pc.index_in(pairs.column("prior_study_key").combine_chunks(), value_set=keys))
    current = when.take(pc.index_in(pairs.column("current_study_key").combine_chunks(), value_set=keys))
    n = pairs.num_rows
    unresolved = pc.sum(pc.or_(pc.is_null(prior), pc.is_null(current))).as_py() or 0
    not_before = pc.sum(pc.fill_null(pc.greater_equal(prior, current), False)).as_py() or 0
    obs = {"rows": n, "prior_not_before_current": not_before, "unresolved_datetimes": unresolved}
    out = [_result("pairs", "pair_order", "critical", not_before == 0 and unresolved == 0, obs,
                   f"{not_before} of {n} pairs have the prior study on/after the current one; "
                   f"{unresolved} cannot be ordered (study or datetime missing)")]
    us = np.array(pc.cast(current, pa.int64()).to_numpy(zero_copy_only=False), dtype=float) - np.array(
        pc.cast(prior, pa.int64()).to_numpy(zero_copy_only=False), dtype=float)
    gap = np.asarray(pairs.column("gap_days").to_numpy(), dtype=float)
    days = us / 86_400e6
    known = ~np.isnan(days)
    inconsistent = int(np.sum(np.abs(gap[known] - days[known]) > tolerance_days))
    obs = {"rows": n, "checked": int(known.sum()), "inconsistent": inconsistent, "tolerance_days": tolerance_days}
    out.append(_result("pairs", "gap_days_consistent", "warning", inconsistent == 0, obs,
                       f"{inconsistent} pairs have gap_days differing from the study datetimes by more than "
                       f"{tolerance_days} day(s)"))
    return out


def _letter_index(letter: str | None) -> int | None:
    if not isinstance(letter, str) or len(letter) != 1 or not "A" <= letter <= "Z":
        return None
    return ord(letter) - ord("A")


def check_vqa(vqa: pa.Table, min_items: int, max_deviation_points: float) -> list[CheckResult]:
    """Answer letter indexes an option equal to ``answer_text`` (critical); letter balance (warning).

    Balance: the expected share of letter L is the mean over items of ``1/len(options)`` for items that
    have an option L; the check fails when any letter's observed share (percent) deviates from it by more
    than ``max_deviation_points``. It is only evaluated with at least ``min_items`` items.
    """
    options = vqa.column("options").to_pylist()
    answers = vqa.column("answer").to_pylist()
    texts = vqa.column("answer_text").to_pylist()
    bad_letter = mismatch = 0
    counts: Counter[str] = Counter()
    expected: defaultdict[str, float] = defaultdict(float)
    for opts, letter, text in zip(options, answers, texts, strict=True):
        opts = opts or []
        for j in range(min(len(opts), 26)):
            expected[chr(ord("A") + j)] += 1.0 / len(opts)
        i = _letter_index(letter)
        if i is None or i >= len(opts):
            bad_letter += 1
            continue
        counts[letter] += 1
        if opts[i] != text:
            mismatch += 1
    n = vqa.num_rows
    out = [_result("vqa", "vqa_answer_in_options", "critical", bad_letter == 0 and mismatch == 0,
                   {"rows": n, "letter_not_an_option": bad_letter, "option_text_mismatch": mismatch},
                   f"{bad_letter} answers do not index an option, {mismatch} option texts differ from answer_text")]
    letters = sorted(expected)
    shares = {k: round(100.0 * counts[k] / n, 2) for k in letters} if n else {}
    uniform = {k: round(100.0 * expected[k] / n, 2) for k in letters} if n else {}
    dev = max((abs(shares[k] - uniform[k]) for k in letters), default=0.0)
    evaluated = n >= min_items
    obs = {"items": n, "evaluated": evaluated, "share_percent": shares, "expected_percent": uniform,
           "max_deviation_points": round(dev, 2), "threshold_points": max_deviation_points}
    msg = (f"largest answer-letter deviation from uniform is {dev:.1f} points (limit {max_deviation_points})"
           if evaluated else f"only {n} items (< {min_items}): balance not evaluated")
    out.append(_result("vqa", "vqa_answer_balance", "warning", (not evaluated) or dev <= max_deviation_points,
                       obs, msg))
    return out


def check_splits(tables: dict[str, pa.Table]) -> list[CheckResult]:
    """No patient in two splits (splits table and vqa.split together); every study patient has a split."""
    assigned: defaultdict[str, set[str]] = defaultdict(set)
    for name in ("splits", "vqa"):
        t = tables[name]
        for p, s in zip(t.column("patient_key").to_pylist(), t.column("split").to_pylist(), strict=True):
            if p is not None:
                assigned[p].add(s)
    multi = sum(1 for v in assigned.values() if len(v) > 1)
    out = [_result("splits", "patient_single_split", "critical", multi == 0,
                   {"patients": len(assigned), "patients_in_multiple_splits": multi},
                   f"{multi} patients appear in more than one split (splits table and vqa items)")]
    study_patients = pc.unique(tables["studies"].column("patient_key")).drop_null()
    split_patients = tables["splits"].column("patient_key").combine_chunks()
    missing = pc.sum(pc.invert(pc.is_in(study_patients, value_set=split_patients))).as_py() or 0
    out.append(_result("splits", "study_patients_have_split", "critical", missing == 0,
                       {"study_patients": len(study_patients), "patients_without_split": missing},
                       f"{missing} of {len(study_patients)} study patients have no split"))
    return out


def check_ledger(ledger: pa.Table, expected_files: Mapping[str, int] | None) -> list[CheckResult]:
    """Ledger balance per run (critical), quarantine reasons (critical), duplicate back-references (warning).

    A run balances when its row count equals the sum of its per-status counts over the valid statuses
    (``schemas.ledger.STATUSES``) and, when ``expected_files[run_id]`` is given (files discovered by the
    scan), equals that number too: nothing discovered is silently lost.
    """
    runs: dict[str, dict[str, int]] = {}
    for run, status in zip(ledger.column("run_id").to_pylist(), ledger.column("status").to_pylist(), strict=True):
        r = runs.setdefault(run, {"rows": 0, **{s: 0 for s in STATUSES}})
        r["rows"] += 1
        if status in STATUSES:
            r[status] += 1
    for run, n in (expected_files or {}).items():
        runs.setdefault(run, {"rows": 0, **{s: 0 for s in STATUSES}})["expected_files"] = int(n)
    unbalanced = []
    for run, r in sorted(runs.items()):
        r["status_sum"] = sum(r[s] for s in STATUSES)
        if r["status_sum"] != r["rows"] or r.get("expected_files", r["rows"]) != r["rows"]:
            unbalanced.append(run)
    out = [_result("ledger", "ledger_balance", "critical", not unbalanced,
                   {"runs": runs, "unbalanced_runs": unbalanced},
                   f"{len(unbalanced)} of {len(runs)} runs do not balance (rows vs per-status counts"
                   f"{' vs discovered files' if expected_files else ''})")]
    status = ledger.column("status")
    reason = ledger.column("reason")
    quarantined = pc.fill_null(pc.equal(status, "quarantined"), False)
    no_reason = pc.or_(pc.is_null(reason), pc.equal(pc.utf8_trim_whitespace(pc.fill_null(reason, "")), ""))
    n_q = pc.sum(quarantined).as_py() or 0
    n_bad = pc.sum(pc.and_(quarantined, no_reason)).as_py() or 0
    out.append(_result("ledger", "ledger_quarantine_reason", "critical", n_bad == 0,
                       {"quarantined": n_q, "without_reason": n_bad},
                       f"{n_bad} of {n_q} quarantined rows have no reason code"))
    dup = pc.fill_null(pc.equal(status, "duplicate"), False)
    n_d = pc.sum(dup).as_py() or 0
    n_orphan = pc.sum(pc.and_(dup, pc.is_null(ledger.column("duplicate_of")))).as_py() or 0
    out.append(_result("ledger", "ledger_duplicate_of", "warning", n_orphan == 0,
                       {"duplicates": n_d, "without_duplicate_of": n_orphan},
                       f"{n_orphan} of {n_d} duplicate rows do not name the first copy"))
    return out


def check_redaction_counts(reports: pa.Table) -> list[CheckResult]:
    """``redaction_counts`` is a JSON object of non-negative integers (critical) summing to ``redactions``
    (warning)."""
    invalid = negative = inconsistent = 0
    for total, raw in zip(reports.column("redactions").to_pylist(), reports.column("redaction_counts").to_pylist(),
                          strict=True):
        try:
            counts = json.loads(raw)
        except (TypeError, ValueError):
            invalid += 1
            continue
        if not isinstance(counts, dict) or not all(isinstance(v, int) and not isinstance(v, bool)
                                                   for v in counts.values()):
            invalid += 1
            continue
        if any(v < 0 for v in counts.values()):
            negative += 1
        elif sum(counts.values()) != total:
            inconsistent += 1
    n = reports.num_rows
    return [
        _result("reports", "redaction_counts_valid", "critical", invalid == 0 and negative == 0,
                {"rows": n, "invalid_json": invalid, "negative_counts": negative},
                f"{invalid} rows have unparseable redaction_counts, {negative} have negative counts"),
        _result("reports", "redaction_counts_sum", "warning", inconsistent == 0,
                {"rows": n, "sum_differs_from_redactions": inconsistent},
                f"{inconsistent} rows have redaction_counts not summing to redactions"),
    ]


def _is_stringish(t: pa.DataType) -> bool:
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return True
    return (pa.types.is_list(t) or pa.types.is_large_list(t)) and _is_stringish(t.value_type)


def check_phi(tables: dict[str, pa.Table], phi_rules: dict) -> list[CheckResult]:
    """PHI patterns (dates, phone numbers, MRNs, e-mails, DICOM person names) in every string column.

    One result per (table, string column) of every table but the ledger; critical for the columns in
    ``phi.critical_columns`` (report text and sections), warning elsewhere. ``observed`` counts flagged
    rows per pattern name; matched text is never reported.
    """
    patterns = [(p["name"], "(?i)" + p["regex"], frozenset(p.get("skip_tables", []))) for p in phi_rules["patterns"]]
    critical = phi_rules.get("critical_columns", {})
    out = []
    for name, table in tables.items():
        if name in phi_rules.get("skip_tables", []):
            continue
        for f in table.schema:
            if not _is_stringish(f.type):  # extra, non-schema columns are scanned too
                continue
            is_list = pa.types.is_list(f.type) or pa.types.is_large_list(f.type)
            values, parents = _flatten(table, f.name + ("[]" if is_list else ""))
            by_pattern = {}
            flagged = np.zeros(table.num_rows, dtype=bool)
            for pname, regex, skip in patterns:
                if name in skip:
                    continue
                hit = np.asarray(pc.fill_null(pc.match_substring_regex(values, regex), False)
                                 .to_numpy(zero_copy_only=False), dtype=bool)
                rows = np.unique(parents[hit])
                by_pattern[pname] = int(len(rows))
                flagged[rows] = True
            n_flag = int(flagged.sum())
            severity = "critical" if f.name in critical.get(name, []) else "warning"
            hits = ", ".join(k for k, v in by_pattern.items() if v) or "none"
            out.append(_result(name, f"phi_patterns:{f.name}", severity, n_flag == 0,
                               {"rows": table.num_rows, "rows_flagged": n_flag, "by_pattern": by_pattern},
                               f"{n_flag} of {table.num_rows} rows of {name}.{f.name} match PHI patterns ({hits})"))
    return out


# ----------------------------------------------------------------------------------------------- main


def run_checks(
    tables: Mapping[str, pa.Table],
    ontology: Any,
    *,
    rules: dict | str | Path | None = None,
    today: dt.date | None = None,
    expected_files: Mapping[str, int] | None = None,
) -> QualityReport:
    """Run every quality gate over the curated tables (and the ledger).

    Parameters
    ----------
    tables : mapping of str to pyarrow.Table
        table name (``schemas.tables.SCHEMAS`` keys) -> table with at least that schema's columns and
        types. Absent tables are checked as empty (fail-closed for references into them).
    ontology : schemas.ontology.Ontology
        anything with a ``concepts`` mapping keyed by concept id (``"F029"``).
    rules : dict or path, optional
        a rules mapping (the parsed YAML, validated by :func:`validate_rules`) or a rules YAML path;
        default ``quality/rules.yaml``.
    today : datetime.date, optional
        reference date for the date plausibility upper bound (default: today, local).
    expected_files : mapping of str to int, optional
        run_id -> number of files the discovery scan found; each run's ledger rows must equal it.

    Returns
    -------
    QualityReport
        one :class:`CheckResult` per check and table, in a fixed order.

    Raises
    ------
    QualityInputError
        ``unknown_table`` for a table name outside the registry, ``schema_mismatch`` for a missing
        column or a column of another type, ``bad_rules`` for an invalid rules file.
    """
    rules = validate_rules(rules) if isinstance(rules, dict) else load_rules(rules)
    t = _prepare_tables(tables)
    today = today or dt.date.today()
    concept_ids = pa.array(sorted(ontology.concepts), type=pa.string())
    results: list[CheckResult] = [check_keys(name, t[name]) for name in SCHEMAS]
    results += [check_allowed_values(r, t) for r in rules["allowed_values"]]
    results += [check_range(r, t) for r in rules["ranges"]]
    dr = rules["date_ranges"]
    lo = dt.date.fromisoformat(str(dr["min_date"]))
    hi = today + dt.timedelta(days=int(dr["max_days_after_today"]))
    results += [check_date_range(r, t, lo, hi) for r in dr["columns"]]
    results += [check_foreign_key(r, t) for r in rules["foreign_keys"]]
    results += [check_entity_refs(r, t, concept_ids) for r in rules["entity_refs"]]
    results.append(check_payload_sha256(t["images"], int(rules["payload_sha256"]["sample_rows"])))
    results += check_pairs(t["pairs"], t["studies"], float(rules["pairs"]["gap_days_tolerance_days"]))
    vb = rules["vqa_balance"]
    results += check_vqa(t["vqa"], int(vb["min_items"]), float(vb["max_deviation_points"]))
    results += check_splits(t)
    results += check_ledger(t["ledger"], expected_files)
    results += check_redaction_counts(t["reports"])
    results += check_phi(t, rules["phi"])
    return QualityReport(results=results, rules_version=rules.get("version"))
