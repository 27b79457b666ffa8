"""The proposal logic on hand-written trial records: exact proposals and stops, no trial run, no database.

A model with fixed memory F = 100 MiB and 10 MiB per sample under ``none``; the plan ``A:1`` saves 6 MiB
per sample (the probe predicts 6 / REALIZED_PRIOR: a plan realizes less than predicted). The limit is 500 MiB, so ``none`` fits up to batch 40 and ``A:1``
(4 MiB per sample) up to 100. Throughputs follow ``b / (t0 + t1·b)`` and are read with ±1% noise.
"""

from __future__ import annotations

import math

from autotune.core.budget import format_bytes
from autotune.core.protocol import Outcome
from autotune.search.calibration import hopeless
from autotune.search.memory_model import REALIZED_PRIOR
from autotune.search.propose import (
    Finished,
    Proposal,
    model_of,
    propose,
    speed_of,
)
from autotune.search.records import TrialKind, TrialRecord, best_record
from autotune.search.space import SearchSpace

MiB = 2**20
LIMIT = 500 * MiB
SPACE = SearchSpace(batch_sizes=(1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128), plans=("none", "A:1"))
SAVINGS = {"A:1": 6 / REALIZED_PRIOR * MiB}  # the probe predicts more than a plan realizes (see memory_model)


def saturating(batch: int) -> float:
    """A step of 10 ms plus 10 ms per sample: 97 samples/s at batch 32, never above 100."""
    return batch / (0.01 + 0.01 * batch)


def knee(batch: int) -> float:
    """A step of 100 ms plus 1 ms per sample: far from saturated at 32 (242/s), so a larger batch pays."""
    return batch / (0.1 + 0.001 * batch)


def trial(
    number: int,
    batch: int,
    plan: str,
    per_sample_mib: float,
    outcome: Outcome = Outcome.COMPLETE,
    samples_per_sec: float = 100.0,
    kind: TrialKind = TrialKind.MEASURED,
    noise: float = 0.01,
) -> TrialRecord:
    peak = int((100 + batch * per_sample_mib) * MiB)
    speed = samples_per_sec if outcome is Outcome.COMPLETE else None
    return TrialRecord(
        number,
        "COMPLETE",
        kind,
        batch,
        plan,
        outcome,
        peak,
        speed,
        samples_per_sec_low=speed * (1 - noise) if speed else None,
        samples_per_sec_high=speed * (1 + noise) if speed else None,
    )


def next_for(
    records: list[TrialRecord],
    taken: set[tuple[int, str]] | None = None,
    shares: dict[str, float] | None = None,
    exhaustive: bool = False,
) -> Proposal | Finished | None:
    model = model_of(records, SAVINGS)
    return propose(records, model, speed_of(records, shares), SPACE, LIMIT, taken or set(), exhaustive)


def calibrated(curve=saturating) -> list[TrialRecord]:
    return [
        trial(0, 1, "none", 10, samples_per_sec=curve(1)),
        trial(1, 4, "none", 10, samples_per_sec=curve(4)),
    ]


def test_calibration_starts_at_the_smallest_batch_then_about_four_times_it() -> None:
    assert next_for([]) == Proposal(1, "none", "calibration")
    assert next_for(calibrated()[:1]) == Proposal(4, "none", "calibration")


def test_a_calibration_batch_that_does_not_fit_bounds_the_next() -> None:
    """Batch 4 ran out of memory: calibration goes on below it, at 2."""
    records = [trial(0, 1, "none", 10, samples_per_sec=50), trial(1, 4, "none", 10, Outcome.OOM)]
    assert next_for(records) == Proposal(2, "none", "calibration")


def test_the_first_plan_s_frontier_comes_first() -> None:
    assert next_for(calibrated()) == Proposal(32, "none", "frontier")  # 100 + 32 x 10 = 420; 48 -> 580


