"""The throughput interval of a reading and of several readings pooled (autotune.core.stats)."""

from __future__ import annotations

import pytest

from autotune.core.plans import parse_plan, recomputes_at_least
from autotune.core.stats import Interval, median_interval, pooled


def test_a_reading_s_interval_is_the_median_s_notch_never_narrower_than_the_floor() -> None:
    steps = [100.0, 102.0, 98.0, 101.0, 99.0, 100.0, 103.0, 97.0]  # IQR 3.0 (inclusive quartiles)
    speed = median_interval(steps)
    assert speed is not None and speed.mid == 100.0
    assert speed.high - speed.mid == pytest.approx(1.57 * 2.5 / 8**0.5)  # quartiles 98.75 and 101.25
    assert median_interval([50.0] * 6) == Interval(49.5, 50.0, 50.5)  # ±1%: never a point
    three = median_interval([90.0, 100.0, 110.0])  # three steps: 1.57 x 1.349 x MAD / sqrt(3)
    assert three is not None and three.high - 100.0 == pytest.approx(1.57 * 1.349 * 10 / 3**0.5)
    outlier = median_interval([100.0, 101.0, 60000.0])  # one absurd step (a timer's): ±1.2%, not ±30000%
    assert outlier is not None and outlier.noise == pytest.approx(1.57 * 1.349 * 1 / 3**0.5 / 101)
    assert median_interval([100.0, 10000.0]) == Interval(100.0, 5050.0, 10000.0)  # two: the half range
    assert median_interval([]) is None


def test_pooled_readings_take_their_median_and_one_outlier_does_not_widen_it() -> None:
    slow, fast = Interval(312, 315, 318), Interval(406, 410, 414)
    assert pooled([slow, fast, fast]) == Interval(405.9, 410, 414.1)  # MAD 0: the readings' own ±1%
    two = pooled([slow, fast])
    assert two is not None and (two.low, two.mid, two.high) == (315.0, 362.5, 410.0)  # two disagree: wide


def test_a_plan_recomputes_at_least_another_when_it_covers_its_classes_ratios_and_operators() -> None:
    def covers(a: str, b: str) -> bool:
        return recomputes_at_least(parse_plan(a), parse_plan(b))

    assert covers("Block:1", "Block:0.5") and not covers("Block:0.5", "Block:1")
    assert covers("Block:1", "Block:1/save=matmul")  # full recompute covers a selective one
    assert not covers("Block:1/save=matmul", "Block:1")
    assert covers("Block:1/save=matmul", "Block:1/recompute=softmax")
    assert covers("Block:1,MLP:1", "MLP:0.5") and not covers("Block:1", "MLP:0.5")
    assert covers("Block:1", "none") and covers("all", "all") and not covers("all", "Block:1")
