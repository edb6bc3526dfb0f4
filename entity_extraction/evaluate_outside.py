"""Evaluation of entity extraction on outside labelled sets: the NegEx/ConText test kit and chest CT extractions.

NegEx test kit (``--negex FILE``): the annotated sentence set distributed with NegEx and GenConText (Chapman W.W.
et al., J Biomed Inform 2001;34(5):301-310; Harkema H. et al., J Biomed Inform 2009;42(5):839-851). One
tab-separated text file, a header line, then one line per annotated condition: report number, target phrase
(the condition), sentence, negation status (``Affirmed``/``Negated``) and, in the ConText version, temporality
(``Recent``/``Historical``/``Hypothetical``) and experiencer (``Patient``/``Other``). Columns are found by
their header names (``concept``/``phrase``/``target``, ``sentence``, ``negation``, ``temporality``,
``experiencer``, any case) and else by position (1, 2, 3, 4, 5: the order of the kit). Each sentence is run
through :meth:`~entity_extraction.extract.EntityExtractor.assert_target` with the target phrase (its first
case-insensitive occurrence) as the only target; predicted negated = assertion ``absent``. Figures: negation
precision, recall and F1 (positive class Negated), over all lines and over the lines whose target names an
ontology finding or condition (the target holds a synonym of one, any family), plus temporality accuracy on
the lines that carry one (``Recent`` = current).

Chest CT extractions (``--ct-extractions DIR``): the layout of ``../shared/data/ct-report-extractions``
(github:openimagingdata/CDEStaging ``chest_ct_findings_*.md``): ``ct_reports_with_findings.jsonl`` (``id``,
``report_text``, ``findings``: ``[{finding, radlex, attributes}]``), else the ``markdown/*.md`` files it was
derived from ("# Report Text" with a fenced text block, then "## Extracted Findings": ``- name`` items with
``  - key: value`` attributes). The gold items are the findings with a stated presence (attribute
``presence``, or its misspelt key ``present``; values starting with ``present`` or ``abs``/``abc`` =
absent). ``ct_findings_map.yaml`` maps each finding name to ontology concepts or gives the reason it names
none. Each report runs through the extractor for the 3D-CT family. Figures:

* *found*: a gold item whose concept has a mention in the report (any section, temporality current or
  historical), over the items that name a concept of the family;
* *mention assertion accuracy*: a found item is right when a mention of its concept has its presence;
* *study-level assertion accuracy*: per (report, concept) pair with a gold item (gold state present if any
  finding of the concept is present, the findings listed without a presence counting as present, else absent)
  and a mention, :func:`~entity_extraction.extract.study_labels` state equal to the gold state.

Items naming concepts outside the family, and items whose name the map lacks, are counted and printed.
"""

from __future__ import annotations

import csv
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from entity_extraction.evaluate import EvaluationDataError, LabelMap  # finding name -> ids, or why none
from schemas.ontology import Ontology, load_ontology

CT_MAP_FILE = Path(__file__).with_name("ct_findings_map.yaml")
CT_JSONL = "ct_reports_with_findings.jsonl"
CT_MARKDOWN = "markdown"
_COLUMN_NAMES = {
    "target": ("concept", "phrase", "target", "condition", "term"),
    "sentence": ("sentence", "text"),
    "negation": ("negation", "negation status"),
    "temporality": ("temporality", "temporality status"),
    "experiencer": ("experiencer",),
}
_KIT_POSITIONS = {"target": 1, "sentence": 2, "negation": 3, "temporality": 4, "experiencer": 5}


def _norm(term: str) -> str:
    return " ".join(term.lower().split()).strip(" ,;.")


# ------------------------------------------------------------------ NegEx kit
@dataclass(frozen=True)
class NegexItem:
    """One annotated line of the NegEx kit: ``negated`` gold, ``temporality`` gold (lower case, or None)."""

    report: str
    target: str
    sentence: str
    negated: bool
    temporality: str | None = None
    experiencer: str | None = None


