"""What a probe trial reports about a model, as typed values: written as JSON by the trial, stored with the
workload, read by the tuner without torch.

- :class:`TorchProbeReport`: the repeated module classes (:class:`ModuleCandidate`), each of their
  instances' saved activations by operator kind (:class:`InstanceStats`), and the fixed memory (weights,
  gradients, optimizer state), all at the probed batch size (autotune.backends.torch_probe).
- :class:`OrtProbeReport`: ORTModule's own recompute plans with their predicted savings
  (autotune.backends.ort).

``to_json``/``from_json`` are the one serialisation; the JSON form is what earlier versions stored, so
databases written before these types existed still read.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from autotune.core.plans import Backend


@dataclass(frozen=True)
class ModuleCandidate:
    """A composite module class with at least two instances; outermost: not nested in another candidate."""

    cls: str
    count: int
    outermost: bool

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModuleCandidate:
        return cls(str(data["cls"]), int(data["count"]), bool(data["outermost"]))


@dataclass(frozen=True)
class InstanceStats:
    """One instance of a candidate class, as the probe's forward saw it (bytes at the probed batch size)."""

    name: str  # qualified module name, e.g. "blocks.0"
    cls: str
    saved_bytes: int  # what autograd keeps for backward while this instance is on the module stack
    input_bytes: int
    forward_seconds: float
    saved_by_kind: dict[str, int] = field(default_factory=dict)  # saved bytes by producing op kind
    output_bytes: dict[str, int] = field(default_factory=dict)  # op output bytes by kind

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> InstanceStats:
        return cls(
            str(data["name"]),
            str(data["cls"]),
            int(data["saved_bytes"]),
            int(data["input_bytes"]),
            float(data["forward_seconds"]),
            {k: int(v) for k, v in data.get("saved_by_kind", {}).items()},
            {k: int(v) for k, v in data.get("output_bytes", {}).items()},
        )


@dataclass(frozen=True)
class PlanCheck:
    """One plan tried on the script's own model against no plan: one forward and backward on the probe's
    batch, from the same random state (autotune.backends.torch_probe). ``error``: why it could not run."""

    plan: str
    loss_delta: float | None = None  # |loss - loss without a plan|, relative to the latter
    grad_delta: float | None = None  # max |grad - grad without a plan|, relative to the largest gradient
    tolerance: float | None = None  # what both deltas must stay within
    error: str | None = None
    skipped: str | None = None  # why the check did not run: the plan is not offered either

    @property
    def ok(self) -> bool:
        return (
            self.error is None
            and self.skipped is None
            and self.tolerance is not None
            and (self.loss_delta or 0.0) <= self.tolerance
            and (self.grad_delta or 0.0) <= self.tolerance
        )

    @property
    def reason(self) -> str:
        """Why the plan is excluded ("" if it is not)."""
        if self.ok:
            return ""
        if self.skipped is not None:
            return f"not checked against no plan: {self.skipped}"
        if self.error is not None:
            return f"fails on this model: {self.error}"
        return (
            f"changes the numbers: loss off by {self.loss_delta:.2g}, gradients by {self.grad_delta:.2g} "
            f"(relative; tolerance {self.tolerance:.0e})"
        )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PlanCheck:
        return cls(**data)


@dataclass(frozen=True)
class CompilePartition:
    """What torch.compile's partitioner does with the model at one activation memory budget (the probe
    asks it: autotune.backends.torch_compile). ``saved_bytes``: what the forward graphs hand to the backward
    at the probed batch size; ``same_as``: the larger ratio whose partition (forward and backward graphs)
    is this one's, so it is no plan of its own."""

    ratio: float
    partition: str  # a hash of the forward and backward graphs of every compiled region
    saved_bytes: int
    graphs: int  # compiled regions (more than one: graph breaks)
    same_as: float | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CompilePartition:
        same = data.get("same_as")
        return cls(
            float(data["ratio"]),
            str(data["partition"]),
            int(data["saved_bytes"]),
            int(data["graphs"]),
            None if same is None else float(same),
        )


