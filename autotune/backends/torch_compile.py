"""Compile plans (``compile:R``): torch.compile's activation memory budget, inside the trial.

For a compiled model torch already chooses what to recompute: AOT autograd traces forward and backward as
one joint graph, and its partitioner (``min_cut_rematerialization_partition``) decides which values the
forward saves and which the backward recomputes. ``torch._functorch.config.activation_memory_budget`` (0-1,
default 1) makes it solve a knapsack: keep at most that share of what the default partition keeps, at the
least recompute time (by its FLOP estimate). The ratio is read when a graph is partitioned (its first
call), so a plan sets it before the script's first compiled step: at the import of torch, in the trial.

The probe asks the partitioner itself what each candidate ratio does to the script's model: one trace of
the model (dynamo, AOT autograd, no code generation) whose partition function runs torch's partitioner
once per ratio on a copy of the joint graph. A ratio's *partition* is the forward and backward graphs it
yields (hashed); ratios with one partition are one plan. Its *saved bytes* are the sizes of the tensors
the forward graph hands to the backward, at the probed batch: the activation memory the partitioner
accounts for (the workspace of the generated kernels and the allocator's rounding are not in it).

The ratio is a share, per graph, of the default partition's saved bytes: neither bytes nor the peak a
device shows (the peak is not even monotonic in it: pytorch issue 197838). Only measurement tells, which
is why the search measures ratios jointly with batch sizes and never bisects them.
"""

from __future__ import annotations

import copy
import hashlib
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from autotune.backends.probe_report import CompilePartition

Inputs = tuple[tuple[Any, ...], dict[str, Any]]

# The ratios the probe asks the partitioner about; 1 is torch's default (the plan ``none``).
CANDIDATE_RATIOS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
DEFAULT_RATIO = 1.0


def set_compile_budget(budget: float | None) -> None:
    """Set torch.compile's activation memory budget for graphs partitioned from now on (None: leave it)."""
    if budget is None:
        return
    from torch._functorch import config

    config.activation_memory_budget = float(budget)


def budget_backend(budget: float, partitioned: list[int] | None = None) -> Callable[..., Any]:
    """A torch.compile backend that partitions at ``budget`` and runs the graphs as traced (the probe's
    correctness check of a compile plan: which values are recomputed, without code generation);
    ``partitioned[0]`` counts the graphs dynamo hands it (AOT autograd's cache may skip the partition
    itself for a graph compiled before in the process)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch import config
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    def partition(joint: Any, joint_inputs: Any, **kwargs: Any) -> Any:
        with config.patch(activation_memory_budget=budget):
            return min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)

    compiler = aot_autograd(fw_compiler=_as_is, bw_compiler=_as_is, partition_fn=partition)

    def backend(graph: torch.fx.GraphModule, example_inputs: Any) -> Any:
        if partitioned is not None:
            partitioned[0] += 1
        return compiler(graph, example_inputs)

    return backend


def partitions(
    model: nn.Module,
    inputs: Inputs,
    ratios: Sequence[float] = CANDIDATE_RATIOS,
    more: Sequence[tuple[nn.Module, Inputs]] = (),
) -> list[CompilePartition]:
    """What the partitioner makes of ``model`` called on ``inputs`` at each of ``ratios`` (and at 1):
    one entry per ratio, in ratio order, each naming the largest ratio with the same partition.

    One dynamo trace (its own cache entries, dropped afterwards); nothing is generated or run but the
    forward that is traced. Raises what tracing raises (the probe reports it). ``more``: the model's other
    trees with their inputs (a model of several: autotune.backends.torch_model), partitioned alike."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch import config
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    asked = sorted({*ratios, DEFAULT_RATIO})
    graphs: dict[float, list[tuple[str, int]]] = {r: [] for r in asked}

    def partition(joint: Any, joint_inputs: Any, **kwargs: Any) -> Any:
        for ratio in asked:
            with config.patch(activation_memory_budget=ratio), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # deepcopy of a graph's pytree specs warns on some versions
                forward, backward = min_cut_rematerialization_partition(
                    copy.deepcopy(joint), joint_inputs, **kwargs
                )
            graphs[ratio].append((_digest(forward, backward), _saved_bytes(forward, kwargs)))
        return min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)

    backend = aot_autograd(fw_compiler=_as_is, bw_compiler=_as_is, partition_fn=partition)
    for module, its_inputs in [(model, inputs), *more]:
        _traced(module, its_inputs, backend)
    keys = {r: hashlib.sha256("".join(k for k, _ in graphs[r]).encode()).hexdigest()[:16] for r in asked}
    largest = {keys[r]: r for r in asked}  # asked is ascending: the last ratio of a partition wins
    return [
        CompilePartition(
            ratio=r,
            partition=keys[r],
            saved_bytes=sum(size for _, size in graphs[r]),
            graphs=len(graphs[r]),
            same_as=None if largest[keys[r]] == r else largest[keys[r]],
        )
        for r in asked
    ]


def _traced(model: nn.Module, inputs: Inputs, backend: Callable[..., Any]) -> None:
    """Call ``model`` compiled with ``backend`` once, with gradients on, from a clean dynamo cache."""
    import torch._dynamo

    args, kwargs = inputs
    torch._dynamo.reset()
    try:
        with torch.enable_grad(), torch.random.fork_rng(devices=_devices()):
            real_compile()(model, backend=backend, dynamic=False)(*args, **kwargs)
    finally:
        torch._dynamo.reset()


def real_compile() -> Callable[..., Any]:
    """torch.compile itself: in a probe trial the name is autotune's wrapper, which compiles nothing
    (autotune.runtime.hooks)."""
    return getattr(torch.compile, "__wrapped__", torch.compile)


def _as_is(graph: torch.fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
    return graph.forward


def _digest(forward: torch.fx.GraphModule, backward: torch.fx.GraphModule) -> str:
    return hashlib.sha256((forward.code + "\n" + backward.code).encode()).hexdigest()


def _saved_bytes(forward: torch.fx.GraphModule, kwargs: dict[str, Any]) -> int:
    """Bytes of the tensors the forward graph saves for the backward (its outputs past the user's)."""
    output = next(node for node in forward.graph.nodes if node.op == "output")
    saved = output.args[0][int(kwargs["num_fwd_outputs"]) :]
    total = 0
    for node in saved:
        value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if isinstance(value, torch.Tensor):
            try:
                total += int(value.numel()) * value.element_size()
            except (TypeError, RuntimeError):  # a symbolic size with no hint
                continue
    return total


def _devices() -> list[int]:
    return [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
