"""The proposal logic on hand-written trial records: exact proposals, no trial run, no database.

A model with fixed memory F = 100 MiB and 10 MiB per sample under ``none``; the plan ``A:1`` saves 6 MiB
per sample by the probe's prediction. The limit is 500 MiB, so ``none`` fits up to batch 40 and ``A:1``
(4 MiB per sample) up to 100.
"""

from __future__ import annotations

from autotune.core.protocol import Outcome
from autotune.search.propose import Proposal, calibration_batches, model_of, propose
from autotune.search.records import TrialKind, TrialRecord, best_record
from autotune.search.space import SearchSpace

MiB = 2**20
LIMIT = 500 * MiB
SPACE = SearchSpace(batch_sizes=(1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128), plans=("none", "A:1"))
SAVINGS = {"A:1": 6 * MiB}


def trial(
    number: int,
    batch: int,
    plan: str,
    per_sample_mib: float,
    outcome: Outcome = Outcome.COMPLETE,
    samples_per_sec: float = 100.0,
    kind: TrialKind = TrialKind.MEASURED,
) -> TrialRecord:
    peak = int((100 + batch * per_sample_mib) * MiB)
    return TrialRecord(
        number,
        "COMPLETE",
        kind,
        batch,
        plan,
        outcome,
        peak,
        samples_per_sec if outcome is Outcome.COMPLETE else None,
    )


def next_for(records: list[TrialRecord], taken: set[tuple[int, str]] | None = None) -> Proposal | None:
    return propose(records, model_of(records, SAVINGS), SPACE, LIMIT, taken or set())


def test_calibration_starts_at_the_smallest_batch_then_about_four_times_it() -> None:
    assert calibration_batches(SPACE.batch_sizes) == [1, 4, 2]
    assert next_for([]) == Proposal(1, "none", "calibration")
    assert next_for([trial(0, 1, "none", 10)]) == Proposal(4, "none", "calibration")


def test_a_calibration_batch_that_does_not_fit_bounds_the_next() -> None:
    """Batch 4 ran out of memory: calibration goes on below it, at 2."""
    records = [trial(0, 1, "none", 10), trial(1, 4, "none", 10, Outcome.OOM)]
    assert next_for(records) == Proposal(2, "none", "calibration")


def test_the_frontier_is_each_plan_s_largest_batch_that_fits() -> None:
    records = [trial(0, 1, "none", 10), trial(1, 4, "none", 10)]
    assert next_for(records) == Proposal(32, "none", "frontier")  # 100 + 32 x 10 = 420 <= 500; 48 -> 580
    records.append(trial(2, 32, "none", 10))
    # A:1 is predicted at 10 - 6 = 4 MiB per sample: 96 -> 484 MiB fits, 128 -> 612 does not
    assert next_for(records) == Proposal(96, "A:1", "frontier")


def test_a_measurement_overrules_the_prediction() -> None:
    """A:1 measured at 96 over the limit (it saves less than predicted): its frontier moves below 96."""
    records = [trial(0, 1, "none", 10), trial(1, 4, "none", 10), trial(2, 32, "none", 10)]
    records.append(trial(3, 96, "A:1", 5))  # 580 MiB: over the limit
    assert next_for(records) == Proposal(64, "A:1", "frontier")  # refitted at 5 MiB/sample: 64 -> 420


def test_configurations_leased_by_other_workers_are_not_proposed() -> None:
    records = [trial(0, 1, "none", 10), trial(1, 4, "none", 10)]
    assert next_for(records, {(32, "none")}) == Proposal(96, "A:1", "frontier")
    assert next_for(records, {(32, "none"), (96, "A:1")}) is None  # the sampler's turn


def test_the_best_record_is_the_fastest_that_fits_and_ignores_verifications_and_copies() -> None:
    records = [
        trial(0, 32, "none", 10, samples_per_sec=300.0),
        trial(1, 48, "none", 10, samples_per_sec=400.0),  # 580 MiB: over
        trial(2, 96, "A:1", 4, samples_per_sec=350.0),
        trial(3, 96, "A:1", 4, samples_per_sec=999.0, kind=TrialKind.VERIFICATION),
        trial(4, 64, "A:1", 4, samples_per_sec=320.0, kind=TrialKind.WARM_START),
    ]
    best = best_record(records, LIMIT)
    assert best is not None and best.number == 2
    assert best_record(records[:2], 100 * MiB) is None
