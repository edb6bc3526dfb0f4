"""Evaluation of entity extraction against the Open-i labels (NLM MeSH codes and NegBio's ChestX-ray14 gold).

A directory in the Open-i layout (``../shared/data/openi``) holds ``indiana_reports.csv`` (columns ``uid``,
``MeSH``, ``indication``, ``comparison``, ``findings``, ``impression``; Demner-Fushman D. et al., JAMIA
2016;23(2):304-310) and optionally ``negbio_openi_gold14_labels.csv`` (``uid`` + the 14 ChestX-ray14 labels
+ ``normal``, 0/1; NegBio, Peng Y. et al., AMIA Jt Summits Transl Sci Proc 2018:188-196).

Per report, the text is rebuilt with section headers (``INDICATION: ... COMPARISON: ... FINDINGS: ...
IMPRESSION: ...``, empty sections left out) and run through :class:`EntityExtractor` for one family
(default 2D-CXR). The *predicted present set* is what the product stores: the concepts whose
:func:`~entity_extraction.extract.study_labels` state is ``present``, i.e. present in IMPRESSION, else in
FINDINGS (indication and comparison describe the request and the prior, never the current study). The *gold
set* maps the report's labels through the data files ``openi_mesh_map.yaml`` / ``negbio14_map.yaml``.
Both sets are restricted to the *scored concepts*: the concepts of the family that the label map can name.
Gold concepts outside the family (e.g. emphysema, a 3D-CT concept) cannot be predicted by a family-restricted
extractor; they are counted and reported, not scored.

Figures: per entity TP/FP/FN with precision TP/(TP+FP), recall TP/(TP+FN), F1 = 2TP/(2TP+FP+FN) (0 when
undefined); micro figures pool the counts over entities; macro figures average per-entity precision, recall
and F1 over the entities with at least one gold positive.
"""

from __future__ import annotations

import csv
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from schemas.errors import ReasonCodedError
from schemas.ontology import Ontology, load_ontology

MESH_MAP_FILE = Path(__file__).with_name("openi_mesh_map.yaml")
NEGBIO_MAP_FILE = Path(__file__).with_name("negbio14_map.yaml")
OPENI_ASSERTION_FILE = Path(__file__).with_name("openi_assertion_map.yaml")
REPORTS_FILE = "indiana_reports.csv"
NEGBIO_FILE = "negbio_openi_gold14_labels.csv"
REPORT_COLUMNS = ("uid", "MeSH", "findings", "impression")
#: report columns turned into sections, in report order, with the header written before each.
SECTION_COLUMNS = (
    ("indication", "INDICATION"),
    ("comparison", "COMPARISON"),
    ("findings", "FINDINGS"),
    ("impression", "IMPRESSION"),
)
LABEL_SETS = ("mesh", "negbio")


class EvaluationDataError(ReasonCodedError, ValueError):
    """A labelled directory or a label map cannot be used (``reason``: ``not_a_directory``,
    ``missing_reports``, ``missing_columns``, ``missing_labels``, ``invalid_map``, ``unknown_label_set``)."""


def _norm(term: str) -> str:
    return " ".join(term.split()).lower()


# ------------------------------------------------------------------ label maps
@dataclass(frozen=True)
class MeshRule:
    """One rule of a MeSH head term: applies when ``qualifiers`` is empty or shares a qualifier with the term."""

    qualifiers: frozenset[str]
    ids: tuple[str, ...]
    reason: str | None


