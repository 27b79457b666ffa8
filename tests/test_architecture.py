"""The package's layers: no import circle, and no layer importing a layer above it.

Every import counts, wherever it stands: at module level, inside a function (the lazy imports that keep
torch and Optuna out of the CLI), or under ``TYPE_CHECKING``. docs/architecture.md draws the same layers.
"""

from __future__ import annotations

import ast
from pathlib import Path

import autotune

# Lowest first. A module may import its own package and the layers below it, nothing above.
LAYERS = (
    "autotune.core",  # the shared vocabulary: errors, budgets, plans, the trial protocol, paths
    "autotune.storage",  # the database: autotune's tables beside Optuna's
    "autotune.backends",  # plans and probes per backend (torch, ONNX Runtime)
    "autotune.runtime",  # inside the user's training process
    "autotune.hardware",  # devices, NVML, memory meters
    "autotune.trials",  # the tuner's side of one trial: command, launcher, measurement
    "autotune.leases",  # who runs what: worker identity, liveness, heartbeats
    "autotune.search",  # the space, the memory model, proposals, the ask/tell loop, verification
    "autotune.cluster",  # trials placed on a cluster (Ray): a node's share, the executor
    "autotune.workers",  # jobs, the worker daemon, tune()
    "autotune.results",  # answers from the database: best, studies, show
    "autotune.finder",  # a search inside the user's process: the decorator, the callbacks
    "autotune.api",  # the library API
    "autotune.cli",  # commands and rendering
)
FACADE = ("autotune", "autotune.__main__")  # the package's own front: lazy attributes, python -m autotune


def package_modules() -> dict[str, Path]:
    root = Path(autotune.__file__).resolve().parent
    found = {}
    for path in sorted(root.rglob("*.py")) + sorted((root / "storage").resolve().rglob("*.py")):
        base = root if path.is_relative_to(root) else (root / "storage").resolve()
        parts = path.relative_to(base).with_suffix("").parts
        parts = parts if base == root else ("storage", *parts)
        name = ".".join(("autotune", *(parts[:-1] if parts[-1] == "__init__" else parts)))
        found[name] = path
    return found


def import_graph(modules: dict[str, Path] | None = None) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, anywhere in its text (``modules``: name -> file, by
    default the installed package's)."""
    modules = modules if modules is not None else package_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                # an imported name that is a module counts as that module, else the module it comes from
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and target != "autotune":
                    edges.add(target)
        graph[name] = edges
    return graph


def layer_of(module: str) -> int:
    for index, layer in enumerate(LAYERS):
        if module == layer or module.startswith(layer + "."):
            return index
    if module in FACADE:
        return len(LAYERS)
    raise AssertionError(f"{module} belongs to no layer: add its package to LAYERS and docs/architecture.md")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = [stack.pop()]
            while component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_module_belongs_to_a_layer() -> None:
    for module in package_modules():
        layer_of(module)


def test_no_import_circle() -> None:
    assert cycles(import_graph()) == []


def test_no_layer_imports_a_layer_above_it() -> None:
    upward = [
        f"{module} -> {target}"
        for module, targets in sorted(import_graph().items())
        for target in sorted(targets)
        if layer_of(target) > layer_of(module)
    ]
    assert upward == []


def test_the_walker_sees_function_level_and_type_checking_imports() -> None:
    """The checks above are only as good as the graph: it must see the imports that hide from a reader."""
    graph = import_graph()
    assert "autotune.workers.tune" in graph["autotune.api"]  # inside api.tune()
    assert "autotune.backends.probe_report" in graph["autotune.backends.ort_plans"]  # under TYPE_CHECKING
    assert "autotune.api" in graph["autotune.cli.trial_commands"]  # `from autotune import api`
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
