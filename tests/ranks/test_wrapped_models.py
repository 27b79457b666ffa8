"""Plans inside DDP- and FSDP-wrapped models, under a real torchrun (gloo, CPU): the repeated blocks are
found through the wrapper (FSDP2's ``FSDPBlock`` is still ``Block``), and checkpointing them keeps rank 0's
loss and gradients (FSDP2: its gradient shards) equal to no plan's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autotune.core.protocol import Outcome
from autotune.trials.measurement import measure, measure_spec

from conftest import SCRIPTS

pytestmark = pytest.mark.ranks

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
SCRIPT = str(SCRIPTS / "distributed.py")


def numbers(tmp_path: Path, wrap: str, plan: str) -> dict:
    out = tmp_path / f"{wrap}-{plan.replace(':', '_')}.pt"
    env = {**os.environ, "AUTOTUNE_PLAN": plan}
    env.pop("AUTOTUNE_TRIAL_REQUEST", None)
    done = subprocess.run(
        [TORCHRUN, "--standalone", "--nproc-per-node", "2", SCRIPT, "--wrap", wrap, "--steps", "1", "--grads", str(out)],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return torch.load(out)


@pytest.mark.parametrize("wrap", ["ddp", "fsdp"])
def test_a_plan_through_the_wrapper_keeps_the_numbers(tmp_path: Path, wrap: str) -> None:
    plain, checkpointed = numbers(tmp_path, wrap, "none"), numbers(tmp_path, wrap, "Block:1")
    assert torch.equal(plain["loss"], checkpointed["loss"])
    assert plain["grads"].keys() == checkpointed["grads"].keys() and len(plain["grads"]) == 4 * 6 + 2
    for name, grad in plain["grads"].items():
        assert torch.equal(grad, checkpointed["grads"][name]), name


@pytest.mark.parametrize("wrap", ["ddp", "fsdp"])
def test_a_trial_finds_the_blocks_through_the_wrapper(tmp_path: Path, wrap: str) -> None:
    spec = measure_spec(
        [TORCHRUN, "--standalone", "--nproc-per-node", "2", SCRIPT, "--wrap", wrap],
        4,
        plan="all",
        device="cpu",
        cache_dir=tmp_path,
    )
    result = measure(spec)
    assert result.outcome is Outcome.COMPLETE, result.error
    assert result.plan == "Block:1"  # `all` expanded in every rank, to the class the model defined
    assert [(c.cls, c.count, c.outermost) for c in result.candidates] == [("Block", 4, True)]
