"""Module-level checkpointing on real (tiny) torch models."""

from __future__ import annotations

import copy
import importlib.util
import os
import sys

import pytest
import torch
from torch import nn

from autotune.backends.torch_modules import apply_plan, find_candidates
from autotune.core.errors import InputError
from autotune.core.plans import parse_plan

from conftest import EXAMPLES

_spec = importlib.util.spec_from_file_location("example_gpt", EXAMPLES / "gpt.py")
gpt = importlib.util.module_from_spec(_spec)
sys.modules["example_gpt"] = gpt  # dataclasses look their module up while the example runs
_spec.loader.exec_module(gpt)

TINY = gpt.GPTConfig(vocab_size=64, block_size=16, n_layer=3, n_head=2, n_embd=32, dropout=0.1)


def tiny_gpt(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return gpt.GPT(TINY)


def test_candidates_of_the_example_transformer() -> None:
    found = {c.cls: (c.count, c.outermost) for c in find_candidates(tiny_gpt())}
    assert found == {"Block": (3, True), "CausalSelfAttention": (3, False), "MLP": (3, False)}


def test_a_model_without_repeated_modules_has_no_candidates() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    assert find_candidates(model) == []
    assert str(apply_plan(model, parse_plan("all"))) == "none"


def _gradients(model: nn.Module) -> dict[str, torch.Tensor]:
    torch.manual_seed(123)
    idx = torch.randint(TINY.vocab_size, (4, TINY.block_size))
    model(idx, torch.roll(idx, -1, dims=1)).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("plan", ["all", "Block:0.5", "MLP,CausalSelfAttention:0.34"])
def test_checkpointing_keeps_the_gradients_exactly(plan: str) -> None:
    reference = _gradients(tiny_gpt())
    planned = tiny_gpt()
    apply_plan(planned, parse_plan(plan))
    for name, grad in _gradients(planned).items():
        torch.testing.assert_close(grad, reference[name], rtol=0, atol=1e-6)  # dropout RNG replayed


def test_plans_select_the_first_instances_and_skip_nested_ones() -> None:
    model = tiny_gpt()
    applied = apply_plan(model, parse_plan("Block:0.34,MLP"))
    assert str(applied) == "Block:0.34,MLP:1"
    wrapped = sorted(name for name, m in model.named_modules() if "forward" in vars(m))
    assert wrapped == ["blocks.0", "blocks.1.mlp", "blocks.2.mlp"]  # blocks.0.mlp is inside blocks.0


def test_all_expands_to_the_outermost_classes_and_applies_once() -> None:
    model = tiny_gpt()
    assert str(apply_plan(model, parse_plan("all"))) == "Block:1"
    assert str(apply_plan(model, parse_plan("MLP"))) == "Block:1"  # already prepared: unchanged


def test_an_unknown_class_names_the_candidates() -> None:
    with pytest.raises(
        InputError, match=r"names Attention, not a repeated module class; candidates: Block x3"
    ):
        apply_plan(tiny_gpt(), parse_plan("Attention"))


def test_deepcopy_of_a_checkpointed_model_runs_its_own_modules() -> None:
    model = tiny_gpt()
    apply_plan(model, parse_plan("all"))
    clone = copy.deepcopy(model)
    assert clone.blocks[0].forward.module is clone.blocks[0]
    with torch.no_grad():
        for p in clone.parameters():
            p.zero_()
    assert not torch.equal(_gradients(model)["head.weight"], torch.zeros_like(model.head.weight))


def test_prepare_outside_a_trial_follows_autotune_plan(monkeypatch) -> None:
    import autotune
    from autotune.runtime import trial

    monkeypatch.setattr(trial, "_loaded", True)
    monkeypatch.setattr(trial, "_trial", None)
    monkeypatch.delenv("AUTOTUNE_PLAN", raising=False)
    plain = autotune.prepare(tiny_gpt())
    assert not any("forward" in vars(m) for m in plain.modules())
    monkeypatch.setenv("AUTOTUNE_PLAN", "Block:0.34")
    planned = autotune.prepare(tiny_gpt())
    assert [name for name, m in planned.named_modules() if "forward" in vars(m)] == ["blocks.0"]
    assert os.environ["AUTOTUNE_PLAN"] == "Block:0.34"
