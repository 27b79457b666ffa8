"""A small residual MLP on synthetic regression data: the simplest script autotune can tune.

Runs on its own (python examples/mlp.py), under autotune (autotune measure examples/mlp.py --batch-size 64),
or as a command template (autotune measure --batch-size 64 -- python examples/mlp.py --batch-size {batch_size}).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch
from torch import nn

import autotune


@dataclass
class MLPConfig:
    n_in: int = 256
    width: int = 1024
    depth: int = 6


class ResidualLayer(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))  # (B, 2W) inside


class ResidualMLP(nn.Module):
    def __init__(self, cfg: MLPConfig) -> None:
        super().__init__()
        self.inp = nn.Linear(cfg.n_in, cfg.width)
        self.layers = nn.Sequential(*(ResidualLayer(cfg.width) for _ in range(cfg.depth)))
        self.out = nn.Linear(cfg.width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.layers(self.inp(x))).squeeze(-1)  # (B,)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch-size", type=int, default=None, help="default: autotune's, else 64")
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()

    torch.manual_seed(0)
    cfg = MLPConfig()
    batch = args.batch_size or autotune.batch_size(default=64)
    model = autotune.prepare(ResidualMLP(cfg))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    target = torch.randn(cfg.n_in)

    for step in range(args.steps):
        x = torch.randn(batch, cfg.n_in)  # (B, n_in)
        loss = ((model(x) - x @ target) ** 2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
