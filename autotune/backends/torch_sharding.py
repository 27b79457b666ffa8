"""FSDP2 sharding plans (``fsdp:...``: autotune.core.plans.Sharding): the script's own ``fully_shard`` calls
take the plan's arguments, with no change to the script.

A job shards its model before the first forward, so the plan cannot wait for it as a recompute plan does:
in a trial, ``torch.distributed.fsdp.fully_shard`` is replaced as that module is imported
(autotune.runtime.hooks) by :func:`watch_fully_shard`'s wrapper, which asks the running trial for its
sharding at each call. A call on a *block* -- a module that holds no module sharded before it -- gets
``reshard_after_forward`` and ``offload_policy`` from the plan; a call on a module that holds sharded ones
(the root, or a group of blocks) keeps the script's own arguments: FSDP2 keeps the root's parameters
gathered for backward by itself, and a group's reshard is the script's design. Every call is recorded
(:func:`calls`): a plan that found no ``fully_shard`` call on a block is refused (:func:`check_applied`),
and a test reads the arguments back from FSDP's own state (:func:`read_state`). Outside a trial (the answer
applied with ``autotune.prepare``) the model is sharded already: ``keep`` and ``reshard`` are set on its
blocks then, through FSDP2's own ``set_reshard_after_forward``.

FSDP2's rules stand: an int must divide the ranks a block is sharded over (FSDP raises otherwise), and
offload with pinned memory needs CUDA (on the CPU it is unpinned, and saves nothing: parameters are in host
memory already).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from autotune.core.errors import InputError
from autotune.core.plans import Sharding

FSDP_MODULES = ("torch.distributed.fsdp", "torch.distributed._composable.fsdp")


@dataclass(frozen=True)
class ShardCall:
    """One ``fully_shard`` call of the script: on what, the script's own ``reshard_after_forward`` (None:
    FSDP's default), and the plan's sharding if it was applied (blocks only)."""

    cls: str
    block: bool
    own_reshard: bool | int | None
    applied: Sharding | None


_CALLS: list[ShardCall] = []  # this run's calls (a warm process's next configuration starts it anew)


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
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule

    @functools.wraps(original)  # its attributes too: fully_shard.state(module) keeps working
    def fully_shard(module: nn.Module | Sequence[nn.Module], *args: Any, **kwargs: Any) -> Any:
        modules = [module] if isinstance(module, nn.Module) else list(module)
        block = not any(isinstance(m, FSDPModule) for root in modules for m in root.modules())
        sharding = sharding_now() if block else None
        own = kwargs.get("reshard_after_forward")
        if sharding is not None and sharding.reshard is not None:
            kwargs["reshard_after_forward"] = sharding.reshard
        if sharding is not None and sharding.offload:
            kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
        _CALLS.append(ShardCall(type(modules[0]).__name__, block, own, sharding))
        return original(module, *args, **kwargs)

    fully_shard._autotune_shards = True  # type: ignore[attr-defined]
    return fully_shard


def calls() -> list[ShardCall]:
    """The script's ``fully_shard`` calls so far in this run."""
    return list(_CALLS)


def reset_calls() -> None:
    """A warm process's next configuration: no call seen yet, as in a fresh process."""
    _CALLS.clear()


def check_applied(model: nn.Module, sharding: Sharding | None, in_trial: bool) -> None:
    """At the model's first forward: in a trial, refuse a sharding plan that reached no block; outside one
    (``$AUTOTUNE_PLAN`` with ``autotune.prepare``, after a run), the model was sharded before autotune saw
    it: ``keep`` and ``reshard`` are set on its blocks now (FSDP2's ``set_reshard_after_forward``), and a
    group or offload, which FSDP2 takes only in ``fully_shard``, is one line naming the arguments.

    Raises:
        InputError: no ``fully_shard`` call on a block was seen in a trial (the script does not shard with
            FSDP2); outside a trial, a plan FSDP2 cannot take after sharding, or a model with no block.
    """
    if sharding is None or (in_trial and any(call.applied == sharding for call in _CALLS)):
        return
    if in_trial:
        seen = f"{len(_CALLS)} fully_shard call(s), none on a block" if _CALLS else "no fully_shard call"
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


def _blocks(model: nn.Module) -> list[nn.Module]:
    """``model``'s FSDP2 blocks: sharded modules that hold no other sharded module, with parameters of their
    own (none if FSDP2 was never imported: it shards nothing then)."""
    if "torch.distributed.fsdp" not in sys.modules:
        return []
    from torch.distributed.fsdp import FSDPModule

    return [
        module
        for module in model.modules()
        if isinstance(module, FSDPModule)
        and not any(isinstance(m, FSDPModule) for m in module.modules() if m is not module)
        and _group(module) is not None
    ]


def _group(module: Any) -> Any:
    """An FSDP2 module's parameter group (None: it holds no parameter of its own)."""
    return module._get_fsdp_state()._fsdp_param_group


def sharded_blocks(model: nn.Module) -> tuple[int, int, int]:
    """``model``'s FSDP2 blocks (:func:`_blocks`), the ranks each is sharded over (the most, if they
    differ), and their parameters' unsharded bytes together: (0, 0, 0) for a model FSDP2 does not shard."""
    blocks = _blocks(model)
    ranks = max((int(_group(b).mesh_info.shard_mesh_size) for b in blocks), default=0)
    size = sum(p.numel() * p.element_size() for b in blocks for p in b.parameters())  # a DTensor's: unsharded
    return len(blocks), ranks, size


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
