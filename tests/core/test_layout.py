"""The layout's import rules (README "Layout"): no import loop between files or between top-level folders, and
each top-level folder is one layer that imports only the layers below it (:data:`LAYERS`): ``etl`` imports nothing
above it; ``dags``, ``quality`` and ``training`` import ``etl``; only the application package ``medreco`` imports
them all; ``medreco_reader`` (the reader distribution, ``reader/src/``) imports nothing of the project.

Imports are read from the source with :mod:`ast` (every ``import`` and ``from ... import``, at module level and
inside functions), so a loop hidden behind a function-level import is found too.
"""

from __future__ import annotations

import ast
from pathlib import Path

from schemas.config import PROJECT_ROOT

#: top-level package -> the folder that holds it (the reader is its own distribution under reader/src)
PACKAGES = {
    "etl": PROJECT_ROOT,
    "schemas": PROJECT_ROOT,
    "entity_extraction": PROJECT_ROOT,
    "quality": PROJECT_ROOT,
    "training": PROJECT_ROOT,
    "dags": PROJECT_ROOT,
    "plugins": PROJECT_ROOT,
    "medreco": PROJECT_ROOT,
    "medreco_reader": PROJECT_ROOT / "reader" / "src",
}

#: the layers, bottom (0) to top: a module imports only its own top-level folder and folders of a lower layer
LAYERS = {
    "schemas": 0,
    "medreco_reader": 0,
    "entity_extraction": 1,
    "etl": 2,
    "quality": 3,
    "training": 3,
    "dags": 4,
    "plugins": 4,
    "medreco": 5,
}


def _module_name(path: Path, base: Path) -> str:
    rel = path.relative_to(base).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg, base in PACKAGES.items():
        for path in sorted((base / pkg).rglob("*.py")):
            mods[_module_name(path, base)] = path
    return mods


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The project module an imported name refers to (the longest known prefix), or None for a library."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module: str) -> set[str]:
    """Project modules imported anywhere in ``module`` (``from pkg import sub`` counts as ``pkg.sub``)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if (target := _resolve(alias.name)) is not None:
                    out.add(target)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_pkg else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                target = _resolve(f"{base}.{alias.name}") if f"{base}.{alias.name}" in MODULES else _resolve(base)
                if target is not None:
                    out.add(target)
    out.discard(module)
    return out


GRAPH = {m: _imports(m) for m in MODULES}


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of nodes (first == last), or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    for root in sorted(graph):
        if state.get(root):
            continue
        stack = [(root, iter(sorted(graph[root])))]
        path = [root]
        state[root] = 1
        while stack:
            node, children = stack[-1]
            for child in children:
                if child not in graph:
                    continue
                if state.get(child) == 1:
                    return path[path.index(child) :] + [child]
                if not state.get(child):
                    state[child] = 1
                    path.append(child)
                    stack.append((child, iter(sorted(graph[child]))))
                    break
            else:
                state[node] = 2
                stack.pop()
                path.pop()
    return None


def _room(module: str) -> str:
    """The node of the folder-level graph: the module's top-level folder."""
    return module.split(".")[0]


def test_the_walker_finds_imports_and_cycles():
    """Negative controls: the walker sees a function-level import and reports a planted loop."""
    assert "etl.storage" in GRAPH["etl.pipeline.context"]
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None
    assert len(MODULES) > 80


def test_no_import_loop_between_files():
    cycle = _find_cycle(GRAPH)
    assert cycle is None, "import loop: " + " -> ".join(cycle or [])


def test_no_import_loop_between_top_level_folders():
    rooms: dict[str, set[str]] = {}
    for mod, deps in GRAPH.items():
        rooms.setdefault(_room(mod), set()).update(_room(d) for d in deps if _room(d) != _room(mod))
    cycle = _find_cycle(rooms)
    assert cycle is None, "folder loop: " + " -> ".join(cycle or [])


def test_every_top_level_folder_has_a_layer():
    assert set(LAYERS) == set(PACKAGES)
    assert {_room(m) for m in MODULES} == set(LAYERS)


def test_each_folder_imports_only_layers_below_it():
    offenders = sorted(
        f"{m} -> {d}"
        for m, deps in GRAPH.items()
        for d in deps
        if _room(d) != _room(m) and LAYERS[_room(d)] >= LAYERS[_room(m)]
    )
    assert offenders == []


def test_the_layer_rule_catches_an_upward_import():
    """Negative control: an etl module importing the application layer breaks the rule."""
    graph = {"etl.x": {"medreco.cli.app"}, "medreco.cli.app": set()}
    bad = [(m, d) for m, deps in graph.items() for d in deps if LAYERS[_room(d)] >= LAYERS[_room(m)]]
    assert bad == [("etl.x", "medreco.cli.app")]
