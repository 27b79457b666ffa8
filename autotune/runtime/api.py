"""The trial runtime's public API (re-exported as ``autotune.batch_size``, ``autotune.grad_accum``, ``autotune.prepare``,
``autotune.step``):

- ``batch_size(default)``: the trial's batch size. Outside a trial: ``AUTOTUNE_BATCH_SIZE`` if set (what
  ``autotune best --env`` exports), else ``default``.
- ``grad_accum(default=1)``: micro-batches per optimizer step: the trial's (from ``--global-batch`` or
  ``--grad-accum``), else ``AUTOTUNE_GRAD_ACCUM``, else ``default``.
- ``prepare(model)``: applies the trial's recompute plan. Outside a trial: ``AUTOTUNE_PLAN`` if set, else
  nothing. A plan per rank (``Block:1|none``) applies the entry of this process's ``$RANK``.
- ``step(samples)``: counts a training step. Steps are also counted automatically through torch's global
  optimizer step hook (first optimizer only); the first explicit ``step()`` call turns that off.

Also ``worst_case()``, ``phase(name)`` and ``due(name)`` (autotune.runtime.trial: phases of the job). The
state of the trial they read is ``autotune.runtime.trial``'s.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from typing import Any, TypeVar

from autotune.core.errors import InputError
from autotune.core.plans import Backend, Sharding, Zero, parse_plan
from autotune.core.protocol import (
    BACKEND_ENV,
    BATCH_SIZE_ENV,
    GRAD_ACCUM_ENV,
    PLAN_ENV,
    RankIdentity,
    worst_case_enabled,
)
from autotune.runtime.segments import prepare_switchable
from autotune.runtime.trial import _Trial, current

M = TypeVar("M")


def batch_size(default: int | None = None) -> int:
    """The batch size to train with: the trial's, else ``$AUTOTUNE_BATCH_SIZE``, else ``default``.

    Raises:
        InputError: none of the three is set, or the variable is not a positive integer.
    """
    trial = current()
    if trial is not None:
        return trial.request.batch_size
    text = os.environ.get(BATCH_SIZE_ENV)
    if text:
        if not text.isascii() or not text.isdigit() or int(text) <= 0:
            raise InputError(f"{BATCH_SIZE_ENV} must be a positive integer, got {text!r}")
        return int(text)
    if default is None:
        raise InputError(
            f"no batch size: not in an autotune trial, {BATCH_SIZE_ENV} is unset and no default given"
        )
    return default


def grad_accum(default: int = 1) -> int:
    """Micro-batches to accumulate per optimizer step: the trial's (``--global-batch``: the global batch over
    the trial's batch size; ``--grad-accum N``: N), else ``$AUTOTUNE_GRAD_ACCUM``, else ``default``.

    Raises:
        InputError: the variable is not a positive integer.
    """
    trial = current()
    if trial is not None:
        return trial.request.grad_accum or 1
    text = os.environ.get(GRAD_ACCUM_ENV)
    if text:
        if not text.isascii() or not text.isdigit() or int(text) <= 0:
            raise InputError(f"{GRAD_ACCUM_ENV} must be a positive integer, got {text!r}")
        return int(text)
    return default


def worst_case() -> bool:
    """Whether the script should feed its longest inputs: pad every batch to the maximum sequence length (or
    draw the largest images) so that a trial's few steps see the shapes the whole job's worst step will
    (OpenNMT-tf's batch autotune mode does the same). On while ``$AUTOTUNE_WORST_CASE`` is 1, in a trial and
    outside it: ``AUTOTUNE_WORST_CASE=1 autotune run ...`` tunes every trial so, and the study is a workload
    of its own."""
    return worst_case_enabled(os.environ)


def prepare(model: M) -> M:
    """Apply the recompute plan (the trial's, else ``$AUTOTUNE_PLAN``) to ``model`` and return it: in place
    for the torch backend; for the ORT backend (the trial's, else ``$AUTOTUNE_BACKEND=ort``) the model
    wrapped in ORTModule, whose plan is in ORT's own environment variables."""
    trial = current()
    backend = (
        trial.request.backend if trial is not None else Backend.parse(os.environ.get(BACKEND_ENV, "torch"))
    )
    if backend is Backend.ORT:
        return _prepare_ort(model, trial)
    plan = parse_plan(trial.request.plan if trial is not None else os.environ.get(PLAN_ENV, "none"))
    if plan.ranks:  # a plan per rank: this rank's entry
        identity = trial.rank if trial is not None else RankIdentity.from_environ()
        plan = plan.for_rank(identity.rank if identity is not None else None)
    if plan.is_none and trial is None:
        return model  # outside a trial with no plan: not even torch is imported
    if plan.compile_budget is not None and trial is None:  # in a trial, set as torch was imported (hooks)
        from autotune.backends.torch_compile import set_compile_budget

        set_compile_budget(plan.compile_budget)
    from autotune.backends.torch_modules import apply_plan, find_candidates  # torch: only once a model exists

    if trial is not None:
        from autotune.backends.torch_modules import own_gradient_checkpointing

        trial.own_hf_checkpointing = own_gradient_checkpointing(model)  # type: ignore[arg-type]
        trial.candidates = [asdict(c.summary()) for c in find_candidates(model)]  # type: ignore[arg-type]
        if trial.request.probe:
            from autotune.backends.torch_probe import Probe

            if trial.probe is None:
                trial.probe = Probe(model, trial.request.batch_size, trial.request.check_plans)  # type: ignore[arg-type]
                trial.plan_applied = "none"
            return model
    if isinstance(plan.sharding, Sharding):  # given to fully_shard before this first forward (runtime.hooks)
        from autotune.backends.torch_sharding import check_applied

        check_applied(model, plan.sharding, in_trial=trial is not None)  # type: ignore[arg-type]
    elif isinstance(plan.sharding, Zero):  # given to deepspeed.initialize before this first forward
        from autotune.backends.deepspeed_zero import check_applied as check_zero

        check_zero(model, plan.sharding, in_trial=trial is not None)
    if trial is not None and (trial.sweep or trial.in_process):  # in-process: taken off after the trial
        return prepare_switchable(model, plan, trial)
    applied = apply_plan(model, plan)  # type: ignore[arg-type]
    if trial is not None:
        trial.plan_applied = str(applied)
    return model


def _prepare_ort(model: M, trial: _Trial | None) -> M:
    from autotune.backends.ort import OrtProbe, wrap

    wrapped = wrap(model)
    if trial is not None:
        trial.candidates = []
        trial.plan_applied = trial.request.plan
        if trial.request.probe and trial.probe is None:
            trial.probe = OrtProbe(wrapped, trial.request.batch_size)
    return wrapped


def step(samples: int | None = None) -> None:
    """Count one training step of ``samples`` samples (default: the batch size). A no-op outside a trial."""
    trial = current()
    if trial is not None:
        trial.explicit_steps = True
        trial.step(samples)


class phase:  # a context manager named as the function users call it as
    """``with autotune.phase("eval"):`` (or ``"save"``, or any name): the code inside is that phase of the
    job, its memory measured on its own. In a trial asked for it (``--with-eval``, ``--with-save``) after its
    measured steps, the trial ends as the last such phase ends (TrialComplete from the ``with``). A no-op
    outside a trial."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._started: float | None = None
        self._counted = False

    def __enter__(self) -> phase:
        trial = current()
        if trial is not None:
            self._counted = trial.enter_phase(self.name)
            self._started = time.perf_counter()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: Any) -> None:
        trial = current()
        if trial is not None and self._started is not None:
            trial.exit_phase(self.name, time.perf_counter() - self._started, ok=kind is None)


def due(name: str) -> bool:
    """Whether the trial awaits phase ``name`` now (``--with-eval``: "eval", ``--with-save``: "save"): its
    measured steps are done and the script has not run it since. A training loop of the user's own runs
    that phase when this is true (inside ``autotune.phase(name)``); a Trainer or Lightning needs nothing.
    False outside a trial."""
    trial = current()
    return trial is not None and name in trial.due_phases()
