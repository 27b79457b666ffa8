"""The throughput model: samples/s over (batch, plan), beside the memory model, to know when a search has won.

A training step takes a fixed time ``t0`` (kernel launches, the optimizer step, synchronisation) plus ``t1``
per sample, so throughput ``b / (t0 + t1·b)`` rises with the batch size and saturates at ``1/t1``. A
recompute plan repeats part of the forward pass: at equal batch size its step is ``1 + overhead`` times as
long. ``t0`` and ``t1`` are fitted to the reference plan's readings (``none`` when it was measured); a
plan's overhead is measured once the plan has a reading, and until then predicted from the probe: the
share of the forward pass the plan repeats, times the share of a step the forward pass takes.

Dominance follows: at equal batch size ``none`` is at least as fast as any recompute plan (an overhead is
never negative against ``none``), and a plan that recomputes everything another plan does
(autotune.core.plans.recomputes_at_least) is no faster than it.

The search asks for an *optimistic* prediction, the most a configuration could reach given what was read
and how noisy the readings were: the fit plus the readings' noise; beyond the largest batch measured, the
flattest step-time line the noisy readings allow (with one batch size measured: throughput proportional to
the batch, which no real step beats); for a plan, the smallest overhead its readings allow, or, unmeasured,
its probe's share times FORWARD_SHARE_OF_STEP, the least share of a step a forward pass takes. A
configuration whose optimistic prediction cannot beat the incumbent by more than the noise is not worth a
trial (autotune.search.propose).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from autotune.core.errors import InputError
from autotune.core.plans import parse_plan, recomputes_at_least
from autotune.core.stats import NOISE_FLOOR, Interval, pooled

# Backward costs about twice the forward, so a forward pass is about a third of a step; a fifth is the
# least it takes in the models measured here (an optimizer step and a data loader add to the rest).
FORWARD_SHARE_OF_STEP = 0.2
EXPECTED_FORWARD_SHARE = 1 / 3  # what a prediction (not a bound) assumes


@dataclass(frozen=True)
class Reading:
    batch_size: int
    plan: str
    throughput: Interval  # samples/s


@dataclass(frozen=True)
class ThroughputModel:
    reference: str | None = None  # the plan t0 and t1 were fitted to
    t0: float | None = None  # seconds per step, fitted (None: fewer than two batch sizes measured)
    t1: float | None = None  # seconds per sample, fitted
    largest: int = 0  # the largest batch size of the reference plan that was measured
    flat: tuple[float, float] = (0.0, 0.0)  # (t0, t1) of the flattest line the readings allow
    noise: float = NOISE_FLOOR  # the reference plan's readings' relative noise
    overhead: dict[str, Interval] = field(default_factory=dict)  # measured, per plan
    forward_shares: dict[str, float] = field(default_factory=dict)  # the probe's, per plan
    pooled: dict[tuple[int, str], Interval] = field(
        default_factory=dict
    )  # the readings of each configuration

    @classmethod
    def fit(
        cls, readings: Sequence[Reading], forward_shares: dict[str, float] | None = None
    ) -> ThroughputModel:
        shares = dict(forward_shares or {})
        grouped: dict[tuple[int, str], list[Interval]] = defaultdict(list)
        for r in readings:
            grouped[(r.batch_size, r.plan)].append(r.throughput)
        configs = {key: p for key, values in grouped.items() if (p := pooled(values)) is not None}
        by_plan: dict[str, dict[int, Interval]] = defaultdict(dict)
        for (batch, plan), speed in configs.items():
            by_plan[plan][batch] = speed
        if not by_plan:
            return cls(forward_shares=shares)
        reference = (
            "none" if "none" in by_plan else max(by_plan, key=lambda p: (len(by_plan[p]), p == "none"))
        )
        base = by_plan[reference]
        t0, t1, flat = _fit_line(base)
        model = cls(
            reference=reference,
            t0=t0,
            t1=t1,
            largest=max(base),
            flat=flat,
            noise=max(s.noise for s in base.values()),
            forward_shares=shares,
            pooled=configs,
        )
        overhead = {
            plan: o
            for plan, points in by_plan.items()
            if plan != reference and (o := model._overhead(points))
        }
        return dataclasses.replace(model, overhead=overhead)

    @property
    def fitted(self) -> bool:
        return self.t0 is not None and self.t1 is not None

    def reference_step(self, batch: int) -> float | None:
        """Seconds per step of the reference plan at ``batch`` (None before two batch sizes are measured)."""
        if self.t0 is None or self.t1 is None:
            return None
        return self.t0 + self.t1 * batch

    def predict(self, batch: int, plan: str) -> float | None:
        """Expected samples/s of ``plan`` at ``batch`` (None before the fit)."""
        step = self.reference_step(batch)
        if step is None or step <= 0:
            return None
        return batch / step / (1 + self._overhead_estimate(plan))

    def optimistic(self, batch: int, plan: str) -> float | None:
        """The most ``plan`` at ``batch`` could reach (see the module docstring); None with no reading."""
        if self.reference is None:
            return None
        flat_t0, flat_t1 = self.flat
        at = max(batch, self.largest)  # below the largest batch measured, the flattest line is flat at it
        flat = at / (flat_t0 + flat_t1 * at) if flat_t0 + flat_t1 * at > 0 else float("inf")
        fitted = self.predict(batch, self.reference)
        if fitted is None:
            base = flat
        elif batch > self.largest:
            base = max(fitted * (1 + self.noise), flat)
        else:
            base = fitted * (1 + self.noise)
        return base / (1 + self.least_overhead(plan))

    def least_overhead(self, plan: str) -> float:
        """The smallest overhead ``plan`` may have against the reference plan: what its readings allow, no
        less than what a plan it recomputes at least as much as was measured at; unmeasured, its probe's
        forward share times FORWARD_SHARE_OF_STEP; 0 for the reference plan and anything unknown."""
        if plan == self.reference:
            return 0.0
        own = self.overhead.get(plan)
        least = own.low if own is not None else self.forward_shares.get(plan, 0.0) * FORWARD_SHARE_OF_STEP
        for other, measured in self.overhead.items():
            if other != plan and _recomputes_at_least(plan, other):
                least = max(least, measured.low)
        return max(least, 0.0) if self.reference == "none" else least

    def _overhead_estimate(self, plan: str) -> float:
        if plan == self.reference:
            return 0.0
        own = self.overhead.get(plan)
        if own is not None:
            return own.mid
        return self.forward_shares.get(plan, 0.0) * EXPECTED_FORWARD_SHARE

    def _overhead(self, points: dict[int, Interval]) -> Interval | None:
        """A plan's overhead from its readings: its step time over the reference plan's at the same batch
        size (measured there, or fitted), minus one; the interval from both readings' noise."""
        ratios = []
        for batch, speed in points.items():
            ref = self.pooled.get((batch, self.reference or ""))
            ref_speed = ref.mid if ref is not None else self.predict(batch, self.reference or "")
            if ref_speed is None:
                continue
            noise = speed.noise + (ref.noise if ref is not None else self.noise)
            ratio = ref_speed / speed.mid  # step time ratio at equal batch size
            ratios.append(Interval(ratio * (1 - noise) - 1, ratio - 1, ratio * (1 + noise) - 1))
        if not ratios:
            return None
        return Interval(
            min(r.low for r in ratios), float(np.median([r.mid for r in ratios])), max(r.high for r in ratios)
        )


