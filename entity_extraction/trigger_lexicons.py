"""The field's published negation/uncertainty trigger lexicons as ConText rules, under our radiology layer.

Sources (files in ``entity_extraction/lexicons/``, each naming its origin and license in its header):

* the NegEx trigger list (Chapman W.W. et al., J Biomed Inform 2001;34(5):301-310; NegEx 2 / GenConText
  ``negex_triggers.txt``): pre-/post-negation, pseudo-negation, scope-ending conjunctions, pre-/post-possible;
* medspaCy's default English ConText rules (``resources/en/context_rules.json`` of the medspacy wheel);
* pyConText's lexical knowledge base (``KB/lexical_kb_05042016.tsv``, Chapman B.E. et al., J Biomed Inform
  2011;44(5):728-737);
* the CheXpert labeler's negation and uncertainty patterns (Irvin J. et al., AAAI 2019), written as phrases.

``field_lexicons_en.yaml`` says how each source's categories map to ours, the precedence and the triggers not
taken (each with a reason and an example sentence). :func:`merge_rules` puts our own rules
(``context_rules_<lang>.json``) first: one rule per literal, the first definition wins.
"""

from __future__ import annotations

import csv
import itertools
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

from schemas.errors import ReasonCodedError

#: categories whose rules state an assertion, and the assertion
ASSERTING = {"NEGATED_EXISTENCE": "absent", "POSSIBLE_EXISTENCE": "uncertain"}
#: our categories that state an assertion of their own (never carry a field reading): negation, uncertainty, the
#: high-likelihood hedge (asserts) and the noun-phrase hedge (uncertain below a negation; extract.py)
STATES_ASSERTION = frozenset({*ASSERTING, "PROBABLE_EXISTENCE", "NP_HEDGE"})
#: at most this many literals from one medspaCy token pattern (the patterns of the English rules give at most 60)
MAX_PATTERN_LITERALS = 200


class LexiconError(ReasonCodedError, ValueError):
    """A lexicon manifest or source file cannot be read (message names the file)."""

    default_reason = "lexicon_invalid"
    message_format = "{message}"


@dataclass(frozen=True)
class FieldRule:
    """One trigger of a field lexicon, already in our categories.

    ``source`` is the manifest's source name (``negex``, ``medspacy``, ``pycontext``, ``chexpert``), ``tag``
    the source's own category (``PREN``, ``NEGATED_EXISTENCE/FORWARD``, ``AMBIVALENT_EXISTENCE``, ``uncertain``).
    """

    literal: str
    category: str
    direction: str
    max_scope: int | None
    source: str
    tag: str

    def as_rule(self) -> dict:
        """The rule in the ``context_rules_<lang>.json`` layout."""
        rule: dict = {
            "literal": self.literal,
            "category": self.category,
            "direction": self.direction,
            "source": self.source,
        }
        if self.max_scope is not None:
            rule["max_scope"] = self.max_scope
        return rule


def _norm(literal: str) -> str:
    return " ".join(literal.lower().split())


def _data_lines(path: Path) -> list[list[str]]:
    with path.open(encoding="utf-8", newline="") as f:
        return [
            row
            for row in csv.reader(
                (ln for ln in f if ln.strip() and not ln.startswith("#")), delimiter="\t", quoting=csv.QUOTE_NONE
            )
        ]


def expand_pattern(pattern: list[dict]) -> list[str]:
    """The literal phrases a medspaCy token pattern matches, when it uses only ``LOWER`` (a string or ``{"IN": [...]}``)
    and ``OP: "?"``.

    Returns
    -------
    list of str
        Every phrase (optional tokens left out or in), at most :data:`MAX_PATTERN_LITERALS`.

    Raises
    ------
    LexiconError
        A token with another attribute or operator, or too many phrases.
    """
    choices: list[list[str]] = []
    for token in pattern:
        if set(token) - {"LOWER", "OP"} or token.get("OP", "?") != "?":
            raise LexiconError(f"token pattern {token} is not LOWER/IN with an optional '?'")
        value = token["LOWER"]
        words = list(value["IN"]) if isinstance(value, dict) else [value]
        choices.append(words + ([""] if token.get("OP") == "?" else []))
    phrases = []
    for combo in itertools.product(*choices):
        phrase = _norm(" ".join(w for w in combo if w))
        if phrase and phrase not in phrases:
            phrases.append(phrase)
        if len(phrases) > MAX_PATTERN_LITERALS:
            raise LexiconError(f"token pattern {pattern} gives more than {MAX_PATTERN_LITERALS} phrases")
    return phrases


def _scope(manifest: dict, category: str, direction: str) -> int | None:
    return (manifest.get("max_scope", {}).get(category) or {}).get(direction)


