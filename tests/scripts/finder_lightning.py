"""A LightningModule fitted with autotune's AutotuneFinder callback (tests/finder): residual MLP blocks on
(batch, 32, 128) inputs, its batch size read by train_dataloader(). ``python finder_lightning.py
OPTIONS_JSON OUT_JSON``: the callback's options; writes what the fit saw to OUT_JSON."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from autotune.backends.torch_modules import applied_plan
from autotune.finder.lightning import AutotuneFinder
from autotune.trials.settings import TrialSettings

options = json.loads(sys.argv[1])
out = sys.argv[2]
if "settings" in options:  # a trial's steps, as TrialSettings' fields
    options["settings"] = TrialSettings(**options["settings"])
# A fixed cost per step, as a data pipeline's: batch 64 reads about 2x batch 16's samples/s, a margin a
# busy neighbour does not flip (the blocks' compute alone is almost linear in the batch here: 460 against 350
# samples/s quiet, and CI once read batch 16 faster). The test is of the callback, not of a speed.
STEP_SECONDS = 0.1


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Net(pl.LightningModule):
    def __init__(self, batch_size: int = 2) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.net = nn.Sequential(*[Block(128) for _ in range(4)], nn.Linear(128, 1))
        self.losses: list[float] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: list[torch.Tensor], index: int) -> torch.Tensor:
        time.sleep(STEP_SECONDS)
        loss = self(batch[0]).pow(2).mean()
        self.losses.append(loss.item())
        return loss

    def train_dataloader(self) -> DataLoader:
        inputs = torch.randn(1024, 32, 128, generator=torch.Generator().manual_seed(0))
        return DataLoader(TensorDataset(inputs), batch_size=self.batch_size)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Start(pl.Callback):
    """The weights and the batch size as the real fit starts."""

    def on_train_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self.weights = {k: v.clone() for k, v in module.state_dict().items()}
        module.losses.clear()

    def on_train_batch_start(
        self, trainer: pl.Trainer, module: pl.LightningModule, batch: list, i: int
    ) -> None:
        self.batch = len(batch[0])


torch.manual_seed(0)
model = Net()
initial = {k: v.clone() for k, v in model.state_dict().items()}
finder = AutotuneFinder(**options)
start = Start()
trainer = pl.Trainer(
    max_steps=3,
    callbacks=[finder, start],
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    accelerator="cpu",
)
trainer.fit(model)
answer = finder.answer
plain = Net()  # the first step's loss with no plan, from the same weights and data
plain.load_state_dict(initial)
first = next(
    iter(
        DataLoader(
            TensorDataset(torch.randn(1024, 32, 128, generator=torch.Generator().manual_seed(0))),
            batch_size=answer.best.batch_size,
        )
    )
)
Path(out).write_text(
    json.dumps(
        {
            "batch": answer.best.batch_size,
            "plan": answer.best.plan,
            "cached": answer.cached,
            "fit_batch": start.batch,
            "fit_steps": trainer.global_step,
            "applied": str(applied_plan(model) or "none"),
            "restored": all(torch.equal(initial[k], start.weights[k]) for k in initial),
            "first_loss": model.losses[0],
            "plain_first_loss": plain(first[0]).pow(2).mean().item(),
            "records": [
                [r.batch_size, r.plan, r.outcome.value if r.outcome else None] for r in answer.records
            ],
        }
    )
)
