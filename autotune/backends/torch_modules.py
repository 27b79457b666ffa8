"""Module-level activation checkpointing for PyTorch models.

Candidates are the module classes that repeat in a model (transformer blocks, attention, MLPs): composite
modules (with children) that occur at least twice, the root and containers excluded (lists, dicts, and a
``Sequential`` of blocks: a ResNet stage, the ``Sequential`` of six ``Sequential`` blocks). A
plan checkpoints ``round(ratio * count)`` instances of the classes it names, spread evenly from the first
(``ModuleRule.chosen``), with non-reentrant
``torch.utils.checkpoint`` — selectively, with an operator policy, through
``create_selective_checkpoint_contexts``; an instance nested inside one already checkpointed is left alone
(recomputing it twice would save nothing more).

State that a block changes as it runs is handled, never recomputed twice:

- a Hugging Face layer (a ``GradientCheckpointingLayer``: every decoder and encoder layer of transformers 5)
  is checkpointed through the framework's own per-layer switch, which turns its KV cache off for the
  checkpointed call. Wrapping it from outside instead lets the recompute append the layer's keys to the
  cache a second time: attention then sees keys twice as long, selective recompute fails ("aten.slice ...
  not found in storage") and plain recompute is right only by luck.
- buffers that the forward updates in place (BatchNorm's running statistics) are put back after the
  recompute, so a checkpointed block updates them once per step, as without a plan.

An offload rule (``Block:0.5/offload``) recomputes nothing: the chosen instances run under
``torch.autograd.graph.save_on_cpu``, so what autograd saves in them waits for backward in host memory
(pinned, on a GPU) and comes back when backward needs it. Their numbers are those of no plan.

A plan's compile budget is not applied here: it is torch.compile's setting (autotune.backends.torch_compile).

The script's own checkpointing (``torch.utils.checkpoint.checkpoint`` called from its modules' forwards,
which is what Hugging Face's ``gradient_checkpointing_enable()`` does too) is counted in a trial
(:func:`watch_own_checkpointing`): a plan then adds to it, and ``none`` keeps it, which the answer says.
autotune's own checkpoints call the function as it was before the watch, so they are not counted.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from autotune.backends.ops import draws_random, may_save, op_kind
from autotune.backends.probe_report import ModuleCandidate
from autotune.core.errors import InputError
from autotune.core.plans import ModuleRule, OpPolicy, Plan

# The plan applied to a model, keyed by the model inside any wrapper (inner_module), never an attribute set
# on it: a wrapper such as Lightning Fabric's forwards attribute writes to the module it wraps, and would then
# refuse to delete the mark it never held, leaving the plan "applied" to the next check, which wraps nothing.
_APPLIED: weakref.WeakKeyDictionary[nn.Module, Plan] = weakref.WeakKeyDictionary()
_OWN_CALLS = [0]  # the script's own torch.utils.checkpoint calls so far (watch_own_checkpointing)
_OWN_OFF = [False]  # own:off applied: the script's own checkpoint calls run their function as it is
# What a plan's wrappers did, counted so that a check can prove its plan ran (autotune.backends.plan_check):
# forwards recomputed or offloaded by a plan's rules, and own checkpoint calls run plainly under own:off.
RAN = {"wrapped": 0, "own_plain": 0}
# torch.utils.checkpoint.checkpoint's own keyword arguments; the rest go to the checkpointed function
_CHECKPOINT_KWARGS = ("use_reentrant", "context_fn", "determinism_check", "debug", "preserve_rng_state")


def watch_own_checkpointing() -> None:
    """From now on, count the calls the script makes to ``torch.utils.checkpoint.checkpoint`` (a module's
    forward that checkpoints itself, a Hugging Face model after ``gradient_checkpointing_enable()``): the
    module's function is replaced by one that counts, then calls it. A script that bound the function before
    (``from torch.utils.checkpoint import checkpoint`` before torch's import finished) is not seen; in a trial
    the watch goes in as torch's import ends (autotune.runtime.hooks)."""
    module = torch.utils.checkpoint
    if getattr(module.checkpoint, "_autotune_counts", False):
        return
    original = module.checkpoint

    @functools.wraps(original)
    def counted(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if _OWN_OFF[0]:  # own:off: the plain call (the numbers are the checkpoint's: it recomputes them)
            RAN["own_plain"] += 1
            return function(*args, **{k: v for k, v in kwargs.items() if k not in _CHECKPOINT_KWARGS})
        _OWN_CALLS[0] += 1
        return original(function, *args, **kwargs)

    counted._autotune_counts = True  # type: ignore[attr-defined]
    module.checkpoint = counted


def _own_off(model: nn.Module) -> int:
    """``own:off``: the script's own checkpointing off. A Hugging Face model's through its own per-layer
    switch (what ``gradient_checkpointing_disable()`` turns off, without its deprecation warning); any other
    ``torch.utils.checkpoint.checkpoint`` call the script makes runs its function as it is (the watch goes
    in now if it was not: outside a trial, a script that bound the function before is not reached).
    Returns how many per-layer switches it turned off."""
    watch_own_checkpointing()
    _OWN_OFF[0] = True
    switched = 0
    for module in model.modules():
        if (
            getattr(module, "gradient_checkpointing", None) is True
        ):  # what the switch turns off, layer by layer
            setattr(module, "gradient_checkpointing", False)  # noqa: B010 (nn.Module's typed __setattr__)
            switched += 1
    return switched


def reset_counters() -> None:
    """Every counter above back to a fresh process's (a warm process's next configuration:
    autotune.runtime.warm)."""
    _OWN_CALLS[0] = 0
    _OWN_OFF[0] = False
    for key in RAN:
        RAN[key] = 0


def own_checkpoint_calls() -> int:
    """The script's own checkpoint calls counted so far (0 before :func:`watch_own_checkpointing`)."""
    return _OWN_CALLS[0]


def own_gradient_checkpointing(model: nn.Module) -> bool:
    """Whether the script turned on a Hugging Face model's own gradient checkpointing (in ``model``): a
    module's ``gradient_checkpointing`` switch is on (read before a plan sets any)."""
    return any(getattr(m, "gradient_checkpointing", None) is True for m in model.modules())


@dataclass(frozen=True)
class Candidate:
    """A repeated module class: its instances (qualified names, module order) and whether it is outermost."""

    cls: str
    names: tuple[str, ...]
    outermost: bool

    @property
    def count(self) -> int:
        return len(self.names)

    def summary(self) -> ModuleCandidate:
        """What a trial reports of this candidate."""
        return ModuleCandidate(self.cls, self.count, self.outermost)


def find_candidates(model: nn.Module) -> list[Candidate]:
    """The repeated composite module classes of ``model``, in order of first appearance."""
    instances: dict[str, list[str]] = {}
    for name, module in model.named_modules():
        if module is model or isinstance(module, nn.ModuleList | nn.ModuleDict) or _holds_blocks(module):
            continue
        if next(module.children(), None) is None:  # a leaf: checkpointing it alone saves nothing
            continue
        if type(module).__name__ in WRAPPERS:  # DDP, FSDP: the blocks are found inside them
            continue
        instances.setdefault(class_name(module), []).append(name)
    repeated = {cls: names for cls, names in instances.items() if len(names) >= 2}
    all_names = {name for names in repeated.values() for name in names}
    return [
        Candidate(cls, tuple(names), outermost=any(not _has_ancestor(n, all_names) for n in names))
        for cls, names in repeated.items()
    ]


# Modules that wrap a model or a block without being one: the repeated blocks are found through them.
WRAPPERS = frozenset(
    {
        "DistributedDataParallel",
        "FullyShardedDataParallel",  # FSDP1, one wrapper per wrapped block
        "CheckpointWrapper",
        "OffloadWrapper",
        "OptimizedModule",  # torch.compile(model)
    }
)


def inner_module(model: nn.Module) -> nn.Module:
    """The model inside the wrappers users put around one: torch.compile's OptimizedModule, DDP and FSDP1,
    DataParallel, Lightning Fabric's _FabricModule, PEFT's PeftModel (its base model: the LoRA layers are in
    it). Accelerate's prepared model is one of these, or the model itself."""
    seen: set[int] = set()
    while id(model) not in seen:
        seen.add(id(model))
        names = {cls.__name__ for cls in type(model).__mro__}
        inner: Any = None
        if "OptimizedModule" in names:
            inner = getattr(model, "_orig_mod", None)
        elif names & {"DistributedDataParallel", "DataParallel", "FullyShardedDataParallel"}:
            inner = getattr(model, "module", None)
        elif "_FabricModule" in names:
            inner = getattr(model, "_original_module", None)
        elif "PeftModel" in names and callable(base := getattr(model, "get_base_model", None)):
            inner = base()
        if not isinstance(inner, nn.Module):
            break
        model = inner
    return model


def applied_plan(model: nn.Module) -> Plan | None:
    """The plan applied to ``model`` (or to the model it wraps), None before one was."""
    return _APPLIED.get(inner_module(model))


def class_name(module: nn.Module) -> str:
    """The name a plan uses for ``module``'s class. FSDP2's ``fully_shard`` swaps a module's class for a
    subclass named ``FSDP<Class>`` (with FSDPModule); a plan names the class the model defined."""
    for cls in type(module).__mro__:
        if cls.__name__ == "FSDPModule" or (
            cls.__name__.startswith("FSDP") and any(b.__name__ == "FSDPModule" for b in cls.__bases__)
        ):
            continue
        return cls.__name__
    return type(module).__name__


def _holds_blocks(module: nn.Module) -> bool:
    """A Sequential of composite children all of one class: a stack of blocks (a ResNet stage, the
    Sequential of six Sequential blocks), not a block. A Sequential of different composites is a block."""
    children = list(module.children())
    return (
        isinstance(module, nn.Sequential)
        and bool(children)
        and len({type(c) for c in children}) == 1
        and next(children[0].children(), None) is not None
    )


def apply_plan(model: nn.Module, plan: Plan) -> Plan:
    """Checkpoint the modules ``plan`` selects, in place. Returns the plan as applied (``all`` expanded).

    Applying a plan to a model that already has one (itself, or the model it wraps) is a no-op that returns
    the first plan.

    Raises:
        InputError: the plan names a class that is not a repeated module class of this model.
    """
    if (already := applied_plan(model)) is not None:
        return already
    candidates = {c.cls: c for c in find_candidates(model)}
    rules = plan.rules
    if plan.everything:
        rules = tuple(ModuleRule(c.cls) for c in candidates.values() if c.outermost)
    unknown = [rule.cls for rule in rules if rule.cls not in candidates]
    if unknown:
        known = ", ".join(f"{c.cls} x{c.count}" for c in candidates.values()) or "none (no repeated modules)"
        raise InputError(
            f"plan {plan} names {', '.join(unknown)}, not a repeated module class; candidates: {known}"
        )
    chosen = {
        name: rule
        for rule in rules
        for name in (candidates[rule.cls].names[i] for i in rule.chosen(candidates[rule.cls].count))
    }
    modules = dict(model.named_modules())
    for name, rule in chosen.items():
        if _has_ancestor(name, set(chosen)):
            continue
        if rule.offload:
            modules[name].forward = _Offloaded(modules[name])
        else:
            _checkpoint_module(modules[name], rule.ops)
    hf_layers = {name for name, rule in chosen.items() if _is_hf_layer(modules[name]) and not rule.offload}
    for name, module in modules.items():
        holds_one = any(layer.startswith(name + ".") or not name for layer in hf_layers)
        if holds_one and hasattr(module, "gradient_checkpointing") and not _is_hf_layer(module):
            # The model-level switch: transformers then builds no KV cache in training and passes none
            # to any layer (GPT-2 passes it positionally, out of the layer's own reach); layers are
            # checkpointed by their own switches, so a model that would wrap every layer itself gets a
            # function that only calls it.
            setattr(module, "gradient_checkpointing", True)  # noqa: B010 (nn.Module's typed __setattr__)
            setattr(module, "_gradient_checkpointing_func", _call)  # noqa: B010
    if plan.own_off:
        RAN["own_plain"] += _own_off(model)  # a switch turned off is the script's checkpointing off
    applied = Plan(
        rules=tuple(sorted(rules)),
        compile_budget=plan.compile_budget,
        own_off=plan.own_off,
        sharding=plan.sharding,  # given to the script's fully_shard calls, checked (torch_sharding)
    )
    _APPLIED[inner_module(model)] = applied
    return applied


@contextlib.contextmanager
def plan_applied(model: nn.Module, plan: Plan) -> Iterator[Plan]:
    """``apply_plan`` for the duration of a ``with`` block: the model is as it was afterwards (the probe's
    correctness check tries each plan on the script's own model this way)."""
    saved = {
        name: {attr: module.__dict__[attr] for attr in _SET_ATTRS if attr in module.__dict__}
        for name, module in model.named_modules()
    }
    key = inner_module(model)
    had_plan = key in _APPLIED
    own_off = _OWN_OFF[0]
    try:
        yield apply_plan(model, plan)
    finally:
        _OWN_OFF[0] = own_off
        for name, module in model.named_modules():
            for attr in _SET_ATTRS:
                if attr in saved[name]:
                    setattr(module, attr, saved[name][attr])
                elif attr in module.__dict__:
                    delattr(module, attr)
        if not had_plan:
            _APPLIED.pop(key, None)


_SET_ATTRS = ("forward", "gradient_checkpointing", "_gradient_checkpointing_func")  # what a plan sets


def _checkpoint_module(module: nn.Module, ops: OpPolicy | None) -> None:
    """Recompute ``module`` in backward: through Hugging Face's per-layer switch where the module has one
    (it turns the layer's KV cache off for the checkpointed call), else by wrapping its forward."""
    recompute = _Recompute(module, ops)
    if _is_hf_layer(module):
        setattr(module, "gradient_checkpointing", True)  # noqa: B010 (only in training, as transformers does)
        setattr(module, "_gradient_checkpointing_func", recompute)  # noqa: B010
    else:
        module.forward = _Checkpointed(module, recompute)


def _call(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return function(*args, **kwargs)


def _is_hf_layer(module: nn.Module) -> bool:
    """A transformers ``GradientCheckpointingLayer`` (found by name: transformers is not imported here)."""
    return hasattr(module, "gradient_checkpointing") and any(
        base.__name__ == "GradientCheckpointingLayer" for base in type(module).__mro__
    )


class _Recompute:
    """``function(*args)`` under non-reentrant checkpointing of ``module`` (selective with ``ops``), where the
    recompute reads and updates copies of the module's buffers, never the buffers themselves.

    Nothing here runs an op inside the checkpointed region (selective recompute replays the region's ops and
    refuses any it did not record), and the buffers are swapped back in a ``finally``: torch stops a
    recompute early, by raising, once it has what backward needs.

    Callable objects rather than closures, here and in :class:`_Checkpointed`: ``copy.deepcopy(model)``
    (EMA copies, for instance) then re-points the copy at the copied module instead of the original.
    """

    def __init__(self, module: nn.Module, ops: OpPolicy | None) -> None:
        self.module = module
        self.ops = ops

    def __call__(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        RAN["wrapped"] += 1  # traced by dynamo: a side effect its compiled code replays at each call
        context: dict[str, Any] = {}
        if self.ops is not None:
            context["context_fn"] = functools.partial(
                create_selective_checkpoint_contexts, functools.partial(_policy, self.ops)
            )
        if torch.compiler.is_compiling():
            # Traced by torch.compile: the checkpoint becomes part of the graph, and the partitioner's
            # backward recomputes pure functions of the forward's values (buffer updates are applied once,
            # by the forward). The buffer swap below mutates Python state, which dynamo cannot trace
            # inside a checkpoint: it would break the graph and run every checkpointed block eagerly.
            return checkpoint(function, *args, use_reentrant=False, **context, **kwargs)
        # The buffers as the forward finds them, copied outside the region: the recompute runs on these
        # copies, so it sees what the forward saw, and what it updates in place is thrown away. (Kernels
        # such as batch norm's update running statistics without bumping their version counters, so which
        # buffers a forward changes cannot be told cheaply; a block's buffers are small beside its
        # activations.)
        buffers = [
            (owner, key, buffer)
            for owner in self.module.modules()
            for key, buffer in owner._buffers.items()
            if buffer is not None
        ]
        with torch.no_grad():
            copies = [buffer.detach().clone() for _, _, buffer in buffers]
        calls = 0

        def run(*inner: Any, **inner_kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == 1 or not buffers:
                return function(*inner, **inner_kwargs)
            for (owner, key, _), copy in zip(buffers, copies, strict=True):
                owner._buffers[key] = copy
            try:
                return function(*inner, **inner_kwargs)
            finally:
                for owner, key, buffer in buffers:
                    owner._buffers[key] = buffer

        return checkpoint(run, *args, use_reentrant=False, **context, **kwargs)


class _Checkpointed:
    """An instance-level ``forward`` that recomputes the module in backward (outside training, or with
    gradients off, the plain forward: nothing would be kept for backward anyway)."""

    def __init__(self, module: nn.Module, recompute: _Recompute) -> None:
        self.module = module
        self.recompute = recompute

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        forward: Callable[..., Any] = type(self.module).forward.__get__(self.module)
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return self.recompute(forward, *args, **kwargs)


class _Offloaded:
    """An instance-level ``forward`` whose saved tensors wait for backward in host memory (pinned when a GPU
    is in use, so the copies back can overlap)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        forward: Callable[..., Any] = type(self.module).forward.__get__(self.module)
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        RAN["wrapped"] += 1
        with torch.autograd.graph.save_on_cpu(pin_memory=torch.cuda.is_available()):
            return forward(*args, **kwargs)


def _policy(ops: OpPolicy, ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    """Save the kinds ``ops`` names, except an op that draws random numbers: it is always recomputed, so that
    the recompute's random stream stays the forward's (autotune.backends.ops.draws_random)."""
    if may_save(op) and ops.saves(op_kind(op)) and not draws_random(op, args, kwargs):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _has_ancestor(name: str, names: set[str]) -> bool:
    parts = name.split(".")
    return any(".".join(parts[:i]) in names for i in range(1, len(parts)))
