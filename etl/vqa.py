"""Multiple-choice VQA items, comparative (a prior/current pair) and single-study, from labels.

Question types (wording and option vocabularies are data: ``config/vqa_templates.yaml``):

========================  =====  ==========================================================================
type                      scope  answer
========================  =====  ==========================================================================
``change``                pair   the pair's change label of the entity (``pairs.change_labels``)
``comparison_presence``   pair   prior only / current only / both / neither, from the two studies' states;
                                 only where both states are ``present`` or ``absent``
``presence``              study  the study's state of the entity: present / absent / uncertain
                                 (``not_mentioned`` gives no item)
``location``              study  the anatomy concept of a finding (``Concept.anatomy_id``) that the study
                                 reports ``present``; options from the family's anatomy concepts
========================  =====  ==========================================================================

Items exist only for entities with labels. Every item has exactly ``cfg.n_options`` distinct option
strings, one of them right. Distractors come from the same vocabulary, minus options confusable with the
answer (``confusable`` groups), ordered by sha256(``item_id|option``) and taken first-come, so the draw is
deterministic and needs no RNG state. The right option's position is sha256(``item_id|answer-position``)
mod ``n_options``, which makes answer letters uniform over items. The question paraphrase is picked by
sha256(``item_id|question``). Item format after the MedReCo comparative VQA release (two images, question,
entity, options A-D, answer letter) and the MIMIC-Diff-VQA question set (Hu et al., KDD 2023).

Per pair and per study at most ``cfg.max_items_per_pair`` items are kept, taken round-robin over the
question types in template-file order, each type's candidates in ``item_id`` order.

Entity names in questions are ``Concept.preferred_name`` in lower case (all-capital acronyms kept). A
finding whose name is shared by another concept of the same family gets its anatomy appended
("bone deformity in the ribs"), so one question text never has two answers in one study; such findings
get no ``location`` item (the name gives the answer away).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from itertools import pairwise
from pathlib import Path

import polars as pl
import pyarrow as pa
import yaml

from schemas.base import table_from_rows
from schemas.config import VQAConfig
from schemas.ontology import Ontology
from schemas.vqa import SCHEMA

LETTERS = "ABCDEF"
QUESTION_TYPES = ("change", "comparison_presence", "presence", "location")
SCOPES = {"change": "pair", "comparison_presence": "pair", "presence": "study", "location": "study"}
#: option keys the code can produce as a right answer, per fixed-vocabulary question type.
ANSWER_KEYS: dict[str, tuple[str, ...]] = {
    "change": ("new", "increased", "decreased", "unchanged", "resolved", "improved", "worsened"),
    "comparison_presence": ("prior_only", "current_only", "both", "neither"),
    "presence": ("present", "absent", "uncertain"),
}
DEFAULT_TEMPLATES = Path(__file__).resolve().parents[1] / "config" / "vqa_templates.yaml"

_PAIR_COLUMNS = (
    "pair_id",
    "patient_key",
    "prior_study_key",
    "current_study_key",
    "family",
    "change_labels",
    "shard",
)
_STUDY_COLUMNS = ("study_key", "patient_key", "family", "shard")
_LABEL_COLUMNS = ("study_key", "entity_id", "state")
_SPLIT_COLUMNS = ("patient_key", "split")


class VQATemplateError(ValueError):
    """A template file that cannot be used; ``reason`` is a machine-readable code.

    Reason codes: ``missing_file``, ``invalid_yaml``, ``bad_structure``, ``unknown_question_type``,
    ``bad_placeholder``, ``missing_answer_option``, ``duplicate_option``, ``too_few_options``.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"[{reason}] {message}")
        self.reason = reason


