"""The probe's instruments, inside the trial: what autograd keeps for backward, and where it comes from.

Forward #2 of the prepared model (after one optimizer step, when lazy state exists) runs under
- ``saved_tensors_hooks``: every tensor autograd saves for backward, by storage (counted once), attributed to
  every candidate instance executing when it is saved (parameters excluded: they are kept anyway);
- a ``TorchDispatchMode`` recorder: which op produced each storage (so saved bytes split by op kind), the
  output bytes of every op inside each instance (what an operator policy would cache), and op times.
Forward #3 runs with module hooks only, to time each instance without the recorder's overhead. At the
optimizer step after it, the plans the search may use are each checked against no plan on forward #2's
inputs (autotune.backends.plan_check), with the probe's hooks and the trial's step timing paused. For a
script that calls torch.compile (which runs eagerly in a probe trial, so the instruments see every op),
torch's partitioner is first asked what each candidate activation memory budget does to the model
(autotune.backends.torch_compile), and the distinct ones are checked like any plan.

A model of several module trees (autotune.backends.torch_model) is probed as one: a forward is the first
tree's (the step calls it first), and each tree's forward in that step is recorded, timed and checked on its
own inputs; a tree called inside another's forward counts in that forward.

The result is a :class:`~autotune.backends.probe_report.TorchProbeReport` (``autotune.backends.probe`` predicts
plan savings from it in the tuner).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from autotune.backends import plan_check, torch_compile
from autotune.backends.ops import may_save, op_kind, op_name
from autotune.backends.probe import plans_to_check
from autotune.backends.probe_report import CompilePartition, InstanceStats, PlanCheck, TorchProbeReport
from autotune.backends.torch_model import trees_of
from autotune.backends.torch_modules import Candidate, find_candidates
from autotune.backends.torch_sharding import local_tensor, sharded_blocks
from autotune.core.plans import parse_plan

RECORDED_FORWARD = 2
TIMED_FORWARD = 3


class Probe:
    def __init__(self, model: nn.Module, batch_size: int, check_plans: tuple[str, ...] = ()) -> None:
        self.model = model
        self.trees = trees_of(model)
        self.batch_size = batch_size
        self.extra_checks = check_plans  # plans named by the user, checked beside those the probe offers
        self.candidates: list[Candidate] = find_candidates(model)
        self.names = {name for c in self.candidates for name in c.names}
        self.classes = {name: c.cls for c in self.candidates for name in c.names}
        self.params = {local_tensor(p).untyped_storage().data_ptr() for p in model.parameters()}
        self.stack: list[str] = []
        self.forwards = 0  # the first tree's
        self.depth = 0  # trees' forwards running (one called inside another is part of that one)
        self.recording = False
        self.timing = False
        self.exits = ExitStack()
        self.producer: dict[int, str] = {}  # storage -> kind of the op that produced it
        self.saved: dict[int, tuple[int, str, tuple[str, ...]]] = {}  # storage -> (bytes, kind, instances)
        self.outputs: dict[str, Counter[str]] = {n: Counter() for n in self.names}
        self.inputs: Counter[str] = Counter()
        self.seconds: dict[str, float] = {}
        self.op_seconds: dict[str, float] = {}
        self.started: dict[str, float] = {}
        self.forward_seconds = 0.0
        self.optimizer: Any = None
        self.done = False
        self.paused = False  # while the plans are checked: those forwards are not the script's
        self.inputs_seen: dict[int, plan_check.Inputs] | None = None  # forward #2's, by tree, for the checks
        self.checks: list[PlanCheck] | None = None
        self.compiles = False  # the script called torch.compile (the trial tells: after_step)
        self.compile_partitions: list[CompilePartition] = []
        self.compile_error: str | None = None
        self.own_checkpointing: str | None = None  # the script's own (the trial tells: after_step)
        self._attach()

    def _attach(self) -> None:
        for index, tree in enumerate(self.trees):
            tree.register_forward_pre_hook(
                lambda m, args, kwargs, i=index: self._root_pre(i, args, kwargs), with_kwargs=True
            )
            tree.register_forward_hook(lambda m, args, out: self._root_post())
        modules = dict(self.model.named_modules())
        for name in self.names:
            modules[name].register_forward_pre_hook(lambda m, args, n=name: self._enter(n, args))
            modules[name].register_forward_hook(lambda m, args, out, n=name: self._leave(n))

    @property
    def pending(self) -> bool:
        """Whether the probe still waits for a forward to time or for its plan checks (the trial measures on
        a few steps for them: autotune.runtime.checks.probe_pending)."""
        return not self.done or self.checks is None

    def after_step(self, trial: Any) -> None:
        """Between two training steps (the trial calls it): once the probe has its data, check the plans
        the search may use against no plan, on forward #2's inputs."""
        if self.depth == 0:  # the recorded or timed forward's trees have all run
            self._end_forward()
        if not self.done or self.checks is not None or not self.inputs_seen:
            return
        self.paused, trial.counting = True, False
        try:
            self.compiles = bool(getattr(trial, "compiled", False))
            self.own_checkpointing = trial.own_checkpointing(counted=False)  # own:off is then checked too
            if self.compiles:
                self._ask_partitioner()
            plans = dict.fromkeys([*plans_to_check(self.result()), *self.extra_checks])
            self.checks = plan_check.check_plans_of(self.model, self._runs(), list(plans))
        finally:
            self.paused, trial.counting = False, True
            self.inputs_seen = None

    def _runs(self) -> list[plan_check.Run]:
        """The trees with the inputs they had in the recorded forward (those that ran in it)."""
        seen = self.inputs_seen or {}
        return [(tree, seen[i]) for i, tree in enumerate(self.trees) if i in seen]

    def _ask_partitioner(self) -> None:
        """torch.compile's partition of the model at each candidate budget (and those the user named)."""
        assert self.inputs_seen is not None  # after_step checked
        named = [
            e.compile_budget
            for p in self.extra_checks
            for e in parse_plan(p).entries
            if e.compile_budget is not None
        ]
        (first, inputs), *more = self._runs()
        try:
            self.compile_partitions = torch_compile.partitions(
                first, inputs, sorted({*torch_compile.CANDIDATE_RATIOS, *named}), more
            )
        except Exception as error:  # a model dynamo cannot trace: no compile plans, and why
            self.compile_error = plan_check.one_line(error)

    def _root_pre(self, index: int, args: Any, kwargs: dict[str, Any]) -> None:
        if self.paused:
            return
        self.depth += 1
        if self.depth > 1:  # a tree called inside another's forward: part of that forward
            return
        if index == 0:  # a new forward of the model: the first tree's
            self._end_forward()
            self.forwards += 1
            self.recording = self.forwards == RECORDED_FORWARD and torch.is_grad_enabled()
            self.timing = self.forwards == TIMED_FORWARD
            if self.recording:
                self.inputs_seen = {}
        if self.recording:
            if self.inputs_seen is not None and index not in self.inputs_seen:
                self.inputs_seen[index] = plan_check.capture(args, kwargs)
            self.exits.enter_context(torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t))
            self.exits.enter_context(_Recorder(self))
        self.started[""] = _now()

    def _root_post(self) -> None:
        if self.paused or not self.depth:  # the forward the probe was attached in: its start was not seen
            return
        self.depth -= 1
        if self.depth > 0:
            return
        if self.timing:
            self.forward_seconds += _now() - self.started[""]
            if len(self.trees) == 1:  # the model's forward is over (several trees: at the next, or the step)
                self.timing, self.done = False, True
        if self.recording:
            self.exits.close()
            self.recording = len(self.trees) > 1  # several trees: the step's next ones are recorded too

    def _end_forward(self) -> None:
        """The model's last forward is over (the first tree runs again): recording or timing stops."""
        self.recording = False
        if self.timing:
            self.timing, self.done = False, True

    def _enter(self, name: str, args: Any) -> None:
        if self.paused or not self.depth:  # outside the model's forward: a recompute in backward
            return
        self.stack.append(name)
        if self.recording:
            self.inputs[name] += sum(_bytes(t) for t in _tensors(args))
        if self.timing:
            self.started[name] = _now()

    def _leave(self, name: str) -> None:
        if self.paused or not self.depth:
            return
        self.stack.pop()
        if self.timing:
            self.seconds[name] = self.seconds.get(name, 0.0) + _now() - self.started[name]

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        ptr = tensor.untyped_storage().data_ptr()
        if ptr not in self.params and ptr not in self.saved:
            self.saved[ptr] = (_bytes(tensor), self.producer.get(ptr, "input"), tuple(self.stack))
        return tensor

    def on_op(self, op: Any, output: Any, seconds: float) -> None:
        kind = op_kind(op)
        self.op_seconds[kind] = self.op_seconds.get(kind, 0.0) + seconds
        in_place = op_name(op).endswith("_")
        fresh = kind != "view" and not in_place  # a new allocation (its address may be a freed tensor's)
        for tensor in _tensors(output):
            ptr = tensor.untyped_storage().data_ptr()
            # The first op to write real values owns a storage: dropout's bernoulli_ fills an empty_like (the
            # mask is dropout's), and the div_ that scales it afterwards does not take it over.
            if fresh or ptr not in self.producer or (in_place and self.producer[ptr] == "factory"):
                self.producer[ptr] = kind
            if fresh and may_save(op):
                for name in self.stack:
                    self.outputs[name][kind] += _bytes(tensor)

    def result(self) -> TorchProbeReport:
        """The probe's measurements. Where the trial ended before the plans were checked, every plan the
        check would have tried is reported as not checked: no plan is offered unchecked."""
        report = self._measurements()
        if self.checks is not None:
            return report
        why = "the probe's trial ended before the check ran (the script trained too few steps)"
        plans = dict.fromkeys([*plans_to_check(report), *self.extra_checks])
        return dataclasses.replace(report, checks=tuple(PlanCheck(p, skipped=why) for p in plans))

    def _measurements(self) -> TorchProbeReport:
        saved_by: dict[str, Counter[str]] = {n: Counter() for n in self.names}
        saved_in: Counter[str] = Counter()
        for size, kind, stack in self.saved.values():
            for name in stack:
                saved_by[name][kind] += size
                saved_in[name] += size
        params = list(self.model.parameters())
        blocks, ranks, block_bytes, blocks_kept = sharded_blocks(self.model)
        zero = sys.modules.get(
            "autotune.backends.deepspeed_zero"
        )  # imported when the script imports deepspeed
        engine = zero.script_engine() if zero is not None else None
        optimizer_bytes = _optimizer_state_bytes(self.optimizer)
        return TorchProbeReport(
            batch_size=self.batch_size,
            weights_bytes=sum(_bytes(p) for p in params),
            gradients_bytes=sum(_bytes(p.grad) for p in params if p.grad is not None),
            optimizer_state_bytes=optimizer_bytes,
            activation_bytes=sum(size for size, _, _ in self.saved.values()),
            forward_seconds=self.forward_seconds,
            op_seconds=dict(self.op_seconds),
            candidates=tuple(c.summary() for c in self.candidates),
            instances=tuple(
                InstanceStats(
                    name=n,
                    cls=self.classes[n],
                    saved_bytes=saved_in[n],
                    input_bytes=self.inputs[n],
                    forward_seconds=self.seconds.get(n, 0.0),
                    saved_by_kind=dict(saved_by[n]),
                    output_bytes=dict(self.outputs[n]),
                )
                for c in self.candidates
                for n in c.names
            ),
            checks=tuple(self.checks or ()),
            compiles=self.compiles,
            compile_partitions=tuple(self.compile_partitions),
            compile_error=self.compile_error,
            gpu=torch.cuda.is_available() and torch.cuda.is_initialized(),
            own_checkpointing=self.own_checkpointing,
            sharded_blocks=blocks,
            shard_ranks=ranks,
            block_parameter_bytes=block_bytes,
            blocks_kept=blocks_kept,
            zero_stage=engine.stage if engine else None,
            zero_ranks=engine.ranks if engine else 0,
            zero_parameter_bytes=engine.parameter_bytes if engine else 0,
            # a partitioned optimizer (stage 1 on) holds this rank's part: 1/ranks of the whole
            zero_optimizer_bytes=(optimizer_bytes or 0) * (engine.ranks if engine.stage >= 1 else 1)
            if engine
            else 0,
        )


class _Recorder(TorchDispatchMode):
    def __init__(self, probe: Probe) -> None:
        super().__init__()
        self.probe = probe

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        start = _now()
        output = func(*args, **(kwargs or {}))
        self.probe.on_op(func, output, _now() - start)
        return output


def _now() -> float:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter()


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def _bytes(tensor: torch.Tensor) -> int:
    return int(local_tensor(tensor).untyped_storage().nbytes())


def _optimizer_state_bytes(optimizer: Any) -> int | None:
    if optimizer is None:
        return None
    return sum(
        _bytes(v) for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)
    )
