"""A small transformer encoder (nn.TransformerEncoder) for the ONNX Runtime backend.

Under autotune: autotune run --backend ort --budget 1GiB examples/ort_transformer.py (autotune.prepare wraps
the model in ORTModule with the trial's memory-optimizer plan). On its own: python examples/ort_transformer.py
trains it in plain PyTorch; after eval "$(autotune best --backend ort --env examples/ort_transformer.py)" the
same command trains under ORTModule with the chosen plan and batch size.

Prints the loss of every step (the tests compare it with plain PyTorch).
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.nn import functional as F

import autotune


class Encoder(nn.Module):
    def __init__(self, vocab: int, d_model: int, nhead: int, layers: int, seq: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.position = nn.Parameter(torch.zeros(1, seq, d_model))
        layer = nn.TransformerEncoderLayer(
            d_model, nhead, 4 * d_model, dropout=0.0, activation="gelu", batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens) + self.position))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--nhead", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--steps", type=int, default=10**9)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    batch = args.batch_size or autotune.batch_size(default=8)
    torch.manual_seed(args.seed)
    model = autotune.prepare(Encoder(args.vocab, args.d_model, args.nhead, args.layers, args.seq))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(args.seed + 1)
    for step in range(args.steps):
        tokens = torch.randint(0, args.vocab, (batch, args.seq), generator=data)
        logits = model(tokens)
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), tokens.roll(-1, dims=1).reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        print(f"step {step} loss {loss.item():.8f}", flush=True)
        optimizer.step()


if __name__ == "__main__":
    main()