def _optional(row: list[str], i: int | None) -> str | None:
    return (row[i].strip().lower() or None) if i is not None and i < len(row) else None


def load_negex_kit(path: str | Path) -> list[NegexItem]:
    """Read a file in the NegEx test-kit layout (see the module docstring).

    Returns
    -------
    list of NegexItem
        In file order; lines whose target does not occur in the sentence are kept (scored as not found).

    Raises
    ------
    EvaluationDataError
        ``missing_reports`` (no such file), ``missing_columns`` (fewer than four columns, or a negation value
        other than affirmed/negated).
    """
    path = Path(path)
    if not path.is_file():
        raise EvaluationDataError("missing_reports", f"{path} is not a file")
    with path.open(newline="", encoding="utf-8", errors="replace") as f:
        rows = [r for r in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE) if any(c.strip() for c in r)]
    if not rows:
        return []
    header = [_norm(c) for c in rows[0]]
    cols: dict[str, int] = {}
    for key, names in _COLUMN_NAMES.items():
        for name in names:
            if name in header:
                cols[key] = header.index(name)
                break
    if not {"target", "sentence", "negation"} <= cols.keys():
        cols = dict(_KIT_POSITIONS)
    out = []
    for row in rows[1:]:
        if len(row) <= max(cols["target"], cols["sentence"], cols["negation"]):
            raise EvaluationDataError("missing_columns", f"{path.name}: a line has {len(row)} columns")
        neg = row[cols["negation"]].strip().lower()
        if neg not in ("affirmed", "negated"):
            raise EvaluationDataError("missing_columns", f"{path.name}: negation value {neg!r} not affirmed/negated")
        out.append(
            NegexItem(
                report=row[0].strip(),
                target=row[cols["target"]].strip(),
                sentence=row[cols["sentence"]].strip(),
                negated=neg == "negated",
                temporality=_optional(row, cols.get("temporality")),
                experiencer=_optional(row, cols.get("experiencer")),
            )
        )
    return out


@dataclass
class BinaryScore:
    """Counts of one binary decision (positive class: negated)."""

    tp: int = 0
    fp: int = 0
    fn: int = 0
    tn: int = 0

    def add(self, gold: bool, predicted: bool) -> None:
        """Count one decision."""
        if gold and predicted:
            self.tp += 1
        elif predicted:
            self.fp += 1
        elif gold:
            self.fn += 1
        else:
            self.tn += 1

    @property
    def n(self) -> int:
        """Decisions counted."""
        return self.tp + self.fp + self.fn + self.tn

    @property
    def prf(self) -> tuple[float, float, float]:
        """(precision, recall, F1); 0 where undefined."""
        p = self.tp / (self.tp + self.fp) if self.tp + self.fp else 0.0
        r = self.tp / (self.tp + self.fn) if self.tp + self.fn else 0.0
        d = 2 * self.tp + self.fp + self.fn
        return p, r, (2 * self.tp / d if d else 0.0)


@dataclass
class NegexResult:
    """Outcome of :func:`evaluate_negex`: ``all``/``ontology`` negation counts, temporality right/total,
    targets not found in their sentence, and ``errors`` (index, target, gold negated, predicted assertion)."""

    all: BinaryScore
    ontology: BinaryScore
    temporality_right: int = 0
    temporality_total: int = 0
    not_found: int = 0
    errors: list[tuple[int, str, bool, str]] = field(default_factory=list)


_TEMPORALITY = {"recent": "current", "historical": "historical", "hypothetical": "hypothetical"}


def _concept_phrase_regex(ontology: Ontology, language: str = "en") -> re.Pattern[str]:
    phrases = {
        _norm(s) for c in ontology.concepts.values() if c.category != "anatomy" for s in c.synonyms.get(language, ())
    }
    alternation = "|".join(re.escape(p) for p in sorted(phrases, key=len, reverse=True) if len(p) > 2)
    return re.compile(rf"(?<![\w-])(?:{alternation})s?(?![\w-])", re.IGNORECASE)