def _fit_line(points: dict[int, Interval]) -> tuple[float | None, float | None, tuple[float, float]]:
    """Step time = t0 + t1·batch, least squares with t0, t1 >= 0, and the flattest line the noise allows."""
    batches = sorted(points)
    steps = np.array([b / points[b].mid for b in batches])
    low, high = batches[0], batches[-1]
    slow_at_low = low / points[low].low  # the slowest step the smallest batch's reading allows
    fast_at_high = high / points[high].high  # the fastest the largest batch's allows
    if len(batches) < 2:  # one batch size: throughput proportional to the batch is the most it can be
        return None, None, (fast_at_high, 0.0)
    flat_t1 = max((fast_at_high - slow_at_low) / (high - low), 0.0)
    flat_t0 = max(fast_at_high - flat_t1 * high, 0.0)
    b = np.array(batches, dtype=float)
    t0, t1 = np.linalg.lstsq(np.stack([np.ones_like(b), b], axis=1), steps, rcond=None)[0]
    if t1 < 0:  # a step that gets faster with more samples is noise: constant step time
        t0, t1 = float(np.mean(steps)), 0.0
    elif t0 < 0:  # no fixed cost: per-sample time only
        t0, t1 = 0.0, float(np.sum(steps * b) / np.sum(b * b))
    return float(t0), float(t1), (flat_t0, flat_t1)


def _recomputes_at_least(plan: str, other: str) -> bool:
    """recomputes_at_least on plan strings; False for a plan it cannot read (an ORT plan)."""
    try:
        return recomputes_at_least(parse_plan(plan), parse_plan(other))
    except InputError:
        return False
