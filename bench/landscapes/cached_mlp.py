"""A residual MLP whose layers keep a copy of their hidden activations in a Python list for the whole step
(as a metrics or feature-logging hook would): memory autograd does not see, so the probe cannot predict it,
and that a recompute plan *doubles*, since backward re-runs the forward that appends to it. The probe
predicts checkpointing saves most of the activations; measured, it saves far less (bench/search_efficiency.py's
"prediction-off" landscape).

    python bench/landscapes/cached_mlp.py [--batch-size 64]
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import autotune

CACHE: list[torch.Tensor] = []


class CachedLayer(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.fc1(self.norm(x)))
        CACHE.append(hidden.detach().clone())  # kept until the step ends, outside autograd
        return x + self.fc2(hidden)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    torch.manual_seed(0)
    batch = args.batch_size or autotune.batch_size(default=64)
    model = autotune.prepare(
        nn.Sequential(nn.Linear(64, args.width), *(CachedLayer(args.width) for _ in range(args.depth)))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for _ in range(args.steps):
        x = torch.randn(batch, 64)
        loss = model(x).square().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        CACHE.clear()
        autotune.step()


if __name__ == "__main__":
    main()
