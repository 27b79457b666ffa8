"""A small torch training script whose model takes its inputs in one of several layouts, with the batch size
an argparse option that the script may ignore: what autotune counts from the model's inputs.

    python inputs.py [--batch-size 32] [--layout rows|seq-first|kwargs|tokens] [--lengths 8-64] [--seed 0]
                     [--vocab 100] [--steps N]

Each step draws its sequence length from --lengths, or takes the longest where autotune.worst_case() is true.
"""

from __future__ import annotations

import argparse
import random

import torch
from torch import nn

import autotune

VOCAB, WIDTH, FEATURES, SEQ = 100, 16, 8, 12


class Rows(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).mean()


class SeqFirst(nn.Module):
    """An LSTM without batch_first: inputs are (T, B, F)."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(FEATURES, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rnn(x)[0].mean()


class Tokens(nn.Module):
    """Token ids (B, T), taken as Hugging Face models take them: ``model(input_ids=...)`` or positionally."""

    def __init__(self, vocab: int = VOCAB) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, WIDTH)
        self.head = nn.Linear(WIDTH, vocab)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.head(self.embed(input_ids))
        return nn.functional.cross_entropy(logits.flatten(0, 1), input_ids.flatten())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--layout", choices=("rows", "seq-first", "kwargs", "tokens"), default="rows")
    p.add_argument("--lengths", default=f"{SEQ}-{SEQ}", help="LO-HI: each step draws its sequence length")
    p.add_argument("--steps", type=int, default=10**9)
    p.add_argument("--vocab", type=int, default=VOCAB, help="token layouts: the logits' width")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.manual_seed(args.seed)
    draw = random.Random(args.seed)
    low, high = (int(v) for v in args.lengths.split("-"))
    b = args.batch_size
    model = (
        Rows() if args.layout == "rows" else SeqFirst() if args.layout == "seq-first" else Tokens(args.vocab)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(args.steps):
        length = high if autotune.worst_case() else draw.randint(low, high)  # padded to the longest
        if args.layout == "rows":
            loss = model(torch.randn(b, FEATURES))
        elif args.layout == "seq-first":
            loss = model(torch.randn(length, b, FEATURES))
        else:
            ids = torch.randint(0, args.vocab, (b, length))
            loss = (
                model(input_ids=ids, attention_mask=torch.ones_like(ids))
                if args.layout == "kwargs"
                else model(ids)
            )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