def _read_source(folder: Path, source: dict, manifest: dict) -> list[FieldRule]:
    name, fmt = source["name"], source["format"]
    path = folder / source["file"]
    out: list[FieldRule] = []

    def add(literal: str, category: str | None, direction: str, tag: str) -> None:
        if category is None:
            return
        if category == "CLAUSE_BREAK":
            direction = "PSEUDO"
        direction = direction.upper()
        out.append(FieldRule(_norm(literal), category, direction, _scope(manifest, category, direction), name, tag))

    if fmt == "negex":
        for row in _data_lines(path):
            tag = row[-1].strip().strip("[]")
            spec = source["tags"][tag]
            add(row[0], spec["category"], spec["direction"], tag)
    elif fmt == "chexpert":
        rows = _data_lines(path)
        for row in rows[1:]:  # header: phrase, reading, direction, from
            add(row[0], source["readings"][row[1]], row[2], row[1])
    elif fmt == "pycontext":
        rows = _data_lines(path)
        for row in rows[1:]:  # header: Lex, Type, Direction
            kind, direction = row[1].strip(), row[2].strip().lower()
            category = source["types"][kind]
            direction = {"forward": "FORWARD", "backward": "BACKWARD", "bidirectional": "BIDIRECTIONAL"}[direction]
            add(row[0], category, direction, kind)
    elif fmt == "medspacy":
        for rule in json.loads(path.read_text(encoding="utf-8"))["context_rules"]:
            kind, direction = rule["category"], rule["direction"].upper()
            category = "CLAUSE_BREAK" if direction == "TERMINATE" else source["categories"][kind]
            literals = expand_pattern(rule["pattern"]) if rule.get("pattern") else [rule["literal"]]
            for literal in literals:
                add(literal, category, direction, f"{kind}/{direction}")
    else:
        raise LexiconError(f"{path.name}: unknown format {fmt!r}")
    return out


def load_field_lexicons(manifest_path: str | Path) -> tuple[list[FieldRule], dict[str, dict]]:
    """Read the manifest and every source it names.

    Parameters
    ----------
    manifest_path : str or Path
        ``field_lexicons_<lang>.yaml`` (layout in its header comment).

    Returns
    -------
    (rules, excluded)
        ``rules``: every field trigger in our categories, sources in manifest order, file order within a source,
        excluded literals left out (duplicates kept: :func:`merge_rules` keeps the first). ``excluded``: literal ->
        ``{"reason", "example"}``.

    Raises
    ------
    LexiconError
        Missing or malformed manifest or source file, unknown format, tag or category.
    """
    manifest_path = Path(manifest_path)
    try:
        manifest = yaml.safe_load(manifest_path.read_text(encoding="utf-8"))
        excluded = {
            _norm(e["literal"]): {"reason": e["reason"], "example": e.get("example")}
            for e in manifest.get("exclude", ())
        }
        rules = [
            r
            for source in manifest["sources"]
            for r in _read_source(manifest_path.parent, source, manifest)
            if r.literal not in excluded
        ]
    except LexiconError:
        raise
    except (OSError, KeyError, IndexError, TypeError, ValueError, yaml.YAMLError) as exc:
        raise LexiconError(f"{manifest_path.name}: {type(exc).__name__}: {exc}") from exc
    return rules, excluded


def _literals(rule: dict) -> Iterable[str]:
    if "phrases" in rule:
        return (_norm(f"{p} {f}") for p in rule["phrases"] for f in rule["followed_by"])
    return (_norm(rule["literal"]),)


def merge_rules(own: list[dict], field: list[FieldRule]) -> list[dict]:
    """Our rules first, then every field trigger whose literal none of ours (nor an earlier field rule) holds.

    Parameters
    ----------
    own : list of dict
        Rules of ``context_rules_<lang>.json``.
    field : list of FieldRule
        :func:`load_field_lexicons` rules, in precedence order.

    Returns
    -------
    list of dict
        Rules in the ``context_rules`` layout. An own rule of a category that states no assertion whose literal a
        field source reads as negated or uncertain gets ``"assertion"`` (``absent``/``uncertain``, the first field
        reading) unless it states its own; a HYPOTHETICAL rule never carries ``absent``.
    """
    field_assertion: dict[str, str] = {}
    for r in field:
        if r.category in ASSERTING:
            field_assertion.setdefault(r.literal, ASSERTING[r.category])
    out, seen = [], set()
    for rule in own:
        lits = list(_literals(rule))
        if rule["category"].upper() not in STATES_ASSERTION and "assertion" not in rule:
            carried = next((field_assertion[lit] for lit in lits if lit in field_assertion), None)
            # ConText moved NegEx's indication phrases ("evaluate for", "to exclude") from negation to hypothetical:
            # what is asked about is not said absent (Harkema et al. 2009); an uncertain reading is carried
            if carried == "absent" and rule["category"].upper() == "HYPOTHETICAL":
                carried = None
            if carried is not None:
                rule = {**rule, "assertion": carried}
        out.append(rule)
        seen.update(lits)
    for r in field:
        if r.literal not in seen:
            seen.add(r.literal)
            out.append(r.as_rule())
    return out
