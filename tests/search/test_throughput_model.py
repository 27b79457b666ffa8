"""The throughput model on exact readings: b / (t0 + t1·(1 + overhead)·b), fitted, bounded, dominated."""

from __future__ import annotations

import pytest

from autotune.core.stats import Interval
from autotune.search.throughput_model import FORWARD_SHARE_OF_STEP, Reading, ThroughputModel

T0, T1 = 0.05, 0.0005  # the synthetic script's --step-seconds and --per-sample-seconds


def speed(batch: int, overhead: float = 0.0, noise: float = 0.01) -> Interval:
    mid = batch / (T0 + T1 * (1 + overhead) * batch)
    return Interval(mid * (1 - noise), mid, mid * (1 + noise))


def fit(*readings: tuple[int, str, float], shares: dict[str, float] | None = None) -> ThroughputModel:
    return ThroughputModel.fit([Reading(b, p, speed(b, o)) for b, p, o in readings], shares)


def test_two_batch_sizes_fit_the_step_line_exactly_and_a_plan_s_overhead_per_sample() -> None:
    model = fit((1, "none", 0), (24, "none", 0), (24, "A:1", 0.25))
    assert model.line is not None
    assert (model.line.t0, model.line.t1) == (pytest.approx(T0), pytest.approx(T1))
    assert model.overhead["A:1"].mid == pytest.approx(0.25)
    assert model.predict(48, "A:1") == pytest.approx(speed(48, 0.25).mid)


def test_the_optimistic_prediction_bounds_the_truth_beyond_the_largest_batch_measured() -> None:
    near = fit((1, "none", 0), (4, "none", 0))
    far = fit((1, "none", 0), (4, "none", 0), (24, "none", 0))
    for batch in (32, 96, 1024):
        assert speed(batch).mid <= far.optimistic(batch, "none") <= near.optimistic(batch, "none")
    # ±1% at batch 1 and 4 allows a much flatter line than ±1% at 1 and 24: the bound tightens with range
    assert far.optimistic(96, "none") < 1.1 * speed(96).mid < near.optimistic(96, "none")
    one = fit((4, "none", 0))  # one batch size: proportional to the batch is the most it could be
    assert one.optimistic(8, "none") == pytest.approx(2 * speed(4).high)
    assert one.optimistic(2, "none") == pytest.approx(speed(4).high)


def test_dominance_against_none_and_between_plans_that_recompute_more() -> None:
    model = fit((1, "none", 0), (24, "none", 0), (24, "A:0.5", 0.4), shares={"A:1": 0.1, "B:1": 0.5})
    assert model.least_overhead("A:0.5") == pytest.approx(model.overhead["A:0.5"].low)
    assert model.least_overhead("A:1") == model.least_overhead("A:0.5")  # recomputes at least as much
    assert model.least_overhead("B:1") == pytest.approx(0.5 * FORWARD_SHARE_OF_STEP)  # the probe's share
    faster = fit((1, "none", 0), (24, "none", 0), (24, "C:1", -0.3))  # a plan read faster than none: noise
    assert faster.least_overhead("C:1") == 0.0
    assert faster.optimistic(24, "C:1") == faster.optimistic(24, "none")


def test_readings_that_pool_down_to_zero_leave_the_flattest_line_flat() -> None:
    """A compiled script's batch 8 read 36.9 and 87.4 samples/s among others: their pooled interval reached
    0, and the flattest line divided by it (ZeroDivisionError, the tuner down)."""
    model = ThroughputModel.fit(
        [
            Reading(8, "none", Interval(0.0, 60.0, 120.0)),
            Reading(32, "none", Interval(660.0, 669.0, 678.0)),
        ]
    )
    assert model.flat is not None and model.flat.t1 == 0.0
    assert model.optimistic(16, "none") is not None


def test_an_offload_plan_is_valued_at_most_at_what_its_copies_to_the_host_and_back_allow() -> None:
    """Issue 31: Block:1/offload was proposed at the largest batch size as if free, and ran 5x slower than
    Block:1 on an H100. Unmeasured, its least overhead is the time its copies take a sample beyond what the
    reference plan's step could hide them behind (its whole time per sample at its largest batch): copies
    of 4x that leave it at least 3x slower."""
    readings = [Reading(b, "none", speed(b)) for b in (1, 24)]
    per_sample = 1 / speed(24).low
    model = ThroughputModel.fit(readings, {}, {"B:1/offload": 4 * per_sample})
    assert model.least_overhead("B:1/offload") == pytest.approx(3.0)
    assert model.optimistic(96, "B:1/offload") < 0.5 * model.optimistic(96, "none")
    assert model.least_overhead("B:1") == 0.0  # no copies, no share: nothing known
    offload = Reading(24, "B:1/offload", speed(24, 0.5))
    measured = ThroughputModel.fit([*readings, offload], {}, {"B:1/offload": 4 * per_sample})
    assert measured.least_overhead("B:1/offload") < 1.0  # measured: its readings speak, not the bound


def test_an_offload_plan_is_bounded_where_small_batches_are_launch_bound() -> None:
    """On an H200, GPT-2 medium's none read 13.0 samples/s at batch 1 and 26.0 at 2: a step line through them
    has no per-sample time (t1 ~ 0), and a bound on t1 said nothing; offload was proposed at 7 and ran at 9.1
    samples/s (Block:1 at 5: 42.2). The whole step's time per sample at 2 bounds the compute the copies could
    hide behind, and however well they overlap, the link bounds the plan: 1 / 0.086 s = 11.6 samples/s."""

    def launch_bound(batch: int) -> Interval:
        return Interval(0.99 * 13 * batch, 13.0 * batch, 1.01 * 13 * batch)

    readings = [Reading(1, "none", launch_bound(1)), Reading(2, "none", launch_bound(2))]
    model = ThroughputModel.fit(readings, {}, {"O": 0.086})
    assert model.least_overhead("O") == pytest.approx(0.086 * 0.99 * 26 - 1)  # 1.2: at most 1/2.2 of none
    assert model.optimistic(7, "O") == pytest.approx(1 / 0.086)  # none's line says 91.9 at 7