def test_a_flat_throughput_curve_stops_the_search_at_once() -> None:
    """none saturates at 100/s and reads 97 at batch 32: A:1 at 96 (its frontier, 484 MiB) could reach at
    most ~101/(1 + 0.2 x 0.5) = 92 with the probe's 50% forward share, so no trial is worth it."""
    records = [*calibrated(), trial(2, 32, "none", 10, samples_per_sec=saturating(32))]
    stop = next_for(records, shares={"A:1": 0.5})
    assert isinstance(stop, Finished)
    assert stop.reason.startswith(
        "no remaining configuration is predicted to beat none@32 (97.0 ±1% samples/s) by more than its noise and 2.5%"
    )


def test_a_plan_that_could_beat_the_incumbent_by_less_than_min_gain_is_not_measured() -> None:
    """none@32 reads 97.0 ±1% on a saturating curve. A:1 repeating 10% of the forward could reach 98.4 at
    its frontier (96): above the incumbent's interval (98.0) but 1.4% above its speed, a gain no reading
    shows (MIN_GAIN, 2.5%), so the search stops. Repeating 2%, it could reach more than 2.5% above: measured."""
    records = [*calibrated(), trial(2, 32, "none", 10, samples_per_sec=saturating(32))]
    assert next_for(records, shares={"A:1": 0.1}) == Finished(
        "no remaining configuration is predicted to beat none@32 (97.0 ±1% samples/s) by more than its noise "
        "and 2.5%; 3 configurations left could change nothing (a fitting one is answered over each, whatever "
        "it reads); the closest, A:1@96, could reach at most 98.4"
    )
    assert next_for(records, shares={"A:1": 0.02}) == Proposal(96, "A:1", "frontier", contenders=1)


def test_without_a_forward_share_a_larger_batch_with_recompute_is_still_tried() -> None:
    """Knowing nothing of A:1's cost, only dominance bounds it: at batch 96 it could beat none@32."""
    records = [*calibrated(knee), trial(2, 32, "none", 10, samples_per_sec=knee(32))]
    assert next_for(records) == Proposal(96, "A:1", "frontier")


def test_a_knee_where_recompute_pays_is_measured_then_the_search_stops() -> None:
    records = [*calibrated(knee), trial(2, 32, "none", 10, samples_per_sec=knee(32))]
    assert next_for(records, shares={"A:1": 0.3}) == Proposal(96, "A:1", "frontier")
    records.append(trial(3, 96, "A:1", 4, samples_per_sec=knee(96) / 1.1))  # 10% slower than none would be
    stop = next_for(records, shares={"A:1": 0.3})
    assert isinstance(stop, Finished)
    assert "beat A:1@96 (445.3 ±1% samples/s)" in stop.reason


def test_a_measured_overhead_rules_a_plan_out() -> None:
    """A:1 measured 40% slower than none at batch 32: at 96 it could reach at most what none reaches at
    96 divided by ~1.37, below none@32, even on a curve far from saturated."""
    records = [
        *calibrated(knee),
        trial(2, 32, "none", 10, samples_per_sec=knee(32)),
        trial(3, 32, "A:1", 4, samples_per_sec=knee(32) / 1.4),
    ]
    assert next_for(records) == Proposal(96, "A:1", "frontier")  # 96/(0.196)/1.37 = 357 > 242: worth it
    records.append(trial(4, 96, "A:1", 4, samples_per_sec=knee(96) / 1.4))  # 350: the incumbent now
    assert isinstance(next_for(records), Finished)


def test_exhaustive_measures_every_frontier_then_hands_over_to_the_sampler() -> None:
    records = [*calibrated(), trial(2, 32, "none", 10, samples_per_sec=saturating(32))]
    assert next_for(records, shares={"A:1": 0.5}, exhaustive=True) == Proposal(96, "A:1", "frontier")
    records.append(trial(3, 96, "A:1", 4, samples_per_sec=80))
    assert next_for(records, exhaustive=True) is None