@dataclass(frozen=True)
class MeshMap:
    """The MeSH-to-concept map (:data:`MESH_MAP_FILE`); keys are normalised head terms (lower case)."""

    family: str
    special: dict[str, str]
    mapped: dict[str, tuple[MeshRule, ...]]
    unmapped: dict[str, str]

    def known(self, head: str) -> bool:
        """Whether the head term (any case/spacing) is special, mapped or listed unmapped."""
        key = _norm(head)
        return key in self.special or key in self.mapped or key in self.unmapped

    def concepts(self, term: str) -> tuple[str, ...] | None:
        """Concept ids one MeSH term names.

        Parameters
        ----------
        term : str
            ``'Head/qualifier/...'`` as in the Open-i MeSH column.

        Returns
        -------
        tuple of str or None
            The ids of the first applying rule; ``()`` when the term names no concept (unmapped head, a rule
            with a reason, or a special term); ``None`` when the head term is not in the map at all.
        """
        parts = [p.strip() for p in term.split("/")]
        key = _norm(parts[0])
        if key in self.special or key in self.unmapped:
            return ()
        rules = self.mapped.get(key)
        if rules is None:
            return None
        quals = {_norm(q) for q in parts[1:]}
        for rule in rules:
            if not rule.qualifiers or rule.qualifiers & quals:
                return rule.ids
        return ()


def load_mesh_map(path: str | Path | None = None, ontology: Ontology | None = None) -> MeshMap:
    """Load and check the MeSH map.

    Parameters
    ----------
    path : str or Path, optional
        YAML file (default :data:`MESH_MAP_FILE`); layout described in its header comment.
    ontology : Ontology, optional
        For the id check (default :func:`schemas.ontology.load_ontology`).

    Returns
    -------
    MeshMap

    Raises
    ------
    EvaluationDataError
        ``invalid_map``: unreadable file, a rule with both or neither of ``ids``/``reason``, a rule list
        without a final catch-all rule, an id not in the ontology, a head listed twice, an unknown family.
    """
    onto = ontology or load_ontology()
    path = Path(path or MESH_MAP_FILE)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        family = data["family"]
        special = {_norm(k): str(v) for k, v in data.get("special", {}).items()}
        unmapped = {_norm(k): str(v) for k, v in data.get("unmapped", {}).items()}
        raw_mapped = data["mapped"]
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError) as exc:
        raise EvaluationDataError("invalid_map", f"{path.name}: {exc}") from exc
    if family not in onto.families:
        raise EvaluationDataError("invalid_map", f"{path.name}: unknown family {family!r}")
    mapped: dict[str, tuple[MeshRule, ...]] = {}
    for head, rules in raw_mapped.items():
        key = _norm(head)
        if key in mapped or key in unmapped or key in special:
            raise EvaluationDataError("invalid_map", f"{path.name}: head term {head!r} listed twice")
        parsed = []
        for rule in rules or ():
            ids, reason = tuple(rule.get("ids") or ()), rule.get("reason")
            if bool(ids) == bool(reason):
                raise EvaluationDataError("invalid_map", f"{path.name}: {head!r}: a rule needs ids or reason, not both")
            unknown = [i for i in ids if i not in onto.concepts]
            if unknown:
                raise EvaluationDataError("invalid_map", f"{path.name}: {head!r}: ids not in the ontology {unknown}")
            parsed.append(MeshRule(frozenset(_norm(q) for q in rule.get("qualifiers") or ()), ids, reason))
        if not parsed or parsed[-1].qualifiers:
            raise EvaluationDataError("invalid_map", f"{path.name}: {head!r}: rule list must end with a catch-all rule")
        mapped[key] = tuple(parsed)
    return MeshMap(family=family, special=special, mapped=mapped, unmapped=unmapped)


@dataclass(frozen=True)
class LabelMap:
    """A per-label map (:data:`NEGBIO_MAP_FILE`): ``mapped`` label -> ids, ``unmapped`` label -> reason."""

    family: str
    mapped: dict[str, tuple[str, ...]]
    unmapped: dict[str, str]


