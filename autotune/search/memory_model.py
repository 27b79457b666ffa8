"""The memory model: peak(batch, plan) ≈ fixed + batch x per_sample(plan), fitted to measured trials.

``fixed`` (weights, gradients, optimizer state, runtime, CUDA context) is shared by every plan; each plan
has its own per-sample slope. One plan measured at two batch sizes calibrates ``fixed``; every other plan
then needs one measurement. A plan not measured yet takes ``none``'s slope minus the saving per sample the
probe predicted for it (``savings``), or else the largest known slope: without a prediction it errs on the
side of fitting less.

Measurement always overrules the model: a configuration that was measured is judged by its measurement,
and a batch that was measured over the limit (or ran out of memory) bounds that plan's batch sizes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from autotune.core.budget import fits
from autotune.core.protocol import Outcome


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
            return max(self.per_sample["none"] - self.savings[plan], 0.05 * self.per_sample["none"])
        return max(self.per_sample.values())

    def measured_saving(self, plan: str) -> float | None:
        """Bytes per sample ``plan`` saves against ``none``, from measurements alone (None if either is unmeasured)."""
        if plan not in self.per_sample or "none" not in self.per_sample:
            return None
        return self.per_sample["none"] - self.per_sample[plan]

    def largest_fitting(self, plan: str, batch_sizes: Sequence[int], limit: int) -> int | None:
        """The largest batch size for ``plan`` that was measured to fit, or is predicted to fit and lies
        below every batch size measured not to fit."""
        measured = {o.batch_size: o for o in self.observations if o.plan == plan}
        failing = [b for b, o in measured.items() if not fits(o.outcome, o.peak_bytes, limit)]
        ceiling = min(failing, default=None)
        best = None
        for batch in batch_sizes:
            if ceiling is not None and batch >= ceiling:
                break
            observed = measured.get(batch)
            predicted = self.predict(batch, plan)
            if observed is not None or (predicted is not None and predicted <= limit):
                best = batch
        return best
