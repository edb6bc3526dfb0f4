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
strings, one of them right. The item's seed is its ``item_id`` (16 hex characters of sha256) as a 64-bit integer;
all draws are SplitMix64 of the seed with a fixed salt, vectorised, with no RNG state (:func:`draw_options`):
distractors come from the same vocabulary minus options confusable with the answer (``confusable`` groups), the
``n - 1`` with the smallest hash; the answer's position is hash mod ``n_options``, which makes answer letters
uniform over items; the question paraphrase is hash mod the number of paraphrases. The shown order is recorded
in ``option_keys`` (vocabulary keys, anatomy ids for ``location``). An item whose question contains its answer
text as whole words (case-insensitive) is dropped. ``study_keys`` names the images' studies and ``mention_ids``
the ``entity_mentions`` of the entity in those studies (when mentions are given). Item format after the MedReCo
comparative VQA release (two images, question, entity, options A-D, answer letter) and the MIMIC-Diff-VQA
question set (Hu et al., KDD 2023).

Per pair and per study at most ``cfg.max_items_per_pair`` items are kept, taken round-robin over the
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

import numpy as np
import polars as pl
import pyarrow as pa
import yaml

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
    return np.array([int(i, 16) for i in item_ids], dtype=np.uint64)


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


_ITEM_COLUMNS = ("patient_key", "family", "entity_id", "shard", "pair_id", "study_key", "anchor", "study_keys",
                 "question_type", "answer_key", "entity_ids")


class _NameTable:
    """Entity display names per family (:func:`_display_names`), entity checks and location answers."""

    def __init__(self, ontology: Ontology) -> None:
        self.ontology = ontology
        rows = []
        for family in ontology.families:
            for entity, name in _display_names(ontology, family).items():
                rows.append((family, entity, name))
        self.names = pl.DataFrame(rows, schema={"family": pl.Utf8, "entity_id": pl.Utf8, "entity_name": pl.Utf8},
                                  orient="row")

    def check(self, pairs: pl.DataFrame) -> None:
        """Raise on an unknown family, an entity not in the ontology or not in its family."""
        for family, entity in pairs.select("family", "entity_id").unique().sort("family", "entity_id").iter_rows():
            if family not in self.ontology.families:
                raise VQAInputError("unknown_family", f"family {family!r} is not in the ontology")
            if entity not in self.ontology.concepts:
                raise VQAInputError(
                    "unknown_entity", f"entity {entity!r} is not in ontology {self.ontology.version}"
                )
            if self.ontology.families and entity not in {c.id for c in self.ontology.family_concepts(family)}:
                raise VQAInputError("entity_not_in_family", f"entity {entity} does not belong to family {family}")

    def locatable(self) -> pl.DataFrame:
        """(family, entity_id, anatomy_id): findings with an anatomy whose name does not need qualifying."""
        onto, rows = self.ontology, []
        for family, entity, name in self.names.iter_rows():
            c = onto.concepts[entity]
            if c.category == "finding" and c.anatomy_id in onto.concepts and name == _readable(c.preferred_name):
                rows.append((family, entity, c.anatomy_id))
        return pl.DataFrame(rows, schema={"family": pl.Utf8, "entity_id": pl.Utf8, "anatomy_id": pl.Utf8},
                            orient="row")

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
    items = items.with_columns(template=pl.Series(template.tolist(), dtype=pl.Utf8),
                               answer_text=pl.Series(answer_text.tolist(), dtype=pl.Utf8))
    items = items.join(names.names, on=["family", "entity_id"], how="left")
    return items.with_columns(
        question=pl.col("template").str.replace_all("{entity}", pl.col("entity_name"), literal=True)
    ).drop("template", "entity_name")