def load_label_map(path: str | Path | None = None, ontology: Ontology | None = None) -> LabelMap:
    """Load and check the NegBio ChestX-ray14 label map.

    Parameters
    ----------
    path : str or Path, optional
        YAML file (default :data:`NEGBIO_MAP_FILE`).
    ontology : Ontology, optional
        For the id check (default :func:`schemas.ontology.load_ontology`).

    Returns
    -------
    LabelMap

    Raises
    ------
    EvaluationDataError
        ``invalid_map``: unreadable file, empty id list, id not in the ontology, a label both mapped and
        unmapped, an unknown family.
    """
    onto = ontology or load_ontology()
    path = Path(path or NEGBIO_MAP_FILE)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        family = data["family"]
        mapped = {str(k): tuple(v) for k, v in data["mapped"].items()}
        unmapped = {str(k): str(v) for k, v in data.get("unmapped", {}).items()}
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError) as exc:
        raise EvaluationDataError("invalid_map", f"{path.name}: {exc}") from exc
    if family not in onto.families:
        raise EvaluationDataError("invalid_map", f"{path.name}: unknown family {family!r}")
    for label, ids in mapped.items():
        if not ids or any(i not in onto.concepts for i in ids) or label in unmapped:
            raise EvaluationDataError("invalid_map", f"{path.name}: {label!r}: bad ids {ids} or also unmapped")
    return LabelMap(family=family, mapped=mapped, unmapped=unmapped)


def load_coded_hedges(path: str | Path | None = None) -> frozenset[str]:
    """Uncertainty cues NLM's Open-i indexing codes as present (:data:`OPENI_ASSERTION_FILE`, ``coded_hedges``).

    Returns
    -------
    frozenset of str
        ConText rule literals, lower case (``"versus"``, ``"probable"``); see :func:`open_i_reading`.

    Raises
    ------
    EvaluationDataError
        ``invalid_map``: unreadable file, or ``coded_hedges`` missing, empty or not a list of strings.
    """
    path = Path(path or OPENI_ASSERTION_FILE)
    try:
        hedges = yaml.safe_load(path.read_text(encoding="utf-8"))["coded_hedges"]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise EvaluationDataError("invalid_map", f"{path.name}: {exc}") from exc
    if not isinstance(hedges, list) or not hedges or not all(isinstance(h, str) and h.strip() for h in hedges):
        raise EvaluationDataError("invalid_map", f"{path.name}: coded_hedges must be a non-empty list of strings")
    return frozenset(_norm(h) for h in hedges)


def open_i_reading(mentions: list[dict], coded_hedges: frozenset[str]) -> list[dict]:
    """Mentions as NLM's Open-i indexing reads them: an ``uncertain`` mention whose every uncertainty cue
    (``hedges``, the ConText literals that made it uncertain) is in ``coded_hedges`` becomes ``present``.

    An evaluation-time mapping (the product keeps its own convention): "atelectasis versus scar" names two coded
    findings for NLM, "may represent atelectasis" none. Mentions without ``hedges`` (another extractor's output)
    are left as they are. Returns new dicts for the changed mentions; the input is not modified.
    """
    out = []
    for m in mentions:
        hedges = m.get("hedges") or ()
        if m["assertion"] == "uncertain" and hedges and all(h in coded_hedges for h in hedges):
            m = {**m, "assertion": "present"}
        out.append(m)
    return out


# ------------------------------------------------------------------ data
@dataclass(frozen=True)
class OpeniReport:
    """One labelled report: ``uid``, section texts, raw ``mesh`` terms and NegBio ``labels`` (None if absent)."""

    uid: str
    sections: dict[str, str]
    mesh: tuple[str, ...]
    labels: dict[str, int] | None = None

    @property
    def text(self) -> str:
        """The report with section headers, e.g. ``"FINDINGS: ...\\nIMPRESSION: ..."`` (empty sections omitted)."""
        return "\n".join(f"{header}: {self.sections[col]}" for col, header in SECTION_COLUMNS if self.sections.get(col))


