"""How sure a throughput reading is: the median of a trial's per-step samples/s with an interval around it.

The interval is the median's ~95% confidence interval that box plots draw as a notch (McGill, Tukey and
Larsen, 1978): ``median ± 1.57 · IQR / √n`` (with three steps the IQR's robust stand-in, 1.349 · MAD, so one
step that a timer or the machine made absurd does not blow it up; with two, the half range). It is never
narrower than ``NOISE_FLOOR`` of the median: two trials of one configuration on one machine differ by about
that much even when their steps agree (the machine's clocks, caches and neighbours move between trials).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

NOISE_FLOOR = 0.01  # the narrowest relative half-width a reading gets
NOTCH = 1.57
IQR_PER_MAD = 2 * 0.6745  # a normal sample's IQR is ~1.349 MADs


@dataclass(frozen=True)
class Interval:
    low: float
    mid: float
    high: float

    @classmethod
    def stored(cls, mid: float, low: float | None, high: float | None) -> Interval:
        """A stored reading's interval: ±NOISE_FLOOR around ``mid`` where none was stored (a trial or a
        winner stored before intervals were kept)."""
        if low is None or high is None:
            return cls(mid * (1 - NOISE_FLOOR), mid, mid * (1 + NOISE_FLOOR))
        return cls(low, mid, high)

    @property
    def noise(self) -> float:
        """Relative half-width: 0.05 is ±5%."""
        return (self.high - self.low) / 2 / self.mid if self.mid > 0 else 0.0

    def overlaps(self, other: Interval) -> bool:
        return self.low <= other.high and other.low <= self.high

    def __str__(self) -> str:
        return f"{self.mid:,.1f} ±{100 * self.noise:.0f}%"


def median_interval(values: Sequence[float]) -> Interval | None:
    """The median of ``values`` with its interval (see the module docstring); None for no values."""
    if not values:
        return None
    mid = statistics.median(values)
    if len(values) >= 4:
        q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
        half = NOTCH * (q3 - q1) / math.sqrt(len(values))
    elif len(values) == 3:  # the notch with the IQR's robust stand-in: one outlying step does not count
        half = NOTCH * IQR_PER_MAD * statistics.median(abs(v - mid) for v in values) / math.sqrt(3)
    else:
        half = (max(values) - min(values)) / 2
    half = min(max(half, NOISE_FLOOR * mid), mid)  # never below the floor, never past zero
    return Interval(mid - half, mid, mid + half)


def pooled(readings: Sequence[Interval]) -> Interval | None:
    """Several readings of one configuration as one: the median of their medians. Its interval is the
    widest of: the readings' spread (with three or more, robustly, ``1.96 · 1.4826 · MAD / √n``, so one
    outlier among agreeing readings does not widen it; with two, their half range), the narrowest
    reading's own noise, and NOISE_FLOOR."""
    if not readings:
        return None
    mids = [r.mid for r in readings]
    mid = statistics.median(mids)
    if len(mids) >= 3:
        mad = statistics.median(abs(m - mid) for m in mids)
        spread = 1.96 * 1.4826 * mad / math.sqrt(len(mids))
    else:
        spread = (max(mids) - min(mids)) / 2
    half = max(spread, min(r.noise for r in readings) * mid, NOISE_FLOOR * mid)
    return Interval(max(mid - half, 0.0), mid, mid + half)  # a speed is never below 0
