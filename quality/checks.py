"""Quality gates over the curated tables: one :class:`CheckResult` per (table, check).

Great Expectations is the engine wherever it can express a check: the per-table suites (keys unique and
non-null, codes, ranges, plausible dates, ontology ids, the PHI scan of every text column) are data in
``quality/expectations.yaml`` and run by :mod:`quality.gx_suites`. The checks below are the cross-table
and row-logic ones GE cannot express (foreign keys, payload hashes, prior before current in pairs, VQA
answers and letter balance, split leakage across tables, ledger balance, redaction counts, curator
decisions); their parameters are in ``quality/rules.yaml``. Both report in the same :class:`CheckResult`
format.

Every ``observed`` value is JSON-able and PHI-free: counts, never a value from a free-text column. A
``critical`` failure blocks a snapshot; a ``warning`` is shown to the curator.

Tables absent from the ``tables`` argument are checked as empty tables (fail-closed: a series table with
no studies table fails its foreign keys). Empty tables pass every check except where another table
refers to them.
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import json
from collections import Counter, defaultdict
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import yaml

from quality.partitions import PartitionedTable, as_partitioned
from quality.results import QUALITY_SCHEMA, SEVERITIES, CheckResult, QualityInputError  # noqa: F401  (public names of the checks)
from schemas.ledger import STATUSES
from schemas.tables import PAYLOAD_COLUMNS, SCHEMAS

RULES_FILE = Path(__file__).with_name("rules.yaml")


@dataclass
class QualityReport:
    """All check results of one run, in check order."""

    results: list[CheckResult] = field(default_factory=list)
    rules_version: int | None = None
    #: ``"<table>: <check>"`` -> rows flagged by a failed row-level expectation (quality/row_flags.py)
    row_flags: dict[str, int] = field(default_factory=dict)
    #: the flagged rows themselves (``quality.row_flags.FLAGS_SCHEMA``); not part of the JSON document
    flags_table: pa.Table | None = field(default=None, repr=False, compare=False)

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
        """JSON document
        ``{"rules_version", "passed", "n_critical_failures", "n_warnings", "row_flags", "results"}``."""
        doc = {
            "rules_version": self.rules_version,
            "passed": self.passed,
            "n_critical_failures": len(self.critical_failures),
            "n_warnings": len(self.warnings),
            "row_flags": dict(self.row_flags),
            "results": [asdict(r) for r in self.results],
        }
        return json.dumps(doc, indent=indent, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> QualityReport:
        """Inverse of :meth:`to_json`."""
        doc = json.loads(text)
        return cls(
            results=[CheckResult(**r) for r in doc["results"]],
            rules_version=doc.get("rules_version"),
            row_flags=dict(doc.get("row_flags") or {}),
        )


# ----------------------------------------------------------------------------------------------- rules


def load_rules(path: str | Path | None = None) -> dict:
    """Load and validate the rules YAML (default ``quality/rules.yaml``).

    The result also carries ``phi.patterns``: the literal-regex PHI patterns of ``quality/expectations.yaml``
    (``{"name", "regex"}``, e.g. the ``date_*`` ones the reports stage uses to verify that no source date
    survives), so they have one definition.

    Raises
    ------
    QualityInputError
        ``bad_rules`` when a section is missing, a table or column is unknown or a severity is invalid.
    """
    from quality.gx_suites import load_suite_config

    rules = validate_rules(yaml.safe_load(Path(path or RULES_FILE).read_text(encoding="utf-8")))
    patterns = load_suite_config()["phi"]["patterns"]
    rules.setdefault("phi", {"patterns": [{"name": p["name"], "regex": p["regex"]} for p in patterns if "regex" in p]})
    return rules


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
    required = ("foreign_keys", "payload_sha256", "pairs", "vqa_balance")
    missing = [k for k in required if k not in (rules or {})]
    if missing:
        raise QualityInputError("bad_rules", f"rules file lacks sections {missing}")
    for rule in rules["foreign_keys"]:
        _validate_rule("foreign_keys", rule)
        if rule.get("ref_table") not in SCHEMAS or rule.get("ref_column") not in SCHEMAS[rule["ref_table"]].names:
            raise QualityInputError("bad_rules", f"foreign_keys: unknown reference in {rule}")
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


def _prepare_tables(tables: Mapping[str, pa.Table | PartitionedTable]) -> dict[str, pa.Table | PartitionedTable]:
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
        optional = set(PAYLOAD_COLUMNS.get(name, ()))  # payload columns are never needed: global tasks skip them
        for f in schema:
            if f.name not in t.schema.names:
                if f.name not in optional:
                    problems.append(f"missing column {f.name}")
            elif not t.schema.field(f.name).type.equals(f.type):
                problems.append(f"column {f.name} is {t.schema.field(f.name).type}, expected {f.type}")
        if problems:
            raise QualityInputError("schema_mismatch", f"table {name}: " + "; ".join(problems))
        out[name] = t
    return out


def _result(table, check, severity, passed, observed, message) -> CheckResult:
    return CheckResult(table, check, severity, bool(passed), observed, message)


# ------------------------------------------------------------------------------------- check kinds


def check_foreign_key(rule: dict, tables: dict[str, pa.Table]) -> CheckResult:
    """Non-null ``table.column`` values exist in ``ref_table.ref_column``.

    Reads the two key columns only: the referenced one whole, the referring one partition by partition
    (:class:`quality.partitions.PartitionedTable`).
    """
    table = tables[rule["table"]]
    ref = tables[rule["ref_table"]].column(rule["ref_column"]).combine_chunks()
    orphans = nulls = 0
    for part in as_partitioned(table).partitions([rule["column"]]):  # the child key, one partition at a time
        col = part.column(rule["column"])
        present = pc.is_in(col, value_set=ref, skip_nulls=True)
        valid = pc.is_valid(col)
        orphans += pc.sum(pc.and_(valid, pc.invert(pc.fill_null(present, False)))).as_py() or 0
        nulls += part.num_rows - (pc.sum(valid).as_py() or 0)
    target = f"{rule['ref_table']}.{rule['ref_column']}"
    obs = {"rows": table.num_rows, "orphans": orphans, "null_skipped": nulls, "references": target}
    return _result(
        rule["table"],
        rule.get("check", f"foreign_key:{rule['column']}"),
        rule["severity"],
        orphans == 0,
        obs,
        f"{orphans} of {table.num_rows} rows have {rule['column']} not in {target}",
    )


def check_payload_sha256(images: pa.Table, sample_rows: int) -> CheckResult:
    """``payload_sha256 == sha256(payload)`` on at most ``sample_rows`` evenly spaced rows (critical)."""
    n = images.num_rows
    idx = np.unique(np.linspace(0, n - 1, num=min(n, sample_rows)).astype(np.int64)) if n else np.array([], int)
    sample = images.select(["payload", "payload_sha256"]).take(pa.array(idx, type=pa.int64()))
    mismatches = 0
    for payload, digest in zip(
        sample.column("payload").to_pylist(), sample.column("payload_sha256").to_pylist(), strict=True
    ):
        if hashlib.sha256(payload or b"").hexdigest() != (digest or "").lower():
            mismatches += 1
    obs = {"rows": n, "rows_sampled": int(len(idx)), "mismatches": mismatches}
    return _result(
        "images",
        "payload_sha256",
        "critical",
        mismatches == 0,
        obs,
        f"{mismatches} of {len(idx)} sampled payloads do not hash to payload_sha256",
    )


def check_recorded_payload_integrity(images: pa.Table, records: Mapping[int, Mapping | None]) -> CheckResult:
    """Every ``images`` row is covered by its shard's recorded payload check, and no check found a mismatch (critical).

    Reads the ``shard`` column only; the hashes were computed where the payloads were written (the normalise
    task, :func:`etl.pixels.integrity.verify_image_files`) and ``records`` holds their counts.

    Parameters
    ----------
    images : pyarrow.Table
        the ``images`` table's metadata (at least its ``shard`` column).
    records : mapping of int to mapping or None
        shard -> ``{"rows", "verified", "mismatches"}`` as recorded (:func:`etl.pixels.integrity.recorded_integrity`).
    """
    counts = (
        {int(v["values"]): int(v["counts"]) for v in pc.value_counts(images.column("shard")).to_pylist()}
        if images.num_rows
        else {}
    )
    unrecorded = mismatched = uncovered = verified = 0
    for shard, n in sorted(counts.items()):
        rec = records.get(shard)
        if rec is None:
            unrecorded += n
            continue
        verified += int(rec.get("verified", 0))
        mismatched += len(rec.get("mismatches") or [])
        uncovered += max(0, n - int(rec.get("verified", 0)))
    ok = unrecorded == 0 and mismatched == 0 and uncovered == 0
    obs = {
        "rows": images.num_rows,
        "shards": len(counts),
        "verified_at_write": verified,
        "rows_without_record": unrecorded,
        "mismatches": mismatched,
        "rows_not_verified": uncovered,
    }
    return _result(
        "images",
        "payload_sha256",
        "critical",
        ok,
        obs,
        f"{mismatched} payloads did not hash to payload_sha256 where written; {unrecorded} rows in shards "
        f"without a recorded check; {uncovered} rows not covered by their shard's check",
    )


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
    out = [
        _result(
            "pairs",
            "pair_order",
            "critical",
            not_before == 0 and unresolved == 0,
            obs,
            f"{not_before} of {n} pairs have the prior study on/after the current one; "
            f"{unresolved} cannot be ordered (study or datetime missing)",
        )
    ]
    us = np.array(pc.cast(current, pa.int64()).to_numpy(zero_copy_only=False), dtype=float) - np.array(
        pc.cast(prior, pa.int64()).to_numpy(zero_copy_only=False), dtype=float
    )
    gap = np.asarray(pairs.column("gap_days").to_numpy(), dtype=float)
    days = us / 86_400e6
    known = ~np.isnan(days)
    inconsistent = int(np.sum(np.abs(gap[known] - days[known]) > tolerance_days))
    obs = {"rows": n, "checked": int(known.sum()), "inconsistent": inconsistent, "tolerance_days": tolerance_days}
    out.append(
        _result(
            "pairs",
            "gap_days_consistent",
            "warning",
            inconsistent == 0,
            obs,
            f"{inconsistent} pairs have gap_days differing from the study datetimes by more than "
            f"{tolerance_days} day(s)",
        )
    )
    return out


def _letter_index(letter: str | None) -> int | None:
    if not isinstance(letter, str) or len(letter) != 1 or not "A" <= letter <= "Z":
        return None
    return ord(letter) - ord("A")


def check_vqa(vqa: pa.Table, min_items: int, max_deviation_points: float) -> list[CheckResult]:
    """Answer letter indexes an option equal to ``answer_text`` (critical); open-ended items well formed
    (critical); letter balance of the multiple-choice items (warning).

    Multiple choice (``answer_format`` null or ``multiple_choice``): the letter indexes an option whose text
    equals ``answer_text``. Open ended (``answer_format == "open_ended"``): no options, no letter, a non-empty
    ``answer_text``. Balance: the expected share of letter L is the mean over multiple-choice items of
    ``1/len(options)`` for items that have an option L; the check fails when any letter's observed share
    (percent) deviates from it by more than ``max_deviation_points``. It is only evaluated with at least
    ``min_items`` multiple-choice items.
    """
    options = vqa.column("options").to_pylist()
    answers = vqa.column("answer").to_pylist()
    texts = vqa.column("answer_text").to_pylist()
    formats = vqa.column("answer_format").to_pylist() if "answer_format" in vqa.column_names else [None] * vqa.num_rows
    bad_letter = mismatch = open_malformed = n = 0
    counts: Counter[str] = Counter()
    expected: defaultdict[str, float] = defaultdict(float)
    for opts, letter, text, fmt in zip(options, answers, texts, formats, strict=True):
        opts = opts or []
        if fmt == "open_ended":
            open_malformed += bool(opts or letter is not None or not (text or "").strip())
            continue
        n += 1
        for j in range(min(len(opts), 26)):
            expected[chr(ord("A") + j)] += 1.0 / len(opts)
        i = _letter_index(letter)
        if i is None or i >= len(opts):
            bad_letter += 1
            continue
        counts[letter] += 1
        if opts[i] != text:
            mismatch += 1
    out = [
        _result(
            "vqa",
            "vqa_answer_in_options",
            "critical",
            bad_letter == 0 and mismatch == 0 and open_malformed == 0,
            {
                "rows": vqa.num_rows,
                "multiple_choice": n,
                "letter_not_an_option": bad_letter,
                "option_text_mismatch": mismatch,
                "open_ended_malformed": open_malformed,
            },
            f"{bad_letter} answers do not index an option, {mismatch} option texts differ from answer_text, "
            f"{open_malformed} open-ended items have options, a letter or no answer text",
        )
    ]
    letters = sorted(expected)
    shares = {k: round(100.0 * counts[k] / n, 2) for k in letters} if n else {}
    uniform = {k: round(100.0 * expected[k] / n, 2) for k in letters} if n else {}
    dev = max((abs(shares[k] - uniform[k]) for k in letters), default=0.0)
    evaluated = n >= min_items
    obs = {
        "items": n,
        "evaluated": evaluated,
        "share_percent": shares,
        "expected_percent": uniform,
        "max_deviation_points": round(dev, 2),
        "threshold_points": max_deviation_points,
    }
    msg = (
        f"largest answer-letter deviation from uniform is {dev:.1f} points (limit {max_deviation_points})"
        if evaluated
        else f"only {n} items (< {min_items}): balance not evaluated"
    )
    out.append(
        _result("vqa", "vqa_answer_balance", "warning", (not evaluated) or dev <= max_deviation_points, obs, msg)
    )
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
    out = [
        _result(
            "splits",
            "patient_single_split",
            "critical",
            multi == 0,
            {"patients": len(assigned), "patients_in_multiple_splits": multi},
            f"{multi} patients appear in more than one split (splits table and vqa items)",
        )
    ]
    study_patients = pc.unique(tables["studies"].column("patient_key")).drop_null()
    split_patients = tables["splits"].column("patient_key").combine_chunks()
    missing = pc.sum(pc.invert(pc.is_in(study_patients, value_set=split_patients))).as_py() or 0
    out.append(
        _result(
            "splits",
            "study_patients_have_split",
            "critical",
            missing == 0,
            {"study_patients": len(study_patients), "patients_without_split": missing},
            f"{missing} of {len(study_patients)} study patients have no split",
        )
    )
    return out


def check_institution_coverage(tables: Mapping[str, Any]) -> list[CheckResult]:
    """Every institution with image studies has reports and entity labels (warnings naming the institutions that
    have none: a site whose report feed failed publishes images without text, which a curator must see).

    Reads key columns only: ``studies.institution``/``study_key``, ``reports.institution``,
    ``study_labels.study_key``.
    """
    studies = tables["studies"].select(["study_key", "institution"])  # pyarrow.Table and PartitionedTable alike
    institution_of = dict(
        zip(studies.column("study_key").to_pylist(), studies.column("institution").to_pylist(), strict=True)
    )
    with_images = sorted({i for i in institution_of.values() if i is not None})
    with_reports = set(tables["reports"].column("institution").to_pylist())
    labelled = {institution_of.get(k) for k in tables["study_labels"].column("study_key").to_pylist()}
    no_reports = [i for i in with_images if i not in with_reports]
    no_labels = [i for i in with_images if i not in labelled]
    return [
        _result(
            "reports",
            "reports_per_institution",
            "warning",
            not no_reports,
            {"institutions_with_studies": len(with_images), "without_reports": no_reports},
            "institutions with image studies and no report: " + (", ".join(no_reports) or "none"),
        ),
        _result(
            "study_labels",
            "labels_per_institution",
            "warning",
            not no_labels,
            {"institutions_with_studies": len(with_images), "without_labels": no_labels},
            "institutions with image studies and no entity label: " + (", ".join(no_labels) or "none"),
        ),
    ]


def check_ledger(ledger: pa.Table, expected_files: Mapping[str, int] | None) -> list[CheckResult]:
    """Ledger balance per run (critical), quarantine reasons (critical), duplicate back-references (warning).

    A run balances when its row count equals the sum of its per-status counts over the valid statuses
    (``schemas.ledger.STATUSES``) and, when ``expected_files[run_id]`` is given (files discovered by the
    scan), equals that number too: nothing discovered is silently lost.
    """
    runs: dict[str, dict[str, int]] = {}
    counted = ledger.select(["run_id", "status"]).group_by(["run_id", "status"]).aggregate([([], "count_all")])
    for c in counted.to_pylist():  # one row per (run, status): no per-file Python objects
        r = runs.setdefault(c["run_id"], {"rows": 0, **{s: 0 for s in STATUSES}})
        r["rows"] += int(c["count_all"])
        if c["status"] in STATUSES:
            r[c["status"]] += int(c["count_all"])
    for run, n in (expected_files or {}).items():
        runs.setdefault(run, {"rows": 0, **{s: 0 for s in STATUSES}})["expected_files"] = int(n)
    unbalanced = []
    for run, r in sorted(runs.items()):
        r["status_sum"] = sum(r[s] for s in STATUSES)
        if r["status_sum"] != r["rows"] or r.get("expected_files", r["rows"]) != r["rows"]:
            unbalanced.append(run)
    out = [
        _result(
            "ledger",
            "ledger_balance",
            "critical",
            not unbalanced,
            {"runs": runs, "unbalanced_runs": unbalanced},
            f"{len(unbalanced)} of {len(runs)} runs do not balance (rows vs per-status counts"
            f"{' vs discovered files' if expected_files else ''})",
        )
    ]
    status = ledger.column("status")
    reason = ledger.column("reason")
    quarantined = pc.fill_null(pc.equal(status, "quarantined"), False)
    no_reason = pc.or_(pc.is_null(reason), pc.equal(pc.utf8_trim_whitespace(pc.fill_null(reason, "")), ""))
    n_q = pc.sum(quarantined).as_py() or 0
    n_bad = pc.sum(pc.and_(quarantined, no_reason)).as_py() or 0
    out.append(
        _result(
            "ledger",
            "ledger_quarantine_reason",
            "critical",
            n_bad == 0,
            {"quarantined": n_q, "without_reason": n_bad},
            f"{n_bad} of {n_q} quarantined rows have no reason code",
        )
    )
    dup = pc.fill_null(pc.equal(status, "duplicate"), False)
    n_d = pc.sum(dup).as_py() or 0
    n_orphan = pc.sum(pc.and_(dup, pc.is_null(ledger.column("duplicate_of")))).as_py() or 0
    out.append(
        _result(
            "ledger",
            "ledger_duplicate_of",
            "warning",
            n_orphan == 0,
            {"duplicates": n_d, "without_duplicate_of": n_orphan},
            f"{n_orphan} of {n_d} duplicate rows do not name the first copy",
        )
    )
    return out


def check_redaction_counts(reports: pa.Table) -> list[CheckResult]:
    """``redaction_counts`` is a JSON object of non-negative integers (critical) summing to ``redactions``
    (warning)."""
    invalid = negative = inconsistent = 0
    for total, raw in zip(
        reports.column("redactions").to_pylist(), reports.column("redaction_counts").to_pylist(), strict=True
    ):
        try:
            counts = json.loads(raw)
        except (TypeError, ValueError):
            invalid += 1
            continue
        if not isinstance(counts, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in counts.values()
        ):
            invalid += 1
            continue
        if any(v < 0 for v in counts.values()):
            negative += 1
        elif sum(counts.values()) != total:
            inconsistent += 1
    n = reports.num_rows
    return [
        _result(
            "reports",
            "redaction_counts_valid",
            "critical",
            invalid == 0 and negative == 0,
            {"rows": n, "invalid_json": invalid, "negative_counts": negative},
            f"{invalid} rows have unparseable redaction_counts, {negative} have negative counts",
        ),
        _result(
            "reports",
            "redaction_counts_sum",
            "warning",
            inconsistent == 0,
            {"rows": n, "sum_differs_from_redactions": inconsistent},
            f"{inconsistent} rows have redaction_counts not summing to redactions",
        ),
    ]


def check_review(ledger: pa.Table, review: list[dict] | None, run_id: str | None) -> list[CheckResult]:
    """Curator decisions are honoured: no file a curator rejected is ingested in ``run_id`` (critical).

    A reject decision is matched to ledger rows by sha256 (the full digest or its first >= 12 hex digits).
    The ledger stage records a rejected file that is quarantined again as ``curator_rejected``
    (:func:`etl.pipeline.ledger.apply_review`); a rejected file that a stage ingested (say after a configuration
    change) is in the curated tables and must not reach a snapshot until the decision is withdrawn.
    ``observed`` counts decisions and files, never a path.
    """
    review = review or []
    prefixes = {str(d.get("sha256", "")).lower()[:12]: d.get("decision") for d in review}
    rows = ledger.filter(pc.equal(ledger.column("run_id"), run_id)) if run_id else ledger
    ingested_rejected = 0
    rejected = {p for p, d in prefixes.items() if d == "reject"}
    if rejected:  # only then are the ledger's digests looked at
        rows = rows.filter(
            pc.is_in(
                pc.utf8_slice_codeunits(pc.utf8_lower(rows.column("sha256")), 0, 12),
                value_set=pa.array(sorted(rejected), type=pa.string()),
            )
        )
    else:
        rows = rows.slice(0, 0)
    for sha, status in zip(rows.column("sha256").to_pylist(), rows.column("status").to_pylist(), strict=True):
        if status == "ingested" and prefixes.get((sha or "").lower()[:12]) == "reject":
            ingested_rejected += 1
    decided = Counter(prefixes.values())
    obs = {
        "decisions": len(review),
        "release": decided.get("release", 0),
        "reject": decided.get("reject", 0),
        "rejected_files_ingested": ingested_rejected,
    }
    return [
        _result(
            "ledger",
            "curator_rejected_not_ingested",
            "critical",
            ingested_rejected == 0,
            obs,
            f"{ingested_rejected} files a curator rejected were ingested in this run",
        )
    ]


# ----------------------------------------------------------------------------------------------- main


def run_checks(
    tables: Mapping[str, pa.Table | PartitionedTable],
    ontology: Any,
    *,
    rules: dict | str | Path | None = None,
    suites: dict | str | Path | None = None,
    today: dt.date | None = None,
    expected_files: Mapping[str, int] | None = None,
    review: list[dict] | None = None,
    run_id: str | None = None,
    gx_project_dir: str | Path | None = None,
    data_docs_dir: str | Path | None = None,
    keep_runs: int | None = None,
    only: Collection[str] | None = None,
    payload_integrity: Mapping[int, Mapping | None] | None = None,
) -> QualityReport:
    """Run every quality gate over the curated tables (and the ledger): the GE suites, then the cross-table checks.

    Parameters
    ----------
    tables : mapping of str to pyarrow.Table or quality.partitions.PartitionedTable
        table name (``schemas.tables.SCHEMAS`` keys) -> table with at least that schema's columns and
        types. Absent tables are checked as empty (fail-closed for references into them). A PartitionedTable
        (the build's curated tables) is never read whole: the GE suites run partition by partition on the
        columns they need, the row flags likewise, and the cross-table checks read only their columns (keys,
        the columns they compare).
    ontology : schemas.ontology.Ontology
        anything with a ``concepts`` mapping keyed by concept id (``"F029"``).
    rules : dict or path, optional
        the cross-table rules (parsed YAML or a path; default ``quality/rules.yaml``).
    suites : dict or path, optional
        the GE suites (parsed by :func:`quality.gx_suites.load_suite_config`, or a path; default
        ``quality/expectations.yaml``).
    today : datetime.date, optional
        reference date for the date plausibility upper bound (default: today, local).
    expected_files : mapping of str to int, optional
        run_id -> number of files the discovery scan found; each run's ledger rows must equal it.
    review : list of dict, optional
        curator decisions (``reports/quarantine_review.json``), for :func:`check_review`.
    run_id : str, optional
        the build run (GE run name; the ledger rows :func:`check_review` looks at).
    gx_project_dir, data_docs_dir, keep_runs : optional
        a GE file context, its Data Docs site and the retention cap (see :func:`quality.gx_suites.run_suites`);
        default: an ephemeral context and no Data Docs.
    only : collection of str, optional
        run the GE suites of these tables only (the cross-table checks always run); default: all tables.
    payload_integrity : mapping of int to mapping or None, optional
        the payload checks recorded where the payloads were written (shard -> counts,
        :func:`etl.pixels.integrity.recorded_integrity`): ``payload_sha256`` is then decided from them and the
        ``images`` table may come without its payload column (the build's quality task never reads it).
        Without it, the ``payload`` column is hashed on ``payload_sha256.sample_rows`` rows.

    Returns
    -------
    QualityReport
        one :class:`CheckResult` per expectation and per cross-table check, in a fixed order. A row-level
        expectation failing on at most ``row_level.max_failed_rate`` of its values (default 0.01) is a
        ``warning`` whose rows are flagged (``row_flags``, ``flags_table``; :mod:`quality.row_flags`).

    Raises
    ------
    QualityInputError
        ``unknown_table`` for a table name outside the registry, ``schema_mismatch`` for a missing
        column or a column of another type, ``bad_rules`` for an invalid rules or expectations file.
    """
    from quality.gx_suites import build_suite_specs, load_suite_config, run_suites, suite_parameters
    from quality.row_flags import DEFAULT_MAX_FAILED_RATE, apply_row_tolerance, flag_counts

    rules = validate_rules(rules) if isinstance(rules, dict) else load_rules(rules)
    suites = suites if isinstance(suites, dict) else load_suite_config(suites)
    t = _prepare_tables(tables)
    results = run_suites(
        t,
        ontology,
        today=today,
        config=suites,
        project_dir=gx_project_dir,
        data_docs_dir=data_docs_dir,
        run_name=run_id,
        keep_runs=keep_runs,
        only=only,
    )
    max_rate = float((suites.get("row_level") or {}).get("max_failed_rate", DEFAULT_MAX_FAILED_RATE))
    results, flags = apply_row_tolerance(
        results, t, build_suite_specs(suites), suite_parameters(suites, ontology, today), max_rate
    )
    results += [check_foreign_key(r, t) for r in rules["foreign_keys"]]
    if payload_integrity is not None:
        results.append(check_recorded_payload_integrity(t["images"], payload_integrity))
    elif "payload" in t["images"].column_names:
        results.append(check_payload_sha256(t["images"], int(rules["payload_sha256"]["sample_rows"])))
    else:
        results.append(check_recorded_payload_integrity(t["images"], {}))  # no record, no payloads: fail closed
    results += check_pairs(t["pairs"], t["studies"], float(rules["pairs"]["gap_days_tolerance_days"]))
    vb = rules["vqa_balance"]
    results += check_vqa(t["vqa"], int(vb["min_items"]), float(vb["max_deviation_points"]))
    results += check_splits(t)
    results += check_ledger(t["ledger"], expected_files)
    results += check_redaction_counts(t["reports"])
    results += check_institution_coverage(t)
    results += check_review(t["ledger"], review, run_id)
    return QualityReport(
        results=results, rules_version=rules.get("version"), row_flags=flag_counts(flags), flags_table=flags
    )
