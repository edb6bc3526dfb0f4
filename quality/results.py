"""What a quality check returns: :class:`CheckResult`, its severities and table schema, and the reason-coded
:class:`QualityInputError` (shared by :mod:`quality.checks` and :mod:`quality.gx_suites`)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow as pa

from schemas.errors import ReasonCodedError

SEVERITIES = ("critical", "warning")

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


class QualityInputError(ReasonCodedError, ValueError):
    """Bad input to :func:`run_checks`; ``reason`` is a machine-readable code.

    Reason codes: ``unknown_table``, ``schema_mismatch``, ``bad_rules``, ``bad_observed``.
    """


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
