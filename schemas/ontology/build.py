"""Regenerate ``medreco_ontology.json`` from MedReCo's ``condition.json`` (a developer tool).

Usage::

    python -m schemas.ontology.build ../shared/data/medreco-reference/condition.json

Concept ids are assigned in order of first appearance (families in the order 2D-CXR, 3D-CT,
3D-Brain-MRI, 2D-Ultrasound), so they are stable while the source file is. Hand-curated English
synonyms live in ``synonyms_en.json`` and are merged in; the report issue deepens them.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).parent
CATEGORIES = {"ANATOMY": ("anatomy", "A"), "ABNORMAL": ("finding", "F"), "DISEASE": ("condition", "C")}
#: findings whose "in <anatomy>" names an anatomy outside every family list -> the concept it means
ANATOMY_ALIASES = {
    "cardiac walls": "Cardiac Chambers",
    "thoracic spine": "Thoracic Vertebrae",
    "thoracic veins": "Veins",
}


def preferred(name: str) -> str:
    """Short preferred name: drop '<x> in <anatomy>' suffix handled by caller, parentheses, '_' parts."""
    name = re.sub(r"\s*\([^)]*\)", "", name).strip()
    return name.replace("_", " / ")


def build(condition: dict) -> dict:
    concepts: dict[str, dict] = {}
    counters = {"A": 0, "F": 0, "C": 0}
    by_name: dict[tuple[str, str], str] = {}
    for family, lists in condition.items():
        for key in ("ANATOMY", "ABNORMAL", "DISEASE"):
            category, prefix = CATEGORIES[key]
            for source_name in lists[key]:
                ident = by_name.get((category, source_name))
                if ident is None:
                    counters[prefix] += 1
                    ident = f"{prefix}{counters[prefix]:03d}"
                    by_name[(category, source_name)] = ident
                    concepts[ident] = {
                        "id": ident,
                        "category": category,
                        "source_name": source_name,
                        "families": [],
                    }
                if family not in concepts[ident]["families"]:
                    concepts[ident]["families"].append(family)
    anatomy_index = {c["source_name"].lower(): i for i, c in concepts.items() if c["category"] == "anatomy"}
    for c in concepts.values():
        name = c["source_name"]
        if c["category"] == "finding":
            head, _, anat = name.rpartition(" in ")
            target = ANATOMY_ALIASES.get(anat.lower(), anat)
            c["anatomy_id"] = anatomy_index[target.lower()]
            c["preferred_name"] = preferred(head)
        else:
            c["preferred_name"] = preferred(name)
    return concepts


def main(argv: list[str]) -> int:
    condition = json.loads(Path(argv[1]).read_text())
    concepts = build(condition)
    syn_path = HERE / "synonyms_en.json"
    synonyms = json.loads(syn_path.read_text()) if syn_path.exists() else {}
    radlex = json.loads((HERE / "radlex_ids.json").read_text()) if (HERE / "radlex_ids.json").exists() else {}
    for ident, c in concepts.items():
        base = [c["preferred_name"].lower()]
        c["synonyms"] = {"en": sorted(set(base + [s.lower() for s in synonyms.get(ident, [])]))}
        c["radlex_id"] = radlex.get(ident)
    families = {
        fam: {
            "anatomy": [i for i, c in concepts.items() if c["category"] == "anatomy" and fam in c["families"]],
            "finding": [i for i, c in concepts.items() if c["category"] == "finding" and fam in c["families"]],
            "condition": [i for i, c in concepts.items() if c["category"] == "condition" and fam in c["families"]],
        }
        for fam in condition
    }
    out = {
        "version": "0.1.0",
        "source": "MedReCo configs/condition.json (time-seed/MedReCo @89bf3636)",
        "families": families,
        "concepts": list(concepts.values()),
    }
    (HERE / "medreco_ontology.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
