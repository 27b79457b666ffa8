"""FSDP2 sharding plans (``fsdp:...``: autotune.core.plans.Sharding): the script's own ``fully_shard`` calls
take the plan's arguments, with no change to the script.

A job shards its model before the first forward, so the plan cannot wait for it as a recompute plan does:
in a trial, ``torch.distributed.fsdp.fully_shard`` is replaced as that module is imported
(autotune.runtime.hooks) by :func:`watch_fully_shard`'s wrapper, which asks the running trial for its
sharding at each call. A call on a *block* -- a module that holds no module sharded before it -- gets
``reshard_after_forward`` and ``offload_policy`` from the plan; a call on a module that holds sharded ones
(the root, or a group of blocks) keeps the script's own arguments: FSDP2 keeps the root's parameters
gathered for backward by itself, and a group's reshard is the script's design. What each call was given is
recorded: a plan that found no ``fully_shard`` call on a block is refused (:func:`check_applied`),
and a test reads the arguments back from FSDP's own state (:func:`read_state`). Outside a trial (the answer
applied with ``autotune.prepare``) the model is sharded already: ``keep`` and ``reshard`` are set on its
blocks then, through FSDP2's own ``set_reshard_after_forward``.

FSDP2's rules stand: an int must divide the ranks a block is sharded over (FSDP raises otherwise), and
offload with pinned memory needs CUDA (on the CPU it is unpinned, and saves nothing: parameters are in host
memory already).
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from autotune.core.errors import InputError
from autotune.core.plans import Sharding

FSDP_MODULES = ("torch.distributed.fsdp", "torch.distributed._composable.fsdp")


# what each of this run's fully_shard calls was given by the plan (None: a root or a group, or no plan); a
# warm process's next configuration starts it anew
_APPLIED: list[Sharding | None] = []


def watch_fully_shard(sharding_now: Callable[[], Sharding | None]) -> None:
    """From now on, every ``fully_shard`` the script reaches through ``torch.distributed.fsdp`` (or the older
    ``torch.distributed._composable.fsdp``) applies ``sharding_now()`` to the blocks it shards. A script
    that bound the function before this call is not seen: in a trial it goes in as the module is imported."""
    for name in FSDP_MODULES:
        module: Any = sys.modules.get(name)
        original = getattr(module, "fully_shard", None)
        if original is None or getattr(original, "_autotune_shards", False):
            continue
        module.fully_shard = _wrapped(original, sharding_now)
        package: Any = sys.modules.get(f"{name}._fully_shard")
        if getattr(package, "fully_shard", None) is original:
            package.fully_shard = module.fully_shard


def _wrapped(original: Callable[..., Any], sharding_now: Callable[[], Sharding | None]) -> Callable[..., Any]:
    from torch.distributed.fsdp import CPUOffloadPolicy

    @functools.wraps(original)  # its attributes too: fully_shard.state(module) keeps working
    def fully_shard(module: nn.Module | Sequence[nn.Module], *args: Any, **kwargs: Any) -> Any:
        modules = [module] if isinstance(module, nn.Module) else list(module)
        sharding = None if any(_holds_sharded(m) for m in modules) else sharding_now()
        if sharding is not None and sharding.reshard is not None:
            kwargs["reshard_after_forward"] = sharding.reshard
        if sharding is not None and sharding.offload:
            kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
        _APPLIED.append(sharding)
        return original(module, *args, **kwargs)

    fully_shard._autotune_shards = True  # type: ignore[attr-defined]
    return fully_shard


def reset_calls() -> None:
    """A warm process's next configuration: no call seen yet, as in a fresh process."""
    _APPLIED.clear()


def check_applied(model: nn.Module, sharding: Sharding | None, in_trial: bool) -> None:
    """At the model's first forward: in a trial, refuse a sharding plan that reached no block; outside one
    (``$AUTOTUNE_PLAN`` with ``autotune.prepare``, after a run), the model was sharded before autotune saw
    it: ``keep`` and ``reshard`` are set on its blocks now (FSDP2's ``set_reshard_after_forward``), and a
    group or offload, which FSDP2 takes only in ``fully_shard``, is one line naming the arguments.

    Raises:
        InputError: no ``fully_shard`` call on a block was seen in a trial (the script does not shard with
            FSDP2); outside a trial, a plan FSDP2 cannot take after sharding, or a model with no block.
    """
    if sharding is None or (in_trial and sharding in _APPLIED):
        return
    if in_trial:
        seen = f"{len(_APPLIED)} fully_shard call(s), none on a block" if _APPLIED else "no fully_shard call"
        raise InputError(
            f"plan {sharding}: the script made {seen} before its model's first forward; fsdp plans are for "
            "scripts that shard their blocks with FSDP2's fully_shard (torch.distributed.fsdp)"
        )
    blocks = _blocks(model)
    if sharding.offload or type(sharding.reshard) is int or not blocks:
        arguments = ", ".join(f"{k}={v}" for k, v in sharding.arguments().items())
        raise InputError(
            f"plan {sharding}: FSDP2 takes it only as it shards; pass {arguments} to the script's fully_shard "
            "calls on its blocks"
        )
    for block in blocks:
        block.set_reshard_after_forward(bool(sharding.reshard), recurse=False)  # type: ignore[operator]