def evaluate_negex(items: list[NegexItem], extractor=None, ontology: Ontology | None = None) -> NegexResult:
    """Score the ConText rules on NegEx-kit items (see the module docstring)."""
    from entity_extraction.extract import EntityExtractor

    onto = ontology or load_ontology()
    ex = extractor or EntityExtractor(ontology=onto)
    concept_re = _concept_phrase_regex(onto, ex.language)
    result = NegexResult(BinaryScore(), BinaryScore())
    for i, item in enumerate(items):
        at = item.sentence.lower().find(item.target.lower()) if item.target else -1
        if at < 0:
            result.not_found += 1
            predicted = {"assertion": "present", "temporality": "current"}
        else:
            predicted = ex.assert_target(item.sentence, at, at + len(item.target))
        negated = predicted["assertion"] == "absent"
        result.all.add(item.negated, negated)
        if concept_re.search(item.target):
            result.ontology.add(item.negated, negated)
        if negated != item.negated:
            result.errors.append((i, item.target, item.negated, predicted["assertion"]))
        gold_t = _TEMPORALITY.get(item.temporality or "")
        if gold_t:
            result.temporality_total += 1
            result.temporality_right += predicted["temporality"] == gold_t
    return result


def render_negex(result: NegexResult, name: str = "NegEx kit") -> str:
    """Text summary of :func:`evaluate_negex`: one line per subset, then temporality."""
    lines = [f"{name}: {result.all.n} annotated sentences ({result.not_found} targets not found in their sentence)"]
    for label, s in (("all targets", result.all), ("targets naming an ontology finding/condition", result.ontology)):
        p, r, f = s.prf
        lines.append(f"negation {label}: n={s.n} TP={s.tp} FP={s.fp} FN={s.fn} P={p:.3f} R={r:.3f} F1={f:.3f}")
    if result.temporality_total:
        lines.append(
            f"temporality accuracy: {result.temporality_right / result.temporality_total:.3f} "
            f"({result.temporality_right} of {result.temporality_total})"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------ CT extractions
@dataclass(frozen=True)
class CtReport:
    """One report of the CT extraction set: ``gold`` = ((finding name, present?), ...) with stated presence;
    ``listed``: names of the findings extracted without a stated presence (found in the report, so present)."""

    id: str
    text: str
    gold: tuple[tuple[str, bool], ...]
    listed: tuple[str, ...] = ()


def _presence(attributes: dict) -> bool | None:
    value = attributes.get("presence", attributes.get("present"))
    if not isinstance(value, str):
        return None
    value = value.strip().lower()
    if value.startswith("present"):
        return True
    if value.startswith(("abs", "abc")):
        return False
    return None


#: "- [name](link)" or "- name", optionally followed by ", [alternate](link)" or a RadLex id "\[RID123\]"
_MD_ITEM = re.compile(r"^- +(?:\[(?P<link>[^\]]+)\]\([^)]*\)|(?P<plain>[^\[\\,\n]+?))\s*(?:[,\\\[].*)?$")
_MD_ATTR = re.compile(r"^\s+- +(?P<key>[^:]+):\s*(?P<value>.*)$")


def parse_ct_markdown(text: str) -> tuple[str, list[dict]]:
    """Report text and findings (``{finding, attributes}``) of one CDEStaging ``chest_ct_findings_*.md`` file."""
    block = re.search(r"#\s*Report Text\s*```[a-z]*\n(?P<body>.*?)```", text, re.S | re.I)
    report = block.group("body").strip() if block else ""
    part = re.search(r"##\s*Extracted Findings\s*\n(?P<body>.*?)(?=\n##\s|\Z)", text, re.S | re.I)
    findings: list[dict] = []
    for line in (part.group("body") if part else "").splitlines():
        attr = _MD_ATTR.match(line)
        if attr and findings:
            findings[-1]["attributes"][attr.group("key").strip().lower()] = attr.group("value").strip()
            continue
        item = _MD_ITEM.match(line.rstrip())
        if item:
            findings.append({"finding": (item.group("link") or item.group("plain")).strip(), "attributes": {}})
    return report, findings


def load_ct_extractions(directory: str | Path) -> list[CtReport]:
    """Read a directory in the ct-report-extractions layout (JSONL, else the markdown files).

    Raises
    ------
    EvaluationDataError
        ``not_a_directory``, ``missing_reports`` (neither the JSONL nor markdown files).
    """
    root = Path(directory)
    if not root.is_dir():
        raise EvaluationDataError("not_a_directory", f"{root} is not a directory")
    raw: list[tuple[str, str, list[dict]]] = []
    if (root / CT_JSONL).is_file():
        for line in (root / CT_JSONL).read_text(encoding="utf-8").splitlines():
            if line.strip():
                rec = json.loads(line)
                raw.append((str(rec["id"]), rec["report_text"], rec.get("findings") or []))
    else:
        files = (
            sorted((root / CT_MARKDOWN).glob("*.md")) if (root / CT_MARKDOWN).is_dir() else sorted(root.glob("*.md"))
        )
        for f in files:
            report, findings = parse_ct_markdown(f.read_text(encoding="utf-8"))
            if report:
                raw.append((f.stem, report, findings))
    if not raw:
        raise EvaluationDataError("missing_reports", f"{root} has no {CT_JSONL} and no report markdown files")
    out = []
    for rid, text, findings in raw:
        gold, listed = [], []
        for f in findings:
            present = _presence(f.get("attributes") or {})
            if present is not None:
                gold.append((_norm(f["finding"]), present))
            else:
                listed.append(_norm(f["finding"]))
        out.append(CtReport(rid, text, tuple(gold), tuple(listed)))
    return out


def load_ct_map(path: str | Path | None = None, ontology: Ontology | None = None) -> LabelMap:
    """Load and check ``ct_findings_map.yaml``.

    Raises
    ------
    EvaluationDataError
        ``invalid_map``: unreadable, an id not in the ontology, a name both mapped and unmapped, unknown family.
    """
    onto = ontology or load_ontology()
    path = Path(path or CT_MAP_FILE)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        family = data["family"]
        mapped = {_norm(k): tuple(v) for k, v in data["mapped"].items()}
        unmapped = {_norm(k): str(v) for k, v in (data.get("unmapped") or {}).items()}
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError) as exc:
        raise EvaluationDataError("invalid_map", f"{path.name}: {exc}") from exc
    if family not in onto.families:
        raise EvaluationDataError("invalid_map", f"{path.name}: unknown family {family!r}")
    for name, ids in mapped.items():
        if not ids or any(i not in onto.concepts for i in ids) or name in unmapped:
            raise EvaluationDataError("invalid_map", f"{path.name}: {name!r}: bad ids {ids} or also unmapped")
    return LabelMap(family, mapped, unmapped)