def load_openi_dir(directory: str | Path) -> list[OpeniReport]:
    """Read an Open-i-layout directory.

    Parameters
    ----------
    directory : str or Path
        Holds ``indiana_reports.csv`` and optionally ``negbio_openi_gold14_labels.csv`` (joined on ``uid``).

    Returns
    -------
    list of OpeniReport
        In file order; ``labels`` is None for every report when the NegBio file is absent, and for a report
        the NegBio file does not list.

    Raises
    ------
    EvaluationDataError
        ``not_a_directory``, ``missing_reports`` (no reports CSV), ``missing_columns`` (reports CSV lacks
        ``uid``/``MeSH``/``findings``/``impression``, or the label CSV lacks ``uid``).
    """
    root = Path(directory)
    if not root.is_dir():
        raise EvaluationDataError("not_a_directory", f"{root} is not a directory")
    reports_path = root / REPORTS_FILE
    if not reports_path.is_file():
        raise EvaluationDataError("missing_reports", f"{root} has no {REPORTS_FILE}")
    labels: dict[str, dict[str, int]] = {}
    labels_path = root / NEGBIO_FILE
    if labels_path.is_file():
        with labels_path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            if "uid" not in (reader.fieldnames or ()):
                raise EvaluationDataError("missing_columns", f"{NEGBIO_FILE} has no 'uid' column")
            names = [n for n in reader.fieldnames or () if n not in ("uid", "filename")]
            for row in reader:
                labels[row["uid"].strip()] = {n: int(float(row[n] or 0)) for n in names}
    out = []
    with reports_path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in REPORT_COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise EvaluationDataError("missing_columns", f"{REPORTS_FILE} lacks columns {missing}")
        for row in reader:
            uid = row["uid"].strip()
            sections = {col: " ".join((row.get(col) or "").split()) for col, _ in SECTION_COLUMNS}
            mesh = tuple(t.strip() for t in (row["MeSH"] or "").split(";") if t.strip())
            out.append(OpeniReport(uid=uid, sections=sections, mesh=mesh, labels=labels.get(uid)))
    return out


# ------------------------------------------------------------------ scoring
@dataclass
class EntityScore:
    """Counts and figures for one concept."""

    entity_id: str
    name: str
    tp: int = 0
    fp: int = 0
    fn: int = 0

    @property
    def support(self) -> int:
        """Gold positives (TP + FN)."""
        return self.tp + self.fn

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else 0.0

    @property
    def recall(self) -> float:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else 0.0

    @property
    def f1(self) -> float:
        d = 2 * self.tp + self.fp + self.fn
        return 2 * self.tp / d if d else 0.0


@dataclass
class EvalResult:
    """Outcome of :func:`evaluate` for one label set.

    ``per_entity``: scored concept id -> :class:`EntityScore` (ontology order); ``micro``/``macro``:
    (precision, recall, F1); ``errors``: ``(uid, entity_id, 'FP'|'FN')`` in report order;
    ``out_of_family``: concept id -> gold positives the family cannot predict; ``unknown_terms``: MeSH
    head terms absent from the map -> count (they count as naming no concept).
    """

    label_set: str
    family: str
    n_reports: int
    n_excluded: int
    per_entity: dict[str, EntityScore]
    micro: tuple[float, float, float]
    macro: tuple[float, float, float]
    errors: list[tuple[str, str, str]] = field(default_factory=list)
    out_of_family: dict[str, int] = field(default_factory=dict)
    unknown_terms: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _figures(scores: list[EntityScore]) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    tp, fp, fn = (sum(getattr(s, k) for s in scores) for k in ("tp", "fp", "fn"))
    p = tp / (tp + fp) if tp + fp else 0.0
    r = tp / (tp + fn) if tp + fn else 0.0
    f = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0
    supported = [s for s in scores if s.support]
    if supported:
        n = len(supported)
        macro = (
            sum(s.precision for s in supported) / n,
            sum(s.recall for s in supported) / n,
            sum(s.f1 for s in supported) / n,
        )
    else:
        macro = (0.0, 0.0, 0.0)
    return (p, r, f), macro


