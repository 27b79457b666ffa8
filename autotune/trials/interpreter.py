"""The Python a trial command runs, checked before the first trial (issue 44).

A template's ``python`` is whatever comes first on the PATH the trial gets: following a hint to call
``.venv/bin/autotune`` without activating the environment, ``-- python examples/hf_trainer.py ...`` ran the
system interpreter, the trial failed with ``ModuleNotFoundError: No module named 'torch'`` (exit 7), and once
the user had activated the environment the same command answered from that stored failure. So:

- :func:`check_interpreter`, before any trial: where the command's Python is not the one autotune runs in,
  the modules the script imports at its top level are looked up with that Python; any it cannot import end
  the run in one line that names both interpreters;
- :func:`interpreter_of` is what a stored failure depended on: a probe failure is stored with it, and a run
  whose command now resolves to another interpreter probes again instead of answering from it
  (autotune.search.probing).
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from autotune.core.errors import InputError
from autotune.trials.command import TrialCommand, python_program, same_interpreter

LOOKUP_SECONDS = 60.0  # the other interpreter's start and the imports' lookup (no import is run)


def interpreter_of(command: TrialCommand, environ: Mapping[str, str]) -> str | None:
    """The interpreter ``command``'s trials run in, as a path (symlinks kept: a virtual environment's
    ``python`` links to the system's, and is another environment): autotune's own for a script, the
    template's ``python`` as the trial's PATH finds it; None for a command that runs no Python directly (a
    shell script, ``torchrun``)."""
    if not command.is_template:
        return sys.executable
    program = python_program(command)
    if program is None:
        return None
    found = shutil.which(program, path=environ.get("PATH", os.defpath))
    return os.path.abspath(found) if found is not None else None


def top_level_imports(script: Path) -> list[str]:
    """The packages ``script`` imports unconditionally (statements at module level, outside ``try``), as
    the first part of each module's name, in order; relative imports and the standard library's own
    modules are left out."""
    try:
        tree = ast.parse(script.read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return []
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module.split(".")[0])
    seen = set(sys.stdlib_module_names) | {"__future__"}
    return [n for n in dict.fromkeys(names) if n not in seen]


def check_interpreter(command: TrialCommand, environ: Mapping[str, str], cwd: str | None = None) -> None:
    """Before the first trial: the command's Python can import what its script imports.

    Raises:
        InputError: the command runs another Python than autotune's, and that one cannot import some of
            the modules the script imports at its top level (both interpreters named, and the modules).
    """
    python = interpreter_of(command, environ)
    if python is None or same_interpreter(python, sys.executable):  # a script runs in autotune's own
        return
    script = command.script_path()
    if script is None:
        return
    cwd = cwd or command.cwd
    modules = top_level_imports(Path(cwd or os.getcwd()) / script)
    if not modules:
        return
    missing = _missing(python, modules, command.env(dict(environ)), cwd)  # the trial's own PYTHONPATH
    if missing:
        raise InputError(
            f"the command's python is {python} (the first on PATH), not the one autotune runs in "
            f"({sys.executable}), and it cannot import {', '.join(missing)}, which {script} imports: give "
            "the command the interpreter of the environment that has them, or activate that environment"
        )


def _missing(python: str, modules: list[str], environ: Mapping[str, str], cwd: str | None) -> list[str]:
    """The modules ``python`` finds no spec for (looked up, never imported); none where it cannot be asked."""
    code = (
        "import importlib.util, json, sys; "
        "print(json.dumps([m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]))"
    )
    try:
        run = subprocess.run(
            [python, "-c", code, *modules],
            capture_output=True,
            text=True,
            timeout=LOOKUP_SECONDS,
            env=dict(environ),
            cwd=cwd,
        )
        found = json.loads(run.stdout) if run.returncode == 0 else []
    except (OSError, subprocess.SubprocessError, ValueError):
        return []  # the trial will say what is wrong with that interpreter
    return [str(m) for m in found]
