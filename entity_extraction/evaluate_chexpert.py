"""Evaluation on reports labelled with the CheXpert observations (mention, negation and uncertainty F1).

Layout (the CheXpert labeler's output, ``../shared/data/chexpert-labeler/labeled_reports.csv``; Irvin J. et al.,
AAAI 2019): a CSV with a header ``Reports`` + the 14 observation names; one report per row; a cell is ``1.0``
(positive), ``0.0`` (negative), ``-1.0`` (uncertain) or empty (not mentioned). Each report runs through
:meth:`~entity_extraction.extract.EntityExtractor.extract` (2D-CXR) and :func:`~entity_extraction.extract.study_labels`;
an observation's predicted class is the strongest study state of its mapped concepts (``chexpert14_map.yaml``):
present -> positive, uncertain -> uncertain, absent -> negative, not mentioned -> blank.

Figures as in the CheXpert paper, pooled over every (report, mapped observation) pair: *mention* F1 (positive
class: any of positive/negative/uncertain), *negation* F1 (class negative), *uncertain* F1 (class uncertain),
*positive* F1 (class positive).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

from entity_extraction.evaluate import EvaluationDataError, LabelMap, load_label_map
from entity_extraction.evaluate_outside import BinaryScore
from schemas.ontology import Ontology, load_ontology

CHEXPERT_MAP_FILE = Path(__file__).with_name("chexpert14_map.yaml")
_CLASSES = {
    "1.0": "positive",
    "1": "positive",
    "0.0": "negative",
    "0": "negative",
    "-1.0": "uncertain",
    "-1": "uncertain",
    "": "blank",
}
_FROM_STATE = {"present": "positive", "uncertain": "uncertain", "absent": "negative", "not_mentioned": "blank"}
_RANK = {"positive": 3, "uncertain": 2, "negative": 1, "blank": 0}
FIGURES = ("mention", "negation", "uncertain", "positive")


@dataclass(frozen=True)
class LabelledReport:
    """One row: ``index`` (row number from 0), ``text`` and gold class per observation."""

    index: int
    text: str
    gold: dict[str, str]


def load_chexpert_labelled(path: str | Path) -> list[LabelledReport]:
    """Read a CSV in the CheXpert labelled-report layout (module docstring).

    Raises
    ------
    EvaluationDataError
        ``missing_reports`` (no such file), ``missing_columns`` (no ``Reports`` column, or a cell that is not
        1/0/-1/empty).
    """
    path = Path(path)
    if not path.is_file():
        raise EvaluationDataError("missing_reports", f"{path} is not a file")
    with path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    if rows and "Reports" not in rows[0]:
        raise EvaluationDataError("missing_columns", f"{path.name}: no 'Reports' column")
    out = []
    for i, row in enumerate(rows):
        gold = {}
        for name, cell in row.items():
            if name == "Reports" or name is None:
                continue
            cls = _CLASSES.get((cell or "").strip())
            if cls is None:
                raise EvaluationDataError("missing_columns", f"{path.name} row {i + 1}: {name} = {cell!r}")
            gold[name] = cls
        out.append(LabelledReport(i, row["Reports"], gold))
    return out


@dataclass
class ChexpertResult:
    """Binary counts per figure, pairs scored, unmapped observations, wrong pairs (row, observation, gold,
    predicted)."""

    scores: dict[str, BinaryScore] = field(default_factory=lambda: {f: BinaryScore() for f in FIGURES})
    pairs: int = 0
    unmapped: tuple[str, ...] = ()
    wrong: list[tuple[int, str, str, str]] = field(default_factory=list)


def evaluate_chexpert(
    reports: list[LabelledReport], extractor=None, ontology: Ontology | None = None, label_map: LabelMap | None = None
) -> ChexpertResult:
    """Score study labels against CheXpert observation labels (module docstring)."""
    from entity_extraction.extract import EntityExtractor, study_labels

    onto = ontology or load_ontology()
    lmap = label_map or load_label_map(CHEXPERT_MAP_FILE, onto)
    ex = extractor or EntityExtractor(ontology=onto)
    result = ChexpertResult(unmapped=tuple(sorted(lmap.unmapped)))
    all_mentions = ex.extract_many([r.text for r in reports], lmap.family)
    for rep, mentions in zip(reports, all_mentions):
        states = {row["entity_id"]: _FROM_STATE[row["state"]] for row in study_labels(mentions, lmap.family, onto)}
        for obs, ids in lmap.mapped.items():
            if obs not in rep.gold:
                continue
            gold = rep.gold[obs]
            pred = max((states.get(i, "blank") for i in ids), key=_RANK.__getitem__)
            result.pairs += 1
            result.scores["mention"].add(gold != "blank", pred != "blank")
            for fig, cls in (("negation", "negative"), ("uncertain", "uncertain"), ("positive", "positive")):
                result.scores[fig].add(gold == cls, pred == cls)
            if gold != pred:
                result.wrong.append((rep.index, obs, gold, pred))
    return result


def render_chexpert(result: ChexpertResult, name: str = "CheXpert labelled reports") -> str:
    """One line per figure, then the observations left out."""
    lines = [f"{name}: {result.pairs} (report, observation) pairs"]
    for fig in FIGURES:
        s = result.scores[fig]
        p, r, f = s.prf
        lines.append(f"{fig} F1: TP={s.tp} FP={s.fp} FN={s.fn} P={p:.3f} R={r:.3f} F1={f:.3f}")
    if result.unmapped:
        lines.append("not scored (no concept of the family): " + ", ".join(result.unmapped))
    return "\n".join(lines)
