"""Every exception class the project defines derives from :class:`schemas.errors.ReasonCodedError`, so each one
carries a machine-readable ``reason`` (the reader package, which imports nothing of the project, is apart).

Read from the source with :mod:`ast`: a class is an exception when one of its bases is a builtin exception or an
exception class of the project (by name), and it must reach ``ReasonCodedError`` through its bases.
"""

from __future__ import annotations

import ast
import builtins

from schemas.config import PROJECT_ROOT

PACKAGES = ("etl", "schemas", "entity_extraction", "quality", "training", "dags", "plugins", "medreco")
BUILTIN_ERRORS = {
    n
    for n in dir(builtins)
    if isinstance(getattr(builtins, n), type) and issubclass(getattr(builtins, n), BaseException)
}


def _base_name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def _classes() -> dict[str, tuple[str, list[str]]]:
    """class name -> (where, base names) for every class of the project's packages."""
    out: dict[str, tuple[str, list[str]]] = {}
    for pkg in PACKAGES:
        for path in sorted((PROJECT_ROOT / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef):
                    out[node.name] = (
                        f"{path.relative_to(PROJECT_ROOT)}:{node.lineno}",
                        [_base_name(b) for b in node.bases],
                    )
    return out


def _ancestors(name: str, classes: dict, seen: frozenset = frozenset()) -> set[str]:
    if name in seen or name not in classes:
        return set()
    out = set()
    for base in classes[name][1]:
        out |= {base} | _ancestors(base, classes, seen | {name})
    return out


def test_every_project_exception_is_reason_coded():
    classes = _classes()
    assert "ReasonCodedError" in classes and len(classes) > 100
    known_errors = {"SnapshotError", "UnsupportedURIError"}  # the reader's (no reason codes there)
    offenders = []
    for name, (where, _) in classes.items():
        up = _ancestors(name, classes)
        is_error = bool(up & (BUILTIN_ERRORS | known_errors)) or any(
            b in classes and _ancestors(b, classes) & BUILTIN_ERRORS for b in up
        )
        if is_error and name != "ReasonCodedError" and "ReasonCodedError" not in up:
            offenders.append(f"{name} ({where})")
    assert offenders == []


def test_a_single_reason_error_is_raised_with_its_message_alone():
    from etl.storage import StorageError

    err = StorageError("cannot read x")
    assert (err.reason, err.detail, str(err)) == ("storage_error", "cannot read x", "cannot read x")
    from schemas.errors import ReasonCodedError

    coded = ReasonCodedError("truncated_file", "file ends early")
    assert (coded.reason, str(coded)) == ("truncated_file", "truncated_file: file ends early")
