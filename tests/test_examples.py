"""The examples run on their own, under autotune with no change, and as a command template."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import AUTOTUNE, EXAMPLES

pytestmark = pytest.mark.slow
SMALL = {"gpt.py": ["--n-layer", "2", "--n-embd", "32", "--block-size", "32"], "mlp.py": []}


@pytest.mark.parametrize("example", sorted(SMALL))
def test_example_runs_on_its_own(example: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOTUNE_")}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / example), "--steps", "3", *SMALL[example]],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("step 0 loss ")


@pytest.mark.parametrize("example", sorted(SMALL))
@pytest.mark.parametrize("form", ["script", "template"])
def test_example_under_autotune(example: str, form: str, tmp_path) -> None:
    script = str(EXAMPLES / example)
    if form == "script":
        command = [script, "--", *SMALL[example]]
    else:
        command = ["--", sys.executable, script, "--batch-size", "{batch_size}", *SMALL[example]]
    options = f"-b 4 --plan all --steps 2 --warmup-steps 1 --device cpu --json --cache-dir {tmp_path}"
    proc = subprocess.run(
        [AUTOTUNE, "measure", *options.split(), *command], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)
    assert (data["outcome"], data["batch_size"]) == ("complete", 4)
    assert data["plan"] == {"gpt.py": "Block:1", "mlp.py": "ResidualLayer:1"}[example]