class VQAInputError(ValueError):
    """Bad input to :func:`build_vqa`; ``reason`` is a machine-readable code.

    Reason codes: ``missing_column``, ``null_value``, ``duplicate_label``, ``unknown_entity``,
    ``entity_not_in_family``, ``unknown_family``, ``unknown_change``, ``unknown_study``,
    ``patient_without_split``, ``too_few_options``, ``duplicate_item``.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"[{reason}] {message}")
        self.reason = reason


# --------------------------------------------------------------------------------------------- templates


def _check_question(qtype: str, text: object) -> str:
    if not isinstance(text, str) or not text.strip():
        raise VQATemplateError("bad_structure", f"{qtype}: every question must be a non-empty string")
    try:
        rendered = text.format(entity="X")
    except (KeyError, IndexError, ValueError) as err:
        raise VQATemplateError(
            "bad_placeholder", f"{qtype}: question {text!r} uses an unknown placeholder {err}"
        ) from None
    if "{entity}" not in text or "{" in rendered:
        raise VQATemplateError(
            "bad_placeholder", f"{qtype}: question {text!r} must contain {{entity}} exactly"
        )
    return text


def validate_templates(data: object, source: str = "<dict>") -> dict:
    """Check a parsed template mapping and return it normalised.

    Returns
    -------
    dict
        ``{"version": str, "question_types": {type: {"scope", "questions": [str], "options": {key: text},
        "confusable": [[key, ...]]}}}`` in file order.

    Raises
    ------
    VQATemplateError
        ``bad_structure``, ``unknown_question_type``, ``bad_placeholder``, ``missing_answer_option``
        or ``duplicate_option``, naming the question type.
    """
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("question_types"), dict)
        or not data["question_types"]
    ):
        raise VQATemplateError("bad_structure", f"{source}: needs a non-empty 'question_types' mapping")
    out: dict = {"version": str(data.get("version", "")), "question_types": {}}
    for qtype, spec in data["question_types"].items():
        if qtype not in QUESTION_TYPES:
            raise VQATemplateError(
                "unknown_question_type", f"{source}: {qtype!r} is not one of {QUESTION_TYPES}"
            )
        if not isinstance(spec, dict):
            raise VQATemplateError("bad_structure", f"{source}: {qtype} must be a mapping")
        if spec.get("scope", SCOPES[qtype]) != SCOPES[qtype]:
            raise VQATemplateError("bad_structure", f"{source}: {qtype} has scope {SCOPES[qtype]!r}")
        questions = spec.get("questions")
        if not isinstance(questions, list) or not questions:
            raise VQATemplateError("bad_structure", f"{source}: {qtype} needs a non-empty 'questions' list")
        entry = {"scope": SCOPES[qtype], "questions": [_check_question(qtype, q) for q in questions]}
        if qtype in ANSWER_KEYS:
            options = spec.get("options")
            if not isinstance(options, dict) or not all(isinstance(v, str) and v for v in options.values()):
                raise VQATemplateError(
                    "bad_structure", f"{source}: {qtype} needs an 'options' key -> text mapping"
                )
            missing = [k for k in ANSWER_KEYS[qtype] if k not in options]
            if missing:
                raise VQATemplateError("missing_answer_option", f"{source}: {qtype} options lack {missing}")
            if len(set(options.values())) != len(options):
                raise VQATemplateError("duplicate_option", f"{source}: {qtype} repeats an option text")
            groups = spec.get("confusable", []) or []
            for g in groups:
                if not isinstance(g, list) or not set(g) <= set(options):
                    raise VQATemplateError(
                        "bad_structure", f"{source}: {qtype} confusable group {g!r} names unknown keys"
                    )
            entry["options"] = {str(k): v for k, v in options.items()}
            entry["confusable"] = [list(g) for g in groups]
        out["question_types"][qtype] = entry
    return out


def load_templates(path: str | Path = DEFAULT_TEMPLATES) -> dict:
    """Read and validate a VQA template YAML file (default ``config/vqa_templates.yaml``).

    Returns
    -------
    dict
        see :func:`validate_templates`.

    Raises
    ------
    VQATemplateError
        ``missing_file``, ``invalid_yaml`` or any code of :func:`validate_templates`.
    """
    p = Path(path)
    if not p.is_file():
        raise VQATemplateError("missing_file", f"VQA template file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as err:
        raise VQATemplateError("invalid_yaml", f"{p} is not valid YAML: {err}") from None
    return validate_templates(data, str(p))


def _check_option_counts(templates: dict, n_options: int) -> None:
    for qtype, spec in templates["question_types"].items():
        if qtype not in ANSWER_KEYS:
            continue
        for key in ANSWER_KEYS[qtype]:
            excluded = {key}.union(*[set(g) for g in spec["confusable"] if key in g])
            available = len(set(spec["options"]) - excluded)
            if available < n_options - 1:
                raise VQATemplateError(
                    "too_few_options",
                    f"{qtype}: answer {key!r} leaves {available} distractors, {n_options - 1} needed "
                    f"(vqa.n_options={n_options}); add options or drop the type from the template file",
                )


# --------------------------------------------------------------------------------------------- helpers


def _h(*parts: str) -> int:
    return int.from_bytes(hashlib.sha256("|".join(parts).encode()).digest()[:8], "big")


def item_id(anchor: str, question_type: str, entity_id: str) -> str:
    """sha256 of ``"anchor|question_type|entity_id"`` (anchor = pair_id or study_key), first 16 hex characters."""
    return hashlib.sha256(f"{anchor}|{question_type}|{entity_id}".encode()).hexdigest()[:16]


def _readable(name: str) -> str:
    """Lower-case a preferred name for use inside a sentence, keeping all-capital acronyms (COPD)."""
    return " ".join(w if (len(w) > 1 and w.isupper()) else w.lower() for w in name.split())


def _display_names(ontology: Ontology, family: str) -> dict[str, str]:
    """Entity id -> unambiguous in-sentence name within one family (see module docstring)."""
    concepts = ontology.family_concepts(family)
    base = {c.id: _readable(c.preferred_name) for c in concepts}
    counts: dict[str, int] = {}
    for name in base.values():
        counts[name] = counts.get(name, 0) + 1
    names = {}
    for c in concepts:
        name = base[c.id]
        if counts[name] > 1 and c.category == "finding" and c.anatomy_id in ontology.concepts:
            name = f"{name} in the {_readable(ontology.concepts[c.anatomy_id].preferred_name)}"
        names[c.id] = name
    seen: dict[str, int] = {}
    for name in names.values():
        seen[name] = seen.get(name, 0) + 1
    return {i: (f"{n} ({i})" if seen[n] > 1 else n) for i, n in names.items()}


def _options(
    iid: str, answer: str, candidates: Iterable[str], n: int, fallback: Iterable[str] = ()
) -> tuple[list[str], int]:
    """``n`` distinct option texts with ``answer`` at a hash-chosen position; returns (options, answer index)."""
    chosen: list[str] = []
    seen = {answer}
    for pool in (candidates, fallback):
        for text in sorted(set(pool) - seen, key=lambda t: (_h(iid, t), t)):
            if len(chosen) == n - 1:
                break
            chosen.append(text)
            seen.add(text)
    if len(chosen) < n - 1:
        raise VQAInputError(
            "too_few_options", f"item {iid}: only {len(chosen) + 1} distinct options, {n} needed"
        )
    pos = _h(iid, "answer-position") % n
    return chosen[:pos] + [answer] + chosen[pos:], pos


def _require(df: pl.DataFrame, columns: tuple[str, ...], name: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise VQAInputError("missing_column", f"{name} lacks column(s) {missing}")
    for c in columns:
        if c != "change_labels" and df.get_column(c).null_count():
            raise VQAInputError("null_value", f"{name}.{c} has null value(s)")


# --------------------------------------------------------------------------------------------- items


class _Builder:
    def __init__(self, templates: dict, cfg: VQAConfig, ontology: Ontology, splits: dict[str, str]) -> None:
        self.types = templates["question_types"]
        self.cfg = cfg
        self.ontology = ontology
        self.splits = splits
        self._names: dict[str, dict[str, str]] = {}

    def name(self, family: str, entity_id: str) -> str:
        """The in-sentence name of an entity in a family; raises on unknown or out-of-family entities."""
        if entity_id not in self.ontology.concepts:
            raise VQAInputError(
                "unknown_entity", f"entity {entity_id!r} is not in ontology {self.ontology.version}"
            )
        if family not in self._names:
            self._names[family] = _display_names(self.ontology, family)
        if entity_id not in self._names[family]:
            raise VQAInputError(
                "entity_not_in_family", f"entity {entity_id} does not belong to family {family}"
            )
        return self._names[family][entity_id]

    def _split(self, patient_key: str) -> str:
        if patient_key not in self.splits:
            raise VQAInputError("patient_without_split", "a patient with VQA items has no row in splits")
        return self.splits[patient_key]

    def _fixed(self, qtype: str, anchor: str, entity_id: str, answer_key: str) -> tuple[str, list[str], int]:
        spec = self.types[qtype]
        iid = item_id(anchor, qtype, entity_id)
        excluded = {answer_key}.union(*[set(g) for g in spec["confusable"] if answer_key in g])
        pool = [spec["options"][k] for k in spec["options"] if k not in excluded]
        options, pos = _options(iid, spec["options"][answer_key], pool, self.cfg.n_options)
        return iid, options, pos

    def _row(self, qtype, iid, family, entity_ids, options, pos, base) -> dict:
        questions = self.types[qtype]["questions"]
        template = questions[_h(iid, "question") % len(questions)]
        return {
            **base,
            "item_id": iid,
            "question_type": qtype,
            "question": template.format(entity=self.name(family, entity_ids[0])),
            "options": options,
            "answer": LETTERS[pos],
            "answer_text": options[pos],
            "entity_ids": entity_ids,
        }

    def pair_items(self, pair: dict, prior: dict[str, str], current: dict[str, str]) -> dict[str, list[dict]]:
        family, pid = pair["family"], pair["pair_id"]
        base = {
            "pair_id": pid,
            "study_key": None,
            "patient_key": pair["patient_key"],
            "split": self._split(pair["patient_key"]),
            "shard": pair["shard"],
        }
        out: dict[str, list[dict]] = {}
        if "change" in self.types:
            items = []
            for label in pair["change_labels"] or []:
                entity, change = label["entity_id"], label["change"]
                if change not in self.types["change"]["options"] or change not in ANSWER_KEYS["change"]:
                    raise VQAInputError("unknown_change", f"pair change label {change!r} has no option text")
                iid, options, pos = self._fixed("change", pid, entity, change)
                items.append(self._row("change", iid, family, [entity], options, pos, base))
            out["change"] = items
        if "comparison_presence" in self.types:
            items = []
            for entity in sorted(set(prior) & set(current)):
                states = (prior[entity], current[entity])
                key = {
                    ("present", "absent"): "prior_only",
                    ("absent", "present"): "current_only",
                    ("present", "present"): "both",
                    ("absent", "absent"): "neither",
                }.get(states)
                if key is None:
                    continue
                iid, options, pos = self._fixed("comparison_presence", pid, entity, key)
                items.append(self._row("comparison_presence", iid, family, [entity], options, pos, base))
            out["comparison_presence"] = items
        return out

    def study_items(self, study: dict, labels: dict[str, str]) -> dict[str, list[dict]]:
        family, skey = study["family"], study["study_key"]
        base = {
            "pair_id": None,
            "study_key": skey,
            "patient_key": study["patient_key"],
            "split": self._split(study["patient_key"]),
            "shard": study["shard"],
        }
        out: dict[str, list[dict]] = {}
        if "presence" in self.types:
            items = []
            for entity in sorted(labels):
                if labels[entity] in ANSWER_KEYS["presence"]:
                    iid, options, pos = self._fixed("presence", skey, entity, labels[entity])
                    items.append(self._row("presence", iid, family, [entity], options, pos, base))
            out["presence"] = items
        if "location" in self.types:
            out["location"] = [
                self._location(skey, family, entity, base)
                for entity in sorted(labels)
                if labels[entity] == "present" and self._locatable(family, entity)
            ]
        return out

    def _locatable(self, family: str, entity: str) -> bool:
        c = self.ontology.concepts.get(entity)
        if c is None or c.category != "finding" or c.anatomy_id not in self.ontology.concepts:
            self.name(family, entity)  # raises on unknown or out-of-family entities
            return False
        return self.name(family, entity) == _readable(c.preferred_name)

    def _location(self, skey: str, family: str, entity: str, base: dict) -> dict:
        onto = self.ontology
        iid = item_id(skey, "location", entity)
        answer = _readable(onto.concepts[onto.concepts[entity].anatomy_id].preferred_name)
        family_anatomy = [
            _readable(onto.concepts[a].preferred_name) for a in onto.families[family]["anatomy"]
        ]
        all_anatomy = [_readable(c.preferred_name) for c in onto.concepts.values() if c.category == "anatomy"]
        options, pos = _options(iid, answer, family_anatomy, self.cfg.n_options, fallback=all_anatomy)
        return self._row(
            "location", iid, family, [entity, onto.concepts[entity].anatomy_id], options, pos, base
        )


def _cap(per_type: dict[str, list[dict]], order: list[str], limit: int) -> list[dict]:
    """Round-robin over question types (template order), each type's items in item_id order."""
    queues = [sorted(per_type.get(t, []), key=lambda r: r["item_id"]) for t in order]
    taken: list[dict] = []
    i = 0
    while len(taken) < limit and any(i < len(q) for q in queues):
        taken.extend(q[i] for q in queues if i < len(q))
        i += 1
    return taken[:limit]


