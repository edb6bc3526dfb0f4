"""k-fold discipline for rule writing: which records of a labelled set rules may be written on, which are held out.

Every record of a shared labelled set falls in one of ``k`` folds by a hash of the set name and its id
(:func:`fold_of`: SHA-256, so the assignment never depends on file order or on the other records). The folds
open for rule writing are listed per set in ``eval_folds.yaml``; rule work looks only at errors on those
(``medreco eval entities --folds development``), and every figure is reported on both parts
(``tuned`` and ``held-out``), with their difference. A rule set that only fits the records at hand shows a gap.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from schemas.errors import ReasonCodedError

FOLDS_FILE = Path(__file__).with_name("eval_folds.yaml")
PARTS = ("tuned", "held-out")


class FoldsError(ReasonCodedError, ValueError):
    """``eval_folds.yaml`` cannot be used (message names the problem)."""

    default_reason = "folds_invalid"
    message_format = "{message}"


def fold_of(set_name: str, record_id: str, k: int, seed: int | None = None) -> int:
    """Fold (0..k-1) of one record: ``int(sha256(set_name + ":" + record_id)) mod k``.

    ``seed`` (an int) draws another assignment: the key becomes ``"<seed>:<set_name>:<record_id>"``. A rule written
    looking at the tuned folds of one assignment is judged on the held-out folds of another (``medreco eval entities
    --fold-seed N``), so the held-out figure is not the one the rule's author saw move.

    Raises
    ------
    ValueError
        ``k`` < 2.
    """
    if k < 2:
        raise ValueError(f"k must be >= 2, got {k}")
    key = f"{set_name}:{record_id}" if seed is None else f"{seed}:{set_name}:{record_id}"
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:8], "big") % k


@dataclass(frozen=True)
class FoldPlan:
    """Folds of one labelled set: ``k``, the folds open for rule writing (``tuned``) and the assignment ``seed``
    (None: the assignment rule work looks at, see :func:`fold_of`)."""

    set_name: str
    k: int
    tuned: frozenset[int]
    seed: int | None = None

    def part(self, record_id: str) -> str:
        """``"tuned"`` or ``"held-out"`` for one record id."""
        return "tuned" if fold_of(self.set_name, str(record_id), self.k, self.seed) in self.tuned else "held-out"

    def reseeded(self, seed: int | None) -> FoldPlan:
        """The same plan over another fold assignment (``seed``; None: the default one)."""
        return FoldPlan(self.set_name, self.k, self.tuned, seed)


def load_fold_plans(path: str | Path | None = None) -> dict[str, FoldPlan]:
    """Fold plans by set name from ``eval_folds.yaml`` (default :data:`FOLDS_FILE`).

    Raises
    ------
    FoldsError
        Missing file or a set without ``k`` >= 2 and a non-empty ``tuned`` list of folds below ``k`` that leaves
        at least one fold held out.
    """
    path = Path(path) if path else FOLDS_FILE
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        plans = {}
        for name, spec in data["sets"].items():
            k, tuned = int(spec["k"]), frozenset(int(f) for f in spec["tuned"])
            if k < 2 or not tuned or not tuned < frozenset(range(k)):
                raise FoldsError(
                    f"{path.name}: set {name}: tuned folds {sorted(tuned)} must be a proper subset of 0..{k - 1}"
                )
            plans[name] = FoldPlan(name, k, tuned)
    except FoldsError:
        raise
    except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError) as exc:
        raise FoldsError(f"{path.name}: {type(exc).__name__}: {exc}") from exc
    return plans


def render_fold_line(plan: FoldPlan, figure: str, values: Mapping[str, float | None], sizes: Mapping[str, int]) -> str:
    """``k-fold <set>[ (seed N)]: <figure>: tuned (folds a,b; n=..) x | held-out (folds c,d; n=..) y | gap y-x``.

    ``values``/``sizes``: by part (``tuned``, ``held-out``; other keys ignored); a value None (the figure is
    undefined on that part, e.g. an F1 without any gold or predicted positive) prints ``n/a``.
    """
    held = sorted(set(range(plan.k)) - plan.tuned)
    tuned = sorted(plan.tuned)
    a, b = values["tuned"], values["held-out"]

    def fmt(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.3f}"

    gap = "n/a" if a is None or b is None else f"{b - a:+.3f}"
    seed = "" if plan.seed is None else f" (seed {plan.seed})"
    return (
        f"k-fold {plan.set_name}{seed}: {figure}: tuned (folds {','.join(map(str, tuned))}; n={sizes['tuned']}) "
        f"{fmt(a)} | held-out (folds {','.join(map(str, held))}; n={sizes['held-out']}) {fmt(b)} | gap {gap}"
    )
