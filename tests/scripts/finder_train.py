"""A training function searched in its own process by ``autotune.find_batch_size`` (tests/finder): a stack
of residual MLP blocks on (batch, 16, 256) inputs. ``python finder_train.py OPTIONS_JSON OUT_JSON``: the
options are find_batch_size's; the mode ``fail`` raises in every call. Writes what happened to OUT_JSON."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from torch import nn

import autotune
from autotune.backends.torch_modules import applied_plan

options = json.loads(sys.argv[1])
out = sys.argv[2]
mode = options.pop("mode", "plain")
if "settings" in options:  # a trial's steps, as TrialSettings' fields
    options["settings"] = autotune.TrialSettings(**options["settings"])
calls: list[int] = []
seen: dict[str, object] = {}


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


def build() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(*[Block(256) for _ in range(4)], nn.Linear(256, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def first_step(model: nn.Module, batch_size: int) -> tuple[float, float]:
    """The loss and the gradients' norm of the first step on fixed inputs."""
    generator = torch.Generator().manual_seed(1)
    loss = model(torch.randn(batch_size, 16, 256, generator=generator)).pow(2).mean()
    loss.backward()
    norm = torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters()))
    return loss.item(), norm.item()


@autotune.find_batch_size(**options)
def train(batch_size: int, steps: int = 10_000) -> float:
    calls.append(batch_size)
    if mode == "fail":
        raise ValueError("the data set is empty")
    model, optimizer = build()
    loss = first_step(model, batch_size)
    optimizer.step()
    optimizer.zero_grad()
    seen["first_step"] = loss
    seen["plan"] = str(applied_plan(model) or "none")
    # a trial runs until autotune ends it (its measurement may take 10 s of steps: a loaded machine's
    # interval is not tight after 35 steps, and 40 ended a `measure` trial's script before its trial did);
    # the call at the answer trains 3 steps (enough to see its plan)
    for _ in range(steps if train.answer is None else 3):
        model(torch.randn(batch_size, 16, 256)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return float(batch_size)


try:
    returned = train()
except autotune.AutotuneError as e:
    Path(out).write_text(json.dumps({"error": f"{type(e).__name__}: {e}", "calls": calls}))
    sys.exit(0)
answer = train.answer
model, _ = build()
plain = first_step(model, answer.best.batch_size)  # the same step without any plan
Path(out).write_text(
    json.dumps(
        {
            "returned": returned,
            "calls": calls,
            "batch": answer.best.batch_size,
            "plan": answer.best.plan,
            "cached": answer.cached,
            "budget_bytes": answer.budget_bytes,
            "limit_bytes": answer.limit_bytes,
            "peak": answer.best.verified_peak_bytes,
            "applied": seen["plan"],
            "first_step": seen["first_step"],
            "plain_first_step": plain,
            "records": [
                [r.batch_size, r.plan, r.outcome.value if r.outcome else None, r.peak_bytes]
                for r in answer.records
            ],
            "trial_env": {k: v for k, v in os.environ.items() if k == "AUTOTUNE_TRIAL_REQUEST"},
        }
    )
)
