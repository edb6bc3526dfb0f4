"""Attribute Types per IOD for de-identification: compound actions of PS3.15 Table E.1-1 resolved by Type.

Table E.1-1 gives some attributes a compound action (``X/Z``, ``X/D``, ``Z/D``, ``X/Z/D``, ``X/Z/U*``)
because the attribute's Type differs between IODs. PS3.15 E.3.1 intends the action that the Type of the
attribute in the object's IOD allows: X for Type 3 (an optional sequence included), Z for Type 2 / 2C, D
for Type 1 / 1C. The Types are data (``schemas/deid/iod_types.yaml``, PS3.3 module tables); this module
reads them and picks the action.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from schemas.config import PROJECT_ROOT
from schemas.errors import ReasonCodedError

TYPES_FILE = PROJECT_ROOT / "schemas" / "deid" / "iod_types.yaml"
#: strength order of PS3.5 7.4 data element types (the strongest of several modules wins)
_STRENGTH = {"1": 5, "1C": 4, "2": 3, "2C": 2, "3": 1}
#: the action each Type asks for (PS3.15 E.3.1)
_WANTED = {"1": "D", "1C": "D", "2": "Z", "2C": "Z", "3": "X"}
#: when the wanted action is not among a compound's choices: the nearest conformant one, in order
_FALLBACK = {"D": ("D", "U*"), "Z": ("Z", "D", "U*"), "X": ("X", "Z", "U*", "D")}


class TypesError(ReasonCodedError, ValueError):
    """Raised for a malformed ``iod_types.yaml`` (unknown module, Type or keyword)."""

    default_reason = "deid_types_invalid"
    message_format = "{message}"


@dataclass(frozen=True)
class IodTypes:
    """Attribute Types of the top level of each IOD, by SOP Class UID (see :func:`load_iod_types`)."""

    edition: str
    #: SOP Class UID (exact, or a prefix ending in ".") -> {keyword: Type}
    by_sop_class: dict[str, dict[str, str]]
    default: dict[str, str]

    def types_for(self, sop_class_uid: str | None) -> dict[str, str]:
        """{keyword: Type} of the listed modules of the IOD of ``sop_class_uid``.

        An exact UID entry wins over the longest matching prefix entry (``"...88."``), which wins over
        the ``default`` entry (composite image IODs). Returns the same dict object for equal inputs.
        """
        uid = (sop_class_uid or "").strip().rstrip("\x00")
        if uid in self.by_sop_class:
            return self.by_sop_class[uid]
        best = None
        for key in self.by_sop_class:
            if key.endswith(".") and uid.startswith(key) and (best is None or len(key) > len(best)):
                best = key
        return self.by_sop_class[best] if best is not None else self.default

    def type_of(self, sop_class_uid: str | None, keyword: str) -> str | None:
        """The Type ("1", "1C", "2", "2C" or "3") of a top-level attribute in the IOD, or None when no listed
        module of the IOD holds it."""
        return self.types_for(sop_class_uid).get(keyword)


@lru_cache(maxsize=4)
def load_iod_types(path: str | None = None) -> IodTypes:
    """Read ``schemas/deid/iod_types.yaml`` (or ``path``).

    Raises
    ------
    TypesError
        for an unknown module name in an IOD, a Type other than 1, 1C, 2, 2C, 3, or a keyword that is
        not in pydicom's data dictionary.
    """
    from pydicom.datadict import tag_for_keyword

    data = yaml.safe_load(Path(path or TYPES_FILE).read_text(encoding="utf-8"))
    modules: dict[str, dict[str, str]] = {}
    for name, attrs in data["modules"].items():
        for kw, t in attrs.items():
            if str(t) not in _STRENGTH:
                raise TypesError(f"{TYPES_FILE.name}: module {name}: Type of {kw} is not 1, 1C, 2, 2C or 3")
            if tag_for_keyword(kw) is None:
                raise TypesError(f"{TYPES_FILE.name}: module {name}: {kw} is not a DICOM keyword")
        modules[name] = {kw: str(t) for kw, t in attrs.items()}

    def merge(names: list[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for name in names:
            if name not in modules:
                raise TypesError(f"{TYPES_FILE.name}: unknown module {name}")
            for kw, t in modules[name].items():
                if kw not in out or _STRENGTH[t] > _STRENGTH[out[kw]]:
                    out[kw] = t
        return out

    iods = data["iods"]
    return IodTypes(
        edition=str(data["edition"]),
        by_sop_class={uid: merge(names) for uid, names in iods["sop_classes"].items()},
        default=merge(iods["default"]),
    )


def action_for_type(compound: str, attribute_type: str | None, untyped: str) -> str:
    """The action of a compound (or plain) Table E.1-1 action for an attribute of a known Type.

    Parameters
    ----------
    compound : str
        the Basic Profile action, e.g. ``"X/Z/D"``, ``"X/Z/U*"`` or a plain ``"X"``.
    attribute_type : str or None
        the attribute's Type in the object's IOD ("1", "1C", "2", "2C", "3"); None when not known.
    untyped : str
        the action used when the Type is not known (``profile.yaml`` ``compound``).

    Returns
    -------
    str
        X for Type 3, Z for Type 2 / 2C, D for Type 1 / 1C when the compound offers it (PS3.15 E.3.1);
        otherwise the nearest conformant choice it offers. A plain action is returned unchanged, except
        that a plain X on a Type 2 / 2C attribute becomes Z (no value kept, the IOD stays valid) and is
        kept X for Type 1 (never a dummy the table did not ask for).
    """
    choices = compound.split("/")
    if attribute_type is None:
        return untyped
    wanted = _WANTED[attribute_type]
    if len(choices) == 1:
        return "Z" if compound == "X" and wanted == "Z" else compound
    for action in _FALLBACK[wanted]:
        if action in choices:
            return action
    return untyped