def gold_sets(
    reports: list[OpeniReport],
    label_set: str,
    ontology: Ontology | None = None,
    mesh_map: MeshMap | None = None,
    label_map: LabelMap | None = None,
) -> tuple[dict[str, set[str]], set[str], Counter, list[str]]:
    """Gold concept sets per report for one label set.

    Parameters
    ----------
    reports : list of OpeniReport
    label_set : {"mesh", "negbio"}
    ontology, mesh_map, label_map : optional
        Defaults: the packaged ontology and maps.

    Returns
    -------
    gold : dict
        uid -> set of concept ids (all families); reports without usable labels are absent (MeSH: only
        'No Indexing' or no terms; NegBio: not in the label file).
    universe : set of str
        Concept ids the label map can name. NegBio: a label with no positive report in the set is treated
        as not annotated there (e.g. ChestX-ray14 'Hernia' is 0 for every Open-i report although NLM coded
        30 hiatal hernias): its concepts leave the universe unless another label with positives maps to them.
    unknown : Counter
        MeSH head terms not in the map (empty for NegBio).
    notes : list of str
        Human-readable notes on what was left out (shown by :func:`render_table`).

    Raises
    ------
    EvaluationDataError
        ``unknown_label_set``; ``missing_labels`` (NegBio requested, no report has NegBio labels).
    """
    onto = ontology or load_ontology()
    gold: dict[str, set[str]] = {}
    unknown: Counter = Counter()
    if label_set == "mesh":
        mmap = mesh_map or load_mesh_map(ontology=onto)
        universe = {i for rules in mmap.mapped.values() for r in rules for i in r.ids}
        no_index = {k for k, v in mmap.special.items() if k != "normal"}
        for rep in reports:
            heads = {_norm(t.split("/")[0]) for t in rep.mesh}
            if not heads or heads <= no_index:
                continue
            ids: set[str] = set()
            for term in rep.mesh:
                found = mmap.concepts(term)
                if found is None:
                    unknown[term.split("/")[0].strip()] += 1
                    continue
                ids.update(found)
            gold[rep.uid] = ids
        return gold, universe, unknown, []
    if label_set == "negbio":
        lmap = label_map or load_label_map(ontology=onto)
        universe = {i for ids in lmap.mapped.values() for i in ids}
        for rep in reports:
            if rep.labels is None:
                continue
            gold[rep.uid] = {i for lab, ids in lmap.mapped.items() if rep.labels.get(lab) == 1 for i in ids}
        if not gold:
            raise EvaluationDataError("missing_labels", f"no report has NegBio labels ({NEGBIO_FILE})")
        positive = {lab for rep in reports if rep.labels for lab, v in rep.labels.items() if v == 1}
        empty = sorted(lab for lab in lmap.mapped if lab not in positive)
        kept = {i for lab, ids in lmap.mapped.items() if lab in positive for i in ids}
        universe &= kept
        notes = (
            [f"labels without a positive report here (not annotated, not scored): {', '.join(empty)}"] if empty else []
        )
        return gold, universe, unknown, notes
    raise EvaluationDataError("unknown_label_set", f"label set {label_set!r} not in {LABEL_SETS}")


def predicted_sets(
    reports: list[OpeniReport],
    family: str = "2D-CXR",
    extractor=None,
    ontology: Ontology | None = None,
    states: tuple[str, ...] = ("present",),
    coded_hedges: frozenset[str] | None = None,
) -> dict[str, set[str]]:
    """Concepts extraction marks present per report (``study_labels`` state ``present``).

    Parameters
    ----------
    reports : list of OpeniReport
    family : str, default "2D-CXR"
    extractor : EntityExtractor, optional
        Built on ``ontology`` when omitted (about a second).
    ontology : Ontology, optional
    states : tuple of str, default ("present",)
        Study-label states counted as predicted (``("present", "uncertain")``: a hedged finding counts as coded).
    coded_hedges : frozenset of str, optional
        Read the mentions as NLM's Open-i indexing does first (:func:`open_i_reading`; None: the product's
        convention as stored).

    Returns
    -------
    dict
        uid -> set of concept ids of ``family``.
    """
    from entity_extraction.extract import EntityExtractor, study_labels

    onto = ontology or load_ontology()
    ex = extractor or EntityExtractor(ontology=onto)
    out = {}
    for rep, mentions in zip(reports, ex.extract_many([r.text for r in reports], family)):
        if coded_hedges is not None:
            mentions = open_i_reading(mentions, coded_hedges)
        out[rep.uid] = {row["entity_id"] for row in study_labels(mentions, family, onto) if row["state"] in states}
    return out


