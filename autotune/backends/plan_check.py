"""The probe's correctness check: each plan the search may use, tried on the script's own model and batch
against no plan, before any trial measures it.

A plan must never change the numbers. A compile plan (``compile:R``) is checked on the graphs torch's
partitioner makes at that budget, run as traced (no code generation: what is checked is which values the
backward recomputes, not a kernel's rounding). Each check runs one forward and backward of the model on the batch
the probe recorded, from the same random state (dropout draws the same masks), with the model's buffers
put back before each run, and compares the loss and every parameter's gradient with no plan's. The loss is
the model's own when its output carries one (a Hugging Face model given labels), else a fixed function of
every floating output that has gradients (the mean of its squares), so that every gradient depends on the
values the plan recomputes.

A sharding FSDP2 takes on a model it has sharded already (``fsdp:keep``, ``fsdp:reshard``, alone or with
recompute rules) is checked the same way: the script's blocks are set to it for the plan's step through
FSDP2's own ``set_reshard_after_forward`` and set back afterwards (autotune.backends.torch_sharding
.resharded); every rank checks its own gradient shards. A reshard group, offload or a ZeRO stage is taken
only as the model is sharded: what is checked of such a plan is the rest of it (autotune.backends.probe
.checked_part).

A model of several module trees (an embedding, a body and a head that the script calls in turn: see
autotune.backends.torch_model) is checked tree by tree in one step: each tree on the inputs it had in the
probe's recorded step, their losses summed.

A check proves that its plan ran: the forwards the plan's rules recompute or offload are counted during its
step (none counted: the check fails, saying so), and so are the script's own checkpoints that ``own:off`` runs
plainly, the graphs a compile budget partitioned and the FSDP2 blocks whose forward ended as a sharding
asks. A plan applied to nothing would otherwise pass with a difference of 0.

Tolerance, relative to the reference (the loss; the largest gradient of any parameter): 1e-5 for 32-bit
parameters, 1e-3 for float16, 1e-2 for bfloat16 (recompute on a GPU may reorder reductions; on the CPU the
numbers come out identical). A plan that raises (selective recompute refusing an op it did not record, an
unsupported module) is excluded with its error.

The script's gradients, buffers and random state are as they were afterwards, and the training step that
follows is not timed with the check in it (autotune.runtime.trial).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map_only

from autotune.backends.probe_report import PlanCheck
from autotune.backends.torch_modules import RAN, plan_applied
from autotune.backends.torch_sharding import local_tensor, resharded
from autotune.core.plans import Plan, Sharding, parse_plan

Inputs = tuple[tuple[Any, ...], dict[str, Any]]
Run = tuple[nn.Module, Inputs]  # a module tree of the model and the inputs it was called with

_SEED = 20261123
_TOLERANCE = {torch.float16: 1e-3, torch.bfloat16: 1e-2, torch.float64: 1e-9}
_DEFAULT_TOLERANCE = 1e-5


def capture(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Inputs:
    """A copy of a forward's inputs that the script cannot change under the check."""
    copied: Inputs = tree_map_only(torch.Tensor, _copy, (args, kwargs))
    return copied


def check_plans(model: nn.Module, inputs: Inputs, plans: Sequence[str]) -> list[PlanCheck]:
    """Each of ``plans`` on ``model`` against no plan (an empty list if no plan's step itself fails)."""
    return check_plans_of(model, [(model, inputs)], plans)