def _contains_answer(items: pl.DataFrame) -> pl.Series:
    """True where the answer text occurs in the question as whole words, case-insensitively."""
    answers = items.get_column("answer_text").unique().to_list()
    patterns = {a: r"(?i)\b" + re.escape(a) + r"\b" for a in answers}
    return items.select(
        pl.col("question").str.contains(pl.col("answer_text").replace_strict(patterns, return_dtype=pl.Utf8))
    ).to_series()


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
        out.append(g.with_columns(
            option_keys=code_list.list.eval(pl.element().replace_strict(positions, table, return_dtype=pl.Utf8)),
            options=code_list.list.eval(pl.element().replace_strict(
                positions, [text[k] for k in table], return_dtype=pl.Utf8)),
            answer=pl.Series(np.array(list(LETTERS))[pos], dtype=pl.Utf8),
        ))
    return pl.concat(out).sort("item_id")


def _with_mentions(items: pl.DataFrame, entity_mentions: pl.DataFrame) -> pl.DataFrame:
    """Add ``mention_ids``: the mentions of the item's first entity in the item's studies, sorted."""
    m = entity_mentions.select("mention_id", "study_key", "entity_id").filter(pl.col("study_key").is_not_null())
    ex = items.select("item_id", "entity_id", pl.col("study_keys").alias("sk")).explode("sk")
    got = (
        ex.join(m, left_on=["sk", "entity_id"], right_on=["study_key", "entity_id"], how="inner")
        .group_by("item_id").agg(mention_ids=pl.col("mention_id").unique().sort())
    )
    return items.join(got, on="item_id", how="left").with_columns(
        pl.col("mention_ids").fill_null(pl.lit([], pl.List(pl.Utf8)))
    )


