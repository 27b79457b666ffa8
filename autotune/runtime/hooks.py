"""The trial's hooks into torch, installed before the user's script runs (by the harness, or by the
injected sitecustomize for commands that are not ``python ...``): count optimizer steps; at the first
forward with gradients of a module the optimizer trains, find the model (every module tree the optimizer
trains: autotune.backends.torch_model) and apply the plan, and from then on count that module's forwards
between optimizer steps (its micro-batches: see autotune.runtime.trial), with what their inputs show
(autotune.runtime.inputs); and the phases of a job inside Hugging Face's Trainer and Lightning
(autotune.runtime.frameworks). torch itself is not imported here: the hooks go in when the script imports it
(a framework's, when the script imports that).

FSDP2: ``fully_shard`` is wrapped as ``torch.distributed.fsdp`` is imported, so a sharding plan reaches the
script's own calls, made before the model's first forward (autotune.backends.torch_sharding). DeepSpeed:
``deepspeed.initialize`` is wrapped as ``deepspeed`` is imported, so a ZeRO plan reaches the config the script
passes it (autotune.backends.deepspeed_zero).

torch.compile: a compile plan's activation memory budget is set as torch is imported, before the script
can compile anything, so a script that calls ``torch.compile`` itself is covered without a change (and
one that calls ``autotune.prepare`` too). ``torch.compile`` is wrapped to tell the trial that the script
compiles; in a probe trial it returns the model as it is, so the probe's instruments see every op of an
eager forward, and the probe asks torch's partitioner about the compiled graphs itself.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from autotune.core.plans import Backend, Plan, Sharding, Zero, parse_plan
from autotune.runtime.api import prepare
from autotune.runtime.frameworks import HOOKS
from autotune.runtime.inputs import read_inputs
from autotune.runtime.trial import _Trial, current


def install() -> None:
    """Hook the running trial into torch: count optimizer steps, apply the plan at the first forward."""
    trial = current()
    if trial is None:
        return
    if trial.request.backend is Backend.ORT:
        # Before the script runs: a script that imports ORTModule itself needs the compatibility fixes
        # in place before onnxruntime's first import (autotune.backends.ort).
        from autotune.backends.ort import load_ortmodule

        load_ortmodule()
    if "torch" in sys.modules:
        _install_torch_hooks(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, _AfterImport("torch", _install_torch_hooks))
    if trial.request.backend is Backend.TORCH:  # before the script can import deepspeed (which imports torch)
        _hook_deepspeed(trial)
    for name, hook in HOOKS.items():  # the phases of a job inside Hugging Face's Trainer and Lightning

        def then(module: ModuleType, hook: Callable[[Any, _Trial], None] = hook) -> None:
            hook(module, trial)

        if name in sys.modules:
            then(sys.modules[name])
        else:
            sys.meta_path.insert(0, _AfterImport(name, then))


def _install_torch_hooks(torch: Any) -> None:
    trial = current()
    assert trial is not None  # install() checked

    def on_optimizer_step(optimizer: object, args: object, kwargs: object) -> None:
        if trial.explicit_steps or current() is not trial:  # no trial now: after a search in-process
            return
        if trial.counted_optimizer is None:
            trial.counted_optimizer = id(optimizer)
            trial.optimizer = optimizer
        if id(optimizer) == trial.counted_optimizer:
            trial.step(None)

    def on_forward(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if torch.is_grad_enabled() and current() is trial:
            trial.forward(read_inputs(torch, args, kwargs, trial.request.batch_size))

    not_model: set[int] = set()  # modules with trainable parameters that no optimizer holds (alive)

    def on_first_forward(module: Any, args: tuple[Any, ...]) -> None:
        # The model is found at the first forward with gradients of a module the optimizer trains (a frozen
        # feature extractor, a loss module, a teacher may run first): every tree it trains (torch_model).
        model = module
        if trial.request.backend is not Backend.ORT:
            from autotune.backends.torch_model import find_model, trainable

            if id(module) in not_model or not torch.is_grad_enabled() or not trainable(module):
                return
            model = find_model(module)
            if model is None:  # trained by no optimizer: never looked at again
                not_model.update(id(m) for m in module.modules())
                return
        handle.remove()
        if current() is not trial:  # a search in-process is over (autotune.finder): apply_at_first_forward
            return
        # its forwards are the trial's micro-batches, with their keyword arguments from now on (Hugging
        # Face models take theirs as input_ids=...)
        _COUNTING.append(module.register_forward_pre_hook(on_forward, with_kwargs=True))
        on_forward(module, args, {})
        if trial.plan_applied is not None:
            return
        if trial.request.backend is not Backend.ORT:
            prepare(model)
        elif type(module).__name__ == "ORTModule":
            prepare(module)  # the script wrapped it itself: record the plan (and the probe)
        else:  # a model ORT never sees would be measured as plain PyTorch
            raise RuntimeError(
                "--backend ort: the script's model runs without ORTModule; wrap it with "
                "model = autotune.prepare(model) (or onnxruntime.training.ortmodule.ORTModule(model))"
            )

    if trial.request.backend is Backend.TORCH:
        _hook_compile(torch, trial)
        _hook_fully_shard(trial)
        from autotune.backends.torch_modules import watch_own_checkpointing

        watch_own_checkpointing()  # the script's own checkpointing: a plan adds to it, none keeps it

    optimizer_module = importlib.import_module("torch.optim.optimizer")
    module_module = importlib.import_module("torch.nn.modules.module")
    optimizer_module.register_optimizer_step_post_hook(on_optimizer_step)
    handle: Any = None

    def arm() -> None:
        nonlocal handle
        if handle is not None:
            handle.remove()
        while _COUNTING:  # a model trained on across runs (a callback's, in-process) is found again
            _COUNTING.pop().remove()
        not_model.clear()  # ids of the last run's modules: a new object may take one
        handle = module_module.register_module_forward_pre_hook(on_first_forward)

    _ARMS[:] = [arm]
    arm()


def apply_at_first_forward() -> Callable[[], None]:
    """Outside any trial (a finder's answer, autotune.finder): apply ``$AUTOTUNE_PLAN`` to the model found
    at its first forward with gradients, as a trial's hook does (``prepare``, without a change to the
    function). Returns what removes the hook if it has not fired."""
    import torch
    from torch.nn.modules import module as module_module

    from autotune.backends.torch_model import find_model, trainable

    not_model: set[int] = set()

    def on_first_forward(module: Any, args: tuple[Any, ...]) -> None:
        if id(module) in not_model or not torch.is_grad_enabled() or not trainable(module):
            return
        model = find_model(module)
        if model is None:
            not_model.update(id(m) for m in module.modules())
            return
        handle.remove()
        prepare(model)

    handle = module_module.register_module_forward_pre_hook(on_first_forward)
    return handle.remove


_ARMS: list[Callable[[], None]] = []  # arms the hook that finds the model at its first forward
_COUNTING: list[Any] = []  # the hook counting the found model's forwards (its handle)


def rearm() -> None:
    """A warm process's next run of the script (autotune.runtime.warm): find its model again at its first
    forward (a no-op before the script has imported torch: the hooks are not in yet)."""
    for arm in _ARMS:
        arm()


def _rank_plan(trial: _Trial) -> Plan:
    """The plan this rank applies. A process that is no rank of a per-rank plan (torchrun's launcher
    imports torch too) applies none; a plan that does not fit the job is refused by ``prepare``, where the
    script applies it."""
    plan = parse_plan(trial.request.plan)
    rank = trial.rank.rank if trial.rank else None
    if plan.ranks and (rank is None or rank >= len(plan.ranks)):
        return Plan.none()
    return plan.for_rank(rank)


def _hook_fully_shard(trial: _Trial) -> None:
    """FSDP2's ``fully_shard`` applies the trial's sharding (``fsdp:...``) to the blocks it shards, from
    when the script imports it (autotune.backends.torch_sharding)."""

    def watch(module: ModuleType) -> None:
        from autotune.backends.torch_sharding import watch_fully_shard

        def sharding_now() -> Sharding | None:
            sharding = _rank_plan(trial).sharding if current() is trial else None
            return sharding if isinstance(sharding, Sharding) else None

        watch_fully_shard(sharding_now)

    name = "torch.distributed.fsdp"
    if name in sys.modules:
        watch(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, watch))


def _hook_deepspeed(trial: _Trial) -> None:
    """DeepSpeed's ``initialize`` applies the trial's ZeRO plan (``zero:...``) to the config it is given,
    from when the script imports ``deepspeed`` (autotune.backends.deepspeed_zero)."""

    def zero_now() -> Zero | None:
        sharding = _rank_plan(trial).sharding if current() is trial else None
        return sharding if isinstance(sharding, Zero) else None

    def watch(module: ModuleType) -> None:
        from autotune.backends.deepspeed_zero import watch_initialize

        watch_initialize(zero_now)

    if "deepspeed" in sys.modules:
        watch(sys.modules["deepspeed"])
    else:
        sys.meta_path.insert(0, _AfterImport("deepspeed", watch))


def _hook_compile(torch: Any, trial: _Trial) -> None:
    """Set this rank's compile budget, and wrap ``torch.compile`` (see the module's docstring)."""
    plan = _rank_plan(trial)
    if plan.compile_budget is not None:
        from autotune.backends.torch_compile import set_compile_budget

        set_compile_budget(plan.compile_budget)
    compile_function = torch.compile

    def compile(model: Any = None, *args: Any, **kwargs: Any) -> Any:
        trial.compiled = True
        if current() is not trial or not trial.request.probe:
            return compile_function(model, *args, **kwargs)
        return model if model is not None else (lambda fn: fn)  # as a decorator with options

    compile.__wrapped__ = compile_function  # type: ignore[attr-defined]
    compile.__doc__ = compile_function.__doc__
    torch.compile = compile


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``callback(module)`` right after module ``name`` has been imported, without importing it.

    It stays on ``sys.meta_path`` until the module is executed: ``importlib.util.find_spec(name)`` asks the
    finders too, without importing (Accelerate asks whether DeepSpeed is installed so), and a finder that
    left at the first question would miss the import that follows."""

    def __init__(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.callback = callback
        self._looking = False  # this finder's own lookup of the real spec, below: it answers None to it

    def find_spec(
        self, fullname: str, path: Any, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name or self._looking:
            return None
        self._looking = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._looking = False
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_hook(module: ModuleType) -> None:
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            exec_module(module)
            self.callback(module)

        spec.loader.exec_module = exec_then_hook  # type: ignore[method-assign]
        return spec