def check_plans_of(model: nn.Module, runs: Sequence[Run], plans: Sequence[str]) -> list[PlanCheck]:
    """Each of ``plans`` applied to ``model`` against no plan, in one step of ``runs`` (``model``'s trees,
    each with its recorded inputs)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params or not plans or not runs:
        return []
    grads = [p.grad for p in params]
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    tolerance = max(_TOLERANCE.get(p.dtype, _DEFAULT_TOLERANCE) for p in params)
    try:
        try:
            reference = _one_step([module for module, _ in runs], params, runs, buffers)
        except Exception:  # the model cannot be run this way at all: nothing to compare against
            return []
        checks = []
        for plan in plans:
            parsed = parse_plan(plan)
            before = dict(RAN)
            partitioned, ended = [0], [0]
            sharding = parsed.sharding if isinstance(parsed.sharding, Sharding) else None
            try:
                with (
                    plan_applied(model, parsed),
                    resharded(model, sharding, ended),
                    _compiled([module for module, _ in runs], parsed.compile_budget, partitioned) as run,
                ):
                    result = _one_step(run, params, runs, buffers)
            except Exception as error:
                checks.append(PlanCheck(plan, error=one_line(error)))
                continue
            ran = {k: RAN[k] - before[k] for k in RAN}
            idle = _did_nothing(parsed, ran, partitioned[0]) or _not_resharded(sharding, ended[0])
            checks.append(
                PlanCheck(plan, error=idle) if idle else _compare(plan, reference, result, tolerance)
            )
        return checks
    finally:
        for param, grad in zip(params, grads, strict=True):
            param.grad = grad
        _restore(buffers)


def _did_nothing(plan: Plan, ran: dict[str, int], partitioned: int) -> str | None:
    """Why the check of ``plan`` proves nothing (a part of it ran nowhere in the check step), or None."""
    compiled = plan.compile_budget is not None and partitioned > 0  # the rules' wrappers are in its graphs
    if (plan.rules or plan.everything) and not ran["wrapped"] and not compiled:
        return "the plan ran nowhere in the check step: no forward it wraps was called"
    if plan.own_off and not ran["own_plain"]:
        return "own:off ran nowhere in the check step: the script's own checkpointing was not called"
    if plan.compile_budget is not None and not compiled:
        return "the compile budget ran nowhere in the check step: nothing was compiled"
    return None


def _not_resharded(sharding: Sharding | None, ended: int) -> str | None:
    """Why the check of a sharding FSDP2 takes after sharding proves nothing (no block's forward ended as
    it asks), or None; a sharding the check cannot try (a group, offload) is not this check's."""
    if sharding is None or not sharding.settable or ended:
        return None
    return f"{sharding} ran nowhere in the check step: no FSDP2 block's forward ended as it asks"


_Step = tuple[float, list[torch.Tensor | None]]


@contextlib.contextmanager
def _compiled(
    modules: list[nn.Module], budget: float | None, partitioned: list[int]
) -> Iterator[list[Callable[..., Any]]]:
    """``modules`` themselves, or for a compile budget each compiled with torch's partitioner at that budget
    and the graphs run as traced (``partitioned[0]`` counts the graphs partitioned); dynamo's caches are
    cleared before and after."""
    if budget is None:
        yield list(modules)
        return
    import torch._dynamo

    from autotune.backends.torch_compile import budget_backend, real_compile

    backend = budget_backend(budget, partitioned)
    torch._dynamo.reset()
    try:
        yield [real_compile()(module, backend=backend, dynamic=False) for module in modules]
    finally:
        torch._dynamo.reset()


def _one_step(
    modules: Sequence[Callable[..., Any]],
    params: list[nn.Parameter],
    runs: Sequence[Run],
    buffers: list[tuple[torch.Tensor, torch.Tensor]],
) -> _Step:
    for param in params:
        param.grad = None
    _restore(buffers)
    devices = (
        [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    )
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(_SEED)
        losses = []
        for module, (_, (args, kwargs)) in zip(modules, runs, strict=True):
            losses.append(_loss(module(*args, **kwargs)))
        loss = sum(losses[1:], losses[0])
        loss.backward()
    # a DTensor's gradient (FSDP2: this rank's shard of it) as its local tensor: each rank compares its own
    grads = [None if p.grad is None else local_tensor(p.grad).detach().clone() for p in params]
    for param in params:
        param.grad = None
    return float(loss.detach().double()), grads


def _compare(plan: str, reference: _Step, result: _Step, tolerance: float) -> PlanCheck:
    (loss, grads), (plan_loss, plan_grads) = reference, result
    for expected, got in zip(grads, plan_grads, strict=True):
        if (expected is None) != (got is None):
            return PlanCheck(plan, error="a parameter's gradient is missing with the plan or without it")
    scale = max((float(g.abs().max()) for g in grads if g is not None and g.numel()), default=0.0)
    worst = max(
        (
            float((e.double() - g.double()).abs().max())
            for e, g in zip(grads, plan_grads, strict=True)
            if e is not None and g is not None and e.numel()
        ),
        default=0.0,
    )
    return PlanCheck(
        plan,
        loss_delta=abs(plan_loss - loss) / max(abs(loss), 1e-30),
        grad_delta=worst / max(scale, 1e-30),
        tolerance=tolerance,
    )


def _loss(output: Any) -> torch.Tensor:
    """The model's own loss if its output has one, else the mean square of every floating output with
    gradients, summed."""
    own = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
    if isinstance(own, torch.Tensor) and own.numel() == 1 and own.requires_grad:
        return own.reshape(())
    parts = [t.float().square().mean() for t in _tensors(output) if t.requires_grad and t.is_floating_point()]
    if not parts:
        raise RuntimeError("the model's output holds no tensor with gradients")
    return torch.stack(parts).sum()


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors(item)


def _copy(tensor: torch.Tensor) -> torch.Tensor:
    copy = tensor.detach().clone()
    return copy.requires_grad_() if tensor.requires_grad and tensor.is_leaf else copy


def _restore(buffers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    with torch.no_grad():
        for buffer, value in buffers:
            buffer.copy_(value)


def one_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")
