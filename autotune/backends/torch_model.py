"""Which modules are the script's model, found when the training step first runs one.

The model is every module tree whose trainable parameters the training step updates: the trees (modules that
are no other module's child) holding a parameter that a live optimizer holds, or, before the script has made
an optimizer, every tree with a trainable parameter. A script that keeps an embedding, a body and a head as
three modules (``h = body(emb(x)); loss = crit(head(h), y)``) has a model of three trees; a frozen teacher, an
EMA copy and a feature extractor without trainable parameters are not part of it. Found through the garbage
collector's list of live objects once per trial, at the first forward with gradients on of a module with
trainable parameters that an optimizer holds (or of any such module, before the script has an optimizer).

A model of one tree is that module (the common case: names and plans exactly as before); a tree whose own
forward the script never calls (a LightningModule whose ``training_step`` calls ``self.net(x)``) is the
parts it calls (:func:`called_parts`). A model of several is a :class:`Whole`: a container that holds the
trees as children (named by their classes) so that one plan covers them all (``TransformerEncoderLayer:0.5``
takes half the layers of every tree together), one probe sees them all, and their candidates are counted
together. It is never called: the script calls its trees.
"""

from __future__ import annotations

import gc
import warnings
from typing import Any

import torch
from torch import nn


class Whole(nn.Module):
    """The script's model when it is several module trees: each a child, in the order found (see the
    module's docstring). A container, never called."""

    def __init__(self, trees: list[nn.Module]) -> None:
        super().__init__()
        counts: dict[str, int] = {}
        for tree in trees:
            name = type(tree).__name__
            counts[name] = counts.get(name, 0) + 1
            self.add_module(name if counts[name] == 1 else f"{name}_{counts[name]}", tree)

    @property
    def trees(self) -> list[nn.Module]:
        return list(self.children())

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the script's model is several modules (autotune Whole): call each of them")


def trees_of(model: nn.Module) -> list[nn.Module]:
    """The module trees ``model`` stands for: a Whole's children, else the model itself."""
    return model.trees if isinstance(model, Whole) else [model]


def trainable(module: nn.Module) -> bool:
    return any(p.requires_grad for p in module.parameters())


def find_model(first: nn.Module) -> nn.Module | None:
    """The script's model, found as ``first`` (a module with trainable parameters) runs its first forward:
    the tree that holds ``first``, then the other trees the optimizers train (or that are trainable, before
    any optimizer exists) in a stable order; one tree is returned as itself, several as a :class:`Whole`.
    None if ``first`` is no part of it (a module with trainable parameters that no optimizer holds)."""
    gc.collect()  # trees the script dropped (a model built to count its parameters) are not the model
    modules: list[nn.Module] = []
    optimizers: list[torch.optim.Optimizer] = []
    with warnings.catch_warnings():
        # isinstance() on every object asks deprecated stand-ins what they are: torch's own
        # `torch.distributed.reduce_op` warned into every trial's log (issue 44) for no code of the user's
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        for obj in gc.get_objects():
            if isinstance(obj, nn.Module):
                modules.append(obj)
            elif isinstance(obj, torch.optim.Optimizer):
                optimizers.append(obj)
    children = {id(child) for module in modules for child in module.children()}
    trees = [m for m in modules if id(m) not in children and not isinstance(m, Whole) and trainable(m)]
    optimized = {id(p) for opt in optimizers for group in opt.param_groups for p in group["params"]}
    if optimized:
        trees = [t for t in trees if any(id(p) in optimized for p in t.parameters())]
    home = next((t for t in trees if any(m is first for m in t.modules())), None)
    if home is None:
        if optimized and not any(id(p) in optimized for p in first.parameters()):
            return None  # trained by no optimizer: a teacher, an EMA copy
        home = first  # not reachable from any tree gc reports: its own
    others = [t for t in trees if t is not home and not any(m is t for m in home.modules())]
    # A stable order for the plan's ratios across trials: by class name, then size (gc's own order follows
    # the collector's history, which a trial's data can change).
    others.sort(key=lambda t: (type(t).__name__, sum(p.numel() for p in t.parameters())))
    distinct = called_parts(home, first)
    owned = {id(p) for part in distinct for p in part.parameters()}
    for tree in others:  # a tree whose parameters another holds already (tied weights) adds nothing
        params = {id(p) for p in tree.parameters()}
        if params - owned:
            distinct.append(tree)
            owned |= params
    return distinct[0] if len(distinct) == 1 else Whole(distinct)


def called_parts(home: nn.Module, first: nn.Module) -> list[nn.Module]:
    """The parts of the tree ``home`` the script calls, ``first`` first (the first of them to run). Where
    ``first`` is ``home``, home. Where it is a part of it, home's own forward is not running (its hook would
    have fired first and found the model then): the script calls its parts, as a LightningModule's
    ``training_step`` calls ``self.net(x)`` and never ``self(x)``, and hooks on home would never see a
    forward (the probe's, the micro-batch count). Its parts are then ``first`` and the trainable children of
    each module on the way from home down to it, in home's order: plans cover their blocks as they covered
    home's (home's own parameters, outside every child, are left out of the probe's weights)."""
    if first is home:
        return [home]
    order = {id(m): i for i, m in enumerate(home.modules())}
    parts: list[nn.Module] = []
    node = home
    while node is not first:
        children = list(node.children())
        on_path = next(c for c in children if any(m is first for m in c.modules()))
        parts += [c for c in children if c is not on_path and trainable(c)]
        node = on_path
    return [first, *sorted(parts, key=lambda m: order[id(m)])]