def score(
    gold: dict[str, set[str]],
    predicted: dict[str, set[str]],
    universe: set[str],
    family: str,
    label_set: str,
    ontology: Ontology | None = None,
    n_reports: int | None = None,
    unknown: Counter | None = None,
    notes: list[str] | None = None,
) -> EvalResult:
    """Per-entity and pooled figures from gold and predicted sets.

    Parameters
    ----------
    gold : dict
        uid -> gold concept ids (reports absent here are not scored).
    predicted : dict
        uid -> predicted present concept ids (missing uid = nothing predicted).
    universe : set of str
        Concepts the label map can name; scored concepts = universe ∩ family concepts.
    family, label_set : str
    ontology : Ontology, optional
    n_reports : int, optional
        Reports read (default ``len(gold)``); ``n_excluded = n_reports - len(gold)``.
    unknown : Counter, optional
        Unmapped-by-omission MeSH heads, carried into the result.
    notes : list of str, optional
        Carried into the result (see :func:`gold_sets`).

    Returns
    -------
    EvalResult
    """
    onto = ontology or load_ontology()
    fam_ids = [c.id for c in onto.family_concepts(family)]
    scored = [i for i in fam_ids if i in universe]
    scored_set = set(scored)
    per = {i: EntityScore(i, onto.concepts[i].preferred_name) for i in scored}
    errors: list[tuple[str, str, str]] = []
    oof: Counter = Counter()
    for uid, g_all in gold.items():
        g = g_all & scored_set
        oof.update(i for i in g_all if i not in scored_set)
        p = predicted.get(uid, set()) & scored_set
        for i in scored:
            if i in g and i in p:
                per[i].tp += 1
            elif i in p:
                per[i].fp += 1
                errors.append((uid, i, "FP"))
            elif i in g:
                per[i].fn += 1
                errors.append((uid, i, "FN"))
    micro, macro = _figures(list(per.values()))
    n = len(gold) if n_reports is None else n_reports
    return EvalResult(
        label_set=label_set,
        family=family,
        n_reports=n,
        n_excluded=n - len(gold),
        per_entity=per,
        micro=micro,
        macro=macro,
        errors=errors,
        out_of_family=dict(oof.most_common()),
        unknown_terms=dict(unknown or {}),
        notes=list(notes or ()),
    )


def evaluate(
    directory: str | Path,
    label_sets: tuple[str, ...] = LABEL_SETS,
    family: str | None = None,
    extractor=None,
    ontology: Ontology | None = None,
    coded_hedges: frozenset[str] | None = None,
) -> dict[str, EvalResult]:
    """Score extraction on an Open-i-layout directory.

    Parameters
    ----------
    directory : str or Path
        See :func:`load_openi_dir`.
    label_sets : tuple of {"mesh", "negbio"}
        Which gold to score against.
    family : str, optional
        Modality family (default: the MeSH map's, 2D-CXR).
    extractor : EntityExtractor, optional
    ontology : Ontology, optional
    coded_hedges : frozenset of str, optional
        See :func:`predicted_sets` (None: the product's convention).

    Returns
    -------
    dict
        label set -> :class:`EvalResult`.

    Raises
    ------
    EvaluationDataError
        See :func:`load_openi_dir` and :func:`gold_sets`.
    """
    onto = ontology or load_ontology()
    reports = load_openi_dir(directory)
    for ls in label_sets:
        if ls not in LABEL_SETS:
            raise EvaluationDataError("unknown_label_set", f"label set {ls!r} not in {LABEL_SETS}")
    golds = {ls: gold_sets(reports, ls, onto) for ls in label_sets}
    fam = family or load_mesh_map(ontology=onto).family
    predicted = predicted_sets(reports, fam, extractor, onto, coded_hedges=coded_hedges)
    results = {
        ls: score(g, predicted, universe, fam, ls, onto, len(reports), unknown, notes)
        for ls, (g, universe, unknown, notes) in golds.items()
    }
    if "negbio" in results:
        results["negbio"].notes.append(negbio_ceiling_note(reports, golds["negbio"], fam, onto))
    return results


