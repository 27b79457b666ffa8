"""The search's algorithm, as small free functions over trial records: fit the memory model, propose the
next configuration (calibration, then the frontier), pick the best fitting trial. No Optuna, no database.

- *Calibration*: the first plan at the smallest batch size, then one about 4x larger (and the ones
  between, if a larger one did not fit), until the memory model has two batch sizes of one plan.
- *Frontier*: for each plan in order, the largest batch size measured or predicted to fit.
- Nothing left to propose: None, and the caller lets the sampler choose.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from autotune.core.protocol import Outcome
from autotune.search.memory_model import MemoryModel, Observation
from autotune.search.records import TrialRecord
from autotune.search.space import SearchSpace

Configuration = tuple[int, str]  # (batch size, plan)


@dataclass(frozen=True)
class Proposal:
    batch_size: int
    plan: str
    why: str  # "calibration", "frontier"


def model_of(records: Iterable[TrialRecord], savings: dict[str, float] | None = None) -> MemoryModel:
    """The memory model fitted to every measured peak (an OOM's peak as a lower bound)."""
    return MemoryModel.fit(
        [
            Observation(r.batch_size, r.plan, r.peak_bytes, r.outcome is Outcome.COMPLETE)
            for r in records
            if r.measured and r.batch_size is not None and r.plan is not None and r.peak_bytes is not None
        ],
        savings,
    )


def propose(
    records: list[TrialRecord],
    model: MemoryModel,
    space: SearchSpace,
    limit: int,
    taken: Iterable[Configuration] = (),
) -> Proposal | None:
    """The next configuration the model wants measured, or None to let the sampler choose.

    ``taken``: configurations leased by any worker (running, queued or ended)."""
    # Anything that ended (a failure too: a broken plan is not proposed again) or is under way.
    tried = {
        (r.batch_size, r.plan) for r in records if r.outcome is not None or r.state in ("RUNNING", "WAITING")
    } | set(taken)
    if not model.calibrated:
        return _calibration(records, space, limit, tried)
    for plan in space.plans:
        largest = model.largest_fitting(plan, space.batch_sizes, limit)
        if largest is not None and (largest, plan) not in tried:
            return Proposal(largest, plan, "frontier")
    return None


def _calibration(
    records: list[TrialRecord], space: SearchSpace, limit: int, tried: set[tuple[int | None, str | None]]
) -> Proposal | None:
    """The first plan's next calibration batch below the smallest one measured not to fit."""
    first = space.plans[0]
    failing = min(
        (
            r.batch_size
            for r in records
            if r.plan == first and r.measured and not r.fits(limit) and r.batch_size is not None
        ),
        default=None,
    )
    for batch in calibration_batches(space.batch_sizes):
        if (batch, first) not in tried and (failing is None or batch < failing):
            return Proposal(batch, first, "calibration")
    return None


def calibration_batches(batch_sizes: tuple[int, ...]) -> list[int]:
    """The smallest batch size, then one about 4x larger, then the ones between."""
    low = batch_sizes[0]
    wide = next((b for b in batch_sizes if b >= 4 * low), batch_sizes[-1])
    return [low, wide, *(b for b in batch_sizes if low < b < wide)]