def build_vqa(
    pairs: pl.DataFrame,
    study_labels: pl.DataFrame,
    studies: pl.DataFrame,
    splits: pl.DataFrame,
    cfg: VQAConfig,
    templates: dict,
    ontology: Ontology,
    entity_mentions: pl.DataFrame | None = None,
) -> pa.Table:
    """Build the ``vqa`` items of one shard (vectorised with polars and numpy).

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
        without it ``mention_ids`` is empty.

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
    types = templates["question_types"]
    order = {t: i for i, t in enumerate(types)}

    label_schema = {"study_key": pl.Utf8, "entity_id": pl.Utf8, "state": pl.Utf8}
    labels = pl.DataFrame(schema=label_schema)
    if study_labels.height:
        _require(study_labels, _LABEL_COLUMNS, "study_labels")
        labels = study_labels.select(_LABEL_COLUMNS)
        if labels.select(pl.struct("study_key", "entity_id").is_duplicated().any()).item():
            raise VQAInputError("duplicate_label", "study_labels repeats an entity of a study")
    split_of = pl.DataFrame(schema={"patient_key": pl.Utf8, "split": pl.Utf8})
    if splits.height:
        _require(splits, _SPLIT_COLUMNS, "splits")
        split_of = splits.select(_SPLIT_COLUMNS).unique("patient_key", keep="first")

    names = _NameTable(ontology)
    parts: list[pl.DataFrame] = []
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
        base = dict(pair_id=pl.lit(None, pl.Utf8), anchor=pl.col("study_key"),
                    study_keys=pl.concat_list(pl.col("study_key")))
        if "presence" in types:
            parts.append(lab.filter(pl.col("state").is_in(ANSWER_KEYS["presence"])).select(
                "patient_key", "family", "entity_id", "shard", "study_key", **base,
                question_type=pl.lit("presence"), answer_key=pl.col("state"),
                entity_ids=pl.concat_list(pl.col("entity_id"))))
        if "location" in types:
            loc = names.locatable().join(lab.filter(pl.col("state") == "present"), on=["family", "entity_id"])
            parts.append(loc.select(
                "patient_key", "family", "entity_id", "shard", "study_key", **base,
                question_type=pl.lit("location"), answer_key=pl.col("anatomy_id"),
                entity_ids=pl.concat_list("entity_id", "anatomy_id")))
    if pairs.height:
        _require(pairs, _PAIR_COLUMNS, "pairs")
        bad_family = set(pairs.get_column("family").unique().to_list()) - set(ontology.families)
        if bad_family:
            raise VQAInputError("unknown_family", f"family {sorted(bad_family)[0]!r} is not in the ontology")
        pr = pairs.select(_PAIR_COLUMNS)
        base = dict(study_key=pl.lit(None, pl.Utf8), anchor=pl.col("pair_id"),
                    study_keys=pl.concat_list("prior_study_key", "current_study_key"))
        if "change" in types:
            ch = pr.explode("change_labels").filter(pl.col("change_labels").is_not_null()).with_columns(
                entity_id=pl.col("change_labels").struct.field("entity_id"),
                answer_key=pl.col("change_labels").struct.field("change"))
            bad = set(ch.get_column("answer_key").unique().to_list()) - (
                set(types["change"]["options"]) & set(ANSWER_KEYS["change"]))
            if bad:
                raise VQAInputError("unknown_change", f"pair change label {sorted(bad)[0]!r} has no option text")
            names.check(ch.select("family", "entity_id").unique())
            parts.append(ch.select("patient_key", "family", "entity_id", "shard", "pair_id", **{
                k: v for k, v in base.items() if k != "pair_id"}, question_type=pl.lit("change"),
                answer_key="answer_key", entity_ids=pl.concat_list(pl.col("entity_id"))))
        if "comparison_presence" in types:
            both = pr.join(labels.rename({"study_key": "prior_study_key", "state": "prior_state"}),
                           on="prior_study_key").join(
                labels.rename({"study_key": "current_study_key", "state": "current_state"}),
                on=["current_study_key", "entity_id"])
            key = pl.concat_str("prior_state", "current_state", separator="|").replace_strict(
                {"present|absent": "prior_only", "absent|present": "current_only", "present|present": "both",
                 "absent|absent": "neither"}, default=None)
            cp = both.with_columns(answer_key=key).filter(pl.col("answer_key").is_not_null())
            names.check(cp.select("family", "entity_id").unique())
            parts.append(cp.select("patient_key", "family", "entity_id", "shard", "pair_id", **{
                k: v for k, v in base.items() if k != "pair_id"}, question_type=pl.lit("comparison_presence"),
                answer_key="answer_key", entity_ids=pl.concat_list(pl.col("entity_id"))))
    parts = [x.select(_ITEM_COLUMNS) for x in parts if x.height]
    if not parts:
        return SCHEMA.empty_table()
    items = pl.concat(parts)
    items = items.join(split_of, on="patient_key", how="left")
    if items.get_column("split").null_count():
        raise VQAInputError("patient_without_split", "a patient with VQA items has no row in splits")
    ids = [item_id(a, t, e) for a, t, e in zip(items["anchor"].to_list(), items["question_type"].to_list(),
                                                items["entity_id"].to_list(), strict=True)]
    items = items.with_columns(item_id=pl.Series(ids, dtype=pl.Utf8),
                               type_order=pl.col("question_type").replace_strict(order, return_dtype=pl.Int32))
    items = _questions(items, types, names)
    items = items.filter(~_contains_answer(items))  # the question must never give its answer away
    # the cap: round-robin over the types in template order, each type's items in item_id order
    items = (
        items.sort("anchor", "type_order", "item_id")
        .with_columns(r=pl.int_range(pl.len()).over("anchor", "type_order"))
        .sort("anchor", "r", "type_order")
        .filter(pl.int_range(pl.len()).over("anchor") < cfg.max_items_per_pair)
        .sort("item_id")
    )
    if items.get_column("item_id").is_duplicated().any():
        dup = items.filter(pl.col("item_id").is_duplicated()).get_column("item_id")[0]
        raise VQAInputError("duplicate_item", f"item {dup} generated twice (repeated pair or label)")
    out = _render_options(items, types, cfg.n_options, names)
    if entity_mentions is not None and entity_mentions.height:
        out = _with_mentions(out, entity_mentions)
    else:
        out = out.with_columns(mention_ids=pl.lit([], pl.List(pl.Utf8)))
    return out.select(SCHEMA.names).to_arrow().cast(SCHEMA)