@dataclass(frozen=True)
class TorchProbeReport:
    """The torch probe: the model's candidates and what each instance keeps for backward."""

    batch_size: int
    weights_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int | None  # None: the script used no torch.optim optimizer
    activation_bytes: int
    forward_seconds: float
    op_seconds: dict[str, float]  # forward time by op kind
    candidates: tuple[ModuleCandidate, ...]
    instances: tuple[InstanceStats, ...]
    checks: tuple[PlanCheck, ...] = ()  # each plan the search may use, against no plan (older probes: none)
    compiles: bool = False  # the script called torch.compile
    # the partitioner at each candidate budget, 1 (torch's default) included; empty: the script does not
    # compile, or the model could not be traced (``compile_error``)
    compile_partitions: tuple[CompilePartition, ...] = ()
    compile_error: str | None = None
    gpu: bool = False  # probed on a GPU: offload plans can save device memory
    # the checkpointing the script does by itself, in words (None: none seen): plans add to it, none keeps it
    own_checkpointing: str | None = None
    # FSDP2: the blocks the script sharded with fully_shard, the ranks each is sharded over, and their
    # parameters' unsharded bytes (all blocks together): what fsdp plans act on (0: no FSDP2 block)
    sharded_blocks: int = 0
    shard_ranks: int = 0
    block_parameter_bytes: int = 0
    blocks_kept: bool = False  # the script's blocks keep their parameters after forward (its own fsdp:keep)
    # DeepSpeed: the ZeRO stage the script's engine runs (None: no deepspeed.initialize seen), the ranks it
    # partitions over, its parameters' full bytes and its optimizer state's (all ranks' parts together):
    # what zero plans act on
    zero_stage: int | None = None
    zero_ranks: int = 0
    zero_parameter_bytes: int = 0
    zero_optimizer_bytes: int = 0

    backend = Backend.TORCH

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TorchProbeReport:
        return cls(
            batch_size=int(data["batch_size"]),
            weights_bytes=int(data["weights_bytes"]),
            gradients_bytes=int(data["gradients_bytes"]),
            optimizer_state_bytes=_int_or_none(data["optimizer_state_bytes"]),
            activation_bytes=int(data["activation_bytes"]),
            forward_seconds=float(data["forward_seconds"]),
            op_seconds={k: float(v) for k, v in data["op_seconds"].items()},
            candidates=tuple(ModuleCandidate.from_json(c) for c in data["candidates"]),
            instances=tuple(InstanceStats.from_json(i) for i in data["instances"]),
            checks=tuple(PlanCheck.from_json(c) for c in data.get("checks", ())),
            compiles=bool(data.get("compiles", False)),
            compile_partitions=tuple(
                CompilePartition.from_json(c) for c in data.get("compile_partitions", ())
            ),
            compile_error=data.get("compile_error"),
            gpu=bool(data.get("gpu", False)),
            own_checkpointing=data.get("own_checkpointing"),
            sharded_blocks=int(data.get("sharded_blocks", 0)),
            shard_ranks=int(data.get("shard_ranks", 0)),
            block_parameter_bytes=int(data.get("block_parameter_bytes", 0)),
            blocks_kept=bool(data.get("blocks_kept", False)),
            zero_stage=_int_or_none(data.get("zero_stage")),
            zero_ranks=int(data.get("zero_ranks", 0)),
            zero_parameter_bytes=int(data.get("zero_parameter_bytes", 0)),
            zero_optimizer_bytes=int(data.get("zero_optimizer_bytes", 0)),
        )

    def compile_partition(self, ratio: float) -> CompilePartition | None:
        """The probe's partition at ``ratio`` (None: not asked)."""
        return next((p for p in self.compile_partitions if abs(p.ratio - ratio) < 1e-9), None)


@dataclass(frozen=True)
class OrtPlanSaving:
    """One of ORTModule's recompute plans, as its memory optimizer lists it."""

    plan: str  # e.g. "BiasGelu+:1:-1"
    freq: int
    saving_bytes: int  # predicted, at the probed batch size
    symbolic: str  # ORT's symbolic form of the saving


@dataclass(frozen=True)
class OrtProbeReport:
    """The ORT probe: ORTModule's analysis of the model's first forward."""

    batch_size: int
    plans: tuple[OrtPlanSaving, ...]
    weights_bytes: int | None = None

    backend = Backend.ORT

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "backend": Backend.ORT.value}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> OrtProbeReport:
        return cls(
            batch_size=int(data["batch_size"]),
            plans=tuple(
                OrtPlanSaving(str(p["plan"]), int(p["freq"]), int(p["saving_bytes"]), str(p["symbolic"]))
                for p in data["plans"]
            ),
            weights_bytes=_int_or_none(data.get("weights_bytes")),
        )


ProbeReport = TorchProbeReport | OrtProbeReport


def probe_report_from_json(data: dict[str, Any] | None) -> ProbeReport | None:
    """The report a probe trial wrote (None for a trial that probed nothing)."""
    if not data:
        return None
    if data.get("backend") == Backend.ORT.value:
        return OrtProbeReport.from_json(data)
    return TorchProbeReport.from_json(data)


def _int_or_none(value: Any) -> int | None:
    return int(value) if value is not None else None