@dataclass
class CtResult:
    """Outcome of :func:`evaluate_ct`.

    ``items``: gold items naming a family concept; ``found``/``mention_right``: of those; ``pairs``/
    ``pairs_found``/``pairs_right``: (report, concept) pairs (study level); ``out_of_family``: concept id ->
    items; ``no_concept``: items the map lists as naming no concept; ``unknown``: names absent from the map;
    ``missed``/``wrong``: (report id, finding name, present?) of items not found / found with another assertion.
    """

    family: str
    n_reports: int
    items: int = 0
    found: int = 0
    mention_right: int = 0
    pairs: int = 0
    pairs_found: int = 0
    pairs_right: int = 0
    out_of_family: Counter = field(default_factory=Counter)
    no_concept: int = 0
    unknown: Counter = field(default_factory=Counter)
    missed: list[tuple[str, str, bool]] = field(default_factory=list)
    wrong: list[tuple[str, str, bool, str]] = field(default_factory=list)


def evaluate_ct(
    reports: list[CtReport], extractor=None, ontology: Ontology | None = None, ct_map: LabelMap | None = None
) -> CtResult:
    """Score extraction on CT extraction reports (see the module docstring)."""
    from entity_extraction.extract import EntityExtractor, study_labels

    onto = ontology or load_ontology()
    cmap = ct_map or load_ct_map(ontology=onto)
    ex = extractor or EntityExtractor(ontology=onto)
    family = cmap.family
    fam_ids = {c.id for c in onto.family_concepts(family)}
    result = CtResult(family, len(reports))
    all_mentions = ex.extract_many([r.text for r in reports], family)
    for rep, mentions in zip(reports, all_mentions):
        kept = [m for m in mentions if m["temporality"] != "hypothetical"]
        states = {row["entity_id"]: row["state"] for row in study_labels(mentions, family, onto)}
        gold_pairs: dict[str, bool] = {}
        for name, present in rep.gold:
            ids = cmap.mapped.get(name)
            if ids is None:
                if name in cmap.unmapped:
                    result.no_concept += 1
                else:
                    result.unknown[name] += 1
                continue
            in_fam = [i for i in ids if i in fam_ids]
            if not in_fam:
                result.out_of_family.update(ids[:1])
                continue
            result.items += 1
            want = "present" if present else "absent"
            hits = [m for m in kept if m["entity_id"] in in_fam]
            if not hits:
                result.missed.append((rep.id, name, present))
            else:
                result.found += 1
                if any(m["assertion"] == want for m in hits):
                    result.mention_right += 1
                else:
                    result.wrong.append((rep.id, name, present, ",".join(sorted({m["assertion"] for m in hits}))))
            for i in in_fam[:1]:
                gold_pairs[i] = gold_pairs.get(i, False) or present
        for name in rep.listed:  # findings listed without a presence are present findings of the report
            for i in [i for i in cmap.mapped.get(name, ()) if i in fam_ids][:1]:
                if i in gold_pairs:
                    gold_pairs[i] = True
        for cid, present in gold_pairs.items():
            result.pairs += 1
            state = states.get(cid, "not_mentioned")
            if state != "not_mentioned":
                result.pairs_found += 1
                result.pairs_right += state == ("present" if present else "absent")
    return result


