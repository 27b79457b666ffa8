"""What a plan makes the backward recompute, counted (torch.utils.flop_counter, as torchtitan's
test_activation_checkpoint counts every policy): examples/gpt.py's model, dropout off, on the CPU.

Without a plan the backward takes 2x the forward's FLOPs. A checkpointed region's forward runs again in the
backward up to the last tensor its backward needs, and no further (torch's non-reentrant checkpoint stops
recomputing there): a region's last matmul (a Block's or an MLP's projection, an attention's output
projection) feeds nothing its backward keeps, so each plan repeats its instances' forward but that matmul.
The probe's forward share, a share of the forward's time (what the throughput model expects a plan to cost
before it is measured), is checked against these counts: it counts each checkpointed instance whole, so it
is at least the counted share (by the last matmul's share: the MLP's projection is half of MLP:1's)."""

from __future__ import annotations

import functools
import importlib.util
import sys

import pytest
import torch
from test_probe import gpt_probe  # noqa: F401 (the fixture: a real probe of the example, once per module)
from torch.utils.flop_counter import FlopCounterMode

from autotune.backends.torch_modules import apply_plan
from autotune.core.plans import parse_plan

from conftest import EXAMPLES


def example():
    spec = importlib.util.spec_from_file_location("gpt_example", EXAMPLES / "gpt.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpt_example"] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


GPT = example()


@functools.cache
def flops(plan: str) -> tuple[int, int, dict[str, int]]:
    """The forward's and the backward's FLOPs with ``plan``, and the forward's by module."""
    torch.manual_seed(0)
    cfg = GPT.GPTConfig(dropout=0.0)
    model = GPT.GPT(cfg)
    if plan != "none":
        apply_plan(model, parse_plan(plan))
    idx = torch.randint(cfg.vocab_size, (4, cfg.block_size))
    with FlopCounterMode(display=False) as forward:
        loss = model(idx, torch.roll(idx, -1, dims=1))
    with FlopCounterMode(display=False) as backward:
        loss.backward()
    by_module = {name: sum(counts.values()) for name, counts in forward.get_flop_counts().items()}
    return forward.get_total_flops(), backward.get_total_flops(), by_module


LAYERS = GPT.GPTConfig.n_layer


def added(plan: str) -> int:
    """The FLOPs ``plan`` adds to the backward."""
    forward, backward, _ = flops(plan)
    assert forward == flops("none")[0]  # a plan never changes the forward
    return backward - flops("none")[1]


def module_flops(suffix: str) -> int:
    """The forward FLOPs of every block's ``suffix`` module (``""``: the block itself)."""
    return sum(flops("none")[2][f"GPT.blocks.{i}{suffix}"] for i in range(LAYERS))


def test_without_a_plan_the_backward_takes_twice_the_forward() -> None:
    assert flops("none")[1] == 2 * flops("none")[0]


def test_each_plan_adds_the_forward_flops_of_what_it_recomputes() -> None:
    blocks, last_matmuls = module_flops(""), module_flops(".mlp.proj")
    assert added("Block:1") == blocks - last_matmuls  # up to the last tensor its backward needs
    assert added("Block:0.5") == (blocks - last_matmuls) // 2  # every other block
    assert added("Block:0.25") == (blocks - last_matmuls) // 4
    assert added("MLP:1") == module_flops(".mlp") - last_matmuls
    assert added("CausalSelfAttention:1") == module_flops(".attn") - module_flops(".attn.proj")
    assert added("Block:1/save=matmul") == 0  # every counted op of the example is a matmul: all saved


@pytest.mark.compat  # a real probe of the example: kept out of the core suite's time
def test_the_probe_s_forward_shares_against_the_counted_flops(gpt_probe) -> None:  # noqa: F811
    shares = {row["plan"]: row["forward_share"] for row in gpt_probe["candidates"]}
    counted = {plan: added(plan) / flops("none")[0] for plan in ("Block:1", "MLP:1", "CausalSelfAttention:1")}
    for plan, share in counted.items():
        assert shares[plan] >= share - 0.05, (plan, shares[plan], share)  # whole instances: at least
