"""A training script that calls torch.compile itself (inductor, on the CPU): for the tests of the
compilation caches autotune gives every workload. ``--width`` changes the graphs it compiles."""

import argparse

import torch
from torch import nn

import autotune


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--steps", type=int, default=1000)
    args = p.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(args.width, args.width), nn.GELU(), nn.Linear(args.width, 1))
    compiled = torch.compile(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = autotune.batch_size(default=4)
    for _ in range(args.steps):
        loss = compiled(torch.randn(batch, args.width)).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    main()
