"""The search space: batch sizes x recompute plans.

Batch sizes are a ladder — powers of two and the midpoints between them (1, 2, 3, 4, 6, 8, 12, 16, 24,
...) — which GPUs like and which keeps neighbouring candidates 25-50% apart. ``--batch-sizes`` takes a
range (``8-512``: the ladder within it) or a list (``8,16,24``). The default range is the whole ladder up to
65536: the memory model then skips, without running them, the batch sizes it predicts cannot fit, so the
range that is actually searched is derived from the model and the budget.

With a global batch (``--global-batch G``) the batch sizes are the micro-batches ``b`` that divide ``G``, and
each trial accumulates ``G / b`` of them per optimizer step: every configuration trains the same global batch.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.backends import parse_backend_plan
from autotune.backends.probe import default_plans, named_plans
from autotune.backends.probe_report import ProbeReport
from autotune.core.batches import micro_batches, per_rank
from autotune.core.errors import InputError
from autotune.core.plans import Backend, parse_plan

DEFAULT_MAX_BATCH = 65536
MAX_BATCH_SIZE = 2**31 - 1  # what every database's integer columns (and Optuna's params) hold


@dataclass(frozen=True)
class SearchSpace:
    batch_sizes: tuple[int, ...]  # micro-batches, with a global batch
    plans: tuple[str, ...]  # canonical plan strings; "none" first when present
    excluded: dict[str, str] = field(default_factory=dict)  # plans the probe left out, with why
    global_batch: int | None = None  # each trial accumulates global_batch / batch_size micro-batches
    declared_accum: int | None = None  # --grad-accum: the script accumulates this many on its own
    world_size: int = 1  # ranks per trial (torchrun): a global batch is shared among them
    max_seq_len: int | None = None  # --max-seq-len: peaks are read at this length (autotune.search.longest)

    def grad_accum(self, batch_size: int) -> int | None:
        """The accumulation a trial at ``batch_size`` runs with (None: the script's own, counted)."""
        if self.global_batch is not None:
            return self.global_batch // (batch_size * self.world_size)
        return self.declared_accum

    @property
    def uniform_plans(self) -> tuple[str, ...]:
        """The plans every rank applies alike (all of them, for a one-process trial, or where only plans
        per rank were named: those are then searched like any plan)."""
        return tuple(p for p in self.plans if "|" not in p) or self.plans

    @property
    def rank_plans(self) -> tuple[str, ...]:
        """The plans that differ by rank: measured once the ranks' peaks are seen to differ."""
        return tuple(p for p in self.plans if "|" in p) if self.uniform_plans != self.plans else ()

    def as_dict(self) -> dict[str, Any]:
        """What names the search (in the study key): the excluded plans follow from the probe."""
        space: dict[str, Any] = {"batch_sizes": list(self.batch_sizes), "plans": list(self.plans)}
        if self.global_batch is not None:
            space["global_batch"] = self.global_batch
        if self.declared_accum is not None:
            space["grad_accum"] = self.declared_accum
        if self.world_size > 1:
            space["world_size"] = self.world_size
        if self.max_seq_len is not None:
            space["max_seq_len"] = self.max_seq_len
        return space

    @classmethod
    def from_dict(cls, space: dict[str, Any]) -> SearchSpace:
        """The space a study row stores (``as_dict``)."""
        return cls(
            tuple(space["batch_sizes"]),
            tuple(space["plans"]),
            global_batch=space.get("global_batch"),
            declared_accum=space.get("grad_accum"),
            world_size=space.get("world_size", 1),
            max_seq_len=space.get("max_seq_len"),
        )


FINE_BELOW = 8  # every batch size up to this one is on the ladder


def ladder(low: int, high: int) -> tuple[int, ...]:
    """Powers of two and their midpoints (x1.5) within [low, high], and every batch size up to FINE_BELOW:
    where a large model's frontier lies (GPT-2 medium in 12 GiB on an H100: batch 7 with checkpointing,
    43.7 samples/s at 8 over the limit, 36.6 at 6; issue 31), a rung is a large share of the batch."""
    values: set[int] = {v for v in range(1, FINE_BELOW + 1) if low <= v <= high}
    power = 1
    while power <= high:
        values.update(v for v in (power, power * 3 // 2) if low <= v <= high)
        power *= 2
    return tuple(sorted(values))


def parse_batch_sizes(text: str | None) -> tuple[int, ...]:
    """``None`` (the default ladder), ``LOW-HIGH`` (the ladder within) or ``A,B,C``.

    Raises:
        InputError: one line naming the bad value.
    """
    if text is None:
        return ladder(1, DEFAULT_MAX_BATCH)
    sizes = _parse_batch_sizes(text)
    if sizes[-1] > MAX_BATCH_SIZE:
        raise InputError(f"invalid batch sizes {text!r}: at most {MAX_BATCH_SIZE}, got {sizes[-1]}")
    return sizes


def _parse_batch_sizes(text: str) -> tuple[int, ...]:
    spec = text.strip()
    if match := re.fullmatch(r"(\d+)\s*-\s*(\d+)", spec, re.ASCII):
        low, high = int(match[1]), int(match[2])
        if not 1 <= low <= high:
            raise InputError(f"invalid batch-size range {text!r}: expected LOW-HIGH with 1 <= LOW <= HIGH")
        return ladder(low, high) or (low,)
    if re.fullmatch(r"\d+(\s*,\s*\d+)*", spec, re.ASCII):
        values = sorted({int(v) for v in spec.split(",")})
        if values[0] < 1:
            raise InputError(f"invalid batch sizes {text!r}: batch sizes must be positive")
        return tuple(values)
    raise InputError(
        f"invalid batch sizes {text!r}: expected a range such as 8-512 or a list such as 8,16,32"
    )


def micro_batch_sizes(global_batch: int, batch_sizes: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """The micro-batches of a global batch (its divisors), within the range of ``batch_sizes`` if given
    (the default ladder leaves every divisor in).

    Raises:
        InputError: none of them lies in that range.
    """
    divisors = micro_batches(global_batch)
    if batch_sizes is None or batch_sizes == parse_batch_sizes(None):
        return divisors
    inside = tuple(b for b in divisors if batch_sizes[0] <= b <= batch_sizes[-1])
    if not inside:
        raise InputError(
            f"no divisor of --global-batch {global_batch} lies within --batch-sizes "
            f"{batch_sizes[0]}-{batch_sizes[-1]}: its micro-batches are {', '.join(map(str, divisors))}"
        )
    return inside


def parse_plan_list(texts: Sequence[str], backend: Backend | str = Backend.TORCH) -> tuple[str, ...]:
    """Plans given with ``--plans`` (separated by ';' or given several times), canonical and deduplicated."""
    plans: list[str] = []
    for text in texts:
        for part in text.split(";"):
            if part.strip():
                plan = str(parse_backend_plan(part, backend))
                if plan not in plans:
                    plans.append(plan)
    if not plans:
        raise InputError("--plans names no plan")
    return tuple(plans)


def build_space(
    batch_sizes: tuple[int, ...],
    plans: tuple[str, ...] | None,
    probe: ProbeReport | None,
    global_batch: int | None = None,
    declared_accum: int | None = None,
    world_size: int = 1,
    max_seq_len: int | None = None,
) -> SearchSpace:
    """The user's plans, or the defaults from the probe (autotune.backends.probe.default_plans: for torch
    the module-level plans with the operator-level ones that are predicted to save memory and passed the
    probe's correctness check; for ORT its own plans with the largest savings and its levels). With a
    global batch, only the batch sizes that divide each rank's share of it. With several ranks, the default
    plans also give the ranks plans of their own (:func:`rank_plans`)."""
    if global_batch is not None:
        batch_sizes = micro_batch_sizes(per_rank(global_batch, world_size), batch_sizes)
    if plans:
        kept, excluded = named_plans(plans, probe)
        return SearchSpace(batch_sizes, kept, excluded, global_batch, declared_accum, world_size, max_seq_len)
    defaults, excluded = default_plans(probe)
    if world_size > 1:
        defaults = (*defaults, *rank_plans(defaults, world_size))
    return SearchSpace(batch_sizes, defaults, excluded, global_batch, declared_accum, world_size, max_seq_len)


def rank_plans(plans: tuple[str, ...], world_size: int) -> tuple[str, ...]:
    """Plans per rank for a job whose ranks differ (a pipeline's first stages keep the activations of more
    micro-batches than its last): over the levels ``none`` and the first checkpointed class at each ratio the
    space has (``Block:0.25`` ... ``Block:1``), the first ``k`` ranks at one level and the others at another,
    for every split ``k`` and every pair of levels. Ordered by how much they recompute, the least first: the
    search measures them only once the ranks' measured peaks differ (autotune.search.propose)."""
    # a plain class rule (not own:off, a compile budget or a sharding, which have no class: the sharding of
    # a block's ranks must be one)
    ladder = [p for p in plans if "/" not in p and "," not in p and "|" not in p and parse_plan(p).rules]
    if not ladder:
        return ()
    cls = parse_plan(ladder[0]).rules[0].cls
    levels = ["none", *sorted((p for p in ladder if parse_plan(p).rules[0].cls == cls),
                              key=lambda p: parse_plan(p).rules[0].ratio)]  # fmt: skip
    found = {}
    for split in range(1, world_size):
        for head in range(len(levels)):
            for tail in range(len(levels)):
                if head != tail:
                    entries = [levels[head]] * split + [levels[tail]] * (world_size - split)
                    found["|".join(entries)] = sum(levels.index(e) for e in entries)
    return tuple(sorted(found, key=lambda p: (found[p], p)))
