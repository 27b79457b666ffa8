"""The phases of a job inside the frameworks users train with, found without a change to their script: a
Hugging Face Trainer's evaluation and checkpoint save, a Lightning trainer's validation loop and
``save_checkpoint``. Each runs inside ``autotune.phase`` (so the meter measures it on its own), and a trial
asked for a phase (``--with-eval``, ``--with-save``) makes the framework run it at its next step after the
measured ones, the way the framework itself would (see autotune.runtime.trial).

Installed like the optimizer-step hook: when the script imports the framework's trainer module
(autotune.runtime.hooks). A checkpoint the trial asks for is written into the trial's own folder and
deleted at once: a trial never writes into the user's output directory (nor rotates their checkpoints).

Hugging Face (``transformers.trainer``): ``Trainer.evaluate`` and ``Trainer._save_checkpoint`` are wrapped;
a callback added to every Trainer sets ``control.should_evaluate`` / ``should_save`` at the step end once a
phase is due, and the Trainer evaluates and saves as it does every ``eval_steps`` (gradients already
zeroed). Lightning (``lightning.pytorch`` or ``pytorch_lightning``): the training epoch loop's
``_should_check_val_fx`` says yes once an evaluation is due (the loop then zeroes the gradients and runs
validation as at ``val_check_interval``), its validation runs are wrapped, and at the end of that batch
``trainer.save_checkpoint`` saves once a save is due.
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.runtime.api import due, phase
from autotune.runtime.trial import PhaseNotRun, _Trial

# module -> how to hook it, once the script imports it
HF_TRAINER = "transformers.trainer"
LIGHTNING_LOOPS = (
    "lightning.pytorch.loops.training_epoch_loop",
    "pytorch_lightning.loops.training_epoch_loop",
)
LIGHTNING_EVALUATION = ("lightning.pytorch.loops.evaluation_loop", "pytorch_lightning.loops.evaluation_loop")
LIGHTNING_TRAINER = ("lightning.pytorch.trainer.trainer", "pytorch_lightning.trainer.trainer")


def checkpoint_dir(trial: _Trial) -> Path:
    """Where a checkpoint the trial asks for goes: its own folder (deleted once saved)."""
    return Path(trial.request.report_path).parent / "checkpoint"


def hook_hf_trainer(module: Any, trial: _Trial) -> None:
    """Wrap ``Trainer.evaluate`` and ``Trainer._save_checkpoint`` in their phases, and add to every Trainer
    the callback that asks for a phase that is due."""
    from transformers.trainer_callback import TrainerCallback

    trainer_class = module.Trainer
    evaluate, save, init = trainer_class.evaluate, trainer_class._save_checkpoint, trainer_class.__init__

    @functools.wraps(save)
    def save_in_phase(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not due("save"):  # the script's own save, where it asked for it
            with phase("save"):
                return save(self, *args, **kwargs)
        output_dir, self.args.output_dir = self.args.output_dir, str(checkpoint_dir(trial))
        try:
            with phase("save"):
                return save(self, *args, **kwargs)
        finally:
            self.args.output_dir = output_dir
            shutil.rmtree(checkpoint_dir(trial), ignore_errors=True)

    class PhasesDue(TrainerCallback):
        """Asks the Trainer for the phases the trial awaits, at the end of a step."""

        def __init__(self, trainer: Any) -> None:
            self.trainer = trainer

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            if due("eval"):
                if self.trainer.eval_dataset is None:
                    raise PhaseNotRun(
                        "--with-eval: the Trainer has no eval_dataset to evaluate on: give it one "
                        "(Trainer(eval_dataset=...)) or leave --with-eval out"
                    )
                control.should_evaluate = True
            if due("save"):
                control.should_save = True
            return control

    @functools.wraps(init)
    def init_with_phases(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.add_callback(PhasesDue(self))

    trainer_class.evaluate = in_phase(evaluate, "eval")
    trainer_class._save_checkpoint = save_in_phase
    trainer_class.__init__ = init_with_phases


def hook_lightning_loop(module: Any, trial: _Trial) -> None:
    """Validate once an evaluation is due; at the end of that batch, save once a save is due."""
    loop_class = module._TrainingEpochLoop
    should_check, advance_end = loop_class._should_check_val_fx, loop_class.on_advance_end

    @functools.wraps(should_check)
    def should_check_or_due(self: Any, *args: Any, **kwargs: Any) -> bool:
        if due("eval"):
            if not self.trainer.enable_validation:
                raise PhaseNotRun(
                    "--with-eval: the Lightning trainer has no validation to run (no val_dataloader, or "
                    "limit_val_batches=0): give the module a val_dataloader or leave --with-eval out"
                )
            return True
        return bool(should_check(self, *args, **kwargs))

    @functools.wraps(advance_end)
    def advance_end_then_save(self: Any, *args: Any, **kwargs: Any) -> None:
        advance_end(self, *args, **kwargs)
        if due("save") and not due("eval"):
            path = checkpoint_dir(trial) / "autotune.ckpt"
            try:
                self.trainer.save_checkpoint(path)
            finally:
                shutil.rmtree(checkpoint_dir(trial), ignore_errors=True)

    loop_class._should_check_val_fx = should_check_or_due
    loop_class.on_advance_end = advance_end_then_save


def hook_lightning_evaluation(module: Any, trial: _Trial) -> None:
    """A validation run (the sanity check's too) is the eval phase; a test run is not."""
    loop = module._EvaluationLoop
    loop.run = in_phase(
        loop.run, "eval", lambda self: self.trainer.validating or self.trainer.sanity_checking
    )


def hook_lightning_trainer(module: Any, trial: _Trial) -> None:
    """``Trainer.save_checkpoint`` is the save phase (a ModelCheckpoint's save, and the trial's)."""
    module.Trainer.save_checkpoint = in_phase(module.Trainer.save_checkpoint, "save")


def in_phase(method: Callable[..., Any], name: str, when: Callable[[Any], bool] | None = None) -> Any:
    """``method`` run inside ``autotune.phase(name)`` (only where ``when(self)``, if given)."""

    @functools.wraps(method)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        if when is not None and not when(self):
            return method(self, *args, **kwargs)
        with phase(name):
            return method(self, *args, **kwargs)

    return wrapped


def _tolerant(hook: Callable[[Any, _Trial], None]) -> Callable[[Any, _Trial], None]:
    """``hook``, leaving the framework as it is where its version lacks what the hook wraps (a renamed
    private method): the script's import must never fail for autotune's sake. A phase asked for is then not
    found, and the trial says how to run it (PhaseNotRun)."""

    @functools.wraps(hook)
    def tolerant(module: Any, trial: _Trial) -> None:
        try:
            hook(module, trial)
        except (AttributeError, ImportError):
            return

    return tolerant


HOOKS = {
    HF_TRAINER: _tolerant(hook_hf_trainer),
    **dict.fromkeys(LIGHTNING_LOOPS, _tolerant(hook_lightning_loop)),
    **dict.fromkeys(LIGHTNING_EVALUATION, _tolerant(hook_lightning_evaluation)),
    **dict.fromkeys(LIGHTNING_TRAINER, _tolerant(hook_lightning_trainer)),
}