def evaluate_by_fold(
    directory: str | Path,
    label_sets: tuple[str, ...],
    plan,
    extractor=None,
    ontology: Ontology | None = None,
    states: tuple[str, ...] = ("present",),
    coded_hedges: frozenset[str] | None = None,
) -> dict[str, dict[str, EvalResult]]:
    """:func:`evaluate` on all reports and on each part of a fold plan (k-fold discipline,
    :mod:`entity_extraction.folds`).

    Parameters
    ----------
    directory, label_sets, extractor, ontology
        As :func:`evaluate`.
    plan : entity_extraction.folds.FoldPlan
        Folds of the set (record id = ``uid``).
    states, coded_hedges
        See :func:`predicted_sets`.

    Returns
    -------
    dict
        label set -> {``"all"``, ``"tuned"``, ``"held-out"``} -> :class:`EvalResult` (one extraction run).

    Raises
    ------
    EvaluationDataError
        As :func:`evaluate`.
    """
    onto = ontology or load_ontology()
    reports = load_openi_dir(directory)
    fam = load_mesh_map(ontology=onto).family
    predicted = predicted_sets(reports, fam, extractor, onto, states, coded_hedges)
    out: dict[str, dict[str, EvalResult]] = {}
    for ls in label_sets:
        if ls not in LABEL_SETS:
            raise EvaluationDataError("unknown_label_set", f"label set {ls!r} not in {LABEL_SETS}")
        gold, universe, unknown, notes = gold_sets(reports, ls, onto)
        out[ls] = {"all": score(gold, predicted, universe, fam, ls, onto, len(reports), unknown, notes)}
        for part in ("tuned", "held-out"):
            sub = {uid: g for uid, g in gold.items() if plan.part(uid) == part}
            out[ls][part] = score(sub, predicted, universe, fam, ls, onto)
    return out


def negbio_ceiling_note(reports: list[OpeniReport], negbio_gold: tuple, family: str, ontology: Ontology) -> str:
    """What a perfect extractor (by NLM's MeSH codes) would score against NegBio: the bound its narrower labels set.

    NegBio's 14 labels are NLM MeSH head terms (``Nodule`` is the head ``Nodule``, not ``Calcified Granuloma``;
    ``Consolidation`` is not ``Airspace Disease``; ``Fibrosis`` is not ``Cicatrix``), while a MedReCo concept
    covers all of them (F016, F007, F008): the MeSH gold sets, scored as predictions, give the ceiling.
    """
    gold, universe, _, _ = negbio_gold
    mesh_gold = gold_sets(reports, "mesh", ontology)[0]
    bound = score(gold, mesh_gold, universe, family, "negbio", ontology)
    (p, r, f), (_, _, af) = bound.micro, bound.macro
    return (
        f"ceiling (NLM MeSH gold scored as the prediction; NegBio labels are narrower MeSH heads than the concepts): "
        f"micro precision {p:.3f}, recall {r:.3f}, F1 {f:.3f}; macro F1 {af:.3f}"
    )


