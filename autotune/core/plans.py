"""Recompute plans: which activations a trial recomputes in backward instead of keeping.

A plan has a compact string form that the CLI accepts and prints, and that is stable (canonical) so it
can name stored trials::

    none                     keep every activation (plain training)
    all                      checkpoint every instance of the outermost repeated module classes
    Block                    checkpoint every instance of class Block            (ratio 1)
    Block:0.5                checkpoint the first half of the Block instances (ColossalAI's ratio)
    Attention:1,MLP:0.25     several classes; nested instances inside a checkpointed one are skipped
    Block:1/save=matmul      operator level: inside the checkpointed Blocks keep (save) the outputs of
                             matmuls and recompute every other op in backward (Megatron's selective recompute)
    Block:1/recompute=softmax+dropout
                             operator level: recompute only softmax and dropout, keep everything else

    Block:1/save=conv        the same for a convolutional block: keep convolution outputs, recompute norms
                             and activations
    Block:0.5/offload        activation offload: the tensors the first half of the Blocks save for backward
                             go to (pinned) host memory and come back for backward: nothing is recomputed,
                             device memory is traded for transfers (GPU only: on the CPU it saves nothing)
    compile:0.5              for a script that calls torch.compile: the partitioner's activation memory
                             budget (``torch._functorch.config.activation_memory_budget``), set before the
                             first compilation: 1 is torch's default, 0 recomputes all it can. Combinable
                             with module rules (``Block:1,compile:0.5``)
    own:off                  for a script that checkpoints by itself (Hugging Face's
                             gradient_checkpointing_enable(), torch.utils.checkpoint in its own forwards):
                             its own checkpointing off, the checkpointed functions called as they are;
                             ``none`` keeps it. Combinable with module rules (``Block:0.5,own:off``)
    fsdp:keep                for a script that shards with FSDP2's ``fully_shard``: its blocks keep their
                             parameters unsharded from forward to backward (``reshard_after_forward=False``:
                             no second all-gather, more memory); ``fsdp:reshard`` reshards them (True),
                             ``fsdp:2`` reshards to groups of 2 ranks (an int dividing the ranks a block
                             is sharded over), ``fsdp:offload`` keeps parameters, gradients and optimizer
                             state in host memory (``CPUOffloadPolicy``; GPU only), ``fsdp:keep+offload``
                             both. Applied to every ``fully_shard`` call on a module that holds no module
                             sharded before it (the blocks; the root keeps the script's own). Combinable
                             with module rules (``Block:0.5,fsdp:keep``); the same on every rank
    zero:2                   for a script that trains with DeepSpeed (``deepspeed.initialize``): ZeRO stage
                             2 (0-3) in the config it passes, ``zero:2+offload`` with the optimizer state in
                             host memory (``offload_optimizer``; at stage 3 the parameters too:
                             ``offload_param``), ``zero:offload`` the script's own stage with offload.
                             Combinable with module rules (``Block:0.5,zero:3``); the same on every rank.
                             A plan names one sharding: fsdp or zero, not both
    Block:1|Block:0.5|none   a plan per rank of a multi-process job, in rank order: rank 0 checkpoints every
                             Block, rank 1 half of them, rank 2 nothing (a pipeline's first stages keep
                             more activations than its last). ``autotune.prepare`` applies the entry of
                             the rank it runs in (``$RANK``); a job with more ranks than entries is refused

Operator kinds: matmul, conv, attention, softmax, dropout, activation, norm, elementwise (``OP_KINDS``).

``compile``, ``own``, ``fsdp`` and ``zero`` are words of the grammar, not class names. Class names are matched against ``type(module).__name__``. ``round(ratio * count)`` instances
are checkpointed (at least one for any ratio > 0), spread evenly from the first in module order
(:meth:`ModuleRule.chosen`: ``Block:0.5`` every other block, as Hugging Face's ``every_n_layers=2``).

This module imports no torch: plans are parsed and printed by commands that run no trial.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from autotune.core.enums import TextEnum
from autotune.core.errors import InputError


class Backend(TextEnum):
    """What applies a plan: torch (activation checkpointing, primary) or ort (ONNX Runtime's ORTModule
    memory optimizer, a deprecated compatibility backend)."""

    TORCH = "torch"
    ORT = "ort"

    @classmethod
    def parse(cls, text: str | Backend) -> Backend:
        """Raises InputError for anything but torch or ort."""
        try:
            return cls(text)
        except ValueError:
            raise InputError(f"unknown backend {text!r}: expected torch or ort") from None


_CLASS = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
OP_KINDS = ("matmul", "conv", "attention", "softmax", "dropout", "activation", "norm", "elementwise")
_RATIO = re.compile(r"\d+(?:\.\d+)?|\.\d+", re.ASCII)
COMPILE = "compile"  # the plan word for torch.compile's activation memory budget
OWN_OFF = "own:off"  # the plan words for the script's own checkpointing, off
FSDP = "fsdp"  # the plan word for FSDP2's resharding and offload (Sharding)
ZERO = "zero"  # the plan word for DeepSpeed's ZeRO stage and offload (Zero)


@dataclass(frozen=True, order=True)
class OpPolicy:
    """Which operator kinds a checkpointed region keeps: ``save`` these (recompute the rest), or
    ``recompute`` these (save the rest)."""

    mode: str  # "save" or "recompute"
    kinds: tuple[str, ...]

    def __post_init__(self) -> None:
        unknown = [k for k in self.kinds if k not in OP_KINDS]
        if self.mode not in ("save", "recompute") or not self.kinds or unknown:
            raise InputError(
                f"invalid operator policy {self}: expected save=KIND[+KIND...] or recompute=KIND[+KIND...] "
                f"with kinds from {', '.join(OP_KINDS)}"
            )

    def saves(self, kind: str) -> bool:
        return (kind in self.kinds) == (self.mode == "save")

    def __str__(self) -> str:
        return f"{self.mode}={'+'.join(self.kinds)}"


@dataclass(frozen=True, order=True)
class ModuleRule:
    """Checkpoint ``ratio`` of the instances of module class ``cls`` (selectively, with ``ops``)."""

    cls: str
    ratio: float = 1.0
    ops: OpPolicy | None = None
    offload: bool = False  # keep the saved tensors in host memory instead of recomputing them

    def __post_init__(self) -> None:
        if not _CLASS.fullmatch(self.cls) or self.cls == COMPILE:
            raise InputError(f"invalid module class name {self.cls!r} in plan")
        if not 0 < self.ratio <= 1 or math.isnan(self.ratio):
            raise InputError(f"plan ratio for {self.cls} must be in (0, 1], got {self.ratio}")
        if self.offload and self.ops is not None:
            raise InputError(f"plan rule for {self.cls}: offload takes no operator policy")

    def count(self, instances: int) -> int:
        """How many of ``instances`` this rule checkpoints."""
        return max(1, math.floor(self.ratio * instances + 0.5)) if instances else 0

    def chosen(self, instances: int) -> list[int]:
        """Which of ``instances`` (by index, in the model's order) it checkpoints: :meth:`count` of them,
        spread evenly from the first: ``Block:0.5`` every other block (0, 2, 4...), ``Block:0.25`` every
        fourth, as Hugging Face's ``every_n_layers`` places them (its ``layer_index % k == 0``)."""
        count = self.count(instances)
        return [i * instances // count for i in range(count)]

    def __str__(self) -> str:
        return f"{self.cls}:{self.ratio:.3g}" + (
            f"/{self.ops}" if self.ops else "/offload" if self.offload else ""
        )


@dataclass(frozen=True)
class Sharding:
    """What FSDP2's ``fully_shard`` is given for the script's blocks (``fsdp:...``; issue 45).

    ``reshard``: ``reshard_after_forward`` -- True reshards parameters after the forward (all-gathered
    again for backward), False keeps them unsharded until backward, an int reshards them to groups of that
    many ranks; None leaves the script's own. ``offload``: ``CPUOffloadPolicy`` (parameters, gradients and
    optimizer state in host memory, copied to the device for each use)."""

    reshard: bool | int | None = None
    offload: bool = False

    def __post_init__(self) -> None:
        group = self.reshard
        if type(group) is int and group < 2:
            raise InputError(f"fsdp:{group}: a group to reshard to is 2 ranks or more (fsdp:keep keeps them)")
        if group is None and not self.offload:
            raise InputError("fsdp: expected keep, reshard, a group size or offload")

    @property
    def may_beat_own(self) -> bool:
        """Whether it may be faster than the script's own sharding: it all-gathers less in backward than
        resharding does (keep, a smaller group)."""
        return self.reshard is False or type(self.reshard) is int

    @property
    def settable(self) -> bool:
        """Whether FSDP2 takes it on a model it has sharded already (``set_reshard_after_forward``: keep,
        reshard), so that the probe's check can try it on the script's own model; a group or offload FSDP2
        takes only as it shards."""
        return type(self.reshard) is bool and not self.offload

    def arguments(self) -> dict[str, str]:
        """What ``fully_shard`` is passed, as Python source (``best --format torchrun`` prints it)."""
        out = {}
        if self.reshard is not None:
            out["reshard_after_forward"] = repr(self.reshard)
        if self.offload:
            out["offload_policy"] = "CPUOffloadPolicy(pin_memory=True)"
        return out

    def __str__(self) -> str:
        group = self.reshard
        reshard = "keep" if group is False else "reshard" if group is True else str(group or "")
        return f"{FSDP}:" + "+".join(filter(None, [reshard, "offload" if self.offload else ""]))


@dataclass(frozen=True)
class Zero:
    """What DeepSpeed's config is given for ZeRO (``zero:...``; issue 45): ``stage`` 0-3 (``zero_optimization.
    stage``: 1 partitions the optimizer state over the ranks, 2 the gradients too, 3 the parameters too,
    gathered for each use), None the script's own; ``offload`` the optimizer state in host memory
    (``offload_optimizer``; at stage 3 the parameters too, ``offload_param``), False the script's own."""

    stage: int | None = None
    offload: bool = False

    def __post_init__(self) -> None:
        if self.stage is not None and self.stage not in range(4):
            raise InputError(f"zero:{self.stage}: ZeRO's stages are 0, 1, 2 and 3")
        if self.stage is None and not self.offload:
            raise InputError("zero: expected a stage (0-3) or offload")
        if self.stage == 0 and self.offload:
            raise InputError(
                "zero:0+offload: DeepSpeed offloads from stage 1 on (stage 0 partitions nothing)"
            )

    @property
    def may_beat_own(self) -> bool:
        """Whether it may be faster than the script's own ZeRO: any stage may gather less than the script's
        (which autotune does not read before the trial); offload moves the optimizer's work to the host."""
        return self.stage is not None and not self.offload

    def config(self, pin_memory: bool) -> dict[str, object]:
        """What it sets in ``zero_optimization`` of the script's DeepSpeed config (the rest is the script's)."""
        out: dict[str, object] = {} if self.stage is None else {"stage": self.stage}
        if self.offload:
            device = {"device": "cpu", "pin_memory": pin_memory}
            out["offload_optimizer"] = device
            if self.stage == 3:
                out["offload_param"] = dict(device)
        return out

    def __str__(self) -> str:
        stage = "" if self.stage is None else str(self.stage)
        return f"{ZERO}:" + "+".join(filter(None, [stage, "offload" if self.offload else ""]))


def _zero(words: str, plan: str) -> Zero:
    stage: int | None = None
    offload = False
    for word in words.split("+"):
        word = word.strip()
        if word == "offload" and not offload:
            offload = True
        elif word in ("0", "1", "2", "3") and stage is None:
            stage = int(word)
        else:
            raise InputError(
                f"invalid plan {plan!r}: expected zero:S (S a ZeRO stage: 0, 1, 2 or 3) and/or +offload "
                "(got zero:" + words + ")"
            )
    return Zero(stage, offload)


def _sharding(words: str, plan: str) -> Sharding:
    reshard: bool | int | None = None
    offload = False
    for word in words.split("+"):
        word = word.strip()
        if word == "offload" and not offload:
            offload = True
        elif word in ("keep", "reshard") and reshard is None:
            reshard = word == "reshard"
        elif word.isdigit() and int(word) >= 2 and reshard is None:
            reshard = int(word)
        else:
            raise InputError(
                f"invalid plan {plan!r}: expected fsdp:keep, fsdp:reshard or fsdp:N (N >= 2 ranks to reshard "
                "to), and/or +offload (got fsdp:" + words + ")"
            )
    return Sharding(reshard, offload)


@dataclass(frozen=True)
class Plan:
    """A recompute plan. Build it with :func:`parse_plan`, or ``Plan.none()`` / ``Plan.all()``."""

    rules: tuple[ModuleRule, ...] = ()
    everything: bool = False
    ranks: tuple[Plan, ...] = ()  # a plan per rank (rank order); rules and everything unset then
    # torch.compile's activation memory budget (0-1) for a script that compiles; None: torch's own (1)
    compile_budget: float | None = None
    own_off: bool = False  # the script's own checkpointing off (``own:off``)
    # FSDP2's settings for the script's blocks (``fsdp:...``) or DeepSpeed's ZeRO (``zero:...``); None: its own
    sharding: Sharding | Zero | None = None

    def __post_init__(self) -> None:
        budget = self.compile_budget
        if budget is not None and (math.isnan(budget) or not 0 <= budget <= 1):
            raise InputError(f"compile budget must be in [0, 1], got {budget}")
        if self.ranks and any(p.sharding != self.ranks[0].sharding for p in self.ranks):
            raise InputError(
                f"plan {'|'.join(map(str, self.ranks))}: fsdp and zero must be the same on every rank (the "
                "ranks that share a model's parameters gather them together)"
            )

    @classmethod
    def per_rank(cls, plans: Sequence[Plan]) -> Plan:
        """One plan per rank; equal entries collapse to that one plan (``A|A`` is ``A``)."""
        plans = tuple(plans)
        if any(p.ranks for p in plans):
            raise InputError("a per-rank plan's entries cannot be per-rank plans themselves")
        if len(set(plans)) <= 1:
            return plans[0] if plans else cls()
        return cls(ranks=plans)

    @property
    def entries(self) -> tuple[Plan, ...]:
        """The plans its ranks apply: one per rank, or itself."""
        return self.ranks or (self,)

    def for_rank(self, rank: int | None) -> Plan:
        """The plan rank ``rank`` applies (every rank's, for a plan that is not per rank).

        Raises:
            InputError: a per-rank plan with fewer entries than ``rank + 1``.
        """
        if not self.ranks:
            return self
        if rank is None or not 0 <= rank < len(self.ranks):
            raise InputError(
                f"plan {self} gives {len(self.ranks)} ranks a plan each, but it is applied in "
                + ("a process that is no rank ($RANK unset)" if rank is None else f"rank {rank}")
            )
        return self.ranks[rank]

    @classmethod
    def none(cls) -> Plan:
        return cls()

    @classmethod
    def all(cls) -> Plan:
        return cls(everything=True)

    @property
    def is_none(self) -> bool:
        return (
            not self.rules
            and not self.everything
            and self.compile_budget is None
            and not self.own_off
            and self.sharding is None
            and all(p.is_none for p in self.ranks)
        )

    @property
    def compiles(self) -> bool:
        """Whether it sets torch.compile's activation memory budget (of any rank)."""
        return any(entry.compile_budget is not None for entry in self.entries)

    def __str__(self) -> str:
        if self.ranks:
            return "|".join(str(p) for p in self.ranks)
        parts = ["all"] if self.everything else [str(rule) for rule in self.rules]
        if self.compile_budget is not None:
            parts.append(f"{COMPILE}:{self.compile_budget:.3g}")
        if self.own_off:
            parts.append(OWN_OFF)
        if self.sharding is not None:
            parts.append(str(self.sharding))
        return ",".join(parts) or "none"


def parse_plan(text: str) -> Plan:
    """Parse a plan string into its canonical :class:`Plan`.

    Raises:
        InputError: one line naming the bad part and the grammar.
    """
    spec = text.strip()
    if "|" in spec:
        entries = spec.split("|")
        if any(not e.strip() for e in entries):
            raise InputError(
                f"invalid plan {text!r}: a per-rank plan needs a plan for every rank (none included)"
            )
        return Plan.per_rank([parse_plan(e) for e in entries])
    if spec.lower() in ("none", ""):
        return Plan.none()
    if spec.lower() == "all":
        return Plan.all()
    rules: dict[str, ModuleRule] = {}
    everything = False
    budget: float | None = None
    own_off = False
    sharding: Sharding | Zero | None = None
    for part in spec.split(","):
        if part.strip().lower() == "all":
            everything = True
            continue
        word, _, words = part.strip().partition(":")
        if word in (FSDP, ZERO):
            if sharding is not None:
                raise InputError(
                    f"invalid plan {text!r}: {str(sharding).partition(':')[0]} named before: a plan names one "
                    "sharding (fsdp or zero), once"
                )
            sharding = _sharding(words, text) if word == FSDP else _zero(words, text)
            continue
        if part.strip().partition(":")[0] == "own":
            if part.strip() != OWN_OFF or own_off:
                raise InputError(
                    f"invalid plan {text!r}: expected own:off once (the script's own checkpointing off)"
                )
            own_off = True
            continue
        part, _, policy_text = part.partition("/")
        name, sep, ratio_text = part.strip().partition(":")
        if name == COMPILE:
            budget = _compile_budget(ratio_text if sep else "", policy_text, text, budget)
            continue
        if sep and not (ratio_text and _RATIO.fullmatch(ratio_text)):
            raise InputError(f"invalid plan {text!r}: ratio {ratio_text!r} must be a number in (0, 1]")
        if not _CLASS.fullmatch(name):
            raise InputError(
                f"invalid plan {text!r}: expected 'none', 'all' or ModuleClass[:ratio],... (got {part.strip()!r})"
            )
        if name in rules:
            raise InputError(f"invalid plan {text!r}: class {name} named twice")
        offload = policy_text.strip() == "offload"
        ops = None if offload else _parse_policy(policy_text, text)
        rules[name] = ModuleRule(name, float(ratio_text) if sep else 1.0, ops, offload)
    if everything and rules:
        raise InputError(f"invalid plan {text!r}: 'all' names its own classes: give it or classes, not both")
    return Plan(
        rules=tuple(sorted(rules.values())),
        everything=everything,
        compile_budget=budget,
        own_off=own_off,
        sharding=sharding,
    )


def _compile_budget(ratio: str, rest: str, plan: str, earlier: float | None) -> float:
    if earlier is not None:
        raise InputError(f"invalid plan {plan!r}: compile named twice")
    if rest or not _RATIO.fullmatch(ratio) or not 0 <= float(ratio) <= 1:
        raise InputError(
            f"invalid plan {plan!r}: expected compile:R, R the activation memory budget in [0, 1] "
            "(torch.compile's share of the activations it would keep)"
        )
    return float(ratio)


def _parse_policy(text: str, plan: str) -> OpPolicy | None:
    if not text.strip():
        return None
    mode, sep, kinds = text.strip().partition("=")
    if not sep:
        raise InputError(
            f"invalid plan {plan!r}: expected /save=KIND+... or /recompute=KIND+... after the class"
        )
    return OpPolicy(mode.strip(), tuple(sorted({k.strip() for k in kinds.split("+") if k.strip()})))


def recomputes_at_least(plan: Plan, other: Plan) -> bool:
    """Whether ``plan`` recomputes in backward everything ``other`` does (so at equal batch size it is no
    faster): every class ``other`` checkpoints, ``plan`` checkpoints at a ratio at least as large, with an
    operator policy that recomputes at least the same kinds; a plan with ``own:off`` recomputes less than
    one without it (the script's own checkpointing is on then), never at least as much. ``all`` is compared only with itself (which
    classes it names is known to the probe, not to the plan)."""
    if plan.own_off and not other.own_off:  # it recomputes less than the script does by itself
        return False
    if any(p.sharding != o.sharding for p in plan.entries for o in other.entries):
        return False  # resharding less is faster, offload slower: no order beside the recompute's
    if other.own_off and not plan.own_off:  # the script's own recompute is more than what other leaves
        other = dataclasses.replace(other, own_off=False)
    if other.is_none or other == Plan(own_off=True):  # nothing of autotune's to recompute at least
        return True
    if plan.ranks or other.ranks:  # rank by rank; a plan that is not per rank stands for every rank
        if plan.ranks and other.ranks and len(plan.ranks) != len(other.ranks):
            return False
        count = max(len(plan.ranks), len(other.ranks))
        return all(recomputes_at_least(plan.for_rank(r), other.for_rank(r)) for r in range(count))
    if plan.everything or other.everything:
        return plan == other
    # torch.compile's partitions at two budgets are two knapsack solutions, not one inside the other
    if other.compile_budget is not None and plan.compile_budget != other.compile_budget:
        return False
    for rule in other.rules:
        mine = next((r for r in plan.rules if r.cls == rule.cls), None)
        if (
            mine is None
            or mine.offload != rule.offload
            or mine.ratio < rule.ratio
            or not _recomputed(mine.ops) >= _recomputed(rule.ops)
        ):
            return False
    return True


def _recomputed(ops: OpPolicy | None) -> set[str]:
    """The operator kinds a checkpointed region recomputes under ``ops`` (all of them without a policy)."""
    return {kind for kind in OP_KINDS if ops is None or not ops.saves(kind)}


# the memory model asks it of every plan it predicts, many times a proposal
@functools.lru_cache(maxsize=4096)
def recompute_part(plan: str) -> str | None:
    """For a plan that names a sharding (fsdp, zero): the rest of it, "none" where there is no rest (what it
    recomputes, its compile budget, own:off: what sets the activations a sample keeps, which the sharding
    does not change). None for any other plan, and for text that is not a PyTorch plan (an ORT plan)."""
    if f"{FSDP}:" not in plan and f"{ZERO}:" not in plan:
        return None
    try:
        parsed = parse_plan(plan)
    except InputError:
        return None
    return None if parsed.sharding is None else str(dataclasses.replace(parsed, sharding=None))


def offloads(plan: str) -> bool:
    """Whether ``plan`` keeps saved tensors in host memory (a ``/offload`` rule; a plan per rank: any entry)."""
    return "/offload" in plan
