"""A Lightning Fabric loop (#32 item 1): ``fabric.setup(model, optimizer)`` around a CNN of six ConvBlocks,
written without autotune in mind."""

from __future__ import annotations

import argparse

import torch
from lightning.fabric import Fabric
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--batch-size", type=int, default=8)
p.add_argument("--steps", type=int, default=1000)
args = p.parse_args()


class ConvBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.norm = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.norm(self.conv(x)))


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.blocks = nn.ModuleList(ConvBlock(16) for _ in range(6))
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean((2, 3)))


fabric = Fabric(accelerator="cpu", devices=1)
torch.manual_seed(0)
model = CNN()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
model, optimizer = fabric.setup(model, optimizer)
for step in range(args.steps):
    images = torch.randn(args.batch_size, 3, 32, 32)
    labels = torch.randint(0, 10, (args.batch_size,))
    loss = nn.functional.cross_entropy(model(images), labels)
    fabric.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.4f}", flush=True)
