"""Selective recompute never caches an op that draws random numbers (issue 31, item 6).

On an H100, ``GPT2Block:1/save=attention+matmul`` was left out: "changes the numbers: gradients by 0.36".
The cause: the recompute starts from the forward's generator state and replays the region's random ops in
order; SDPA's fused dropout, cached, drew nothing, and the block's later dropouts drew other masks. On the
CPU dropout is ``bernoulli_`` in place (never cached) and SDPA with dropout decomposes into it, so the same
fault needs an out-of-place random op, as CUDA's ``native_dropout`` is: the model below calls it, then the
CPU's ``F.dropout``. Before: ``save=dropout`` gave gradients 0.45 (relative) off no plan's."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autotune.backends.ops import draws_random
from autotune.backends.torch_modules import apply_plan
from autotune.core.plans import parse_plan


class Fused(nn.Module):
    """A block whose first dropout is CUDA's kind (out of place: cacheable) and whose second is the CPU's."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.a = nn.Linear(width, width)
        self.b = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = torch.native_dropout(torch.tanh(self.a(x)), 0.1, self.training)
        return x + F.dropout(self.b(h), 0.1, self.training) * h


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Fused() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x.square().mean()


def _step(model: nn.Module, x: torch.Tensor) -> tuple[float, list[torch.Tensor]]:
    torch.manual_seed(7)  # the same random stream with and without a plan
    loss = model(x)
    loss.backward()
    return float(loss), [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("plan", ["Fused:1/save=dropout", "Fused:1/recompute=dropout", "Fused:1/save=matmul"])
def test_a_plan_that_would_cache_a_random_op_keeps_the_loss_and_gradients_exactly(plan: str) -> None:
    torch.manual_seed(0)
    model = Stack()
    x = torch.randn(8, 32)
    loss, grads = _step(copy.deepcopy(model), x)
    planned = copy.deepcopy(model)
    apply_plan(planned, parse_plan(plan))
    planned_loss, planned_grads = _step(planned, x)
    assert planned_loss == loss
    assert all(torch.equal(a, b) for a, b in zip(planned_grads, grads, strict=True))


def test_an_attention_kernel_draws_random_numbers_only_with_dropout() -> None:
    attention = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    q = torch.randn(1, 2, 4, 8)
    assert draws_random(attention, (q, q, q, 0.1), {})
    assert draws_random(attention, (q, q, q), {"dropout_p": 0.1})
    assert not draws_random(attention, (q, q, q, 0.0), {})
    assert not draws_random(attention, (q, q, q), {})
    assert draws_random(torch.ops.aten.native_dropout.default, (q, 0.1, True), {})
    assert not draws_random(torch.ops.aten.mm.default, (q, q), {})