@contextlib.contextmanager
def resharded(model: nn.Module, sharding: Sharding | None, ended: list[int]) -> Iterator[None]:
    """``sharding`` on ``model``'s blocks for the duration of a ``with`` block, where it is one FSDP2 takes
    after sharding (``Sharding.settable``: keep, reshard), through FSDP2's own ``set_reshard_after_forward``:
    the probe's check tries it on the script's model this way. ``ended[0]`` counts the block forwards that
    ended as the plan asks (parameters still gathered for keep, resharded for reshard), so the check knows
    the plan ran; the script's own setting is back afterwards. Any other sharding: nothing is set."""
    blocks = _blocks(model) if sharding is not None and sharding.settable else []
    if not blocks:
        yield
        return
    keep = sharding is not None and sharding.reshard is False
    states = [(b._get_fsdp_state(), _group(b)) for b in blocks]  # type: ignore[operator]
    saved = [(state._auto_reshard_after_forward, group.post_forward_mesh_info) for state, group in states]

    def count(module: nn.Module, args: Any, output: Any) -> None:  # after FSDP2's own post-forward hook
        if _group(module).is_unsharded == keep:
            ended[0] += 1

    handles = [b.register_forward_hook(count) for b in blocks]
    try:
        for block in blocks:
            block.set_reshard_after_forward(not keep, recurse=False)  # type: ignore[operator]
        yield
    finally:
        for handle in handles:
            handle.remove()
        for (state, group), (auto, after) in zip(states, saved, strict=True):
            state._auto_reshard_after_forward, group.post_forward_mesh_info = auto, after


def _blocks(model: nn.Module) -> list[nn.Module]:
    """``model``'s FSDP2 blocks: sharded modules that hold no other sharded module, with parameters of their
    own (none if FSDP2 was never imported: it shards nothing then)."""
    if "torch.distributed.fsdp" not in sys.modules:
        return []
    from torch.distributed.fsdp import FSDPModule

    return [
        module
        for module in model.modules()
        if isinstance(module, FSDPModule) and not _holds_sharded(module) and _group(module) is not None
    ]


def _holds_sharded(module: nn.Module) -> bool:
    """Whether a module below ``module`` is sharded by FSDP2 (``module`` is then a root or a group, not a
    block)."""
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in module.modules() if m is not module)


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor's own storage holder: a DTensor's (FSDP2's sharded parameters, their gradients) is its
    local shard, what this rank holds; a DTensor itself has no storage."""
    return getattr(tensor, "_local_tensor", tensor)


def _group(module: Any) -> Any:
    """An FSDP2 module's parameter group (None: it holds no parameter of its own)."""
    return module._get_fsdp_state()._fsdp_param_group


def sharded_blocks(model: nn.Module) -> tuple[int, int, int, bool]:
    """``model``'s FSDP2 blocks (:func:`_blocks`), the ranks each is sharded over (the most, if they
    differ), their parameters' unsharded bytes together, and whether every block keeps its parameters
    unsharded after forward (``reshard_after_forward=False``, the script's own or a plan's): (0, 0, 0, False)
    for a model FSDP2 does not shard."""
    blocks = _blocks(model)
    ranks = max((int(_group(b).mesh_info.shard_mesh_size) for b in blocks), default=0)
    size = sum(p.numel() * p.element_size() for b in blocks for p in b.parameters())  # a DTensor's: unsharded
    kept = bool(blocks) and all(_group(b).post_forward_mesh_info is None for b in blocks)
    return len(blocks), ranks, size, kept


def read_state(model: nn.Module) -> dict[str, dict[str, Any]]:
    """What FSDP2's own state holds for each sharded module of ``model`` (by qualified name, "" the root):
    ``reshard`` -- False (kept unsharded after forward), True (resharded over its shard group) or the size
    of the smaller group it reshards to -- and ``offload`` (its parameters live in host memory)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule

    out = {}
    for name, module in model.named_modules():
        if not isinstance(module, FSDPModule):
            continue
        group = _group(module)
        if group is None:
            continue
        after = group.post_forward_mesh_info
        reshard: bool | int = (
            False if after is None else True if after is group.mesh_info else int(after.shard_mesh_size)
        )
        out[name] = {"reshard": reshard, "offload": isinstance(group.offload_policy, CPUOffloadPolicy)}
    return out
