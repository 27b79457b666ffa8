"""A training script that calls torch.compile itself (inductor, on the CPU): for the tests of compile plans
and of the compilation caches autotune gives every workload. ``--width`` changes the graphs it compiles;
``--blocks N`` trains N residual MLP blocks (a repeated class: module plans too), else one small MLP;
``--dropout`` puts dropout in each block; ``--grads FILE`` writes the first step's loss and gradients."""

import argparse

import torch
from torch import nn

import autotune


class Block(nn.Module):
    def __init__(self, width: int, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.dropout(self.down(torch.nn.functional.gelu(self.up(self.norm(x)))))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--blocks", type=int, default=0)
    p.add_argument("--tokens", type=int, default=16, help="per sample, with --blocks")
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--grads", default=None)
    args = p.parse_args()
    torch.manual_seed(0)
    if args.blocks:
        blocks = [Block(args.width, args.dropout) for _ in range(args.blocks)]
        model: nn.Module = nn.Sequential(*blocks, nn.Linear(args.width, 1))
        shape = (args.tokens, args.width)
    else:
        model = nn.Sequential(nn.Linear(args.width, args.width), nn.GELU(), nn.Linear(args.width, 1))
        shape = (args.width,)
    compiled = torch.compile(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = autotune.batch_size(default=4)
    for step in range(args.steps):
        loss = compiled(torch.randn(batch, *shape)).square().mean()
        loss.backward()
        if step == 0 and args.grads:
            budget = torch._functorch.config.activation_memory_budget  # what the partitioner used
            grads = [q.grad.clone() for q in model.parameters()]
            torch.save({"loss": loss.detach(), "grads": grads, "budget": budget}, args.grads)
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    main()