def build_vqa(
    pairs: pl.DataFrame,
    study_labels: pl.DataFrame,
    studies: pl.DataFrame,
    splits: pl.DataFrame,
    cfg: VQAConfig,
    templates: dict,
    ontology: Ontology,
) -> pa.Table:
    """Build the ``vqa`` items of one shard.

    Parameters
    ----------
    pairs : polars.DataFrame
        ``pairs`` rows (:mod:`schemas.pairs`): ``pair_id``, ``patient_key``, ``prior_study_key``,
        ``current_study_key``, ``family``, ``change_labels`` (list of {entity_id, change, source}), ``shard``.
    study_labels : polars.DataFrame
        ``study_labels`` rows: ``study_key``, ``entity_id``, ``state``; one row per (study, entity).
    studies : polars.DataFrame
        ``studies`` rows: ``study_key``, ``patient_key``, ``family`` (null: no study-level items), ``shard``.
        Every labelled study must be here.
    splits : polars.DataFrame
        ``splits`` rows: ``patient_key``, ``split``; every patient with an item must be here.
    cfg : schemas.config.VQAConfig
        ``n_options`` (options per item, 2-6) and ``max_items_per_pair`` (cap per pair and per study).
    templates : dict
        from :func:`load_templates`.
    ontology : schemas.ontology.Ontology
        entity names and anatomy vocabularies.

    Returns
    -------
    pyarrow.Table
        :data:`schemas.vqa.SCHEMA`, sorted by ``item_id``. Pair items carry ``pair_id`` (``study_key``
        null), single-study items carry ``study_key`` (``pair_id`` null). ``answer`` is the letter
        (A-F) of ``answer_text`` in ``options``; ``entity_ids`` is ``[entity]`` or, for ``location``,
        ``[finding, anatomy]``.

    Raises
    ------
    VQATemplateError
        ``too_few_options`` when a fixed vocabulary cannot give ``cfg.n_options`` options.
    VQAInputError
        on a missing column, a null key, a repeated (study, entity) label, an entity not in the ontology
        or not in the study's family, a change label without option text, a labelled study missing from
        ``studies``, or a patient missing from ``splits``.
    """
    if pairs.height == 0 and studies.height == 0:
        return SCHEMA.empty_table()
    templates = validate_templates(templates)
    _check_option_counts(templates, cfg.n_options)
    order = list(templates["question_types"])

    states: dict[str, dict[str, str]] = {}
    if study_labels.height:
        _require(study_labels, _LABEL_COLUMNS, "study_labels")
        for study_key, entity_id, state in study_labels.select(_LABEL_COLUMNS).iter_rows():
            per = states.setdefault(study_key, {})
            if entity_id in per:
                raise VQAInputError("duplicate_label", f"study_labels repeats entity {entity_id} of a study")
            per[entity_id] = state
    split_of: dict[str, str] = {}
    if splits.height:
        _require(splits, _SPLIT_COLUMNS, "splits")
        split_of = dict(splits.select(_SPLIT_COLUMNS).iter_rows())
    builder = _Builder(templates, cfg, ontology, split_of)

    rows: list[dict] = []
    if studies.height:
        _require(studies, ("study_key", "patient_key", "shard"), "studies")
        if "family" not in studies.columns:
            raise VQAInputError("missing_column", "studies lacks column(s) ['family']")
        known = set(studies.get_column("study_key").to_list())
        unknown = set(states) - known
        if unknown:
            raise VQAInputError("unknown_study", f"{len(unknown)} labelled study(ies) are not in studies")
        for study in studies.select(_STUDY_COLUMNS).to_dicts():
            labels = states.get(study["study_key"])
            if study["family"] is None or not labels:
                continue
            if study["family"] not in ontology.families:
                raise VQAInputError("unknown_family", f"family {study['family']!r} is not in the ontology")
            rows.extend(_cap(builder.study_items(study, labels), order, cfg.max_items_per_pair))
    if pairs.height:
        _require(pairs, _PAIR_COLUMNS, "pairs")
        for pair in pairs.select(_PAIR_COLUMNS).to_dicts():
            if pair["family"] not in ontology.families:
                raise VQAInputError("unknown_family", f"family {pair['family']!r} is not in the ontology")
            items = builder.pair_items(
                pair, states.get(pair["prior_study_key"], {}), states.get(pair["current_study_key"], {})
            )
            rows.extend(_cap(items, order, cfg.max_items_per_pair))
    rows.sort(key=lambda r: r["item_id"])
    for a, b in pairwise(rows):
        if a["item_id"] == b["item_id"]:
            raise VQAInputError(
                "duplicate_item", f"item {a['item_id']} generated twice (repeated pair or label)"
            )
    return table_from_rows(rows, SCHEMA)
