"""The memory model: peak(batch, plan) ≈ fixed + batch x per_sample(plan), fitted to measured trials.

``fixed`` (weights, gradients, optimizer state, runtime, CUDA context) is shared by every plan; each plan
has its own per-sample slope. One plan measured at two batch sizes calibrates ``fixed``; every other plan
then needs one measurement. A plan not measured yet takes ``none``'s slope minus the saving per sample the
probe predicted for it (``savings``), or else the largest known slope: without a prediction it errs on the
side of fitting less.

Measurement always overrules the model: a configuration that was measured is judged by its measurement,
and a batch that was measured over the limit (or ran out of memory) bounds the larger batch sizes of its
own plan. Nothing is assumed across plans: a plan predicted (or even measured, at other batch sizes) to
save more per sample than another may still peak higher at some batch size, and the physical peak of a
plan parameter is not monotonic (torch.compile's budget: pytorch issue 197838). The model orders
candidates; only a measurement, or a larger batch of the same plan, rules one out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from autotune.core.budget import fits
from autotune.core.protocol import Outcome

MIN_SLOPE_SHARE = 0.05  # no plan keeps less than this share of the activations per sample
SAVING_DOUBT = 2.0  # an optimistic bound takes the probe's predicted saving as up to this many times too low


@dataclass(frozen=True)
class Observation:
    batch_size: int
    plan: str
    peak_bytes: int
    complete: bool  # False: the trial ran out of memory, so the peak is only a lower bound

    @property
    def outcome(self) -> Outcome:
        return Outcome.COMPLETE if self.complete else Outcome.OOM


@dataclass(frozen=True)
class MemoryModel:
    fixed: float | None = None
    per_sample: dict[str, float] = field(default_factory=dict)
    observations: tuple[Observation, ...] = ()
    savings: dict[str, float] = field(default_factory=dict)  # predicted saving per sample vs none (the probe)

    @classmethod
    def fit(cls, observations: Sequence[Observation], savings: dict[str, float] | None = None) -> MemoryModel:
        complete = [o for o in observations if o.complete]
        plans = sorted({o.plan for o in complete})
        calibrated = any(len({o.batch_size for o in complete if o.plan == p}) >= 2 for p in plans)
        if not calibrated:
            return cls(observations=tuple(observations), savings=dict(savings or {}))
        # Least squares on [fixed, slope(plan_1), ..., slope(plan_k)].
        rows = np.zeros((len(complete), 1 + len(plans)))
        rows[:, 0] = 1.0
        for i, o in enumerate(complete):
            rows[i, 1 + plans.index(o.plan)] = o.batch_size
        peaks = np.array([o.peak_bytes for o in complete], dtype=float)
        solution = np.linalg.lstsq(rows, peaks, rcond=None)[0]
        slopes = {plan: max(float(s), 1.0) for plan, s in zip(plans, solution[1:], strict=True)}
        return cls(
            fixed=max(float(solution[0]), 0.0),
            per_sample=slopes,
            observations=tuple(observations),
            savings=dict(savings or {}),
        )

    @property
    def calibrated(self) -> bool:
        return self.fixed is not None

    def predict(self, batch_size: int, plan: str) -> float | None:
        """Predicted peak in bytes, or None before calibration."""
        if self.fixed is None:
            return None
        return self.fixed + batch_size * self.slope(plan)

    def slope(self, plan: str) -> float:
        """Bytes per sample of ``plan``: measured, else none's minus the predicted saving, else the largest."""
        if plan in self.per_sample:
            return self.per_sample[plan]
        if "none" in self.per_sample and plan in self.savings:
            return max(
                self.per_sample["none"] - self.savings[plan], MIN_SLOPE_SHARE * self.per_sample["none"]
            )
        return max(self.per_sample.values())

    def measured_saving(self, plan: str) -> float | None:
        """Bytes per sample ``plan`` saves against ``none``, from measurements alone (None if either is unmeasured)."""
        if plan not in self.per_sample or "none" not in self.per_sample:
            return None
        return self.per_sample["none"] - self.per_sample[plan]

    def saving(self, plan: str) -> float | None:
        """Bytes per sample ``plan`` saves against ``none``: measured, else the probe's prediction (None if
        neither is known)."""
        if plan == "none":
            return 0.0
        measured = self.measured_saving(plan)
        return measured if measured is not None else self.savings.get(plan)

    def ceiling(self, plan: str, limit: int) -> int | None:
        """The smallest batch size measured not to fit with ``plan``: no batch size from there up can fit
        ``plan`` (a plan's peak grows with its batch size; no other plan's measurement bounds it)."""
        bounding = [
            o.batch_size
            for o in self.observations
            if o.plan == plan and not fits(o.outcome, o.peak_bytes, limit)
        ]
        return min(bounding, default=None)

    def optimistic_slope(self, plan: str) -> float:
        """The fewest bytes per sample ``plan`` may take: measured, else none's minus SAVING_DOUBT times the
        probe's predicted saving, else (nothing known) MIN_SLOPE_SHARE of the smallest slope measured."""
        if plan in self.per_sample:
            return self.per_sample[plan]
        floor = MIN_SLOPE_SHARE * min(self.per_sample.values())
        if "none" in self.per_sample and plan in self.savings:
            return max(self.per_sample["none"] - SAVING_DOUBT * self.savings[plan], floor)
        return floor

    def largest_possible(self, plan: str, batch_sizes: Sequence[int], limit: int) -> int | None:
        """The largest batch size ``plan`` could fit below its ceiling with its optimistic slope: how far a
        plan not measured yet might reach (what the stopping rule values it at)."""
        if self.fixed is None:
            return None
        ceiling = self.ceiling(plan, limit)
        fitting = [
            b
            for b in batch_sizes
            if (ceiling is None or b < ceiling) and self.fixed + b * self.optimistic_slope(plan) <= limit
        ]
        return max(fitting, default=None)

    def largest_fitting(self, plan: str, batch_sizes: Sequence[int], limit: int) -> int | None:
        """The largest batch size for ``plan`` that was measured to fit, or is predicted to fit and lies
        below its ceiling (see :meth:`ceiling`)."""
        measured = {o.batch_size: o for o in self.observations if o.plan == plan}
        ceiling = self.ceiling(plan, limit)
        best = None
        for batch in batch_sizes:
            if ceiling is not None and batch >= ceiling:
                break
            observed = measured.get(batch)
            predicted = self.predict(batch, plan)
            if observed is not None or (predicted is not None and predicted <= limit):
                best = batch
        return best
