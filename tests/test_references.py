"""What the code's docstrings point a reader to exists (issue 29): every dotted ``autotune.x.y`` names a
module of the package and, after it, a name that module (or a class of it) defines; every file a docstring
names is in the repository (a path from the repository's root, or a file name found in it). Two kinds of
stale pointer were found: ``autotune.cli.commands`` (split into three modules long ago) and 13 references to
a RELIABILITY.md that lived outside the repository (now docs/reliability.md)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOTTED = re.compile(r"\bautotune(?:\.[A-Za-z_]\w*)+")
FILE = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-][\w.-]*\.(?:py|md|toml|txt|cfg|yaml|yml))\b")
# Files named as examples of a user's own (a script to tune) or as another project's
NOT_OURS = {"train.py", "script.py", "mytrain.py", "symbolic_shape_infer.py"}
SOURCES = sorted(
    p
    for folder in ("autotune", "storage", "tests", "bench", "examples")
    for p in (ROOT / folder).rglob("*.py")
    if "site-packages" not in p.parts and p.name != "test_references.py"  # its docstring quotes stale ones
)


def docstrings(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            text = ast.get_docstring(node, clean=False)
            if text:
                yield text


def defined(path: Path, names: list[str]) -> bool:
    """Whether ``names`` (a top-level name, then a class's attribute) are defined in the module at ``path``."""
    body: list[ast.stmt] = ast.parse(path.read_text(encoding="utf-8")).body
    if len(names) == 1 and names[0] in lazy(body):
        return True
    for name in names:
        found = None
        for node in body:
            if (
                (
                    isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                    and node.name == name
                )
                or (
                    isinstance(node, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
                )
                or (
                    isinstance(node, ast.AnnAssign)
                    and isinstance(node.target, ast.Name)
                    and node.target.id == name
                )
                or (
                    isinstance(node, ast.ImportFrom | ast.Import)
                    and any((a.asname or a.name.split(".")[0]) == name for a in node.names)
                )
            ):
                found = node
        if found is None:
            return False
        body = found.body if isinstance(found, ast.ClassDef) else []
    return True


def lazy(body: list[ast.stmt]) -> set[str]:
    """The names a module's ``__all__`` lists (the package's API is loaded lazily, by ``__getattr__``)."""
    for node in body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return {e.value for e in getattr(node.value, "elts", []) if isinstance(e, ast.Constant)}
    return set()


def resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:cut])
        module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if parts[:cut] == ["autotune", "storage"]:
            module = ROOT / "storage" / "__init__.py"  # the storage/ folder, imported as autotune.storage
        elif parts[: min(cut, 2)] == ["autotune", "storage"] and cut > 2:
            alt = ROOT.joinpath("storage", *parts[2:cut])
            module = alt.with_suffix(".py") if alt.with_suffix(".py").is_file() else alt / "__init__.py"
        if module.is_file():
            return defined(module, parts[cut:]) if parts[cut:] else True
    return False


def names() -> Iterator[tuple[str, str, str]]:
    for path in SOURCES:
        for text in docstrings(path):
            for dotted in DOTTED.findall(text):
                yield "dotted", dotted.rstrip("."), str(path.relative_to(ROOT))
            for named in FILE.findall(text):
                yield "file", named, str(path.relative_to(ROOT))


def exists(named: str) -> bool:
    if "/" in named:
        return (ROOT / named).exists()
    return named in NOT_OURS or any(ROOT.glob(f"**/{named}"))


@pytest.mark.parametrize("kind", ["dotted", "file"])
def test_every_name_a_docstring_gives_exists(kind: str) -> None:
    missing = sorted(
        {
            f"{where}: {name}"
            for k, name, where in names()
            if k == kind and not (resolves if k == "dotted" else exists)(name)
        }
    )
    assert missing == []
