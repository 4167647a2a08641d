"""The package's layout: modules import each other one way (no cycles, function-level imports
counted too), so a newcomer can follow a flow without climbing back up."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _modules() -> dict[str, Path]:
    out = {}
    for path in (SRC / "mirrorfit").rglob("*.py"):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the mirrorfit modules it imports anywhere in its body."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                    and node.module.startswith("mirrorfit"):
                for alias in node.names:  # `from pkg import module` imports that module
                    child = f"{node.module}.{alias.name}"
                    found.add(child if child in modules else node.module)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name in modules)
        # A package's own __init__ runs first, but importing a submodule is not a climb back.
        graph[name] = {m for m in found if m in modules and m != name
                       and not name.startswith(m + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_modules_import_each_other_one_way():
    graph = import_graph()
    assert len(graph) > 80  # the walk found the package
    assert cycles(graph) == []


def test_the_cycle_check_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_only_the_entry_points_sit_at_the_top():
    top = sorted(p.name for p in (SRC / "mirrorfit").glob("*.py"))
    assert top == ["__init__.py", "__main__.py", "_io.py", "config.py", "errors.py"]
