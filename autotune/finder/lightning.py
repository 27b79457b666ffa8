"""``AutotuneFinder``: Lightning's ``BatchSizeFinder`` shape, measured (issue 44).

    from autotune.finder.lightning import AutotuneFinder

    trainer = lightning.Trainer(callbacks=[AutotuneFinder(budget="12GB")])   # no budget: the device's
    trainer.fit(model, datamodule)     # searches at fit's start, then fits at the answer

At ``on_fit_start`` it searches batch size x recompute plan in this process, as ``BatchSizeFinder`` scales
the batch size: each configuration sets ``batch_arg_name`` on the module (or its datamodule, or their
hparams), reloads the training data and runs the fit loop, which autotune ends after the configuration's
measured steps (autotune.finder.inprocess); loggers, the other callbacks and validation are off during the
search, and the weights, optimizer state and loop are restored from a checkpoint afterwards (as
``BatchSizeFinder`` restores them). Then it sets the answer's batch size, applies its plan to the module and
its accumulation to the trainer, and fit goes on from the first step. ``answer`` is the TuneResult.
"""

from __future__ import annotations

import importlib
import os
import uuid
from copy import deepcopy
from typing import Any

from autotune.core.errors import InputError
from autotune.finder.search import FinderOptions, answer_environment, running_script, search_in_process

try:
    import lightning.pytorch as pl
except ImportError:  # the older package name
    import pytorch_lightning as pl  # type: ignore[no-redef]

_parsing: Any = importlib.import_module(f"{pl.__name__}.utilities.parsing")
lightning_hasattr, lightning_setattr = _parsing.lightning_hasattr, _parsing.lightning_setattr


class AutotuneFinder(pl.Callback):
    """Searches at ``on_fit_start`` and fits at the answer (see the module docstring). ``options``:
    autotune.finder.search.FinderOptions' (``budget``: None, the device's memory)."""

    def __init__(self, batch_arg_name: str = "batch_size", **options: Any) -> None:
        self.batch_arg_name = batch_arg_name
        self.options = FinderOptions.of("AutotuneFinder", options)
        self.answer: Any = None  # the TuneResult, once found

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str | None = None) -> None:
        """What the search needs, said before fit starts (Lightning's own finder refuses the same)."""
        if trainer._accelerator_connector.is_distributed:
            raise InputError(
                "AutotuneFinder searches in one process: a distributed strategy's ranks would each search; "
                "search with one device, or run `autotune run` with a torchrun template"
            )
        if stage == "fit" and not trainer.fit_loop._data_source.is_module():
            raise InputError(
                "AutotuneFinder sets the batch size on the module or its datamodule: dataloaders passed to "
                "fit() directly are built already; build them in train_dataloader() from "
                f"self.{self.batch_arg_name}"
            )
        if not lightning_hasattr(pl_module, self.batch_arg_name):
            raise InputError(
                f"AutotuneFinder: no {self.batch_arg_name!r} on the module, its datamodule or their hparams "
                "(batch_arg_name names the attribute train_dataloader() reads)"
            )

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        from autotune.runtime.trial import current

        running = current()
        if running is not None:  # a trial of `autotune run` or `measure`: its batch size, no search
            lightning_setattr(pl_module, self.batch_arg_name, running.request.batch_size)
            _reload(trainer.fit_loop)
            return
        if self.answer is None:
            self.answer = self._search(trainer, pl_module)
        self._apply(trainer, pl_module)

    def _search(self, trainer: Any, pl_module: pl.LightningModule) -> Any:
        loop = trainer.fit_loop
        checkpoint = os.path.join(trainer.default_root_dir, f".autotune_{uuid.uuid4()}.ckpt")
        trainer.save_checkpoint(checkpoint)
        saved = {
            "loggers": trainer.loggers,
            "callbacks": trainer.callbacks,
            "max_steps": loop.epoch_loop.max_steps,
            "limit_train_batches": trainer.limit_train_batches,
            "limit_val_batches": trainer.limit_val_batches,
            "loop": deepcopy(loop.state_dict()),
        }
        trainer.loggers = []
        trainer.callbacks = []  # this one included: the search runs inside its on_fit_start
        trainer.limit_train_batches, trainer.limit_val_batches = 1.0, 0
        loop.epoch_loop.max_steps = -1  # autotune ends each configuration after its measured steps

        def train(batch: int) -> None:
            lightning_setattr(pl_module, self.batch_arg_name, batch)
            _reset_progress(trainer)
            _reload(loop)
            loop.load_state_dict(deepcopy(saved["loop"]))
            loop.restarting = False
            loop.run()

        try:
            return search_in_process(train, type(pl_module), self.options, _name(pl_module), running_script())
        finally:
            trainer.loggers, trainer.callbacks = saved["loggers"], saved["callbacks"]
            loop.epoch_loop.max_steps = saved["max_steps"]
            trainer.limit_train_batches = saved["limit_train_batches"]
            trainer.limit_val_batches = saved["limit_val_batches"]
            loop.load_state_dict(deepcopy(saved["loop"]))
            loop.restarting = False
            trainer._checkpoint_connector.restore(checkpoint)  # weights, optimizer state, loop progress
            trainer.strategy.remove_checkpoint(checkpoint)
            _reset_progress(trainer)

    def _apply(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The answer: the batch size read by train_dataloader(), the plan on the module, the accumulation."""
        from autotune.runtime.api import prepare

        answer = self.answer
        answer_environment(answer)
        lightning_setattr(pl_module, self.batch_arg_name, answer.best.batch_size)
        prepare(pl_module)  # $AUTOTUNE_PLAN, applied in place (nothing for none)
        if answer.grad_accum and answer.grad_accum > 1:
            trainer.accumulate_grad_batches = answer.grad_accum
        _reload(trainer.fit_loop)


def _reload(loop: Any) -> None:
    """The training data again, at the batch size now set (Lightning's finder does the same)."""
    loop._combined_loader = None
    loop.setup_data()


def _reset_progress(trainer: pl.Trainer) -> None:
    if trainer.lightning_module.automatic_optimization:
        trainer.fit_loop.epoch_loop.automatic_optimization.optim_progress.reset()
    else:
        trainer.fit_loop.epoch_loop.manual_optimization.optim_step_progress.reset()
    trainer.fit_loop.epoch_progress.reset()


def _name(pl_module: pl.LightningModule) -> str:
    cls = type(pl_module)
    return f"lightning:{cls.__module__}.{cls.__qualname__}"
