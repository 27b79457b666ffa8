"""Which configurations verification re-measures against the leader (autotune.search.contenders.rivals, #32
item 7): those whose readings' interval overlaps the leader's, and those the throughput model fitted to the
other readings puts at the leader's speed unless the model's structure ranks them below it."""

from __future__ import annotations

from test_propose import trial

from autotune.search.contenders import rivals
from autotune.search.records import Configuration, TrialRecord


def ranked(records: list[TrialRecord]) -> list:
    readings = [(r.config, r.throughput) for r in records]
    return sorted(readings, key=lambda pair: -pair[1].mid)


def test_a_smaller_batch_of_the_leader_s_plan_that_read_slower_is_no_rival() -> None:
    """A loop with throughput flat from batch 4 to 24: batch 1 (20.3 samples/s) was re-measured twice against
    none@24 (32.7), on a fit of the flat batches that put batch 1 at the leader's speed. Batch 4, whose
    reading overlaps the leader's, is its rival."""
    speeds = {1: 20.3, 4: 32.7, 24: 32.7}
    records = [trial(n, b, "none", 10, samples_per_sec=s) for n, (b, s) in enumerate(speeds.items())]
    assert rivals(Configuration(24, "none"), ranked(records), records, {}) == [(4, "none")]


def test_a_slow_reading_of_another_plan_the_model_puts_at_the_leader_s_speed_is_a_rival() -> None:
    """The other side (issue 25): A:1@48 read 315 once where the rest of the landscape puts it at ~410,
    above none@24's 387. It is re-measured: another plan at a larger batch is not ranked below the leader."""
    records = [
        trial(0, 8, "none", 10, samples_per_sec=8 / (0.05 + 8 * 0.0005)),
        trial(1, 24, "none", 10, samples_per_sec=24 / (0.05 + 24 * 0.0005)),
        trial(2, 8, "A:1", 5, samples_per_sec=8 / (0.05 + 8 * 0.0005 * 2.8)),
        trial(3, 24, "A:1", 5, samples_per_sec=24 / (0.05 + 24 * 0.0005 * 2.8)),
        trial(4, 48, "A:1", 5, samples_per_sec=48 / (0.05 + 48 * 0.0005 * 2.8) / 1.3),
    ]
    assert (48, "A:1") in rivals(Configuration(24, "none"), ranked(records), records, {})


def test_a_configuration_the_leader_dominates_that_also_read_slower_is_no_rival() -> None:
    """Issue 41: bench/time_to_answer.py's GPT-2 on the CPU spent 65 of its 188 s re-measuring GPT2Block:0.25@7
    (3.68 samples/s, its interval overlapping the leader's) beside none@7 (3.80), which recomputes nothing at
    the same batch: the structure and the readings agree. Where the readings disagree with the structure
    (the plan read faster, or a smaller batch read as fast), it is a rival still."""
    records = [
        trial(0, 4, "none", 10, samples_per_sec=3.30, noise=0.03),
        trial(1, 7, "none", 10, samples_per_sec=3.80, noise=0.03),
        trial(2, 7, "A:0.25", 8, samples_per_sec=3.68, noise=0.03),
    ]
    assert records[2].throughput.overlaps(records[1].throughput)
    assert rivals(Configuration(7, "none"), ranked(records), records, {}) == []
    faster = [*records[:2], trial(2, 7, "A:0.25", 8, samples_per_sec=3.85, noise=0.03)]
    assert rivals(Configuration(7, "none"), ranked(faster), faster, {}) == [(7, "A:0.25")]
