"""Module-level activation checkpointing for PyTorch models.

Candidates are the module classes that repeat in a model (transformer blocks, attention, MLPs): composite
modules (with children) that occur at least twice, the root and pure containers excluded. A plan
checkpoints the first ``round(ratio * count)`` instances of the classes it names with non-reentrant
``torch.utils.checkpoint`` — selectively, with an operator policy, through
``create_selective_checkpoint_contexts``; an instance nested inside one already checkpointed is left alone (recomputing
it twice would save nothing more).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from autotune.backends.ops import may_save, op_kind
from autotune.backends.probe_report import ModuleCandidate
from autotune.core.errors import InputError
from autotune.core.plans import ModuleRule, OpPolicy, Plan

_MARK = "_autotune_plan"  # set on a model once a plan has been applied to it


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
        if module is model or isinstance(module, nn.ModuleList | nn.ModuleDict):
            continue
        if next(module.children(), None) is None:  # a leaf: checkpointing it alone saves nothing
            continue
        instances.setdefault(type(module).__name__, []).append(name)
    repeated = {cls: names for cls, names in instances.items() if len(names) >= 2}
    all_names = {name for names in repeated.values() for name in names}
    return [
        Candidate(cls, tuple(names), outermost=any(not _has_ancestor(n, all_names) for n in names))
        for cls, names in repeated.items()
    ]


def apply_plan(model: nn.Module, plan: Plan) -> Plan:
    """Checkpoint the modules ``plan`` selects, in place. Returns the plan as applied (``all`` expanded).

    Applying a plan to a model that already has one is a no-op that returns the first plan.

    Raises:
        InputError: the plan names a class that is not a repeated module class of this model.
    """
    if hasattr(model, _MARK):
        return getattr(model, _MARK)
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
        for name in candidates[rule.cls].names[: rule.count(candidates[rule.cls].count)]
    }
    modules = dict(model.named_modules())
    for name, rule in chosen.items():
        if not _has_ancestor(name, set(chosen)):
            module = modules[name]
            module.forward = _Checkpointed(module, rule.ops)
    applied = Plan(rules=tuple(sorted(rules)))
    setattr(model, _MARK, applied)
    return applied


class _Checkpointed:
    """An instance-level ``forward`` that recomputes the module in backward.

    A callable object rather than a closure: ``copy.deepcopy(model)`` (EMA copies, for instance) then
    re-points the copy's forward at the copied module instead of the original.
    """

    def __init__(self, module: nn.Module, ops: OpPolicy | None = None) -> None:
        self.module = module
        self.ops = ops

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        forward: Callable[..., Any] = type(self.module).forward.__get__(self.module)
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        if self.ops is None:
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)
        context = functools.partial(
            create_selective_checkpoint_contexts, functools.partial(_policy, self.ops)
        )
        return checkpoint(forward, *args, use_reentrant=False, context_fn=context, **kwargs)


def _policy(ops: OpPolicy, ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    if may_save(op) and ops.saves(op_kind(op)):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _has_ancestor(name: str, names: set[str]) -> bool:
    parts = name.split(".")
    return any(".".join(parts[:i]) in names for i in range(1, len(parts)))
