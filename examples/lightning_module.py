"""A Lightning module that knows nothing of autotune: a small transformer encoder classifying synthetic token
sequences, trained by ``lightning.Trainer`` with gradient accumulation. Tune it keeping the global batch:

    autotune run --budget 2GiB --global-batch 64 -- python examples/lightning_module.py \\
        --batch-size {batch_size} --accumulate {grad_accum}

then train with the answer:

    eval "$(autotune best --env --budget 2GiB -- python examples/lightning_module.py \\
        --batch-size {batch_size} --accumulate {grad_accum})"
    python examples/lightning_module.py --batch-size $AUTOTUNE_BATCH_SIZE --accumulate $AUTOTUNE_GRAD_ACCUM \\
        --recompute "$AUTOTUNE_PLAN"

``--val-batches N`` gives the trainer a validation set of N batches (run every ``--val-every`` steps);
``autotune run --with-eval --with-save`` makes each trial also validate once and save a checkpoint once after
its measured steps, so the answer fits those too.

Inside a trial autotune counts Lightning's optimizer steps (``batch x accumulation`` samples each) and applies
the trial's plan at the model's first forward; outside, ``--recompute PLAN`` applies one through
``autotune.prepare`` in ``configure_model``.
"""

from __future__ import annotations

import argparse
import os

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Classifier(L.LightningModule):
    def __init__(self, vocab: int = 512, width: int = 128, layers: int = 4, classes: int = 10) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=4 * width, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, classes)

    def configure_model(self) -> None:
        if os.environ.get("AUTOTUNE_PLAN"):  # outside autotune: the plan its answer names
            import autotune

            autotune.prepare(self)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        tokens, labels = batch
        return nn.functional.cross_entropy(self(tokens), labels)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> None:
        tokens, labels = batch
        self.log("val_loss", nn.functional.cross_entropy(self(tokens), labels))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--accumulate", type=int, default=1, help="micro-batches per optimizer step")
    parser.add_argument("--max-steps", type=int, default=1000)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--recompute", default="", help="a recompute plan to apply (AUTOTUNE_PLAN's form)")
    parser.add_argument("--val-batches", type=int, default=0, help="a validation set of N batches (0: none)")
    parser.add_argument("--val-every", type=int, default=1000, help="validate every N steps")
    parser.add_argument("--val-batch-size", type=int, default=64)
    args = parser.parse_args()
    if args.recompute:
        os.environ["AUTOTUNE_PLAN"] = args.recompute

    torch.manual_seed(0)
    samples = args.max_steps * args.batch_size * args.accumulate
    tokens = torch.randint(0, 512, (max(samples, 1), args.seq))
    data = DataLoader(TensorDataset(tokens, tokens[:, 0] % 10), batch_size=args.batch_size, shuffle=True)
    held_out = torch.randint(0, 512, (args.val_batches * args.val_batch_size, args.seq))
    validation = DataLoader(TensorDataset(held_out, held_out[:, 0] % 10), batch_size=args.val_batch_size)
    trainer = L.Trainer(
        max_steps=args.max_steps,
        val_check_interval=min(args.val_every, len(data)),
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        accumulate_grad_batches=args.accumulate,
        accelerator="auto",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Classifier(), data, validation if args.val_batches else None)


if __name__ == "__main__":
    main()
