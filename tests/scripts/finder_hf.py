"""A tiny GPT-2 (built from a config, no download) trained by a Hugging Face Trainer holding autotune's
AutotuneCallback (tests/finder). ``python finder_hf.py OPTIONS_JSON OUTPUT_DIR OUT_JSON``: the callback's
options; writes what the training saw to OUT_JSON."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    default_data_collator,
)

from autotune.backends.torch_modules import applied_plan
from autotune.finder.hf import AutotuneCallback
from autotune.trials.settings import TrialSettings

options, output_dir, out = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
if "settings" in options:  # a trial's steps, as TrialSettings' fields
    options["settings"] = TrialSettings(**options["settings"])


class Tokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 512

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 256, (64,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


def collate(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """A fixed cost per batch, as a data pipeline's: batch 16 reads about 2.8x batch 4's samples/s, a margin a
    busy neighbour does not flip (162 against 115 samples/s without it). The test is of the callback, not of a
    speed."""
    time.sleep(0.1)
    return default_data_collator(items)


class Start(TrainerCallback):
    """The weights as the real training starts, and the batches it trains."""

    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] | None = None
        self.batches: list[int] = []

    def on_train_begin(self, args, state, control, model=None, **kwargs):  # type: ignore[no-untyped-def]
        self.weights = {k: v.clone() for k, v in model.state_dict().items()}

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        self.batches.append(state.train_batch_size)


torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=64))
initial = {k: v.clone() for k, v in model.state_dict().items()}
finder, start = AutotuneCallback(**options), Start()
args = TrainingArguments(
    output_dir=output_dir,
    per_device_train_batch_size=2,
    max_steps=3,
    report_to="none",
    use_cpu=True,
    save_strategy="steps",
    save_steps=1,  # the real training saves every step; the search's trials save nothing
    logging_steps=1,
)
trainer = Trainer(
    model=model, args=args, train_dataset=Tokens(), data_collator=collate, callbacks=[finder, start]
)
trainer.train()
answer = finder.answer
Path(out).write_text(
    json.dumps(
        {
            "batch": answer.best.batch_size,
            "plan": answer.best.plan,
            "cached": answer.cached,
            "train_batches": start.batches,
            "steps": trainer.state.global_step,
            "applied": str(applied_plan(trainer.model) or "none"),
            "restored": all(torch.equal(initial[k], start.weights[k]) for k in initial),
            "save_steps": trainer.args.save_steps,
            "records": [
                [r.batch_size, r.plan, r.outcome.value if r.outcome else None] for r in answer.records
            ],
        }
    )
)
