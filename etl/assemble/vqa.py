"""VQA items, comparative (a prior/current pair, two cases) and single-study, multiple choice and open-ended.

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
strings, one of them right. The item's seed is its ``item_id`` (16 hex characters of sha256) as a 64-bit integer;
all draws are SplitMix64 of the seed with a fixed salt, vectorised, with no RNG state (:func:`draw_options`):
distractors come from the same vocabulary minus options confusable with the answer (``confusable`` groups), the
``n - 1`` with the smallest hash; the answer's position is hash mod ``n_options``, which makes answer letters
uniform over items; the question paraphrase is hash mod the number of paraphrases. The shown order is recorded
in ``option_keys`` (vocabulary keys, anatomy ids for ``location``). An item whose question contains its answer
text as whole words (case-insensitive) is dropped, and so is a location item whose question shares a word stem
with its anatomy answer ("pleural effusion" -> "pleura": :func:`_shares_stem`). ``study_keys`` names the images' studies
and ``mention_ids`` the ``entity_mentions`` of the entity in those studies (when mentions are given). Item format after
the MedReCo comparative VQA release (two images, question, entity, options A-D, answer letter) and the MIMIC-Diff-VQA
question set (Hu et al., KDD 2023).

Two-case items (``case_severity``, ``case_laterality``, ``case_presence``; scope ``case``) compare a query study
with its rank-1 reference case of another patient (``retrieval_targets``): :func:`build_case_comparison_vqa`,
run in the cross-patient retrieval stage. Open-ended items (``answer_format`` ``open_ended``, question types
``open_abnormality``, ``open_presence``, ``open_view``, ``open_location``, ``open_level``, ``open_type``,
``open_difference``) follow Medical-Diff-VQA (templates and keyword lists in the template file); their free-text
answers come from the labels, the deciding mentions' attributes (:func:`entity_attributes`), the image view and
the pair's change labels (:data:`OPEN_ANSWERS`); yes/no answers are balanced by :func:`balance_yes_no`.

Per pair and per study at most ``cfg.max_items_per_pair`` items are kept (per answer format), taken round-robin over the
question types in template-file order, each type's candidates in ``item_id`` order.

Entity names in questions are ``Concept.preferred_name`` in lower case (all-capital acronyms kept). A
finding whose name is shared by another concept of the same family gets its anatomy appended
("bone deformity in the ribs"), so one question text never has two answers in one study; such findings
get no ``location`` item (the name gives the answer away).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import yaml

from etl.assemble.frame_keys import has_duplicate_keys
from etl.assemble.shard_groups import DEFAULT_MAX_STUDIES, rows_of, shard_groups, study_keys_of
from schemas.config import CONFIG_DIR, VQAConfig
from schemas.errors import ReasonCodedError
from schemas.ontology import Ontology
from schemas.vqa import SCHEMA

LETTERS = "ABCDEF"
QUESTION_TYPES = (
    "change",
    "comparison_presence",
    "presence",
    "location",
    "case_severity",
    "case_laterality",
    "case_presence",
)
SCOPES = {
    "change": "pair",
    "comparison_presence": "pair",
    "presence": "study",
    "location": "study",
    "case_severity": "case",
    "case_laterality": "case",
    "case_presence": "case",
}
#: multiple-choice types of two cases (built by :func:`build_case_comparison_vqa` from retrieval targets)
CASE_TYPES = ("case_severity", "case_laterality", "case_presence")
#: option keys the code can produce as a right answer, per fixed-vocabulary question type.
ANSWER_KEYS: dict[str, tuple[str, ...]] = {
    "change": ("new", "increased", "decreased", "unchanged", "resolved", "improved", "worsened"),
    "comparison_presence": ("prior_only", "current_only", "both", "neither"),
    "presence": ("present", "absent", "uncertain"),
    "case_severity": ("more_severe", "less_severe", "same_severity"),
    "case_laterality": ("same_side", "opposite_side", "query_bilateral", "reference_bilateral"),
    "case_presence": ("query_only", "reference_only", "both", "neither"),
}
#: open-ended (Medical-Diff-VQA) question types and their scope; stored as ``"open_" + type``
OPEN_TYPES = {
    "abnormality": "study",
    "presence": "study",
    "view": "study",
    "location": "study",
    "level": "study",
    "type": "study",
    "difference": "pair",
}
OPEN_PREFIX = "open_"
#: open-ended answer kinds: kind -> (open type, question names an entity, yes/no answer)
OPEN_ANSWERS: dict[str, tuple[str, bool, bool]] = {
    "finding_list": ("abnormality", False, False),
    "any_abnormality": ("abnormality", False, True),
    "entity_presence": ("presence", True, True),
    "bilateral": ("presence", True, True),
    "view_name": ("view", False, False),
    "is_pa": ("view", False, True),
    "is_ap": ("view", False, True),
    "location_text": ("location", True, False),
    "severity": ("level", True, False),
    "type_word": ("type", True, False),
    "change_summary": ("difference", False, False),
}
_OPEN_ANSWER_TEXTS = ("yes", "no", "nothing_changed", "views", "changes", "list_separator")
DEFAULT_TEMPLATES = CONFIG_DIR / "vqa_templates.yaml"

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


class VQATemplateError(ReasonCodedError, ValueError):
    """A template file that cannot be used; ``reason`` is a machine-readable code.

    Reason codes: ``missing_file``, ``invalid_yaml``, ``bad_structure``, ``unknown_question_type``,
    ``bad_placeholder``, ``missing_answer_option``, ``duplicate_option``, ``too_few_options``.
    """

    message_format = "[{reason}] {message}"


class VQAInputError(ReasonCodedError, ValueError):
    """Bad input to :func:`build_vqa`; ``reason`` is a machine-readable code.

    Reason codes: ``missing_column``, ``null_value``, ``duplicate_label``, ``unknown_entity``,
    ``entity_not_in_family``, ``unknown_family``, ``unknown_change``, ``unknown_study``,
    ``patient_without_split``, ``too_few_options``, ``duplicate_item``.
    """

    message_format = "[{reason}] {message}"


# --------------------------------------------------------------------------------------------- templates


def _check_question(qtype: str, text: object, needs_entity: bool = True) -> str:
    if not isinstance(text, str) or not text.strip():
        raise VQATemplateError("bad_structure", f"{qtype}: every question must be a non-empty string")
    try:
        rendered = text.format(entity="X")
    except (KeyError, IndexError, ValueError) as err:
        raise VQATemplateError(
            "bad_placeholder", f"{qtype}: question {text!r} uses an unknown placeholder {err}"
        ) from None
    if ("{entity}" in text) != needs_entity or "{" in rendered:
        need = "must contain {entity} exactly" if needs_entity else "must have no placeholder"
        raise VQATemplateError("bad_placeholder", f"{qtype}: question {text!r} {need}")
    return text


def _validate_open(data: dict, source: str) -> dict:
    """The ``open_ended``, ``open_answers`` and ``type_keywords`` parts of a template mapping (see the YAML)."""
    spec_all = data.get("open_ended") or {}
    if not isinstance(spec_all, dict):
        raise VQATemplateError("bad_structure", f"{source}: 'open_ended' must be a mapping")
    out: dict = {}
    for otype, spec in spec_all.items():
        if otype not in OPEN_TYPES:
            raise VQATemplateError(
                "unknown_question_type", f"{source}: open {otype!r} is not one of {tuple(OPEN_TYPES)}"
            )
        if not isinstance(spec, dict) or spec.get("scope", OPEN_TYPES[otype]) != OPEN_TYPES[otype]:
            raise VQATemplateError(
                "bad_structure", f"{source}: open {otype} must be a mapping of scope {OPEN_TYPES[otype]}"
            )
        questions = spec.get("questions") or [  # an already normalised mapping validates again
            {"text": t, "answer": k} for k, ts in (spec.get("kinds") or {}).items() for t in ts
        ]
        if not isinstance(questions, list) or not questions:
            raise VQATemplateError("bad_structure", f"{source}: open {otype} needs a non-empty 'questions' list")
        kinds: dict[str, list[str]] = {}
        for q in questions:
            if not isinstance(q, dict) or q.get("answer") not in OPEN_ANSWERS:
                raise VQATemplateError(
                    "bad_structure", f"{source}: open {otype} question {q!r} needs an 'answer' of {tuple(OPEN_ANSWERS)}"
                )
            kind = q["answer"]
            if OPEN_ANSWERS[kind][0] != otype:
                raise VQATemplateError(
                    "bad_structure", f"{source}: answer {kind!r} belongs to open {OPEN_ANSWERS[kind][0]}"
                )
            kinds.setdefault(kind, []).append(_check_question(otype, q.get("text"), OPEN_ANSWERS[kind][1]))
        out[otype] = {"scope": OPEN_TYPES[otype], "kinds": kinds}
    answers = data.get("open_answers") or {}
    if out:
        missing = [k for k in _OPEN_ANSWER_TEXTS if k not in answers]
        if missing:
            raise VQATemplateError("missing_answer_option", f"{source}: open_answers lacks {missing}")
        if not isinstance(answers["views"], dict) or not isinstance(answers["changes"], dict):
            raise VQATemplateError("bad_structure", f"{source}: open_answers views and changes must be mappings")
        bad = [k for k, v in answers["changes"].items() if k not in ANSWER_KEYS["change"] or "{entity}" not in v]
        if bad:
            raise VQATemplateError(
                "bad_placeholder", f"{source}: open_answers.changes {bad} (known change, {{entity}})"
            )
    words = data.get("type_keywords") or []
    if not isinstance(words, list) or not all(isinstance(w, str) and w for w in words):
        raise VQATemplateError("bad_structure", f"{source}: 'type_keywords' must be a list of words")
    reason = data.get("case_reason", "Query report: {query}. Reference report: {reference}.")
    if not isinstance(reason, str) or "{query}" not in reason or "{reference}" not in reason:
        raise VQATemplateError("bad_placeholder", f"{source}: case_reason needs {{query}} and {{reference}}")
    return {
        "open_ended": out,
        "open_answers": {str(k): v for k, v in answers.items()},
        "type_keywords": [str(w) for w in words],
        "case_reason": reason,
    }


def validate_templates(data: object, source: str = "<dict>") -> dict:
    """Check a parsed template mapping and return it normalised.

    Returns
    -------
    dict
        ``{"version": str, "question_types": {type: {"scope", "questions": [str], "options": {key: text},
        "confusable": [[key, ...]]}}, "open_ended": {type: {"scope", "kinds": {answer kind: [question]}}},
        "open_answers": {...}, "type_keywords": [str], "case_reason": str}`` in file order (the open parts
        empty when the file has none).

    Raises
    ------
    VQATemplateError
        ``bad_structure``, ``unknown_question_type``, ``bad_placeholder``, ``missing_answer_option``
        or ``duplicate_option``, naming the question type.
    """
    if not isinstance(data, dict) or not isinstance(data.get("question_types"), dict) or not data["question_types"]:
        raise VQATemplateError("bad_structure", f"{source}: needs a non-empty 'question_types' mapping")
    out: dict = {"version": str(data.get("version", "")), "question_types": {}}
    for qtype, spec in data["question_types"].items():
        if qtype not in QUESTION_TYPES:
            raise VQATemplateError("unknown_question_type", f"{source}: {qtype!r} is not one of {QUESTION_TYPES}")
        if not isinstance(spec, dict):
            raise VQATemplateError("bad_structure", f"{source}: {qtype} must be a mapping")
        if spec.get("scope", SCOPES[qtype]) != SCOPES[qtype]:
            raise VQATemplateError("bad_structure", f"{source}: {qtype} has scope {SCOPES[qtype]!r}")
        questions = spec.get("questions")
        if not isinstance(questions, list) or not questions:
            raise VQATemplateError("bad_structure", f"{source}: {qtype} needs a non-empty 'questions' list")
        entry: dict[str, Any] = {"scope": SCOPES[qtype], "questions": [_check_question(qtype, q) for q in questions]}
        if qtype in ANSWER_KEYS:
            options = spec.get("options")
            if not isinstance(options, dict) or not all(isinstance(v, str) and v for v in options.values()):
                raise VQATemplateError("bad_structure", f"{source}: {qtype} needs an 'options' key -> text mapping")
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
    out.update(_validate_open(data, source))
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


_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix(seed: np.ndarray, salt: int) -> np.ndarray:
    """SplitMix64 finaliser of ``seed + salt * golden`` (Steele et al., OOPSLA 2014): uint64 -> uint64."""
    with np.errstate(over="ignore"):
        z = seed.astype(np.uint64) + np.uint64(salt) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


#: salts of the per-item draws from the item seed
_SALT_POSITION, _SALT_QUESTION, _SALT_DISTRACTOR = 1, 2, 3


def item_seed(item_ids: list[str]) -> np.ndarray:
    """The seed of each item: its ``item_id`` (16 hex characters of sha256) read as an unsigned 64-bit integer."""
    if not item_ids:
        return np.empty(0, dtype=np.uint64)
    blob = "".join(item_ids)
    if len(blob) != 16 * len(item_ids):
        raise ValueError("an item_id is not 16 hex characters")
    return np.frombuffer(bytes.fromhex(blob), dtype=">u8").astype(np.uint64)


def item_ids(frame: pl.DataFrame, *columns: str) -> pl.Series:
    """:func:`item_id` of every row: sha256 of the ``columns`` joined by ``|``, first 16 hex characters."""
    joined = frame.select(pl.concat_str(list(columns), separator="|")).to_series().to_list()
    sha = hashlib.sha256
    return pl.Series("item_id", [sha(s.encode()).hexdigest()[:16] for s in joined], dtype=pl.Utf8)


def draw_options(
    seeds: np.ndarray, answer_key: str, pool_keys: list[str], tiers: list[int], n: int
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded distractor draw and answer position for items sharing one answer and one distractor pool.

    Parameters
    ----------
    seeds : numpy.ndarray of uint64, shape (m,)
        item seeds (:func:`item_seed`).
    answer_key : str
        the right option's key.
    pool_keys : list of str
        distractor keys (answer and its confusables already removed), length P.
    tiers : list of int
        per pool key, lower tiers are used up first (location: the family's anatomy before other anatomy).
    n : int
        options per item.

    Returns
    -------
    codes : numpy.ndarray of int64, shape (m, n)
        option keys in display order as indexes into ``pool_keys + [answer_key]``: the ``n - 1`` distractors
        with the smallest (tier, SplitMix64(seed XOR j, 3)) in draw order, the answer (index P) at ``position``.
    position : numpy.ndarray of int64, shape (m,)
        the answer's index, SplitMix64(seed, 1) mod n: uniform over the n letters.

    Raises
    ------
    VQAInputError
        ``too_few_options`` when P < n - 1.
    """
    m, k = len(seeds), len(pool_keys)
    if k < n - 1:
        raise VQAInputError("too_few_options", f"answer {answer_key!r}: only {k + 1} distinct options, {n} needed")
    score = _mix(seeds[:, None] ^ np.arange(k, dtype=np.uint64)[None, :], _SALT_DISTRACTOR) >> np.uint64(2)
    score = score + (np.asarray(tiers, dtype=np.uint64)[None, :] << np.uint64(62))
    chosen = np.argsort(score, axis=1, kind="stable")[:, : n - 1]
    position = (_mix(seeds, _SALT_POSITION) % np.uint64(n)).astype(np.int64)
    full = np.empty((m, n), dtype=np.int64)
    cols = np.arange(n)[None, :]
    before = cols < position[:, None]
    after = cols > position[:, None]
    src = np.where(before, cols, cols - 1).clip(0, max(n - 2, 0))
    picked = np.take_along_axis(chosen, src, axis=1) if n > 1 else np.zeros((m, 1), dtype=np.int64)
    full[:] = np.where(before | after, picked, k)
    return full, position


