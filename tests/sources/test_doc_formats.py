"""The report input formats of docs/reports.md: the table names every format and field, and every example parses."""

from __future__ import annotations

import re

import pytest

from etl.sources.reports import FORMATS, RECORD_FIELDS, REQUIRED_FIELDS, ReportSourceError, iter_report_source
from schemas.config import PROJECT_ROOT

PAGE = (PROJECT_ROOT / "docs" / "reports.md").read_text(encoding="utf-8")
SECTION = PAGE[PAGE.index("## Report input formats") : PAGE.index("\n## ", PAGE.index("## Report input formats") + 1)]
EXAMPLES = dict(re.findall(r"<!-- report-example: ([a-z0-9-]+) -->\n```\n(.*?)```", SECTION, flags=re.DOTALL))


def test_the_table_names_every_format_and_field():
    rows = [line for line in SECTION.splitlines() if line.startswith("| `") and "report_format" not in line]
    formats = {re.match(r"\| `([a-z0-9]+)`", r).group(1) for r in rows}
    assert formats == set(FORMATS)
    fielded = next(r for r in rows if r.startswith("| `jsonl`"))
    cells = [c.strip() for c in fielded.strip("|").split("|")]
    assert re.findall(r"`([a-z_]+)`", cells[2]) == list(REQUIRED_FIELDS)
    assert sorted(re.findall(r"`([a-z_]+)`", cells[3])) == sorted(set(RECORD_FIELDS) - set(REQUIRED_FIELDS))


@pytest.mark.parametrize(
    ("name", "fmt", "n"),
    [("jsonl", "jsonl", 3), ("csv", "csv", 2), ("csv-openi", "csv", 2), ("text", "text", 1), ("hl7", "hl7", 1)],
)
def test_every_example_is_three_lines_the_parser_reads(name, fmt, n):
    text = EXAMPLES[name]
    assert len(text.splitlines()) == 3, name
    items = list(iter_report_source(text.encode(), fmt, f"R-1001.{'txt' if fmt == 'text' else fmt}"))
    assert not [i for i in items if isinstance(i, ReportSourceError)], items
    assert len(items) == n
    if fmt == "hl7":
        assert items[0]["accession_number"] == "ACC-77" and items[0]["report_datetime"] == "2023-03-14T10:15:00"
    if fmt == "text":
        assert items[0]["report_id"] == "R-1001"
    if name == "jsonl":
        assert [i["accession_number"] for i in items] == ["ACC-77", None, None]
