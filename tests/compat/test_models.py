"""Model-family compatibility (CI's own phase, `make test-compat`): Hugging Face GPT-2, Llama and BERT
built from configs, a torchvision ResNet and a Lightning module, each trained by a real script in real
trials; a Hugging Face Trainer through a command template. Nothing is downloaded.

For each family: the probe finds the repeated blocks (not their containers), every plan the search may use
passed the probe's check against no plan, and at one batch size every default plan completes and peaks
lower than no plan, each measured after no plan in one warm process (the search's way: every family's
script runs warm); in this process, every plan gives no plan's loss, gradients and buffers exactly.
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "transformers", reason="the compatibility suite needs the test extra: pip install -e '.[test]'"
)
pytest.importorskip(
    "torchvision", reason="the compatibility suite needs the test extra: pip install -e '.[test]'"
)
pytest.importorskip(
    "lightning", reason="the compatibility suite needs the test extra: pip install -e '.[test]'"
)

import torch

from autotune import api
from autotune.backends.probe import default_plans, plans_to_check, saving_per_sample
from autotune.backends.torch_modules import find_candidates, plan_applied
from autotune.core.plans import Backend, parse_plan
from autotune.core.protocol import Outcome
from autotune.hardware.devices import resolve_device
from autotune.hardware.meters import make_meter
from autotune.hardware.nvml import nvml_loader
from autotune.trials.command import TrialCommand
from autotune.trials.measurement import TrialJob
from autotune.trials.settings import TrialSettings
from autotune.trials.warm import WarmTrials

from conftest import DETERMINISTIC_CPU_ALLOCATOR, MiB

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
from models import build, loss_of

pytestmark = pytest.mark.compat

SCRIPTS = Path(__file__).parent / "scripts"
# The outermost repeated class of each family, and how many blocks it has.
BLOCKS = {
    "gpt2": ("GPT2Block", 4),
    "llama": ("LlamaDecoderLayer", 4),
    "bert": ("BertLayer", 4),
    "resnet": ("BasicBlock", 8),
    "lightning": ("TransformerEncoderLayer", 4),
}
# ResNet at 64 images: at 16, its activations were a few percent of the process's peak and, on another CPU
# (CI's), a plan that saves a fourth of them (BasicBlock:1/save=conv) measured 0.2 MiB over no plan.
BATCH = {"gpt2": 16, "llama": 16, "bert": 16, "resnet": 64, "lightning": 32}


def _step(model: torch.nn.Module, inputs: dict[str, Any]) -> tuple[float, dict[str, torch.Tensor]]:
    torch.manual_seed(7)  # the same dropout masks with and without a plan
    loss = loss_of(model(**inputs))
    loss.backward()
    state = {f"grad:{n}": p.grad for n, p in model.named_parameters() if p.grad is not None}
    state.update({f"buffer:{n}": b for n, b in model.named_buffers()})
    return float(loss), state


@pytest.mark.parametrize("family", BLOCKS)
def test_every_plan_gives_the_loss_gradients_and_buffers_of_no_plan(family: str) -> None:
    model, batch = build(family)
    model.train()
    inputs = batch(4)
    reference = _step(copy.deepcopy(model), inputs)
    candidates = find_candidates(model)
    outer = next(c.cls for c in candidates if c.outermost)
    plans = [f"{c.cls}:1" for c in candidates] + [f"{outer}:0.5"]
    plans += [f"{outer}:1/save=matmul", f"{outer}:1/save=attention+conv+matmul", f"{outer}:1/recompute=norm"]
    for plan in plans:
        copied = copy.deepcopy(model)
        with plan_applied(copied, parse_plan(plan)):
            loss, state = _step(copied, inputs)
        assert loss == reference[0], plan
        assert state.keys() == reference[1].keys(), plan
        different = [k for k in state if not torch.equal(state[k], reference[1][k])]
        assert different == [], f"{plan} changes {different[:3]}"
        assert "forward" not in vars(copied.get_submodule(copied_name(copied, outer))), "plan left in place"


def copied_name(model: torch.nn.Module, cls: str) -> str:
    return next(name for name, m in model.named_modules() if type(m).__name__ == cls)


def _command(family: str) -> list[str]:
    if family == "lightning":
        return [sys.executable, str(Path(__file__).parents[2] / "examples" / "lightning_module.py"),
                "--batch-size", "{batch_size}"]  # fmt: skip
    return [sys.executable, str(SCRIPTS / "train.py"), "--model", family, "--batch-size", "{batch_size}"]


def _warm(family: str, cache: Path) -> WarmTrials:
    """The family's configurations measured one after another in one warm process, as the search measures
    them (autotune.trials.warm): no plan first, so each plan reads after a configuration holding more, never
    under what a process of its own reads (GPT-2 here: 0.5-2.6 MiB over, ~55 s of start-ups fewer)."""
    environ = {**os.environ, **DETERMINISTIC_CPU_ALLOCATOR}
    device = resolve_device("cpu", environ, nvml_loader(None))
    command = TrialCommand.parse(_command(family))
    settings = TrialSettings(warmup_steps=1, measured_steps=2, tight=0)  # a fixed length: memory, not speed
    return WarmTrials(TrialJob(command, Backend.TORCH, device, make_meter(device), settings, cache, environ))


@pytest.mark.parametrize("family", BLOCKS)
def test_the_probe_finds_the_blocks_and_every_default_plan_completes_and_saves_memory(
    family: str, tmp_path: Path
) -> None:
    probed = api.probe(_command(family), batch_size=4, device="cpu", cache_dir=tmp_path)
    assert probed.outcome is Outcome.COMPLETE, probed.error
    report = probed.probe
    assert report is not None and report.backend.value == "torch"
    assert [(c.cls, c.count) for c in report.candidates if c.outermost] == [BLOCKS[family]]
    checked = {c.plan: c for c in report.checks}
    assert set(checked) == set(plans_to_check(report))
    assert [p for p, c in checked.items() if not c.ok] == []
    plans, excluded = default_plans(report)
    outer = BLOCKS[family][0]
    assert f"{outer}:1" in plans and any(p.startswith(f"{outer}:1/save=") for p in plans), (plans, excluded)
    warm = _warm(family, tmp_path)
    try:
        none = warm.run(BATCH[family], parse_plan("none"))
        assert none.outcome is Outcome.COMPLETE, none.error
        peaks = {}
        for run, plan in enumerate(plans[1:], start=2):
            result = warm.run(BATCH[family], parse_plan(plan))
            assert result.outcome is Outcome.COMPLETE, f"{plan}: {result.error}"
            assert result.plan == plan
            assert (result.warm_run, warm.off) == (run, None)  # every family's script runs warm
            peaks[plan] = result.peak_bytes
    finally:
        warm.close()
    print(f"{family}: none {none.peak_bytes / MiB:.1f} MiB; " + ", ".join(
        f"{plan} -{(none.peak_bytes - peak) / MiB:.1f}" for plan, peak in peaks.items()
    ))  # fmt: skip
    # A plan of the outermost block predicted to save what the meter resolves (docs/reliability.md: RSS reads
    # within 8 MiB) peaks lower than no plan. A plan of a module inside the block is only held to no more than
    # no plan within that noise, whatever its prediction: what it keeps is partly its neighbours' too
    # (BertSelfOutput:1 read 0.4 MiB above no plan with one torch thread, 1 MiB below with two; Llama's
    # LlamaAttention:1, predicted 24.4 MiB, saved 7.8 MiB quiet and read 3.2 MiB above no plan in two loaded
    # CI runs). The search does not rely on such a prediction: it learns each plan's realized share.
    resolved = {
        p
        for p in peaks
        if [r.cls for r in parse_plan(p).rules] == [outer]
        and saving_per_sample(report, p) * BATCH[family] >= 8 * MiB
    }
    assert resolved >= {f"{outer}:1"}
    assert [plan for plan in resolved if peaks[plan] >= none.peak_bytes] == []
    assert [plan for plan, peak in peaks.items() if peak > none.peak_bytes + 8 * MiB] == []
