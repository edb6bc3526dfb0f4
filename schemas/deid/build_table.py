"""Regenerate ``table_e1_1.csv`` (PS3.15 Annex E Table E.1-1) from a machine-readable copy (developer tool).

Usage::

    python -m schemas.deid.build_table ../shared/data/deid/reference/dicom_part15_table_E1-1.csv

The source is the Flywheel extraction of PS3.15 2025c (machine-extracted). This tool normalises tags,
adds the pydicom keyword of each attribute, keeps the action columns, and applies the corrections in
``CORRECTIONS`` (each checked against the standard's text and documented there). Output columns:
tag, keyword, name, basic, safe_private, uids, device, institution, patient_chars, full_dates,
modified_dates, clean_desc, clean_struct, clean_graph.
"""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

from pydicom.datadict import keyword_for_tag

HERE = Path(__file__).parent
EDITION = "PS3.15 2025c"
COLUMNS = {
    "Basic Prof.": "basic",
    "Rtn. Safe Priv. Opt.": "safe_private",
    "Rtn. UIDs Opt.": "uids",
    "Rtn. Dev. Id. Opt.": "device",
    "Rtn. Inst. Id. Opt.": "institution",
    "Rtn. Pat. Chars. Opt.": "patient_chars",
    "Rtn. Long. Full Dates Opt.": "full_dates",
    "Rtn. Long. Modif. Dates Opt.": "modified_dates",
    "Clean Desc. Opt.": "clean_desc",
    "Clean Struct. Cont. Opt.": "clean_struct",
    "Clean Graph. Opt.": "clean_graph",
}
#: tag -> {column: action}: where the extraction disagrees with the standard's text. Empty at 2025c: every
#: row spot-checked (identifying attributes, UIDs, dates, options) matched the published table.
CORRECTIONS: dict[str, dict[str, str]] = {}


def main(argv: list[str]) -> int:
    rows = []
    for r in csv.DictReader(open(argv[1], newline="", encoding="utf-8")):
        m = re.match(r"\(([0-9A-Fa-fx]{4}),([0-9A-Fa-fx]{4})\)", r["Tag"].strip())
        if not m:
            if "gggg" in r["Tag"]:  # private attributes: handled by the engine, not by tag
                continue
            raise SystemExit(f"unparsed tag {r['Tag']!r}")
        tag = f"({m.group(1).upper().replace('X', 'x')},{m.group(2).upper().replace('X', 'x')})"
        keyword = ""
        if "x" not in tag:
            keyword = keyword_for_tag(int(m.group(1) + m.group(2), 16)) or ""
        row = {"tag": tag, "keyword": keyword, "name": r["Attribute Name"].strip()}
        row.update({new: (r[old] or "").strip() for old, new in COLUMNS.items()})
        row.update(CORRECTIONS.get(tag, {}))
        rows.append(row)
    rows.sort(key=lambda x: x["tag"])
    out = HERE / "table_e1_1.csv"
    with out.open("w", newline="", encoding="utf-8") as f:
        f.write(f"# {EDITION} Table E.1-1, Basic Application Level Confidentiality Profile and options\n")
        w = csv.DictWriter(f, fieldnames=["tag", "keyword", "name", *COLUMNS.values()])
        w.writeheader()
        w.writerows(rows)
    print(f"{len(rows)} attributes -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
