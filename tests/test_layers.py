"""The import structure: four floors, arrows pointing down, no circles.

    floor 3  api/                       CLI, REST, worker, services (load, call the core, save)
    floor 2  profiler/  |  storage/     torch  |  SQL   (neither imports the other)
    floor 1  optimizer/                 the pure core: no storage, api, profiler or torch

Every import in the packages is read with `ast` (module level, inside functions
and under TYPE_CHECKING alike) and resolved to the module it names. The test
fails on an import against the floors, on torch outside `profiler/`, on a file
that imports a file importing it back (any cycle), and on a cycle between
subpackages (e.g. optimizer.latency -> optimizer.sim -> optimizer.latency).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FLOORS = {"optimizer": 1, "profiler": 2, "storage": 2, "api": 3}
HEAVY_IN_CORE = ("torch", "sqlalchemy", "alembic", "fastapi", "pydantic", "typer")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def _modules() -> dict[str, Path]:
    found = {}
    for package in FLOORS:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[_module_name(path)] = path
    return found


def _imported_names(path: Path) -> Iterator[tuple[int, str, tuple[str, ...]]]:
    """(line, module, names imported from it) for every absolute or relative import."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    here = _module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield node.lineno, base, tuple(a.name for a in node.names)


@cache
def _edges() -> dict[str, list[tuple[int, str]]]:
    """Project module -> (line, project module it imports), resolved to existing modules."""
    mods = _modules()
    out: dict[str, list[tuple[int, str]]] = {}
    for name, path in mods.items():
        targets = []
        for line, module, names in _imported_names(path):
            if module.split(".")[0] not in FLOORS:
                continue
            subs = [f"{module}.{n}" for n in names if f"{module}.{n}" in mods]
            targets += [(line, t) for t in subs]
            if module in mods and len(subs) < len(names or (1,)):
                targets.append((line, module))
        out[name] = sorted({t for t in targets if t[1] != name})
    return out


def test_imports_point_down_the_floors() -> None:
    wrong = []
    for source, targets in _edges().items():
        top = source.split(".")[0]
        for line, target in targets:
            other = target.split(".")[0]
            if other != top and FLOORS[other] >= FLOORS[top]:
                wrong.append(f"{_modules()[source].relative_to(ROOT)}:{line} imports {target}")
    assert not wrong, "imports against the floors (see this file's docstring):\n" + "\n".join(wrong)


@pytest.mark.parametrize("package", ["optimizer", "storage", "api"])
def test_torch_only_in_the_profiler_and_a_light_core(package: str) -> None:
    banned = ("torch",) if package != "optimizer" else HEAVY_IN_CORE
    wrong = []
    for name, path in _modules().items():
        if name.split(".")[0] != package:
            continue
        for line, module, _ in _imported_names(path):
            if module.split(".")[0] in banned:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not wrong, "\n".join(wrong)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _package_of(module: str) -> str:
    """A module's subpackage (optimizer.latency.model -> optimizer.latency)."""
    mods = _modules()
    parts = module.split(".")
    path = mods[module]
    return module if path.name == "__init__.py" else ".".join(parts[:-1])


def test_no_file_imports_a_file_that_imports_it_back() -> None:
    graph = {m: {t for _, t in targets} for m, targets in _edges().items()}
    assert _cycles(graph) == []


def test_no_cycle_between_subpackages() -> None:
    graph: dict[str, set[str]] = {}
    for source, targets in _edges().items():
        a = _package_of(source)
        graph.setdefault(a, set())
        for _, target in targets:
            b = _package_of(target)
            # A package importing its own subpackages (re-exports) is not a cycle.
            if b != a and not b.startswith(a + "."):
                graph[a].add(b)
    assert _cycles(graph) == []


def test_the_checks_see_what_they_claim() -> None:
    """Guards against a vacuous pass: the walk finds the known arrows and a planted cycle."""
    edges = _edges()
    assert ("optimizer.sim.engine" in edges) and len(edges) > 120
    assert any(t == "optimizer.config" for _, t in edges["optimizer.sim.engine"])
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