def test_a_measurement_overrules_the_prediction() -> None:
    """A:1 measured at 96 over the limit (it saves less than predicted): its frontier moves below 96."""
    records = [*calibrated(knee), trial(2, 32, "none", 10, samples_per_sec=knee(32))]
    records.append(trial(3, 96, "A:1", 5, samples_per_sec=knee(96) / 1.05))  # 580 MiB: over the limit
    assert next_for(records) == Proposal(64, "A:1", "frontier")  # refitted at 5 MiB/sample: 64 -> 420


def test_a_batch_over_the_limit_with_another_plan_bounds_nothing_but_that_plan() -> None:
    """A:1 (predicted to save more than none) did not fit at 16: that bounds A:1 only. none keeps the
    frontier its own measurements give (32), because no plan's peak is assumed to follow another's (a
    compile budget's is not even monotonic in the budget)."""
    records = [*calibrated(knee), trial(2, 16, "A:1", 30, Outcome.OOM)]
    model = model_of(records, SAVINGS)
    assert model.ceiling("A:1", LIMIT) == 16
    assert model.ceiling("none", LIMIT) is None
    assert model.largest_fitting("A:1", SPACE.batch_sizes, LIMIT) == 8
    assert model.largest_fitting("none", SPACE.batch_sizes, LIMIT) == 32  # 100 + 32 x 10 = 420 MiB; 48: 580
    assert next_for(records) == Proposal(32, "none", "frontier")


def test_the_plan_that_saves_the_most_is_tried_when_the_first_does_not_fit_then_the_budget_is_hopeless() -> (
    None
):
    records = [trial(0, 1, "none", 500, Outcome.OOM)]
    assert next_for(records) == Proposal(1, "A:1", "calibration")
    assert hopeless(records, model_of(records, SAVINGS), SPACE, LIMIT) is None
    records.append(trial(1, 1, "A:1", 450))  # 550 MiB
    why = hopeless(records, model_of(records, SAVINGS), SPACE, LIMIT)
    assert why == (
        "no configuration fits 500.00 MiB (budget minus headroom): the smallest batch, 1, does not fit with any "
        "plan, not even A:1 (the one that saves the most); the smallest peak measured was 550.00 MiB (batch 1, plan A:1, trial 1)"
    )


def test_configurations_leased_by_other_workers_are_not_proposed() -> None:
    """With none@32 under way elsewhere, A:1 is proposed no further than 8x the largest batch measured (4:
    its frontier, 96, is an extrapolation of 24x); once that is taken too, the next most promising."""
    records = calibrated(knee)
    assert next_for(records, {(32, "none")}) == Proposal(32, "A:1", "frontier")
    assert next_for(records, {(32, "none"), (32, "A:1")}) == Proposal(24, "none", "candidate")
    records.append(trial(2, 32, "none", 10, samples_per_sec=knee(32)))
    assert next_for(records, {(96, "A:1")}) == Proposal(64, "A:1", "candidate")


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


