"""``AutotuneCallback``: a Hugging Face Trainer that finds its batch size and recompute plan, measured
(issue 44), where ``auto_find_batch_size=True`` halves the batch size until it stops running out of memory.

    from autotune.finder.hf import AutotuneCallback

    trainer = Trainer(model, args, train_dataset=data, callbacks=[AutotuneCallback(budget="12GB")])
    trainer.train()      # searches first, then trains at the answer

A Trainer callback is told of events, not handed the Trainer, and ``on_train_begin`` comes after the
dataloader is built; so the callback's class wraps ``Trainer.train`` (once, as it is created): a Trainer
holding an ``AutotuneCallback`` whose search has not run searches as ``train()`` starts. Each configuration
is a run of the Trainer's own ``train()`` at ``per_device_train_batch_size``, which autotune ends after the
configuration's measured steps (autotune.finder.inprocess); during the search the Trainer saves, evaluates
and logs nothing and reports to no tracker (its callbacks but the default flow are set aside), the weights
are kept in a file in the trial folder and loaded back afterwards, and an optimizer the Trainer made is made
again (one passed in ``optimizers=`` gets its state back). Then ``train()`` runs at the answer: its batch size,
its accumulation (``gradient_accumulation_steps``) and its plan applied to ``trainer.model``. ``answer`` is
the TuneResult.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from typing import Any

from transformers import Trainer, TrainerCallback
from transformers.trainer_callback import DefaultFlowCallback

from autotune.core.errors import InputError
from autotune.finder.search import FinderOptions, answer_environment, running_script, search_in_process

# what the search sets on TrainingArguments, and to what: no checkpoint, evaluation or log line per trial,
# no progress bar, and steps enough for any trial (autotune ends each one)
_TRIAL_ARGS = {
    "save_strategy": "no",
    "eval_strategy": "no",
    "logging_strategy": "no",
    "disable_tqdm": True,
    "max_steps": 10**9,
    "eval_on_start": False,
    "load_best_model_at_end": False,
}


class AutotuneCallback(TrainerCallback):
    """Searches as ``train()`` starts, then trains at the answer (see the module docstring). ``options``:
    autotune.finder.search.FinderOptions' (``budget``: None, the device's memory)."""

    def __init__(self, **options: Any) -> None:
        self.options = FinderOptions.of("AutotuneCallback", options)
        self.answer: Any = None  # the TuneResult, once found
        _wrap_train()

    def search(self, trainer: Trainer, train: Any) -> None:
        """Search with ``train`` (Trainer.train as it was) unless done, then set the answer on ``trainer``;
        in a trial of ``autotune run`` or ``measure``, that trial's batch size and no search."""
        from autotune.runtime.trial import current

        running = current()
        if running is not None:
            trainer.args.per_device_train_batch_size = running.request.batch_size
            trainer._train_batch_size = trainer.args.train_batch_size
            return
        if self.answer is None:
            self.answer = self._search(trainer, train)
        self._apply(trainer)

    def _search(self, trainer: Trainer, train: Any) -> Any:
        args = trainer.args
        if args.world_size > 1:
            raise InputError(
                "AutotuneCallback searches in one process: under a distributed launch each rank would "
                "search; search with one device, or run `autotune run` with a torchrun template"
            )
        saved_args = {name: getattr(args, name) for name in (*_TRIAL_ARGS, "per_device_train_batch_size")}
        callbacks = list(trainer.callback_handler.callbacks)
        own_optimizer = trainer.optimizer is not None
        with tempfile.TemporaryDirectory(prefix="autotune-hf-") as folder:
            saved = Path(folder) / "state.pt"
            import torch

            torch.save(_state(trainer, own_optimizer), saved)  # on disk: no trial's peak holds a copy
            for name, value in _TRIAL_ARGS.items():
                setattr(args, name, _typed(args, name, value))
            trainer.callback_handler.callbacks = [c for c in callbacks if isinstance(c, DefaultFlowCallback)]

            def train_at(batch: int) -> None:
                args.per_device_train_batch_size = batch
                trainer._train_batch_size = args.train_batch_size
                if not own_optimizer:  # made again, as a fresh train() makes it
                    trainer.optimizer = trainer.lr_scheduler = None
                train(trainer)

            try:
                return search_in_process(
                    train_at, type(trainer.model), self.options, _name(trainer), running_script()
                )
            finally:
                trainer.is_in_train = False
                trainer.callback_handler.callbacks = callbacks
                for name, value in saved_args.items():
                    setattr(args, name, value)
                _restore(trainer, torch.load(saved, weights_only=False), own_optimizer)
                trainer.accelerator.free_memory()

    def _apply(self, trainer: Trainer) -> None:
        """The answer on the Trainer: batch size, accumulation, the plan on its model."""
        from autotune.runtime.api import prepare

        answer = self.answer
        answer_environment(answer)
        trainer.args.per_device_train_batch_size = answer.best.batch_size
        trainer._train_batch_size = trainer.args.train_batch_size
        if answer.grad_accum and answer.grad_accum > 1:
            trainer.args.gradient_accumulation_steps = answer.grad_accum
        prepare(trainer.model)  # $AUTOTUNE_PLAN, applied in place (nothing for none)


def _wrap_train() -> None:
    """``Trainer.train`` searches first for a Trainer holding an AutotuneCallback (once per process)."""
    train = Trainer.train
    if getattr(train, "_autotune_search", False):
        return

    @functools.wraps(train)
    def search_then_train(self: Trainer, *args: Any, **kwargs: Any) -> Any:
        for callback in self.callback_handler.callbacks:
            if isinstance(callback, AutotuneCallback):
                callback.search(self, train)
        return train(self, *args, **kwargs)

    search_then_train._autotune_search = True  # type: ignore[attr-defined]
    Trainer.train = search_then_train  # type: ignore[method-assign]


def _state(trainer: Any, own_optimizer: bool) -> dict[str, Any]:
    state = {"model": trainer.model.state_dict()}
    if own_optimizer:
        state["optimizer"] = trainer.optimizer.state_dict()
        if trainer.lr_scheduler is not None:
            state["scheduler"] = trainer.lr_scheduler.state_dict()
    return state


def _restore(trainer: Any, state: dict[str, Any], own_optimizer: bool) -> None:
    trainer.model.load_state_dict(state["model"])
    if own_optimizer:
        trainer.optimizer.load_state_dict(state["optimizer"])
        if "scheduler" in state:
            trainer.lr_scheduler.load_state_dict(state["scheduler"])
    else:
        trainer.optimizer = trainer.lr_scheduler = None


def _typed(args: Any, name: str, value: Any) -> Any:
    """``value`` as the field holds it (TrainingArguments turns strategy strings into enums)."""
    current = getattr(args, name)
    return type(current)(value) if isinstance(value, str) and not isinstance(current, str) else value


def _name(trainer: Trainer) -> str:
    return f"hf-trainer:{type(trainer.model).__name__}"