def _require(df: pl.DataFrame, columns: tuple[str, ...], name: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise VQAInputError("missing_column", f"{name} lacks column(s) {missing}")
    for c in columns:
        if c != "change_labels" and df.get_column(c).null_count():
            raise VQAInputError("null_value", f"{name}.{c} has null value(s)")


# --------------------------------------------------------------------------------------------- items


_ITEM_COLUMNS = (
    "patient_key",
    "family",
    "entity_id",
    "shard",
    "pair_id",
    "study_key",
    "anchor",
    "study_keys",
    "question_type",
    "answer_key",
    "entity_ids",
)


class _NameTable:
    """Entity display names per family (:func:`_display_names`), entity checks and location answers."""

    def __init__(self, ontology: Ontology) -> None:
        self.ontology = ontology
        rows = []
        for family in ontology.families:
            for entity, name in _display_names(ontology, family).items():
                rows.append((family, entity, name))
        self.names = pl.DataFrame(
            rows, schema={"family": pl.Utf8, "entity_id": pl.Utf8, "entity_name": pl.Utf8}, orient="row"
        )

    def check(self, pairs: pl.DataFrame) -> None:
        """Raise on an unknown family, an entity not in the ontology or not in its family."""
        for family, entity in pairs.select("family", "entity_id").unique().sort("family", "entity_id").iter_rows():
            if family not in self.ontology.families:
                raise VQAInputError("unknown_family", f"family {family!r} is not in the ontology")
            if entity not in self.ontology.concepts:
                raise VQAInputError("unknown_entity", f"entity {entity!r} is not in ontology {self.ontology.version}")
            if self.ontology.families and entity not in {c.id for c in self.ontology.family_concepts(family)}:
                raise VQAInputError("entity_not_in_family", f"entity {entity} does not belong to family {family}")

    def locatable(self) -> pl.DataFrame:
        """(family, entity_id, anatomy_id): findings with an anatomy whose name does not need qualifying."""
        onto, rows = self.ontology, []
        for family, entity, name in self.names.iter_rows():
            c = onto.concepts[entity]
            if c.category == "finding" and c.anatomy_id in onto.concepts and name == _readable(c.preferred_name):
                rows.append((family, entity, c.anatomy_id))
        return pl.DataFrame(rows, schema={"family": pl.Utf8, "entity_id": pl.Utf8, "anatomy_id": pl.Utf8}, orient="row")

    def anatomy_name(self, anatomy_id: str) -> str:
        return _readable(self.ontology.concepts[anatomy_id].preferred_name)


def _questions(items: pl.DataFrame, types: dict, names: _NameTable) -> pl.DataFrame:
    """Add ``question`` (paraphrase SplitMix64(seed, 2) mod count, entity name filled in) and ``answer_text``."""
    seeds = item_seed(items.get_column("item_id").to_list())
    pick = _mix(seeds, _SALT_QUESTION)
    qtypes = items.get_column("question_type").to_numpy()
    template = np.empty(len(items), dtype=object)
    for qtype, spec in types.items():
        mask = qtypes == qtype
        qs = np.array(spec["questions"], dtype=object)
        template[mask] = qs[(pick[mask] % np.uint64(len(qs))).astype(np.int64)]
    answer_text = np.empty(len(items), dtype=object)
    keys = items.get_column("answer_key").to_numpy()
    for qtype, spec in types.items():
        mask = qtypes == qtype
        if qtype == "location":
            answer_text[mask] = [names.anatomy_name(k) for k in keys[mask]]
        elif mask.any():
            answer_text[mask] = [spec["options"][k] for k in keys[mask]]
    items = items.with_columns(
        template=pl.Series(template.tolist(), dtype=pl.Utf8), answer_text=pl.Series(answer_text.tolist(), dtype=pl.Utf8)
    )
    items = items.join(names.names, on=["family", "entity_id"], how="left")
    return items.with_columns(
        question=pl.col("template").str.replace_all("{entity}", pl.col("entity_name"), literal=True)
    ).drop("template", "entity_name")


def _is_word_char(c: str) -> bool:
    return c.isalnum() or c == "_"


def _has_phrase(text: str, phrase: str) -> bool:
    """True where ``phrase`` occurs in ``text`` case-insensitively with a word boundary (regex ``\\b``) at both
    ends, as ``re.search(r"(?i)\\b" + re.escape(phrase) + r"\\b", text)`` decides, without compiling a pattern."""
    t, p = text.lower(), phrase.lower()
    if not p:
        return False
    start = t.find(p)
    while start >= 0:
        end = start + len(p)
        left = start > 0 and _is_word_char(t[start - 1])
        right = end < len(t) and _is_word_char(t[end])
        if left != _is_word_char(p[0]) and right != _is_word_char(p[-1]):
            return True
        start = t.find(p, start + 1)
    return False


#: question types whose answer is an anatomy name: a question sharing a word stem with it gives it away
#: ("Where is the pleural effusion?" -> "pleura")
_STEM_CHECKED_TYPES = frozenset({"location", OPEN_PREFIX + "location"})


def _word_stem(word: str) -> str:
    """A crude stem for the giveaway check: the word less its last two letters, at least four letters."""
    return word[: max(4, len(word) - 2)]


def _shares_stem(question: str, answer: str) -> bool:
    """True where a word of ``answer`` of four or more letters has its :func:`_word_stem` at the start of a
    word of ``question`` (case-insensitive): "pleural" gives away "pleura", "hepatic parenchymal" gives away
    "hepatic parenchyma", "lungs" gives away "lung"."""
    words = re.findall(r"[^\W\d_]+", question.lower())
    return any(
        any(w.startswith(_word_stem(a)) for w in words) for a in re.findall(r"[^\W\d_]+", answer.lower()) if len(a) >= 4
    )


def _contains_answer(items: pl.DataFrame) -> pl.Series:
    """True where the answer text occurs in the question as whole words, case-insensitively, or, for the
    anatomy answers of :data:`_STEM_CHECKED_TYPES`, where the question shares a word stem with the answer."""
    # questions are templates filled with entity names: few distinct (question, answer) pairs, checked once each
    keys = ["question", "answer_text", "question_type"]
    pairs = items.select(keys).unique()
    hit = [
        None if q is None or a is None else _has_phrase(q, a) or (t in _STEM_CHECKED_TYPES and _shares_stem(q, a))
        for q, a, t in pairs.iter_rows()
    ]
    pairs = pairs.with_columns(contains=pl.Series(hit, dtype=pl.Boolean))
    return (
        items.select(keys)
        .join(pairs, on=keys, how="left", nulls_equal=True, maintain_order="left")
        .get_column("contains")
    )


def _render_options(items: pl.DataFrame, types: dict, n: int, names: _NameTable) -> pl.DataFrame:
    """Add ``options``, ``option_keys`` (the recorded, seeded order), ``answer`` letter (:func:`draw_options`)."""
    onto = names.ontology
    all_anatomy = [c.id for c in onto.concepts.values() if c.category == "anatomy"]
    out = []
    for (qtype, family, answer_key), g in items.group_by("question_type", "family", "answer_key"):
        spec = types[qtype]
        if qtype == "location":
            fam = [a for a in onto.families[family]["anatomy"]]
            seen_names = {names.anatomy_name(answer_key)}
            pool, tiers = [], []
            for tier, ids in ((0, fam), (1, sorted(all_anatomy, key=lambda a: (names.anatomy_name(a), a)))):
                for a in sorted(ids, key=lambda a: (names.anatomy_name(a), a)):
                    nm = names.anatomy_name(a)
                    if nm not in seen_names:
                        seen_names.add(nm)
                        pool.append(a)
                        tiers.append(tier)
            text = {a: names.anatomy_name(a) for a in pool + [answer_key]}
        else:
            excluded = {answer_key}.union(*[set(c) for c in spec["confusable"] if answer_key in c])
            pool = [k for k in spec["options"] if k not in excluded]
            tiers = [0] * len(pool)
            text = spec["options"]
        seeds = item_seed(g.get_column("item_id").to_list())
        idx, pos = draw_options(seeds, answer_key, pool, tiers, n)
        table = list(pool) + [answer_key]
        code_list = pl.Series(idx.astype(np.uint32)).arr.to_list()
        positions = list(range(len(table)))
        out.append(
            g.with_columns(
                option_keys=code_list.list.eval(pl.element().replace_strict(positions, table, return_dtype=pl.Utf8)),
                options=code_list.list.eval(
                    pl.element().replace_strict(positions, [text[k] for k in table], return_dtype=pl.Utf8)
                ),
                answer=pl.Series(np.array(list(LETTERS))[pos], dtype=pl.Utf8),
            )
        )
    return pl.concat(out).sort("item_id")


def _with_mentions(items: pl.DataFrame, entity_mentions: pl.DataFrame | None) -> pl.DataFrame:
    """Add ``mention_ids``: the mentions of the item's ``mention_entities`` in the item's studies, sorted."""
    if entity_mentions is None or entity_mentions.height == 0:
        return items.with_columns(mention_ids=pl.lit([], pl.List(pl.Utf8)))
    m = entity_mentions.select("mention_id", "study_key", "entity_id").filter(pl.col("study_key").is_not_null())
    ex = items.select("item_id", pl.col("mention_entities").alias("me"), pl.col("study_keys").alias("sk"))
    ex = ex.explode("sk").explode("me")
    got = (
        ex.join(m, left_on=["sk", "me"], right_on=["study_key", "entity_id"], how="inner")
        .group_by("item_id")
        .agg(mention_ids=pl.col("mention_id").unique().sort())
    )
    return items.join(got, on="item_id", how="left").with_columns(
        pl.col("mention_ids").fill_null(pl.lit([], pl.List(pl.Utf8)))
    )


# --------------------------------------------------------------------------------------------- open-ended


def entity_attributes(
    lab: pl.DataFrame, entity_mentions: pl.DataFrame | None, type_keywords: list[str]
) -> pl.DataFrame:
    """Per (study, entity) label: the structured attributes of :func:`etl.assemble.retrieval.entity_states` plus
    ``type_word``.

    Parameters
    ----------
    lab : polars.DataFrame
        labels with ``study_key``, ``patient_key``, ``family``, ``entity_id``, ``state``, ``shard`` (``change``
        optional).
    entity_mentions : polars.DataFrame or None
        ``entity_mentions`` rows; None or empty: every attribute null.
    type_keywords : list of str
        the type words (``type_keywords`` of the template file).

    Returns
    -------
    polars.DataFrame
        ``study_key``, ``entity_id``, ``laterality``, ``severity``, ``anatomy``, ``mention_ids`` (the deciding
        mentions, text order) and ``type_word``: the first keyword (whole word, case-insensitive, longest
        alternative first) in the text of the deciding mentions, in text order; null when none.
    """
    from etl.assemble.retrieval import _MENTION_COLUMNS, entity_states

    full = lab.with_columns(change=pl.col("change") if "change" in lab.columns else pl.lit("none"))
    full = full.select("study_key", "patient_key", "family", "entity_id", "state", "change", "shard")
    if (
        entity_mentions is None
        or entity_mentions.height == 0
        or any(c not in entity_mentions.columns for c in (*_MENTION_COLUMNS, "text"))
    ):
        st = entity_states(full, pl.DataFrame(), ["present", "absent", "uncertain"])
        return st.select("study_key", "entity_id", "laterality", "severity", "anatomy", "mention_ids").with_columns(
            type_word=pl.lit(None, pl.Utf8)
        )
    st = entity_states(full, entity_mentions, ["present", "absent", "uncertain"])
    st = st.select("study_key", "entity_id", "laterality", "severity", "anatomy", "mention_ids")
    if not type_keywords:
        return st.with_columns(type_word=pl.lit(None, pl.Utf8))
    alternatives = "|".join(re.escape(w) for w in sorted(type_keywords, key=lambda w: (-len(w), w)))
    pattern = r"(?i)(?:^|[^\w-])(" + alternatives + r")(?:$|[^\w-])"
    texts = entity_mentions.select("mention_id", "text")
    words = (
        st.select("study_key", "entity_id", "mention_ids")
        .with_columns(order=pl.int_ranges(pl.col("mention_ids").list.len()))
        .explode("mention_ids", "order")
        .join(texts, left_on="mention_ids", right_on="mention_id", how="inner")
        .with_columns(type_word=pl.col("text").str.extract(pattern, 1).str.to_lowercase())
        .filter(pl.col("type_word").is_not_null())
        .sort("study_key", "entity_id", "order")
        .group_by("study_key", "entity_id")
        .agg(pl.col("type_word").first())
    )
    return st.join(words, on=["study_key", "entity_id"], how="left")


_OPEN_COLUMNS = (
    "patient_key",
    "family",
    "entity_id",
    "shard",
    "pair_id",
    "study_key",
    "anchor",
    "study_keys",
    "question_type",
    "kind",
    "answer_text",
    "entity_ids",
)


def _open_items(
    lab: pl.DataFrame,
    studies: pl.DataFrame,
    pairs: pl.DataFrame | None,
    views: pl.DataFrame | None,
    attrs: pl.DataFrame,
    spec: dict,
    names: _NameTable,
) -> pl.DataFrame:
    """Open-ended candidate items (one per anchor, answer kind and subject), answers from the structured state.

    ``entity_id`` is the item's subject: the entity, or ``"*"`` for study- and pair-level questions; the answer
    kinds are those of :data:`OPEN_ANSWERS`, enabled by the template file's ``open_ended`` questions.
    """
    kinds = {k for t in spec["open_ended"].values() for k in t["kinds"]}
    ans = spec["open_answers"]
    yes, no = ans["yes"], ans["no"]
    onto = names.ontology
    concepts = pl.DataFrame(
        [(c.id, c.category, c.anatomy_id if c.anatomy_id in onto.concepts else None) for c in onto.concepts.values()],
        schema={"entity_id": pl.Utf8, "category": pl.Utf8, "concept_anatomy": pl.Utf8},
        orient="row",
    )
    anatomy = pl.DataFrame(
        [(a, names.anatomy_name(a)) for a, c in onto.concepts.items() if c.category == "anatomy"],
        schema={"anatomy_id": pl.Utf8, "anatomy_name": pl.Utf8},
        orient="row",
    )
    study = dict(
        pair_id=pl.lit(None, pl.Utf8),
        study_key=pl.col("study_key"),
        anchor=pl.col("study_key"),
        study_keys=pl.concat_list("study_key"),
    )
    parts: list[pl.DataFrame] = []

    def add(df: pl.DataFrame, kind: str, answer: pl.Expr, entity_ids: pl.Expr, subject: pl.Expr, base: dict) -> None:
        if kind in kinds and df.height:
            parts.append(
                df.select(
                    "patient_key",
                    "family",
                    "shard",
                    **base,
                    entity_id=subject,
                    question_type=pl.lit(OPEN_PREFIX + OPEN_ANSWERS[kind][0]),
                    kind=pl.lit(kind),
                    answer_text=answer,
                    entity_ids=entity_ids,
                ).select(_OPEN_COLUMNS)
            )

    one = pl.concat_list(pl.col("entity_id"))
    ent = pl.col("entity_id")
    st = (
        lab.join(attrs, on=["study_key", "entity_id"], how="left")
        .join(concepts, on="entity_id", how="left")
        .join(names.names, on=["family", "entity_id"], how="left")
    )
    abnormal = st.filter(pl.col("category").is_in(["finding", "condition"]))
    present = st.filter(pl.col("state") == "present")
    keys = ["study_key", "patient_key", "family", "shard"]
    found = (
        abnormal.filter(pl.col("state") == "present")
        .sort("entity_name", "entity_id")
        .group_by(keys, maintain_order=True)
        .agg(names_=pl.col("entity_name"), ids=pl.col("entity_id"))
    )
    add(found, "finding_list", pl.col("names_").list.join(ans["list_separator"]), pl.col("ids"), pl.lit("*"), study)
    summary = (
        abnormal.sort("entity_id")
        .group_by(keys)
        .agg(
            n_present=(pl.col("state") == "present").sum(),
            n_uncertain=(pl.col("state") == "uncertain").sum(),
            n_absent=(pl.col("state") == "absent").sum(),
            ids=pl.col("entity_id"),
        )
    )
    summary = summary.filter((pl.col("n_present") > 0) | ((pl.col("n_uncertain") == 0) & (pl.col("n_absent") > 0)))
    add(
        summary,
        "any_abnormality",
        pl.when(pl.col("n_present") > 0).then(pl.lit(yes)).otherwise(pl.lit(no)),
        pl.col("ids"),
        pl.lit("*"),
        study,
    )
    pa_ = st.filter(pl.col("state").is_in(["present", "absent"]))
    add(
        pa_,
        "entity_presence",
        pl.when(pl.col("state") == "present").then(pl.lit(yes)).otherwise(pl.lit(no)),
        one,
        ent,
        study,
    )
    lat = present.filter(pl.col("laterality").is_in(["left", "right", "bilateral"]))
    add(
        lat,
        "bilateral",
        pl.when(pl.col("laterality") == "bilateral").then(pl.lit(yes)).otherwise(pl.lit(no)),
        one,
        ent,
        study,
    )
    loc = (
        present.filter(pl.col("category") == "finding")
        .with_columns(anatomy_id=pl.coalesce("anatomy", "concept_anatomy"))
        .join(anatomy, on="anatomy_id", how="inner")
    )
    add(
        loc,
        "location_text",
        pl.concat_str(pl.col("laterality").fill_null(""), pl.col("anatomy_name"), separator=" ").str.strip_chars(),
        pl.concat_list("entity_id", "anatomy_id"),
        ent,
        study,
    )
    add(present.filter(pl.col("severity").is_not_null()), "severity", pl.col("severity"), one, ent, study)
    add(present.filter(pl.col("type_word").is_not_null()), "type_word", pl.col("type_word"), one, ent, study)
    if views is not None and views.height and kinds & {"view_name", "is_pa", "is_ap"}:
        v = (
            views.select("study_key", "view")
            .filter(pl.col("view").is_not_null())
            .unique()
            .filter(pl.len().over("study_key") == 1)
            .join(
                studies.select("study_key", "patient_key", "family", "shard").filter(pl.col("family").is_not_null()),
                on="study_key",
                how="inner",
            )
        )
        none = pl.lit([], pl.List(pl.Utf8))
        named = v.filter(pl.col("view").is_in(list(ans["views"])))
        add(
            named,
            "view_name",
            pl.col("view").replace_strict(ans["views"], return_dtype=pl.Utf8),
            none,
            pl.lit("*"),
            study,
        )
        frontal = v.filter(pl.col("view").is_in(["PA", "AP"]))
        for kind, value in (("is_pa", "PA"), ("is_ap", "AP")):
            add(
                frontal,
                kind,
                pl.when(pl.col("view") == value).then(pl.lit(yes)).otherwise(pl.lit(no)),
                none,
                pl.lit("*"),
                study,
            )
    if pairs is not None and pairs.height and "change_summary" in kinds:
        ch = (
            pairs.explode("change_labels")
            .filter(pl.col("change_labels").is_not_null())
            .with_columns(
                entity_id=pl.col("change_labels").struct.field("entity_id"),
                change=pl.col("change_labels").struct.field("change"),
            )
            .join(names.names, on=["family", "entity_id"], how="left")
            .with_columns(phrase=pl.col("change").replace_strict(ans["changes"], default=None, return_dtype=pl.Utf8))
            .with_columns(phrase=pl.col("phrase").str.replace_all("{entity}", pl.col("entity_name"), literal=True))
            .sort("entity_name", "entity_id")
        )
        by_pair = ch.group_by(
            "pair_id", "patient_key", "family", "shard", "prior_study_key", "current_study_key", maintain_order=True
        ).agg(
            phrases=pl.col("phrase").drop_nulls(),
            changed=pl.col("entity_id").filter(pl.col("phrase").is_not_null()),
            ids=pl.col("entity_id"),
        )
        pair = dict(
            study_key=pl.lit(None, pl.Utf8),
            anchor=pl.col("pair_id"),
            study_keys=pl.concat_list("prior_study_key", "current_study_key"),
        )
        add(
            by_pair.with_columns(pl.col("pair_id")),
            "change_summary",
            pl.when(pl.col("phrases").list.len() > 0)
            .then(pl.col("phrases").list.join("; "))
            .otherwise(pl.lit(ans["nothing_changed"])),
            pl.when(pl.col("changed").list.len() > 0).then(pl.col("changed")).otherwise(pl.col("ids")),
            pl.lit("*"),
            {k: v for k, v in pair.items()} | {"pair_id": pl.col("pair_id")},
        )
    if not parts:
        return pl.DataFrame(
            schema={
                c: (pl.List(pl.Utf8) if c in ("study_keys", "entity_ids") else pl.Int32 if c == "shard" else pl.Utf8)
                for c in _OPEN_COLUMNS
            }
        )
    return pl.concat([p.with_columns(pl.col("shard").cast(pl.Int32)) for p in parts])


def _open_questions(items: pl.DataFrame, spec: dict, names: _NameTable) -> pl.DataFrame:
    """Add ``question``: the kind's paraphrase SplitMix64(seed, 2) mod count, the entity name filled in."""
    kinds = {k: qs for t in spec["open_ended"].values() for k, qs in t["kinds"].items()}
    pick = _mix(item_seed(items.get_column("item_id").to_list()), _SALT_QUESTION)
    item_kinds = items.get_column("kind").to_numpy()
    template = np.empty(len(items), dtype=object)
    for kind, qs in kinds.items():
        mask = item_kinds == kind
        if mask.any():
            template[mask] = np.array(qs, dtype=object)[(pick[mask] % np.uint64(len(qs))).astype(np.int64)]
    if len(items) and any(t is None for t in template):
        raise VQATemplateError("unknown_question_type", "an open-ended item kind has no question template")
    items = items.with_columns(template=pl.Series(template.tolist(), dtype=pl.Utf8))
    items = items.join(names.names, on=["family", "entity_id"], how="left")
    return items.with_columns(
        question=pl.col("template").str.replace_all("{entity}", pl.col("entity_name").fill_null(""), literal=True)
    ).drop("template", "entity_name")


def balance_yes_no(items: pl.DataFrame, yes: str = "yes", no: str = "no") -> pl.DataFrame:
    """Keep as many ``yes`` as ``no`` answers per (shard, split, question_type) among yes/no items.

    The majority answer is subsampled: its items with the smallest ``item_id`` are kept (a sha256 prefix, so
    a deterministic pseudo-random choice); other items pass unchanged. Balanced per shard means balanced per
    split over all shards.

    Parameters
    ----------
    items : polars.DataFrame
        with ``item_id``, ``shard``, ``split``, ``question_type``, ``answer_text`` and ``yes_no`` (bool).

    Returns
    -------
    polars.DataFrame
        the kept rows, in input order.
    """
    grp = ["shard", "split", "question_type"]
    yn = pl.col("yes_no") & pl.col("answer_text").is_in([yes, no])
    n_yes = (yn & (pl.col("answer_text") == yes)).sum().over(grp)
    n_no = (yn & (pl.col("answer_text") == no)).sum().over(grp)
    rank = pl.col("item_id").rank("ordinal").over([*grp, "yes_no", "answer_text"])
    return items.filter(~yn | (rank <= pl.min_horizontal(n_yes, n_no)))


def build_vqa(
    pairs: pl.DataFrame,
    study_labels: pl.DataFrame,
    studies: pl.DataFrame,
    splits: pl.DataFrame,
    cfg: VQAConfig,
    templates: dict,
    ontology: Ontology,
    entity_mentions: pl.DataFrame | None = None,
    images: pl.DataFrame | None = None,
    max_studies: int = DEFAULT_MAX_STUDIES,
) -> pa.Table:
    """Build the ``vqa`` items of one shard or many (vectorised with polars and numpy): multiple choice and open-ended.

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
    entity_mentions : polars.DataFrame, optional
        ``entity_mentions`` rows (``mention_id``, ``study_key``, ``entity_id``) for the ``mention_ids`` provenance;
        without it ``mention_ids`` is empty. With the columns of :func:`etl.assemble.retrieval.entity_states` and
        ``text`` it also gives the attributes (laterality, severity, anatomy, type word) of open-ended answers.
    images : polars.DataFrame, optional
        ``images`` rows (``study_key``, ``view``) for the open-ended ``view`` questions (a study with exactly one
        distinct non-null view); without it no view item.
    max_studies : int
        with more ``studies`` rows than this, the items are built group by group of whole shards
        (:func:`etl.assemble.shard_groups.shard_groups`), so that peak memory stays that of one group; every item is
        per patient and yes/no balancing is per shard, so the result is the same as in one pass.

    Returns
    -------
    pyarrow.Table
        :data:`schemas.vqa.SCHEMA`, sorted by ``shard``, then ``item_id``. Pair items carry ``pair_id`` (``study_key``
        null), single-study items carry ``study_key`` (``pair_id`` null). Multiple choice: ``answer`` is the
        letter (A-F) of ``answer_text`` in ``options``; ``entity_ids`` is ``[entity]`` or, for ``location``,
        ``[finding, anatomy]``. Open-ended (``question_type`` ``open_<type>``, module docstring): ``options``
        empty, ``answer`` null, the free-text answer in ``answer_text``; their ``item_id`` hashes
        ``anchor|question_type|subject|kind`` (subject: the entity, or ``*``). Yes/no open-ended answers are
        balanced per (split, question type) by :func:`balance_yes_no` after the cap.

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
    groups = []
    if studies.height > max_studies:
        _require(studies, ("study_key", "patient_key", "shard"), "studies")
        if pairs.height:
            _require(pairs, _PAIR_COLUMNS, "pairs")
        if study_labels.height:
            _require(study_labels, _LABEL_COLUMNS, "study_labels")
            unknown = (
                study_labels.select("study_key").unique().join(studies.select("study_key"), on="study_key", how="anti")
            )
            if unknown.height:
                raise VQAInputError("unknown_study", f"{unknown.height} labelled study(ies) are not in studies")
        all_shards = pl.concat(
            [
                studies.get_column("shard").cast(pl.Int64),
                *([pairs.get_column("shard").unique().cast(pl.Int64)] if pairs.height else []),
            ]
        )
        groups = shard_groups(all_shards, max_studies)  # ascending: the groups' outputs concatenate in shard order
    if len(groups) <= 1:
        return _build_vqa_group(pairs, study_labels, studies, splits, cfg, templates, ontology, entity_mentions, images)
    tables = []
    for group in groups:  # every patient lies in one shard: items, caps and yes/no balance are per shard
        keys = study_keys_of(studies, group)
        tables.append(
            _build_vqa_group(
                pairs.filter(pl.col("shard").is_in(group)) if pairs.height else pairs,
                rows_of(study_labels, "study_key", keys),
                studies.filter(pl.col("shard").is_in(group)),
                splits,
                cfg,
                templates,
                ontology,
                rows_of(entity_mentions, "study_key", keys),
                rows_of(images, "study_key", keys),
            )
        )
    out = pa.concat_tables(tables)
    del tables
    ids = pl.from_arrow(out.column("item_id"))
    if ids.is_duplicated().any():
        raise VQAInputError(
            "duplicate_item",
            f"item {ids.filter(ids.is_duplicated())[0]} generated twice (a study or pair under two shards)",
        )
    return out


def _build_vqa_group(
    pairs: pl.DataFrame,
    study_labels: pl.DataFrame,
    studies: pl.DataFrame,
    splits: pl.DataFrame,
    cfg: VQAConfig,
    templates: dict,
    ontology: Ontology,
    entity_mentions: pl.DataFrame | None,
    images: pl.DataFrame | None,
) -> pa.Table:
    """:func:`build_vqa` on one group of whole shards (validated templates)."""
    if pairs.height == 0 and studies.height == 0:
        return SCHEMA.empty_table()
    types = {t: v for t, v in templates["question_types"].items() if v["scope"] != "case"}
    order = {t: i for i, t in enumerate(types)}
    order.update({OPEN_PREFIX + t: len(order) + i for i, t in enumerate(templates["open_ended"])})

    label_schema = {"study_key": pl.Utf8, "entity_id": pl.Utf8, "state": pl.Utf8}
    labels = pl.DataFrame(schema=label_schema)
    if study_labels.height:
        _require(study_labels, _LABEL_COLUMNS, "study_labels")
        labels = study_labels.select(*_LABEL_COLUMNS, *(["change"] if "change" in study_labels.columns else []))
        if has_duplicate_keys(labels, ("study_key", "entity_id")):
            raise VQAInputError("duplicate_label", "study_labels repeats an entity of a study")
    split_of = pl.DataFrame(schema={"patient_key": pl.Utf8, "split": pl.Utf8})
    if splits.height:
        _require(splits, _SPLIT_COLUMNS, "splits")
        split_of = splits.select(_SPLIT_COLUMNS).unique("patient_key", keep="first")

    names = _NameTable(ontology)
    parts: list[pl.DataFrame] = []
    open_parts: list[pl.DataFrame] = []
    if studies.height:
        _require(studies, ("study_key", "patient_key", "shard"), "studies")
        if "family" not in studies.columns:
            raise VQAInputError("missing_column", "studies lacks column(s) ['family']")
        unknown = labels.select("study_key").unique().join(studies.select("study_key"), on="study_key", how="anti")
        if unknown.height:
            raise VQAInputError("unknown_study", f"{unknown.height} labelled study(ies) are not in studies")
        labels = labels.filter(pl.col("state") != "not_mentioned")  # gives no item of any type
        lab = labels.join(studies.select(_STUDY_COLUMNS).filter(pl.col("family").is_not_null()), on="study_key")
        names.check(lab.select("family", "entity_id").unique())
        base = dict(
            pair_id=pl.lit(None, pl.Utf8), anchor=pl.col("study_key"), study_keys=pl.concat_list(pl.col("study_key"))
        )
        if "presence" in types:
            parts.append(
                lab.filter(pl.col("state").is_in(ANSWER_KEYS["presence"])).select(
                    "patient_key",
                    "family",
                    "entity_id",
                    "shard",
                    "study_key",
                    **base,
                    question_type=pl.lit("presence"),
                    answer_key=pl.col("state"),
                    entity_ids=pl.concat_list(pl.col("entity_id")),
                )
            )
        if "location" in types:
            loc = names.locatable().join(lab.filter(pl.col("state") == "present"), on=["family", "entity_id"])
            parts.append(
                loc.select(
                    "patient_key",
                    "family",
                    "entity_id",
                    "shard",
                    "study_key",
                    **base,
                    question_type=pl.lit("location"),
                    answer_key=pl.col("anatomy_id"),
                    entity_ids=pl.concat_list("entity_id", "anatomy_id"),
                )
            )
        if templates["open_ended"]:
            attrs = entity_attributes(lab, entity_mentions, templates["type_keywords"])
            pr_open = None
            if pairs.height and "difference" in templates["open_ended"]:
                _require(pairs, _PAIR_COLUMNS, "pairs")
                pr_open = pairs.select(_PAIR_COLUMNS)
            open_parts.append(_open_items(lab, studies, pr_open, images, attrs, templates, names))
    if pairs.height:
        _require(pairs, _PAIR_COLUMNS, "pairs")
        bad_family = set(pairs.get_column("family").unique().to_list()) - set(ontology.families)
        if bad_family:
            raise VQAInputError("unknown_family", f"family {sorted(bad_family)[0]!r} is not in the ontology")
        pr = pairs.select(_PAIR_COLUMNS)
        base = dict(
            study_key=pl.lit(None, pl.Utf8),
            anchor=pl.col("pair_id"),
            study_keys=pl.concat_list("prior_study_key", "current_study_key"),
        )
        if "change" in types:
            ch = (
                pr.explode("change_labels")
                .filter(pl.col("change_labels").is_not_null())
                .with_columns(
                    entity_id=pl.col("change_labels").struct.field("entity_id"),
                    answer_key=pl.col("change_labels").struct.field("change"),
                )
            )
            bad = set(ch.get_column("answer_key").unique().to_list()) - (
                set(types["change"]["options"]) & set(ANSWER_KEYS["change"])
            )
            if bad:
                raise VQAInputError("unknown_change", f"pair change label {sorted(bad)[0]!r} has no option text")
            names.check(ch.select("family", "entity_id").unique())
            parts.append(
                ch.select(
                    "patient_key",
                    "family",
                    "entity_id",
                    "shard",
                    "pair_id",
                    **{k: v for k, v in base.items() if k != "pair_id"},
                    question_type=pl.lit("change"),
                    answer_key="answer_key",
                    entity_ids=pl.concat_list(pl.col("entity_id")),
                )
            )
        if "comparison_presence" in types:
            both = pr.join(
                labels.rename({"study_key": "prior_study_key", "state": "prior_state"}), on="prior_study_key"
            ).join(
                labels.rename({"study_key": "current_study_key", "state": "current_state"}),
                on=["current_study_key", "entity_id"],
            )
            key = pl.concat_str("prior_state", "current_state", separator="|").replace_strict(
                {
                    "present|absent": "prior_only",
                    "absent|present": "current_only",
                    "present|present": "both",
                    "absent|absent": "neither",
                },
                default=None,
            )
            cp = both.with_columns(answer_key=key).filter(pl.col("answer_key").is_not_null())
            names.check(cp.select("family", "entity_id").unique())
            parts.append(
                cp.select(
                    "patient_key",
                    "family",
                    "entity_id",
                    "shard",
                    "pair_id",
                    **{k: v for k, v in base.items() if k != "pair_id"},
                    question_type=pl.lit("comparison_presence"),
                    answer_key="answer_key",
                    entity_ids=pl.concat_list(pl.col("entity_id")),
                )
            )
    parts = [x.select(_ITEM_COLUMNS) for x in parts if x.height]
    open_items = pl.concat(open_parts) if open_parts else pl.DataFrame()
    if not parts and open_items.height == 0:
        return SCHEMA.empty_table()
    frames = []
    if parts:
        items = pl.concat(parts)
        items = items.with_columns(item_id=item_ids(items, "anchor", "question_type", "entity_id"))
        items = _questions(items, types, names).with_columns(
            kind=pl.lit(None, pl.Utf8),
            answer_format=pl.lit("multiple_choice"),
            yes_no=pl.lit(False),
            mention_entities=pl.concat_list("entity_id"),
        )
        frames.append(items)
    if open_items.height:
        names.check(open_items.filter(pl.col("entity_id") != "*").select("family", "entity_id").unique())
        op = open_items.with_columns(
            item_id=item_ids(open_items, "anchor", "question_type", "entity_id", "kind"),
            answer_key=pl.lit(None, pl.Utf8),
        )
        op = _open_questions(op, templates, names).with_columns(
            answer_format=pl.lit("open_ended"),
            yes_no=pl.col("kind").replace_strict({k: v[2] for k, v in OPEN_ANSWERS.items()}, return_dtype=pl.Boolean),
            mention_entities=pl.col("entity_ids"),
        )
        frames.append(op.select(frames[0].columns) if frames else op)
    items = pl.concat(frames, how="vertical_relaxed")
    items = items.join(split_of, on="patient_key", how="left")
    if items.get_column("split").null_count():
        raise VQAInputError("patient_without_split", "a patient with VQA items has no row in splits")
    items = items.with_columns(type_order=pl.col("question_type").replace_strict(order, return_dtype=pl.Int32))
    items = items.filter(~_contains_answer(items))  # the question must never give its answer away
    items = _cap(items, cfg.max_items_per_pair)
    if items.get_column("item_id").is_duplicated().any():
        dup = items.filter(pl.col("item_id").is_duplicated()).get_column("item_id")[0]
        raise VQAInputError("duplicate_item", f"item {dup} generated twice (repeated pair or label)")
    ans = templates["open_answers"]
    items = balance_yes_no(items, ans.get("yes", "yes"), ans.get("no", "no"))
    return _finish(items, types, cfg.n_options, names, entity_mentions)


def _cap(items: pl.DataFrame, cap: int) -> pl.DataFrame:
    """At most ``cap`` items per anchor and answer format: round-robin over the types in template order, each
    type's items in item_id order (multiple-choice and open-ended items are capped separately)."""
    group = ["anchor", "answer_format"] if "answer_format" in items.columns else ["anchor"]
    keep = (  # decided on the key columns alone, then applied to the wide rows
        items.select(*group, "type_order", "item_id")
        .with_row_index("_row")
        .sort(*group, "type_order", "item_id")
        .with_columns(_round=pl.int_range(pl.len()).over(*group, "type_order"))
        .sort(*group, "_round", "type_order")
        .filter(pl.int_range(pl.len()).over(group) < cap)
        .sort("item_id")
        .get_column("_row")
    )
    return items[keep]


def _finish(
    items: pl.DataFrame, types: dict, n: int, names: _NameTable, entity_mentions: pl.DataFrame | None
) -> pa.Table:
    """Options and letters of the multiple-choice items, empty ones for open-ended items, mentions, schema."""
    mc = items.filter(pl.col("answer_format") == "multiple_choice")
    op = items.filter(pl.col("answer_format") == "open_ended")
    frames = []
    if mc.height:
        frames.append(_render_options(mc, types, n, names))
    if op.height:
        frames.append(
            op.with_columns(
                option_keys=pl.lit([], pl.List(pl.Utf8)),
                options=pl.lit([], pl.List(pl.Utf8)),
                answer=pl.lit(None, pl.Utf8),
            )
        )
    if not frames:
        return SCHEMA.empty_table()
    out = pl.concat([f.select(frames[0].columns) for f in frames]).sort("shard", "item_id")
    out = _with_mentions(out, entity_mentions)
    for c in ("reference_study_key", "reason"):
        if c not in out.columns:
            out = out.with_columns(pl.lit(None, pl.Utf8).alias(c))
    return out.select(SCHEMA.names).to_arrow().cast(SCHEMA)


# --------------------------------------------------------------------------------------------- two cases


def _describe(state: pl.Expr, severity: pl.Expr, laterality: pl.Expr, name: pl.Expr) -> pl.Expr:
    """ "<severity> <laterality> <entity>" for a present entity, "no <entity>" for an absent one."""
    present = pl.concat_str(severity.fill_null(""), laterality.fill_null(""), name, separator=" ")
    return (
        pl.when(state == "present")
        .then(present.str.replace_all(r"\s+", " ").str.strip_chars())
        .otherwise(pl.concat_str(pl.lit("no "), name))
    )


def build_case_comparison_vqa(
    retrieval_targets: pl.DataFrame,
    study_labels: pl.DataFrame,
    entity_mentions: pl.DataFrame,
    cfg: VQAConfig,
    templates: dict,
    ontology: Ontology,
    severity_grades: dict[str, float],
    max_queries: int = 4 * DEFAULT_MAX_STUDIES,
) -> pa.Table:
    """Multiple-choice items comparing a query study with a reference case of another patient.

    The reference of a (query study, entity) is its rank-1 ``retrieval_targets`` candidate (same split, family
    and entity, another patient; query state ``present``). Question types (template scope ``case``):

    * ``case_severity``: both studies report a severity of the entity in ``severity_grades``: more severe /
      less severe / of similar severity (grade comparison); distractor ``not_present``;
    * ``case_laterality``: both report a laterality: same side (equal values), opposite side (left vs right),
      bilateral in the query only, bilateral in the reference only;
    * ``case_presence``: every other entity of the family labelled ``present`` or ``absent`` in both studies:
      query only / reference only / both / neither; ``entity_ids`` = [that entity, the linking entity].

    The attributes are those of :func:`etl.assemble.retrieval.entity_states`; ``reason`` is the template file's
    ``case_reason`` filled with both studies' descriptions (:func:`_describe`), ``mention_ids`` the deciding
    mentions of both studies. Items are anchored on ``"query|reference"``: ``item_id`` = :func:`item_id` of
    (anchor, type, entity), at most ``cfg.max_items_per_pair`` per anchor (round-robin over the types in
    template order), options and letters as in :func:`build_vqa`, and a question that contains its answer is
    dropped. At the default retrieval threshold (relevance > 0.9) only identical states are linked, so
    ``case_severity`` and ``case_laterality`` answers are then always "similar" / "same side".

    Parameters
    ----------
    retrieval_targets : polars.DataFrame
        ``retrieval_targets`` rows (:mod:`schemas.retrieval_targets`).
    study_labels : polars.DataFrame
        all ``study_labels`` rows (``study_key``, ``patient_key``, ``family``, ``entity_id``, ``state``,
        ``change``, ``shard``).
    entity_mentions : polars.DataFrame
        all ``entity_mentions`` rows (may be empty: attributes unreported, no severity/laterality items).
    cfg : schemas.config.VQAConfig
    templates : dict
        from :func:`load_templates`; only its ``case`` scope types are used.
    ontology : schemas.ontology.Ontology
    severity_grades : dict of str to float
        ordinal grade per severity word (``severity.ordinal`` of ``config/retrieval_similarity.yaml``).
    max_queries : int
        items are built group by group of whole query shards holding at most this many rank-1 references
        (:func:`etl.assemble.shard_groups.shard_groups`): the same items, with the peak memory of one group.

    Returns
    -------
    pyarrow.Table
        :data:`schemas.vqa.SCHEMA`, sorted by ``shard``, then ``item_id``: ``study_key`` = query,
        ``reference_study_key``, ``study_keys`` = [reference, query], ``pair_id`` null,
        ``patient_key``/``split``/``shard`` of the query.

    Raises
    ------
    VQATemplateError
        ``too_few_options``.
    VQAInputError
        ``unknown_entity`` / ``entity_not_in_family``.
    """
    from etl.assemble.retrieval import entity_states

    templates = validate_templates(templates)
    _check_option_counts(templates, cfg.n_options)
    types = {t: v for t, v in templates["question_types"].items() if v["scope"] == "case"}
    if not types or retrieval_targets.height == 0 or study_labels.height == 0:
        return SCHEMA.empty_table()
    names = _NameTable(ontology)
    refs = retrieval_targets.filter((pl.col("rank") == 1) & (pl.col("state") == "present")).select(
        pl.col("query_study_key").alias("q"),
        pl.col("candidate_study_key").alias("r"),
        pl.col("entity_id").alias("link"),
        "family",
        "split",
        pl.col("query_patient_key").alias("patient_key"),
        "shard",
    )
    st = entity_states(study_labels, entity_mentions, ["present", "absent"]).select(
        "study_key", "entity_id", "state", "severity", "laterality", "mention_ids"
    )
    grades = pl.DataFrame({"sev": list(severity_grades), "g": [float(v) for v in severity_grades.values()]})
    groups = shard_groups(refs.get_column("shard").cast(pl.Int64), max_queries) if refs.height else []
    tables = []
    for group in groups:  # items are per (query, reference) anchor: built group by group of the queries' shards
        g_refs = refs.filter(pl.col("shard").is_in(group)) if len(groups) > 1 else refs
        g_st = (
            st.filter(
                pl.col("study_key").is_in(
                    pl.concat([g_refs.get_column("q"), g_refs.get_column("r")]).unique().implode()
                )
            )
            if len(groups) > 1
            else st
        )
        tables.append(_case_items(g_refs, g_st, grades, types, templates, cfg, names))
    tables = [t for t in tables if t.num_rows]
    return pa.concat_tables(tables) if tables else SCHEMA.empty_table()


def _case_items(
    refs: pl.DataFrame,
    st: pl.DataFrame,
    grades: pl.DataFrame,
    types: dict,
    templates: dict,
    cfg: VQAConfig,
    names: _NameTable,
) -> pa.Table:
    """Two-case items of ``refs`` (rank-1 references) from the entity states ``st``: :func:`build_case_comparison_vqa`
    on one group of query shards, sorted by ``shard``, then ``item_id``."""
    q_st = st.rename({c: f"q_{c}" for c in st.columns if c not in ("entity_id",)})
    r_st = st.rename({c: f"r_{c}" for c in st.columns if c not in ("entity_id",)})
    parts = []
    linked = (
        refs.with_columns(entity_id=pl.col("link"))
        .join(q_st, left_on=["q", "entity_id"], right_on=["q_study_key", "entity_id"])
        .join(r_st, left_on=["r", "entity_id"], right_on=["r_study_key", "entity_id"])
    )
    if "case_severity" in types:
        sev = linked.join(grades.rename({"sev": "q_severity", "g": "qg"}), on="q_severity").join(
            grades.rename({"sev": "r_severity", "g": "rg"}), on="r_severity"
        )
        parts.append(
            sev.with_columns(
                question_type=pl.lit("case_severity"),
                answer_key=pl.when(pl.col("qg") > pl.col("rg"))
                .then(pl.lit("more_severe"))
                .when(pl.col("qg") < pl.col("rg"))
                .then(pl.lit("less_severe"))
                .otherwise(pl.lit("same_severity")),
            )
        )
    if "case_laterality" in types:
        sides = ["left", "right", "bilateral"]
        lat = linked.filter(pl.col("q_laterality").is_in(sides) & pl.col("r_laterality").is_in(sides))
        key = (
            pl.when(pl.col("q_laterality") == pl.col("r_laterality"))
            .then(pl.lit("same_side"))
            .when(pl.col("q_laterality") == "bilateral")
            .then(pl.lit("query_bilateral"))
            .when(pl.col("r_laterality") == "bilateral")
            .then(pl.lit("reference_bilateral"))
            .otherwise(pl.lit("opposite_side"))
        )
        parts.append(lat.with_columns(question_type=pl.lit("case_laterality"), answer_key=key))
    if "case_presence" in types:
        anchors = refs.sort("link").unique(["q", "r"], keep="first", maintain_order=True)
        both = (
            anchors.join(q_st, left_on="q", right_on="q_study_key")
            .join(r_st, left_on=["r", "entity_id"], right_on=["r_study_key", "entity_id"])
            .filter(pl.col("entity_id") != pl.col("link"))
        )
        key = pl.concat_str("q_state", "r_state", separator="|").replace_strict(
            {
                "present|absent": "query_only",
                "absent|present": "reference_only",
                "present|present": "both",
                "absent|absent": "neither",
            },
            default=None,
        )
        parts.append(both.with_columns(question_type=pl.lit("case_presence"), answer_key=key))
    cols = [
        "q",
        "r",
        "link",
        "entity_id",
        "family",
        "split",
        "patient_key",
        "shard",
        "question_type",
        "answer_key",
        "q_state",
        "r_state",
        "q_severity",
        "r_severity",
        "q_laterality",
        "r_laterality",
        "q_mention_ids",
        "r_mention_ids",
    ]
    parts = [p.select(cols) for p in parts if p.height]
    if not parts:
        return SCHEMA.empty_table()
    items = pl.concat(parts)
    names.check(items.select("family", "entity_id").unique())
    items = items.with_columns(anchor=pl.concat_str("q", "r", separator="|"))
    order = {t: i for i, t in enumerate(types)}
    items = items.with_columns(
        item_id=item_ids(items, "anchor", "question_type", "entity_id"),
        type_order=pl.col("question_type").replace_strict(order, return_dtype=pl.Int32),
    )
    items = _questions(items, types, names).join(names.names, on=["family", "entity_id"], how="left")
    reason = templates["case_reason"].split("{query}")
    before, rest = reason[0], reason[1].split("{reference}")
    items = items.with_columns(
        reason=pl.concat_str(
            pl.lit(before),
            _describe(pl.col("q_state"), pl.col("q_severity"), pl.col("q_laterality"), pl.col("entity_name")),
            pl.lit(rest[0]),
            _describe(pl.col("r_state"), pl.col("r_severity"), pl.col("r_laterality"), pl.col("entity_name")),
            pl.lit(rest[1]),
        )
    )
    items = items.filter(~_contains_answer(items))
    items = _cap(items, cfg.max_items_per_pair)
    if items.height == 0:
        return SCHEMA.empty_table()
    items = _render_options(items, types, cfg.n_options, names)
    out = items.with_columns(
        pair_id=pl.lit(None, pl.Utf8),
        study_key=pl.col("q"),
        reference_study_key=pl.col("r"),
        study_keys=pl.concat_list("r", "q"),
        answer_format=pl.lit("multiple_choice"),
        entity_ids=pl.when(pl.col("question_type") == "case_presence")
        .then(pl.concat_list("entity_id", "link"))
        .otherwise(pl.concat_list("entity_id")),
        mention_ids=pl.concat_list(pl.col("q_mention_ids").fill_null([]), pl.col("r_mention_ids").fill_null([]))
        .list.unique()
        .list.sort(),
    )
    return out.sort("shard", "item_id").select(SCHEMA.names).to_arrow().cast(SCHEMA)