def test_a_landscape_whose_peak_is_not_monotonic_in_the_plan_parameter_is_searched_to_its_optimum() -> None:
    """The probe predicts A:0.75 saves more than A:0.5 (6 against 4 MiB per sample), as a ratio would
    suggest; measured, A:0.75 saves 2 and A:0.5 saves 6 (a partition that keeps more at a larger budget,
    pytorch issue 197838). The search, run against that truth until it stops, must end on the brute-force
    optimum: A:0.75 not fitting at a batch size must not rule out A:0.5 there."""
    truth = {"none": (10, 0.0), "A:0.5": (4, 0.3), "A:0.75": (8, 0.4)}  # MiB per sample, overhead
    space = SearchSpace(batch_sizes=SPACE.batch_sizes, plans=("none", "A:0.75", "A:0.5"))
    savings = {"A:0.5": 4 * MiB, "A:0.75": 6 * MiB}

    def measured(number: int, batch: int, plan: str) -> TrialRecord:
        per_sample, overhead = truth[plan]
        fits_limit = 100 + batch * per_sample <= LIMIT / MiB
        speed = knee(batch) / (1 + overhead)
        return trial(number, batch, plan, per_sample, Outcome.COMPLETE if fits_limit else Outcome.OOM, speed)

    records: list[TrialRecord] = []
    shares = {"A:0.5": 0.3, "A:0.75": 0.4}
    for number in range(40):
        model = model_of(records, savings)
        proposal = propose(records, model, speed_of(records, shares), space, LIMIT, set())
        if not isinstance(proposal, Proposal):
            break
        records.append(measured(number, proposal.batch_size, proposal.plan))
    assert isinstance(proposal, Finished), proposal
    everything = [measured(0, b, p) for p in truth for b in space.batch_sizes]
    optimum = max((r for r in everything if r.fits(LIMIT)), key=lambda r: r.samples_per_sec or 0)
    best = best_record(records, LIMIT)
    assert best is not None and (best.batch_size, best.plan) == (optimum.batch_size, optimum.plan) == (
        96,
        "A:0.5",
    )
    assert len(records) < len(everything) // 2  # it searched, it did not enumerate


def test_a_first_plan_that_fits_at_the_smallest_batch_only_hands_the_calibration_to_the_next_plan() -> None:
    """none fits at batch 1 and failed at 2 (nothing between to bisect): one batch size gives no slope, so
    the calibration goes on with the plan expected to save the most, not with the sampler (the tight
    landscape of bench/search_efficiency.py took 16 trials instead of 6 this way)."""
    records = [trial(0, 1, "none", 300), trial(1, 2, "none", 300, Outcome.OOM)]  # 400 MiB, then over
    assert next_for(records) == Proposal(1, "A:1", "calibration")
    records.append(trial(2, 1, "A:1", 120))
    assert next_for(records) == Proposal(4, "A:1", "calibration")


def test_a_plan_the_probe_overrates_costs_one_over_budget_trial_then_its_own_slope_predicts_it() -> None:
    """Issue 31 on an H100: the probe predicted GPT2Block:1 saves 2.47 of ~2.8 GiB per sample; measured peaks
    were 16-38% above prediction, and the search measured GPT2Block:1 at 16, 12 and 8 over the budget before
    6 fitted. In miniature: A:1 is predicted to save 9.5 of none's 10 MiB per sample (0.5 left, every batch
    to 128 fits, 3.35 MiB once the prior's 70% realization is applied) where it truly keeps 5. Its first
    trial over the budget is a lower bound and a ceiling: the
    next proposal bisects towards what fitted, never one rung down; once one trial of A:1 completed, its own
    slope predicts it (a linear landscape: exactly), and one A:1 trial was over the budget."""
    truth = {"none": 10.0, "A:1": 5.0}
    records = [*calibrated(knee), trial(2, 32, "none", 10, samples_per_sec=knee(32))]

    def measure(batch: int, plan: str) -> TrialRecord:
        over = 100 + batch * truth[plan] > LIMIT / MiB
        peak_mib = LIMIT / MiB + 2 if over else truth[plan]  # stopped just past the limit: a lower bound
        speed = knee(batch) / (1.3 if plan == "A:1" else 1.0)
        if over:
            record = trial(len(records), batch, plan, 0, Outcome.OVER_BUDGET)
            return TrialRecord(**{**record.__dict__, "peak_bytes": int(peak_mib * MiB)})
        return trial(len(records), batch, plan, truth[plan], samples_per_sec=speed)

    for _ in range(8):
        proposal = propose(
            records, model_of(records, {"A:1": 9.5 * MiB}), speed_of(records), SPACE, LIMIT, set()
        )
        if not isinstance(proposal, Proposal):
            break
        records.append(measure(proposal.batch_size, proposal.plan))
    a1 = [(r.batch_size, r.outcome) for r in records if r.plan == "A:1"]
    assert a1[0] == (96, Outcome.OVER_BUDGET)  # the probe's prediction, 70% realized: 3.35 MiB a sample
    assert a1[1] == (64, Outcome.COMPLETE)  # between 32 (fitted) and 96, above its bound: fits
    assert all(outcome is Outcome.COMPLETE for _, outcome in a1[1:])  # its own slope from then on
    model = model_of(records, {"A:1": 9.5 * MiB})
    for batch in (8, 48, 96):  # its own slope now: exact
        assert abs(model.predict(batch, "A:1") - (100 + batch * 5) * MiB) < 0.05 * (100 + batch * 5) * MiB
    best = best_record(records, LIMIT)
    assert best is not None and (best.batch_size, best.plan) == (64, "A:1")


