"""Every input that can be checked before a trial is checked before it: one line, exit 2, no trial (or, for
plans that need the model's classes, nothing after the probe). Each case once ran trials first, or ended
in a traceback."""

from __future__ import annotations

import subprocess
from pathlib import Path

import optuna
import pytest

from conftest import AUTOTUNE, SYNTHETIC

TINY = """\
import autotune
import torch
class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)
    def forward(self, x):
        return x + self.b(torch.relu(self.a(x)))
model = torch.nn.Sequential(Block(), Block())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
while True:
    model(torch.randn(autotune.batch_size(default=4), 16)).sum().backward()
    opt.step()
    opt.zero_grad()
"""


def run(cache: Path, *argv: str, script: str | Path = SYNTHETIC) -> subprocess.CompletedProcess[str]:
    options = ["--budget", "1GB", "--trials", "2", "--steps", "1", "--warmup-steps", "1", "--device", "cpu"]
    return subprocess.run(
        [AUTOTUNE, "run", *options, "--cache-dir", str(cache), *argv, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def trials_run(cache: Path) -> int:
    return len(list((cache / "trials").glob("*"))) if (cache / "trials").exists() else 0


def refused(proc: subprocess.CompletedProcess[str], after_the_probe: bool = False) -> str:
    """The one error line of a refused run (after the probe's own line, where the probe had to run)."""
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 + after_the_probe and lines[-1].startswith("Error: "), proc.stderr
    return lines[-1]


def test_a_plan_naming_no_class_of_the_model_is_refused_after_the_probe(tmp_path: Path) -> None:
    script = tmp_path / "tiny.py"
    script.write_text(TINY)
    line = refused(run(tmp_path, "--plans", "none;Nope:1", script=script), after_the_probe=True)
    assert line == (
        "Error: plan 'Nope:1' names Nope, not a repeated module class of this model; candidates: Block x2 "
        "(autotune probe lists them)"
    )
    assert trials_run(tmp_path) == 1  # the probe, which found the classes; no measured trial


@pytest.mark.parametrize("kind", ["directory", "not executable", "not on the PATH"])
def test_a_command_that_cannot_start_is_refused_before_a_trial(tmp_path: Path, kind: str) -> None:
    target = {"directory": tmp_path / "models", "not executable": tmp_path / "train.sh"}.get(kind)
    if kind == "directory":
        target.mkdir()
    elif kind == "not executable":
        target.write_text("python train.py\n")
    program = str(target) if target else "no-such-trainer"
    line = refused(run(tmp_path, script=program))
    assert (
        line
        == {
            "directory": f"Error: {program} is a directory: give the training script (train.py) or a command",
            "not executable": f"Error: {program} is not executable: chmod +x it, or name its interpreter "
            f"(python {program})",
            "not on the PATH": "Error: no-such-trainer: command not found on the PATH",
        }[kind]
    )
    assert trials_run(tmp_path) == 0


@pytest.mark.parametrize("char", ["\u0085", "\u202e", "\u200b"])
def test_invisible_characters_in_a_study_name_are_refused(tmp_path: Path, char: str) -> None:
    line = refused(run(tmp_path, "--study", f"my{char}study"))
    assert "no control or format characters" in line
    assert trials_run(tmp_path) == 0


def test_batch_sizes_beyond_what_the_database_holds_are_refused(tmp_path: Path) -> None:
    line = refused(run(tmp_path, "--batch-sizes", "99999999999999999999999"))
    assert (
        line
        == "Error: invalid batch sizes '99999999999999999999999': at most 2147483647, got 99999999999999999999999"
    )
    assert trials_run(tmp_path) == 0


@pytest.mark.parametrize("directions", [["maximize"], ["minimize", "maximize"]])
def test_an_optuna_study_autotune_did_not_create_is_never_written_to(
    tmp_path: Path, directions: list[str]
) -> None:
    storage = f"sqlite:///{tmp_path / 'autotune.db'}"
    assert subprocess.run([AUTOTUNE, "studies", "--cache-dir", str(tmp_path)], timeout=60).returncode == 0
    theirs = optuna.create_study(study_name="theirs", storage=storage, directions=directions)
    theirs.optimize(lambda t: [t.suggest_float("x", 0, 1)] * len(directions), n_trials=2)
    line = refused(run(tmp_path, "--study", "theirs"))
    assert line == (
        f"Error: study 'theirs' in sqlite:///{tmp_path / 'autotune.db'} was not created by autotune, which never "
        "writes to it: choose another --study"
    )
    assert len(optuna.load_study(study_name="theirs", storage=storage).trials) == 2
    assert trials_run(tmp_path) == 0
