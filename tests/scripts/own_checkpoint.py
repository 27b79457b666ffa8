"""A small torch script whose model may checkpoint its blocks by itself (``--own-checkpoint``: each
block's forward through ``torch.utils.checkpoint.checkpoint``, as a user writes it), for the tests of what
autotune sees of a script's own checkpointing."""

from __future__ import annotations

import argparse

import torch
import torch.utils.checkpoint
from torch import nn

import autotune


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.net(x)


class Model(nn.Module):
    def __init__(self, own: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.own = own

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False) if self.own else block(x)
        return x.pow(2).mean()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--own-checkpoint", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Model(args.own_checkpoint)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = autotune.batch_size(default=8)
    while True:
        loss = model(torch.randn(batch, 32))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
