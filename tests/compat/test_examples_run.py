"""The Trainer and Lightning examples run on their own with an answer's variables, the plan applied through
``autotune.prepare`` outside any trial."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip(
    "transformers", reason="the compatibility suite needs the test extra: pip install -e '.[test]'"
)
pytest.importorskip(
    "lightning", reason="the compatibility suite needs the test extra: pip install -e '.[test]'"
)

from conftest import EXAMPLES

pytestmark = pytest.mark.compat


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOTUNE_")}
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=300, env=env)


def test_the_trainer_example_trains_with_a_plan_outside_autotune() -> None:
    proc = run(str(EXAMPLES / "hf_trainer.py"), "--max_steps", "2", "--seq", "64", "--gradient_accumulation_steps",
               "2", "--recompute", "GPT2Block:1/save=matmul")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("train_samples_per_second=")


def test_the_lightning_example_trains_with_a_plan_outside_autotune() -> None:
    proc = run(str(EXAMPLES / "lightning_module.py"), "--max-steps", "2", "--seq", "64", "--accumulate", "2",
               "--recompute", "TransformerEncoderLayer:1")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
