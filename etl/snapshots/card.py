"""The dataset card (``DATASET_CARD.md``) of a release: counts per institution, modality, entity and split,
de-identification codes, known limitations."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pyarrow.compute as pc


def _counts(table: pa.Table, column: str, distinct: str | None = None) -> dict[str, int]:
    if table.num_rows == 0 or column not in table.column_names:
        return {}
    if distinct:
        pairs = set(zip(table[column].to_pylist(), table[distinct].to_pylist(), strict=True))
        return dict(sorted(Counter(str(a) for a, _ in pairs).items()))
    return dict(sorted(Counter(str(v) for v in table[column].to_pylist()).items()))


def _by_split(table: pa.Table, split_of: dict[str, str], distinct: str | None = None) -> dict[str, int]:
    if table.num_rows == 0:
        return {}
    keys = table[distinct].to_pylist() if distinct else range(table.num_rows)
    seen = set()
    out: Counter = Counter()
    for k, p in zip(keys, table["patient_key"].to_pylist(), strict=True):
        if k in seen:
            continue
        seen.add(k)
        out[split_of.get(p, "unassigned")] += 1
    return dict(sorted(out.items()))


def card_facts(tables: dict[str, pa.Table], inputs: dict | None = None) -> dict:
    """Counts for the dataset card, computed from a release's tables (PHI-free: codes and counts only).

    Returns
    -------
    dict
        ``institution``/``modality``/``split``: ``{value: {measure: count}}``; ``entity``: ``{entity_id:
        {"studies_present": n, "mentions": n}}``; ``report_links``: reports per ``link_status``;
        ``inputs``: the input ledger summary (or None); ``empty_tables``: tables with no rows.
    """
    empty = pa.table({})
    get = lambda name: tables.get(name, empty)  # noqa: E731
    studies, images, reports, pairs, vqa, splits = (
        get(n) for n in ("studies", "images", "reports", "pairs", "vqa", "splits")
    )

    def merge(**measures: dict[str, int]) -> dict[str, dict[str, int]]:
        values = sorted({v for m in measures.values() for v in m})
        return {v: {name: m.get(v, 0) for name, m in measures.items()} for v in values}

    split_of = (
        dict(zip(splits["patient_key"].to_pylist(), splits["split"].to_pylist(), strict=True))
        if splits.num_rows
        else {}
    )
    labels, mentions = get("study_labels"), get("entity_mentions")
    present = labels.filter(pc.equal(labels["state"], "present")) if labels.num_rows else labels
    entity = merge(
        studies_present=_counts(present, "entity_id", distinct="study_key"), mentions=_counts(mentions, "entity_id")
    )
    return {
        "institution": merge(
            patients=_counts(splits, "institution"),
            studies=_counts(studies, "institution"),
            images=_counts(images, "institution"),
            reports=_counts(reports, "institution"),
        ),
        "modality": merge(
            studies=_counts(studies, "modality"), images=_counts(images, "modality"), pairs=_counts(pairs, "modality")
        ),
        "split": merge(
            patients=_counts(splits, "split"),
            studies=_by_split(studies, split_of),
            pairs=_by_split(pairs, split_of),
            vqa_items=_counts(vqa, "split"),
        ),
        "entity": entity,
        "report_links": _counts(reports, "link_status"),
        "inputs": inputs,
        "empty_tables": sorted(t for t, tbl in tables.items() if tbl.num_rows == 0),
    }


def _entity_names() -> dict[str, tuple[str, str, str]]:
    """Entity id -> (preferred name, category, modality families joined by ``/``)."""
    try:
        from schemas.ontology import load_ontology

        return {c.id: (c.preferred_name, c.category, "/".join(c.families)) for c in load_ontology().concepts.values()}
    except (OSError, KeyError, ValueError):  # the card still lists ids
        return {}


def _grid(title: str, rows: dict[str, dict[str, int]], first: str) -> list[str]:
    if not rows:
        return ["", f"## {title}", "", "(none)"]
    measures = list(next(iter(rows.values())))
    out = ["", f"## {title}", "", "| " + " | ".join([first, *measures]) + " |", "|---|" + "---:|" * len(measures)]
    out += ["| " + " | ".join([k, *(str(v[m]) for m in measures)]) + " |" for k, v in rows.items()]
    return out


#: limitations that hold for every release (the card adds the release's own: quarantines, empty tables ...)
KNOWN_LIMITATIONS = (
    "Report text de-identification is rule based; residual PHI in free text is possible and should be reported.",
    "Entity labels come from rule-based extraction (medspaCy ConText), not from human annotation.",
    "Dates are shifted per patient (intervals within a patient are kept); absolute dates and seasons are not real.",
    "Images flagged at risk of burned-in text are quarantined unless a pixel-cleaning rule covers the device, so "
    "some modalities (ultrasound, secondary capture) are under-represented.",
    "Splits are patient level; `external_test` holds whole institutions out and differs in case mix by design.",
)


def dataset_card(manifest: dict, facts: dict) -> str:
    """Markdown dataset card of a release (deterministic: no time, no storage location).

    Parameters
    ----------
    manifest : dict
        the release manifest (version, parent, hashes, tables, de-id codes).
    facts : dict
        from :func:`card_facts`.
    """
    codes = manifest.get("deid_method_codes") or []
    lines = [
        f"# MedReCo-DB snapshot {manifest['version']}",
        "",
        f"- parent: {manifest['parent'] or 'none'} ({manifest.get('change', 'initial')} change)",
        f"- content hash: `{manifest['content_hash']}`",
        f"- code {manifest['code_version']}; config hash `{manifest['config_hash']}`; ontology "
        f"{manifest['ontology_version']}; key fingerprint `{manifest['key_fingerprint']}`",
        "- format: one Delta Lake table per table under `snapshots/tables/<table>/`, pinned per release "
        "(manifest.json: Delta version, data files, sha256, rows)",
        "",
        "Load it: `pip install ./reader` (the MedReCo-DB reader: pyarrow, polars, deltalake, numpy, nibabel, "
        "Pillow; `./reader[torch]` adds the torch Datasets), then `from medreco_reader import load_snapshot; "
        f'snap = load_snapshot(ROOT, version="{manifest["version"]}"); snap.table("pairs")` (polars '
        f"LazyFrame). Check it: `medreco snapshot verify {manifest['version']} --root ROOT`. Hand it over: "
        f"`medreco snapshot export {manifest['version']} DEST --root ROOT` writes a self-contained folder with "
        'train/val/test splits that `datasets.load_dataset(DEST, "pairs", split="train")` reads.',
        "",
        "## Tables",
        "",
        "| table | rows | schema | key | files |",
        "|---|---:|---|---|---:|",
    ]
    lines += [
        f"| {t} | {v['rows']} | {v['schema_version']} | {', '.join(v.get('key', []))} | {len(v.get('files', []))} |"
        for t, v in manifest["tables"].items()
    ]
    lines += _grid("Counts per institution", facts.get("institution", {}), "institution")
    lines += _grid("Counts per modality", facts.get("modality", {}), "modality")
    lines += _grid("Counts per split", facts.get("split", {}), "split")
    names = _entity_names()
    entity = {
        f"{e} {names[e][0]} ({names[e][1]}, {names[e][2]})" if e in names else e: v
        for e, v in facts.get("entity", {}).items()
    }
    lines += _grid("Entities (studies labelled present, mentions in reports)", entity, "entity")
    lines += [
        "",
        "Each entity belongs to the modality families in brackets (chest radiograph, CT, brain MRI, "
        "ultrasound): the same name under two ids is the same finding in two families, labelled apart. "
        "`mentions` counts every mention in the reports, whatever its assertion; `studies` counts the studies "
        "labelled present (a study_labels row with state present). An entity with mentions and no study is "
        "mentioned only as absent, uncertain or historical, or only in reports not linked to a study of this "
        "release.",
    ]
    lines += [
        "",
        "## De-identification",
        "",
        "DICOM PS3.15 Annex E, DeidentificationMethodCodeSequence (CID 7050, scheme DCM):",
        "",
    ]
    lines += [f"- `{c}` {m}" for c, m in codes] or ["- (not recorded)"]
    lines += [
        "",
        "Pseudonyms are keyed HMAC-SHA256 values; UIDs are remapped to `2.25.<keyed hash>`; report "
        "text is scrubbed by the rule-based text de-identifier.",
    ]
    inputs = facts.get("inputs")
    limits = list(KNOWN_LIMITATIONS)
    if inputs:
        lines += [
            "",
            "## Inputs",
            "",
            f"{inputs['files_seen']} input files in the run ledger "
            f"(input ledger sha256 `{inputs['input_ledger_sha256']}`):",
            "",
        ]
        lines += [f"- {s}: {n}" for s, n in inputs["by_status"].items()]
        if inputs["quarantined_by_reason"]:
            limits.append(
                "Quarantined inputs are not in this release: "
                + ", ".join(f"{r} {n}" for r, n in inputs["quarantined_by_reason"].items())
                + "."
            )
    if codes and "113102" not in {c for c, _ in codes}:
        limits.append(
            "Head CT and MR volumes were not defaced (config deid.deface is off or quarantine): with off "
            "they keep the patient's face, with quarantine they are withheld."
        )
    links = {k: v for k, v in facts.get("report_links", {}).items() if k != "linked"}
    if links:
        limits.append(
            "Reports without an image study in this release: " + ", ".join(f"{k} {v}" for k, v in links.items()) + "."
        )
    if facts.get("empty_tables"):
        limits.append("Tables with no rows in this release: " + ", ".join(facts["empty_tables"]) + ".")
    lines += ["", "## Known limitations", ""] + [f"- {x}" for x in limits]
    lines += [
        "",
        "## Licence and terms of use",
        "",
        "Derived from clinical data of the contributing institutions under their data use agreement: use is "
        "limited to the research purposes and people that agreement names; no attempt to re-identify any "
        "person; no redistribution outside it. The Hugging Face card's `license: other` refers to this "
        "section.",
        "",
        "## Citation",
        "",
        "```bibtex",
        "@misc{medreco_db_" + manifest["version"].replace(".", "_") + ",",
        "  title  = {MedReCo-DB: a de-identified comparative imaging dataset, release " + manifest["version"] + "},",
        "  note   = {content hash " + manifest["content_hash"] + "}",
        "}",
        "```",
        "",
    ]
    return "\n".join(lines)
