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
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.level == 0
                and node.module.startswith("mirrorfit")
            ):
                for alias in node.names:  # `from pkg import module` imports that module
                    child = f"{node.module}.{alias.name}"
                    found.add(child if child in modules else node.module)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name in modules)
        # A package's own __init__ runs first, but importing a submodule is not a climb back.
        graph[name] = {
            m for m in found if m in modules and m != name and not name.startswith(m + ".")
        }
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
    # config/ is a package; _frameworks.py is what every layer asks before a framework starts
    assert top == ["__init__.py", "__main__.py", "_frameworks.py", "_io.py", "errors.py"]


# Where a framework may be imported, and why: its engine's folder, and the modules whose job
# needs it whichever engine trains. A new import elsewhere fails here: reach the engine through
# engine/contract.py, or add the module with its reason.
FRAMEWORK_HOMES = {
    "tensorflow": {
        "mirrorfit.engine.tensorflow": "the TensorFlow engine",
        "mirrorfit.engine.backends": "imports it with its C++ start-up lines filtered",
        "mirrorfit.serving": "TF Serving's protocol and SavedModels",
        "mirrorfit.artifacts.export": "writes a SavedModel",
        "mirrorfit.job.evaluate": "scores a SavedModel",
        "mirrorfit.data": "the tf.data readers: image folders, TFRecords, user datasets",
        "mirrorfit.bench.flops": "TensorFlow's profiler counts a model's FLOPs",
        "mirrorfit.distribute.cluster": "TensorFlow's own TF_CONFIG resolver, cross-checked",
    },
    "jax": {
        "mirrorfit.engine.jax": "the JAX engine",
        "mirrorfit.engine.backends": "imports it before Keras, to say in one line it is missing",
        "mirrorfit.bench.jax_point": "a bench point of the JAX engine, in its own process",
        "mirrorfit.bench.flops": "XLA's cost analysis counts a model's FLOPs",
    },
}


def _framework_imports() -> dict[str, set[str]]:
    """module -> the frameworks (tensorflow, jax) it imports anywhere in its body."""
    found: dict[str, set[str]] = {}
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
                else []
            )
            if isinstance(node, ast.ImportFrom) and node.module == "mirrorfit.data._tf":
                names = ["tensorflow"]  # the data modules' lazy TensorFlow
            for imported in names:
                top = imported.split(".")[0]
                if top in FRAMEWORK_HOMES:
                    found.setdefault(name, set()).add(top)
    return found


def test_frameworks_are_imported_only_where_they_must_be():
    stray = {
        module: sorted(frameworks)
        for module, frameworks in _framework_imports().items()
        for framework in frameworks
        if not any(
            module == home or module.startswith(home + ".") for home in FRAMEWORK_HOMES[framework]
        )
    }
    assert not stray, stray


# Outside engine/ a module asks an engine what it can do (mirrorfit.engine.backends' tables,
# the engine package's attributes), not which one it is. The exceptions, where the user names
# the backend itself: module -> (comparisons, why).
BACKEND_NAMED = {
    "mirrorfit._frameworks": (1, "whether TensorFlow's module is loaded: its start-up lines"),
    "mirrorfit.bench": (1, "FLOPs are counted by the first backend the user listed"),
    "mirrorfit.bench.grid": (2, "the data JAX rows read; Keras's own fit rows, per backend"),
    "mirrorfit.bench.point": (2, "a row's label and the process it runs in, per backend"),
    "mirrorfit.bench.fit_point": (2, "the yardstick's placement and steps per call, per backend"),
    "mirrorfit.cli": (1, "bench --backend tensorflow without TensorFlow installed"),
    "mirrorfit.data.sources": (1, "a missing module's name, not a backend"),
}


def _backend_comparisons(path: Path) -> int:
    names = {"jax", "tensorflow"}
    count = 0
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare) and any(
            isinstance(side, ast.Constant) and side.value in names
            for side in [node.left, *node.comparators]
        ):
            count += 1
    return count


def test_no_backend_comparisons_outside_the_engines():
    found = {
        name: n
        for name, path in _modules().items()
        if not name.startswith("mirrorfit.engine")
        for n in [_backend_comparisons(path)]
        if n
    }
    assert found == {name: n for name, (n, _) in BACKEND_NAMED.items()}


# The packages data flows through first (docs/architecture.md): they import nothing of the
# packages that run on them (an engine's reader is passed in: artifacts.checkpoint.ReadState).
BELOW = ("mirrorfit.data", "mirrorfit.models", "mirrorfit.artifacts")
ABOVE = ("mirrorfit.engine", "mirrorfit.fitting", "mirrorfit.job", "mirrorfit.cli")


def test_the_lower_packages_do_not_reach_up():
    climbs = {
        module: {d for d in deps if d.startswith(ABOVE)}
        for module, deps in import_graph().items()
        if module.startswith(BELOW)
    }
    assert {m: d for m, d in climbs.items() if d} == {}
