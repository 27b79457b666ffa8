"""Calibration: the first trials of a search, which fit the memory model's fixed memory and a slope that
the noise does not hide, and the proof that a budget is hopeless.

The calibration plan is the first one, or, if it does not fit at the smallest batch size (or fits at it
alone, which gives no slope), the one expected to save the most, then the next (no plan is ruled out by
another's measurement). Its batch grows about GROWTH x a step from the smallest until its peaks rise
above the memory noise, and bisects below a failure
(autotune.search.memory_model.MemoryModel.calibration_batch). Once every plan was measured not to fit at
the smallest batch size, the budget is hopeless.
"""

from __future__ import annotations

from autotune.core.budget import format_bytes
from autotune.core.protocol import Outcome
from autotune.search.memory_model import GROWTH, MemoryModel
from autotune.search.records import Configuration, TrialRecord
from autotune.search.space import SearchSpace


def next_calibration(
    records: list[TrialRecord],
    model: MemoryModel,
    space: SearchSpace,
    limit: int,
    tried: set[Configuration],
) -> tuple[int, str] | None:
    """The calibration plan's next configuration (MemoryModel.calibration_batch: growing geometrically until
    its peaks rise above the noise, bisecting below a failure); None when it cannot grow any more or its
    next batch size is under way. The plan is the first one, or if it does not fit at the smallest batch
    size the one expected to save the most, then the next (no plan is ruled out by another's measurement).
    A plan that fits at one batch size only (the next one up failed) gives no slope: while no plan has
    given one, the calibration moves on to the next plan as if the first had not fitted."""
    smallest = space.batch_sizes[0]
    for plan in dict.fromkeys((space.uniform_plans[0], *by_saving(model, space))):
        if any(not r.fits(limit) for r in _measured(records, smallest, plan)):
            continue  # this plan cannot calibrate the model: it does not fit even at the smallest batch
        batch = model.calibration_batch(plan, space.batch_sizes, limit)
        if batch is None and not model.calibrated:
            continue  # it fits at one batch size only: no slope from it, the next plan's is needed
        if batch is not None and (batch, plan) in tried and not _measured(records, batch, plan):
            batch = _ahead(model, space, limit, plan, batch)  # another worker measures it: the next step
        if batch is None or (batch, plan) in tried:
            return None  # nothing left to grow to, or its next batch is under way (another worker's)
        return batch, plan
    return None


def _ahead(model: MemoryModel, space: SearchSpace, limit: int, plan: str, batch: int) -> int | None:
    """The calibration's step after ``batch``, while another worker measures it (as if it fitted): two
    GPUs calibrate at once, one step ahead at most."""
    ceiling = model.ceiling(plan, limit)
    ahead = next((b for b in space.batch_sizes if b >= GROWTH * batch), None)
    return ahead if ahead is not None and (ceiling is None or ahead < ceiling) else None


def by_saving(model: MemoryModel, space: SearchSpace) -> list[str]:
    """The plans, the one expected to save the most memory per sample first: the largest known saving,
    else one whose saving is unknown (it may save anything; the last in the space, which orders plans from
    none towards checkpointing more), else none."""

    def saving(plan: str) -> tuple[float, bool, int]:
        known = model.saving(plan)
        return (known or 0.0, known is None, space.plans.index(plan))

    return sorted(space.uniform_plans, key=saving, reverse=True)


def most_saving(model: MemoryModel, space: SearchSpace) -> str:
    """The plan expected to save the most memory per sample (see :func:`by_saving`)."""
    return by_saving(model, space)[0]


def hopeless(records: list[TrialRecord], model: MemoryModel, space: SearchSpace, limit: int) -> str | None:
    """Why no configuration can fit, once every plan was measured not to fit at the smallest batch size
    (None while something still could: no plan's failure says another will fail)."""
    smallest, plan = space.batch_sizes[0], most_saving(model, space)
    if not all(any(not r.fits(limit) for r in _measured(records, smallest, p)) for p in space.uniform_plans):
        return None
    lowest = min((r for r in records if r.measured), key=lambda r: r.peak_bytes or 0)
    bound = "" if lowest.outcome is Outcome.COMPLETE else " at least"
    plans = ""  # a search of no plans at all
    if space.uniform_plans != ("none",):
        plans = " with any plan" + (
            "" if plan == "none" else f", not even {plan} (the one that saves the most)"
        )
    return (
        f"no configuration fits {format_bytes(limit)} (budget minus headroom): the smallest batch, {smallest}, "
        f"does not fit{plans}; the smallest peak measured was{bound} "
        f"{format_bytes(lowest.peak_bytes or 0)} (batch {lowest.batch_size}, plan {lowest.plan}, trial "
        f"{lowest.number})"
    )


def _measured(records: list[TrialRecord], batch: int, plan: str) -> list[TrialRecord]:
    return [r for r in records if (r.batch_size, r.plan) == (batch, plan) and r.measured]
