"""Regenerate ``safe_private_tcia.csv`` from the TCIA private tag knowledge base (developer tool).

Usage::

    python -m schemas.deid.build_safe_private ../shared/data/deid/reference/TCIAPrivateTagKB-02-01-2024-formatted.csv

Keeps top-level private attributes (not nested in a sequence) whose TCIA disposition is ``k`` (keep) and
whose VR is neither SQ, UN nor PN: the allow-list of Retain Safe Private (113111). Columns:
private_creator, group, element (the low byte, hex), vr, name.
"""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

HERE = Path(__file__).parent
PATTERN = re.compile(r'^\(([0-9a-fA-F]{4}),"?([^",]+?)"?,([0-9a-fA-F]{2})\)$')


def main(argv: list[str]) -> int:
    rows = {}
    for r in csv.DictReader(open(argv[1], newline="", encoding="utf-8-sig")):
        m = PATTERN.match(r["element_sig_pattern"].strip())
        vr = r["vr"].strip().upper()
        if not m or r["private_disposition"].strip().lower() != "k" or vr in ("SQ", "UN", "PN", ""):
            continue
        group, creator, element = m.group(1).upper(), m.group(2).strip(), m.group(3).upper()
        rows[(creator.upper(), group, element)] = {
            "private_creator": creator,
            "group": group,
            "element": element,
            "vr": vr,
            "name": r["tag_name"].strip(),
        }
    out = HERE / "safe_private_tcia.csv"
    with out.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=["private_creator", "group", "element", "vr", "name"])
        w.writeheader()
        w.writerows(rows[k] for k in sorted(rows))
    print(f"{len(rows)} safe private attributes -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
