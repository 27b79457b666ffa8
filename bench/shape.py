"""The code's shape, for architecture reviews: module sizes, the import graph, and a run spec's route.

    python bench/shape.py modules        # lines and the longest function of every module
    python bench/shape.py imports        # import cycles (function-level imports included) and import floors
    python bench/shape.py route          # the files a TuneSpec passes through during a real tune() (CPU)

``route`` runs one small tuning job of tests/scripts/synthetic.py in this process under a profiler hook and
records every call that receives the spec object itself: the files entered, the moves between files, and
the moves "back up" to a module on a higher import floor than the one it came from.
"""

from __future__ import annotations

import ast
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "autotune"


sys.path.insert(0, str(ROOT / "tests"))
from test_architecture import cycles, import_graph, package_modules  # noqa: E402  (one walker: the test's)


def _sources() -> dict[str, Path]:
    """Module name -> file: the package's own modules, or in the old flat layout (before issue 14),
    storage/ mapped onto autotune.storage."""
    import autotune

    base = Path(autotune.__file__).resolve().parent
    if (base / "storage").exists():
        return package_modules()
    found: dict[str, Path] = {}
    for path in sorted(base.rglob("*.py")):
        parts = path.relative_to(base.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    for path in sorted((ROOT / "storage").rglob("*.py")):
        parts = ("autotune", "storage", *path.relative_to(ROOT / "storage").with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def modules() -> None:
    rows = []
    for name, path in _sources().items():
        tree = ast.parse(path.read_text())
        longest = max(
            (
                (node.end_lineno - node.lineno + 1, node.name)
                for node in ast.walk(tree)
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            ),
            default=(0, "-"),
        )
        rows.append((len(path.read_text().splitlines()), name, longest))
    print(f"{'module':<44} {'lines':>5}  longest function")
    for lines, name, (length, function) in sorted(rows, key=lambda r: -r[0]):
        print(f"{name:<44} {lines:>5}  {length:>3} {function}")
    print(
        f"{len(rows)} modules; over 300 lines: {sum(r[0] > 300 for r in rows)}; "
        f"functions over 40 lines: {sum(r[2][0] > 40 for r in rows)}"
    )


def floors(graph: dict[str, set[str]]) -> dict[str, int]:
    """Each module's import floor: 0 for modules importing nothing of the package, else 1 + the highest
    floor it imports (the members of a cycle share one floor)."""
    component_of = {m: tuple(c) for c in cycles(graph) for m in c}
    memo: dict[str, int] = {}

    def floor(node: str, seen: frozenset[str]) -> int:
        if node in memo:
            return memo[node]
        group = set(component_of.get(node, (node,)))
        below = {t for m in group for t in graph.get(m, ()) if t not in group and t not in seen}
        value = 1 + max((floor(t, seen | group) for t in below), default=-1)
        for m in group:
            memo[m] = value
        return value

    return {m: floor(m, frozenset()) for m in graph}


def imports() -> None:
    graph = import_graph(_sources())
    found = cycles(graph)
    levels = floors(graph)
    print(f"{len(graph)} modules on {max(levels.values()) + 1} import floors")
    print(f"import cycles: {len(found)}")
    for component in found:
        print("  " + " <-> ".join(component))


def route() -> None:
    from autotune import TrialSettings, tune, tune_spec

    levels = floors(import_graph(_sources()))
    by_file = {str(path): name for name, path in _sources().items()}
    spec = None
    tracked: set[int] = set()  # the spec and the objects it carries down
    calls: list[tuple[str, str]] = []

    def profile(frame, event, arg):
        if event != "call" or not tracked:
            return
        callee = by_file.get(frame.f_code.co_filename)
        if callee is None or not any(id(v) in tracked for v in frame.f_locals.values()):
            return
        caller, back = None, frame.f_back
        while back is not None and caller is None:
            caller, back = by_file.get(back.f_code.co_filename), back.f_back
        if caller is not None and caller != callee:
            calls.append((caller, callee))

    with tempfile.TemporaryDirectory() as cache:
        spec = tune_spec(
            [str(ROOT / "tests" / "scripts" / "synthetic.py"), "--per-sample-mib", "2"],
            "2GiB",
            trials=3,
            batch_sizes="1,2,4",
            device="cpu",
            cache_dir=Path(cache),
            settings=TrialSettings(1, 2),
        )
        tracked.update(id(v) for v in (spec, spec.command, spec.budget, spec.settings))
        sys.setprofile(profile)
        try:
            tune(spec, environ=dict(os.environ))
        finally:
            sys.setprofile(None)
    up = [(a, b) for a, b in calls if levels[b] > levels[a]]
    print("calls between modules that carry the spec:", len(calls))
    for (a, b), n in sorted(Counter(calls).items()):
        print(f"  {a} -> {b}  x{n}" + ("  (up)" if levels[b] > levels[a] else ""))
    entered = {m for pair in calls for m in pair}
    print(
        f"files entered: {len(entered)}; distinct moves: {len(set(calls))}; calls up a floor: {len(up)} "
        f"({len(set(up))} distinct)"
    )


if __name__ == "__main__":
    {"modules": modules, "imports": imports, "route": route}[
        sys.argv[1] if len(sys.argv) > 1 else "modules"
    ]()
