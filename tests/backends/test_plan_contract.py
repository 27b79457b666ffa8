"""One contract, every plan backend (issue 29): module plans, operator-level (selective) plans, offload,
torch.compile's memory budget, and ORT's memory optimizer. For each: the plan's string round-trips through
its parser; applied to a real model, loss and gradients equal no plan's, bit for bit; and the probe of
examples/gpt.py either predicts it to save memory (>= 0) or refuses it with the reason."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from test_probe import gpt_probe  # noqa: F401 (the fixture: a real probe of the example, once per module)
from torch import nn

from autotune.backends import parse_backend_plan
from autotune.backends.torch_compile import budget_backend, real_compile
from autotune.backends.torch_modules import apply_plan
from autotune.core.plans import Backend, parse_plan

from conftest import Blocks

TORCH_PLANS = {
    "module": "Block:1",
    "module ratio": "Block:0.5",
    "operator": "Block:1/save=matmul",
    "offload": "Block:1/offload",
    "compile": "compile:0.5",
}


def step(
    prepare: Callable[[nn.Module], Callable[[torch.Tensor], Any]],
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One forward and backward of the same model and batch, prepared as ``prepare`` says."""
    torch.manual_seed(0)
    model = Blocks()
    x = torch.randn(8, 16)
    loss = prepare(model)(x).square().mean()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def with_plan(text: str) -> Callable[[nn.Module], Callable[[torch.Tensor], Any]]:
    plan = parse_plan(text)

    def prepare(model: nn.Module) -> Callable[[torch.Tensor], Any]:
        if plan.rules:
            apply_plan(model, plan)
        if plan.compile_budget is not None:  # torch's partitioner at that budget, its graphs run as traced
            torch._dynamo.reset()
            return real_compile()(model, backend=budget_backend(plan.compile_budget), dynamic=False)
        return model

    return prepare


@pytest.mark.parametrize("kind", list(TORCH_PLANS))
def test_a_torch_plan_round_trips_and_keeps_the_loss_and_gradients(kind: str) -> None:
    text = TORCH_PLANS[kind]
    assert str(parse_backend_plan(text, Backend.TORCH)) == text
    reference = step(lambda model: model)
    loss, grads = step(with_plan(text))
    assert torch.equal(loss, reference[0])
    assert len(grads) == len(reference[1]) == 4 * 4 + 2
    assert all(torch.equal(a, b) for a, b in zip(grads, reference[1], strict=True))


@pytest.mark.compat  # a real probe of the example: kept out of the core suite's time
@pytest.mark.parametrize("kind", ["module", "operator", "offload"])
def test_the_probe_predicts_a_saving_or_refuses_the_plan(kind: str, gpt_probe) -> None:  # noqa: F811
    """(The probe's rows are whole classes; a ratio saves its share of its class's. examples/gpt.py does not
    compile: a compile plan's rows come from the probe of a script that does, tests/backends/
    test_compile_plans.py.)"""
    rows = {row["plan"]: row for row in gpt_probe["candidates"]}
    row = rows[TORCH_PLANS[kind]]
    assert row["saving_bytes"] >= 0 or row["excluded"], row


@pytest.mark.compat  # ORTModule exports and builds its graphs: a minute of real trials
def test_an_ort_plan_round_trips_and_keeps_the_losses(tmp_path) -> None:
    from test_ort import SMALL, measured, plain_pytorch

    for text in ("BiasGelu+:1:-1", "level:1"):
        assert str(parse_backend_plan(text, Backend.ORT)) == text
    reference = plain_pytorch("--batch-size", "4", "--steps", "12", *SMALL)
    result, got = measured(tmp_path, "level:1", *SMALL)
    assert result["outcome"] == "complete" and result["plan"] == "level:1"
    assert max(abs(a - b) for a, b in zip(got, reference[: len(got)], strict=True)) < 1e-5
    assert result["peak_bytes"] > 0