def negbio_ceiling_by_fold(directory: str | Path, plan, ontology: Ontology | None = None) -> dict[str, EvalResult]:
    """The NegBio ceiling (:func:`negbio_ceiling_note`: NLM's MeSH gold scored as the prediction) on all reports and
    on each part of a fold plan.

    No rule of ours enters it, so its held-out minus tuned difference is what the NegBio label set alone gives on
    that fold assignment: the yardstick for the extractor's NegBio gap (:mod:`entity_extraction.folds`).

    Parameters
    ----------
    directory : str or Path
        See :func:`load_openi_dir`; it must hold the NegBio label file.
    plan : entity_extraction.folds.FoldPlan
        Folds of the set (record id = ``uid``).
    ontology : Ontology, optional

    Returns
    -------
    dict
        ``"all"``, ``"tuned"``, ``"held-out"`` -> :class:`EvalResult` (label set ``negbio``).

    Raises
    ------
    EvaluationDataError
        As :func:`load_openi_dir` and :func:`gold_sets` (``missing_labels`` without NegBio labels).
    """
    onto = ontology or load_ontology()
    reports = load_openi_dir(directory)
    fam = load_mesh_map(ontology=onto).family
    gold, universe, _, _ = gold_sets(reports, "negbio", onto)
    mesh_gold = gold_sets(reports, "mesh", onto)[0]
    out = {"all": score(gold, mesh_gold, universe, fam, "negbio", onto)}
    for part in ("tuned", "held-out"):
        sub = {uid: g for uid, g in gold.items() if plan.part(uid) == part}
        out[part] = score(sub, mesh_gold, universe, fam, "negbio", onto)
    return out


_TITLES = {"mesh": "Open-i MeSH (NLM)", "negbio": "NegBio ChestX-ray14 gold"}


def render_table(result: EvalResult, ontology: Ontology | None = None, reading: str = "present findings") -> str:
    """Text table of one :class:`EvalResult`: one row per scored entity, then notes; last line micro/macro.

    ``reading``: what counts as predicted, named in the title line.

    Returns
    -------
    str
        Lines: a title, a header, entity rows (``id name TP FP FN P R F1``) in descending support, the
        out-of-family gold counts, and a final line
        ``micro P=... R=... F1=... | macro P=... R=... F1=...`` (three decimals).
    """
    onto = ontology or load_ontology()
    lines = [
        f"{_TITLES.get(result.label_set, result.label_set)}: {result.n_reports - result.n_excluded} reports "
        f"scored ({result.n_excluded} without labels left out), family {result.family}, {reading}",
        f"{'entity':<7} {'name':<38} {'TP':>5} {'FP':>5} {'FN':>5} {'P':>6} {'R':>6} {'F1':>6}",
    ]
    for s in sorted(result.per_entity.values(), key=lambda s: (-s.support, -s.fp, s.entity_id)):
        lines.append(
            f"{s.entity_id:<7} {s.name[:38]:<38} {s.tp:>5} {s.fp:>5} {s.fn:>5} "
            f"{s.precision:>6.3f} {s.recall:>6.3f} {s.f1:>6.3f}"
        )
    if result.out_of_family:
        parts = ", ".join(f"{i} {onto.concepts[i].preferred_name} {n}" for i, n in result.out_of_family.items())
        lines.append(f"not scored, gold outside {result.family}: {parts}")
    lines.extend(result.notes)
    if result.unknown_terms:
        lines.append(
            "MeSH heads not in the map (no concept assumed): "
            + ", ".join(f"{k} {v}" for k, v in result.unknown_terms.items())
        )
    (mp, mr, mf), (ap, ar, af) = result.micro, result.macro
    lines.append(f"micro P={mp:.3f} R={mr:.3f} F1={mf:.3f} | macro P={ap:.3f} R={ar:.3f} F1={af:.3f}")
    return "\n".join(lines)


def mesh_heads(reports_csv: str | Path) -> Counter:
    """Distinct MeSH head terms of an Open-i reports CSV with their counts (whitespace collapsed, case kept)."""
    heads: Counter = Counter()
    with Path(reports_csv).open(newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            for term in (row.get("MeSH") or "").split(";"):
                if term.strip():
                    heads[re.sub(r"\s+", " ", term.split("/")[0].strip())] += 1
    return heads
