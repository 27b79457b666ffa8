"""A multi-process CPU trial's rank peaks are floored by each rank's own high-water mark, as its report gives
it: a sampler the machine starved once read 38.7 MiB for a two-node trial's rank that held 160 MiB from its
first step to its last (CI, beside three busy phases), and the trial's peak is the worst rank's."""

from __future__ import annotations

from autotune.core.protocol import Outcome, TrialReport
from autotune.hardware.meters import MemoryReading, RankPeak
from autotune.trials.measurement import ranks_own_high_water

MiB = 2**20


def report(rss_peak: int | None) -> TrialReport:
    return TrialReport(Outcome.COMPLETE, steps_done=3, rss_peak=rss_peak)


def test_a_rank_s_peak_is_never_below_its_own_high_water_mark() -> None:
    sampled = MemoryReading(
        337 * MiB, "rss-rank", 40, 4, ranks=(RankPeak(0, "cpu", 38 * MiB), RankPeak(1, "cpu", 337 * MiB))
    )
    reports = {0: report(200 * MiB), 1: report(300 * MiB), 2: report(90 * MiB), 3: report(None)}
    floored = ranks_own_high_water(sampled, reports)
    assert floored.ranks == (
        RankPeak(0, "cpu", 200 * MiB),  # its report's: the sampler missed it
        RankPeak(1, "cpu", 337 * MiB),  # sampled above its own mark (its tree: its workers too)
        RankPeak(2, "cpu", 90 * MiB),  # never sampled: its report's
    )
    assert floored.peak_bytes == 337 * MiB and floored.method == "rss-rank" and floored.samples == 40
    assert ranks_own_high_water(sampled, {0: report(400 * MiB)}).peak_bytes == 400 * MiB  # the worst rank's


def test_other_readings_are_left_as_they_are() -> None:
    one = MemoryReading(50 * MiB, "rss", 10, 1)
    assert ranks_own_high_water(one, {0: report(80 * MiB)}) is one
    gpu = MemoryReading(5 * MiB, "nvml", 10, 2, ranks=(RankPeak(0, "cuda:0", 5 * MiB),))
    assert ranks_own_high_water(gpu, {0: report(80 * MiB)}) is gpu