def render_ct(result: CtResult, ontology: Ontology | None = None) -> str:
    """Text summary of :func:`evaluate_ct`."""
    onto = ontology or load_ontology()

    def frac(a: int, b: int) -> str:
        return f"{a / b:.3f}" if b else "n/a"

    lines = [
        f"CT extractions: {result.n_reports} reports, family {result.family}, gold findings with a stated presence",
        f"gold present/absent findings naming a {result.family} concept found: {result.found} of {result.items} "
        f"({frac(result.found, result.items)})",
        f"mention assertion accuracy (found findings): {frac(result.mention_right, result.found)} "
        f"({result.mention_right} of {result.found})",
        f"study-level assertion accuracy (report-concept pairs found): {frac(result.pairs_right, result.pairs_found)} "
        f"({result.pairs_right} of {result.pairs_found}; {result.pairs} pairs)",
    ]
    if result.out_of_family:
        parts = ", ".join(f"{i} {onto.concepts[i].preferred_name} {n}" for i, n in result.out_of_family.most_common())
        lines.append(f"not scored, concept outside {result.family}: {parts}")
    lines.append(f"not scored, name no ontology concept: {result.no_concept}")
    if result.unknown:
        lines.append("names not in the map: " + ", ".join(f"{k} {v}" for k, v in result.unknown.most_common()))
    return "\n".join(lines)
