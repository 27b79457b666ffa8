"""The interpreter a template runs (issue 44, autotune.trials.interpreter): following the README's "call
.venv/bin/autotune", ``-- python examples/hf_trainer.py ...`` ran the system Python (first on PATH), its
trial failed on ``import torch`` (exit 7), and after the user activated the environment the same command
answered from that stored failure. Here the "system" Python is the interpreter this virtual environment is
made from (no torch, no Optuna), put first on PATH as ``python``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.trials.command import TrialCommand
from autotune.trials.interpreter import interpreter_of, top_level_imports

from conftest import AUTOTUNE, SYNTHETIC

BASE = os.path.realpath(sys.executable)  # the venv's python links to it: the same file, another environment


@pytest.fixture
def system_python(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH finds the base interpreter as ``python`` first."""
    bin_dir = tmp_path / "system-bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(BASE)
    missing = subprocess.run(
        [str(bin_dir / "python"), "-c", "import importlib.util as u; print(u.find_spec('optuna') is None)"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert missing.stdout.strip() == "True"  # the premise: the base interpreter lacks what the venv has
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def run(cache: Path, script: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AUTOTUNE, "run", "--device", "cpu", "--budget", "300MiB", "--plans", "none", "--batch-sizes", "1-4",
         "--steps", "2", "--warmup-steps", "1", "--trials", "4", "--cache-dir", str(cache),
         "--", "python", str(script), "--base-mib", "10", "--step-seconds", "0.01"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip


def test_a_template_s_python_that_cannot_import_the_script_s_imports_is_said_before_any_trial(
    tmp_path: Path, system_python: dict[str, str]
) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import os\nimport optuna\nfrom autotune import batch_size\ntry:\n    import nothing_here\n"
        "except ImportError:\n    pass\n\nprint(batch_size())\n"
    )
    assert top_level_imports(script) == ["optuna", "autotune"]  # not os (the standard library), not the try's
    cache = tmp_path / "cache"
    proc = run(cache, script, system_python)
    assert proc.returncode == 2, proc.stderr
    python = str(tmp_path / "system-bin" / "python")
    assert proc.stderr.strip() == (
        f"Error: the command's python is {python} (the first on PATH), not the one autotune runs in "
        f"({sys.executable}), and it cannot import optuna, which {script} imports: give the command the "
        "interpreter of the environment that has them, or activate that environment"
    )
    assert not (cache / "trials").exists() or not any((cache / "trials").iterdir())  # no trial ran
    assert interpreter_of(TrialCommand.parse(["python", str(script)]), system_python) == python


def test_a_failure_stored_from_another_interpreter_is_probed_again_once_the_environment_changed(
    tmp_path: Path, system_python: dict[str, str]
) -> None:
    """The synthetic script imports only the standard library and autotune at its top: the check passes,
    and under the base interpreter its trial fails later (autotune's tuner side needs what the venv has)
    with the failure stored. The same environment answers from it, naming the interpreter; the venv's
    Python first on PATH (the environment activated) probes again and tunes."""
    broken = tmp_path / "broken.py"  # fails under the base interpreter only: Optuna, imported in main
    broken.write_text(
        "import runpy\nimport sys\n\n\ndef main():\n    import optuna  # noqa: F401\n\n"
        f"    sys.argv[0] = {str(SYNTHETIC)!r}\n    runpy.run_path(sys.argv[0], run_name='__main__')\n\n\nmain()\n"
    )
    cache = tmp_path / "cache"
    first = run(cache, broken, system_python)
    assert first.returncode == 7, first.stderr
    assert "No module named" in first.stderr
    python = str(tmp_path / "system-bin" / "python")
    again = run(cache, broken, system_python)
    assert again.returncode == 7
    assert "stored from an earlier run, on worker " in again.stderr and f", with {python}): " in again.stderr
    venv = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    fixed = run(cache, broken, venv)
    assert fixed.returncode == 0, fixed.stderr
    assert "stored from an earlier run" not in fixed.stderr