def test_a_hopeless_budget_is_told_by_a_completed_peak_not_by_a_trial_stopped_at_the_budget() -> None:
    """CI: a 50 MiB run re-measured none@16 (read at 104 MiB for a 200 MiB budget) and stopped it at 50.16 MiB;
    that bound became "the smallest peak measured" and 52.80 MiB the budget it "needs"."""
    from autotune.search.verify import no_fit_message

    other_budget = trial(3, 8, "A:1", 4, kind=TrialKind.WARM_START)  # 132 MiB, complete
    stopped = trial(5, 16, "none", -3, Outcome.OVER_BUDGET)  # 52 MiB: where the budget stopped it

    def budget_for(peak: int) -> str:  # the search's, at its default 5% headroom (Search.budget_for)
        return format_bytes(math.ceil(peak / 0.95))

    assert no_fit_message([other_budget, stopped], 47 * MiB, budget_for) == (
        "no configuration fits 47.00 MiB (budget minus headroom): the smallest peak measured was 132.00 MiB "
        "(batch 8, plan A:1, trial 3 (measured for another budget)); it needs a budget of at least 138.95 MiB; "
        "every trial is kept"
    )
    assert no_fit_message([stopped], 47 * MiB, budget_for).startswith(
        "no configuration fits 47.00 MiB (budget minus headroom): the smallest peak measured was at least 52.00 MiB "
    )


def test_a_plan_outranked_at_its_last_frontier_by_a_fitting_none_is_not_measured() -> None:
    """none@32 fits, read 3% below the curve its smaller batches trace (a reading's noise), so the curve
    values anything at 32 just above none@32's interval. A:1 at 48 saved nothing and read over the limit
    (580 MiB): its frontier is 32, where none fits and outranks it (no faster, and a tie goes to none
    whatever the peaks). Measuring A:1@32 could change nothing (issue 41: GPT-2 measured GPT2Block:0.25@7
    beside a fitting none@7 for 21 s of a 151 s run), so the search stops. Before A:1 was measured
    anywhere, its frontier at 32 is measured: it shows how far the plan reaches."""
    records = [*calibrated(knee), trial(2, 32, "none", 10, samples_per_sec=0.97 * knee(32))]
    model = model_of(records)  # no probe: what A:1 saves is not known
    assert model.largest_fitting("A:1", SPACE.batch_sizes, LIMIT) == 32  # none's, until A:1 is measured
    first = propose(records, model, speed_of(records), SPACE, LIMIT, set())
    assert first == Proposal(32, "A:1", "frontier")  # its reach: where it saves what it might
    records.append(trial(3, 48, "A:1", 10, samples_per_sec=knee(48)))
    assert model_of(records, SAVINGS).largest_fitting("A:1", SPACE.batch_sizes, LIMIT) == 32
    stop = next_for(records)
    assert isinstance(stop, Finished), stop
    assert stop.reason.startswith("no remaining configuration is predicted to beat none@32 (235.2 ±1%")
