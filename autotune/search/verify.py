"""Verification: the winner is chosen on repeated, longer readings, never on one.

The fastest fitting configuration (the *leader*) is re-run longer (twice the measured steps, at least 10). The
configurations whose throughput interval overlaps the leader's are its *rivals* (at most two); so is the
next best when the leader's verified reading falls below that configuration's interval (a busy machine
once made a one-reading winner of a configuration that verified at half its speed). With rivals, every
contender is re-run longer, interleaved (A B C A B C: a load that comes and goes falls on all of them),
up to ROUNDS times (a round decides where none of its readings was disturbed and every contender ties
with the fastest or lies below it beyond both intervals: :func:`decided`); so is the leader whose longer
run disagrees with its own search reading beyond their intervals (autotune.search.noise.disagree), beside
the next best: a 48x disagreement is measured, never answered.
Each contender's throughput is then the median of all its readings, the search's included
(autotune.core.stats.pooled); the fastest wins, and among those within its noise the one with the smaller
peak where the peaks differ by more than the memory noise, so the same job on the same machine gives the
same answer run after run (at equal batch size, ``none`` over a plan that recomputes). A contender fits by
the majority of its peaks, the verifications' included (autotune.search.records.peak_verdict), measured
once more while they split evenly; one over the limit is out; if the leader is, the next configuration is
verified, up to MAX_VERIFICATIONS. A run that could pay for one run where its contenders need a round reads
the one :func:`choose` takes from the readings at hand; where that stand-in for the leader does not fit and
no run is left, the others that fit by their readings answer (:func:`standing`), unverified: the leader was
not shown not to fit.

Verifications are leased like trials (kind ``verify``, on the leader): one worker runs the comparison, a
dead verifier's is run once more by another (the readings already stored count), and the others wait
(``Step.BUSY``). This module runs the verification; the rules it runs by, as functions of the trial records
(who is compared, when a round decides, who wins), are autotune.search.contenders.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable

from autotune.core.budget import format_bytes, with_rise
from autotune.core.errors import DamagedData, NoFitError, StorageFault, TrialLost
from autotune.core.protocol import Outcome
from autotune.core.stats import Interval
from autotune.search import noise
from autotune.search.contenders import (
    challengers,
    choose,
    decided,
    disproved,
    dominating,
    in_place,
    rivals,
    settled_alone,
    speeds,
    standing,
    unverified,
)
from autotune.search.loop import Search, Step
from autotune.search.optuna_trials import fail_trial, records_of, tell_result
from autotune.search.propose import Configuration, model_of
from autotune.search.records import (
    READINGS,
    ProposedBy,
    TrialKind,
    TrialRecord,
    best_record,
    peak_verdict,
    superseded,
)
from autotune.storage import BestRow, JobState, Lease, LeaseKind, LeaseState
from autotune.trials.interrupts import StopRequested
from autotune.trials.result import TrialResult
from autotune.trials.settings import TrialSettings

MAX_VERIFICATIONS = 3  # leaders verified before the search gives up
MAX_SETTLING = 2  # longer runs of a contender whose peaks split evenly over the limit (one decides)
ROUNDS = 2  # interleaved longer runs of each contender, at most
POLL_SECONDS = 0.5


def verify(search: Search, settings: TrialSettings) -> BestRow:
    """Verify until the study has a best plan (this worker or another stores it). A leader that fails its
    verification is a measurement like any other (a peak over the limit bounds its plan's larger batch
    sizes, a point for the fit): the search goes on from it, within ``--trials``, before the next
    verification, as a worker's does (autotune.workers.jobwork). Falling back to the next fitting
    configuration measured once answered batch 4 where 12 and 16 fitted, with 7 of 10 trials unused.

    Raises:
        NoFitError: MAX_VERIFICATIONS configurations failed verification, or none fits.
        ScriptError: the script failed in the trials the search went on with.
    """
    while True:
        search.shield.check()  # a Ctrl-C while another worker verifies: at once, not when it is done
        step, best = verify_step(search, settings)
        if best is not None:
            return best
        if step is Step.RAN:  # the leader failed: search on from its reading
            search.run()
        elif step is Step.BUSY:
            time.sleep(POLL_SECONDS)


def verify_step(search: Search, settings: TrialSettings) -> tuple[Step, BestRow | None]:
    """One round of verification, with trials of ``settings``; the best plan once one is stored.

    Raises:
        NoFitError: MAX_VERIFICATIONS configurations failed verification, or none fits.
    """
    store, name = search.store, search.name
    if (stored := store.best(name)) is not None:
        return Step.FINISHED, stored
    search.recovery.recover()  # verify leases of dead workers too: failed, queued once more
    kinds = (LeaseKind.VERIFY,)
    lease = store.take_queued(name, search.worker, search.device, kinds=kinds)
    if lease is not None:
        lease = search.taken_lease(lease)
    else:
        leases = store.leases(name, kinds=kinds)
        if any(x.state in (LeaseState.RUNNING, LeaseState.QUEUED) for x in leases):
            return Step.BUSY, None
        if any(x.state is LeaseState.DONE for x in leases):  # another run's, ended since we read no answer
            if (stored := store.best(name)) is not None:
                return Step.FINISHED, stored
            raise DamagedData(
                f"study {name!r}: its verification is done but the database holds no answer for it (the "
                "database was edited); --force tunes it again"
            )
        records = records_of(search.study)
        tried = {(x.batch_size, x.plan) for x in leases}
        candidate = next((c for c, _ in _fitting_configs(search, records) if c not in tried), None)
        if len(tried) >= MAX_VERIFICATIONS or candidate is None:
            raise NoFitError(_no_fit_message(search, records))
        batch, plan = candidate
        lease = store.claim_verification(name, batch, plan, search.worker, search.device)
        if lease is None:
            return Step.MISSED, None
    return Step.RAN, _verify_lease(search, lease, settings)


def _verify_lease(search: Search, lease: Lease, settings: TrialSettings) -> BestRow | None:
    """Verify the leader of ``lease`` against its rivals: the best plan, stored, if a contender fits."""
    leader = Configuration(lease.batch_size, lease.plan)
    if _fitting(search, leader) is None:  # only possible for a stale queued retry: nothing to verify any more
        search.store.end_lease(lease.id, LeaseState.FAILED, "no fitting trial of this configuration")
        return None
    records = records_of(search.study)
    stronger = dominating(leader, [c for c, _ in _fitting_configs(search, records)], records)
    if (spent := _unaffordable(search)) is not None:
        return _unverified(search, lease, leader, stronger, records, spent)
    contenders = in_place(leader, stronger, _rivals(search, leader, records))
    if stronger:
        names = " and ".join(c.label for c in stronger)
        one = len(stronger) == 1
        search.reporter.note(
            f"{leader.label} leads on readings a busy machine took; {names} {'fits' if one else 'fit'} and "
            f"cannot be slower by the throughput model's structure: measured in its place ({leader.label} "
            f"is verified only if {'it does' if one else 'none of them does'} not fit)"
        )
    if len(contenders) == 1 and not stronger:
        result = _run_verification(search, lease, leader, settings, "verifies {trial}")
        if not _fits(search, lease, leader, settings):
            _failed(search, lease, leader)
            return None
        records = records_of(search.study)  # with the verification
        overtaken = _disproved(search, leader, result, records)
        contradicted = noise.disagreeing(records, leader)
        if not overtaken and not contradicted:
            return _store(search, lease, leader, records)
        rivals_ = challengers(leader, _fitting_configs(search, records), records, search.forward_shares)
        if settled_alone(leader, overtaken, rivals_, records):
            search.reporter.note(
                f"{leader.label} verified at {result.throughput} samples/s, which its search reading "
                "contradicts (the machine was busy): nothing it does not dominate could be faster, so a "
                "reading more would move the speed reported, not the answer"
            )
            return _store(search, lease, leader, records)
        named = " and ".join(c.label for c in rivals_)
        if overtaken:
            why = f"below {overtaken.label}'s interval"
        else:  # its own readings disagree: nothing is answered from them
            why = "which its search reading contradicts (the machine was busy for one of them)"
        search.reporter.note(
            f"{leader.label} verified at {result.throughput} samples/s, {why}: it is measured again"
            + (f", interleaved with {named}" if rivals_ else "")
        )
        contenders.extend(rivals_)
    asked = [leader, *contenders]  # what the verification would measure, had the run the runs
    contenders, rounds = _within_cost(search, contenders)
    fitting = set(contenders)
    latest: set[int] = set()  # the numbers of the last round's readings
    for round_ in range(1, rounds + 1):
        if round_ > 1:
            left = [c for c in contenders if c in fitting]
            ended = decided(records_of(search.study), left, latest, bool(stronger)) or _unaffordable(
                search, len(fitting)
            )
            if ended is not None:
                search.reporter.note(f"the verification ends after round {round_ - 1} of {rounds}: {ended}")
                break
        latest = set()
        for config in contenders:
            if config in fitting:
                note = f"re-measures {{trial}} (round {round_} of {rounds})"
                _run_verification(search, lease, config, settings, note)
                records = records_of(search.study)
                latest.add(
                    max(r.number for r in records if r.config == config and r.kind is TrialKind.VERIFICATION)
                )
                if peak_verdict(records, config, search.limit) is False:
                    fitting.discard(config)
    fitting = {c for c in contenders if c in fitting and _fits(search, lease, c, settings)}
    # what was measured in the leader's place did not fit: those that dominate it (``stronger``), or the one
    # chosen from the readings at hand where the run could pay for no round (``stood_in``: :func:`standing`)
    stood_in = not stronger and leader not in contenders
    if not fitting and (stronger or stood_in):
        records = records_of(search.study)
        if (spent := _unaffordable(search)) is not None:
            if stronger:
                return _unverified(search, lease, leader, [], records, spent)
            return _standing(search, lease, asked, contenders, records, spent)
        names = " and ".join(c.label for c in contenders)
        search.reporter.note(f"{names} did not fit: {leader.label} is verified")
        contenders = [leader]
        _run_verification(search, lease, leader, settings, "verifies {trial}")
        fitting = {leader} if _fits(search, lease, leader, settings) else set()
    if not fitting:
        _failed(search, lease, leader)
        return None
    records = records_of(search.study)
    chosen = choose(
        records,
        [c for c in contenders if c in fitting],
        model_of(records, search.savings, limit=search.limit, fixed_savings=search.fixed_savings).noise,
    )
    return _store(search, lease, chosen, records)


def _standing(
    search: Search,
    lease: Lease,
    asked: list[Configuration],
    measured: list[Configuration],
    records: list[TrialRecord],
    spent: str,
) -> BestRow:
    """The answer where what stood in for the leader did not fit and the run can pay for no more runs
    (``spent``: why): :func:`standing`."""
    memory = model_of(records, search.savings, limit=search.limit, fixed_savings=search.fixed_savings)
    kept = standing(asked, measured, records, search.limit, memory.noise) or asked[0]
    names = " and ".join(c.label for c in measured)
    search.reporter.note(
        f"{names} did not fit in {'its' if len(measured) == 1 else 'their'} verification, and {spent}: "
        f"{kept.label} is answered unverified, on its search readings"
    )
    return _store(search, lease, kept, records)


def _unverified(
    search: Search,
    lease: Lease,
    leader: Configuration,
    stronger: list[Configuration],
    records: list[TrialRecord],
    spent: str,
) -> BestRow:
    """The answer where the run can pay for no verification (``spent``: why): :func:`unverified`."""
    memory = model_of(records, search.savings, limit=search.limit, fixed_savings=search.fixed_savings)
    chosen = unverified(leader, stronger, records, memory.noise)
    note = f"{chosen.label} answered unverified: {spent} before its verification"
    if chosen != leader:
        note += f" (over {leader.label}, which it dominates by the throughput model's structure, read busy)"
    search.reporter.note(note)
    return _store(search, lease, chosen, records)


def _fits(search: Search, lease: Lease, config: Configuration, settings: TrialSettings) -> bool:
    """Whether ``config`` fits by the majority of its peaks (autotune.search.records.peak_verdict), measured
    once more, longer, while they are split evenly over the limit: one reading over it among readings under
    it is the meter's noise as often as the configuration's (RSS on a shared machine), and it decides."""
    for _ in range(MAX_SETTLING):
        verdict = peak_verdict(records_of(search.study), config, search.limit)
        if verdict is not None:
            return verdict
        if _unaffordable(search) is not None:  # undecided, and no trial left to decide it: not an answer
            break
        note = "re-measures {trial}: as many of its peaks were over the limit as under it"
        _run_verification(search, lease, config, settings, note)
    return peak_verdict(records_of(search.study), config, search.limit) is True


def _unaffordable(search: Search, runs: int = 1) -> str | None:
    """Why the run cannot pay for ``runs`` more verification runs (autotune.search.cost), None while it
    can."""
    return search.cost.unaffordable(records_of(search.study), runs)


def _within_cost(search: Search, contenders: list[Configuration]) -> tuple[list[Configuration], int]:
    """The contenders and the rounds the run can pay for: whole rounds only (readings compared are taken
    side by side, never a leader's new reading against a rival's search one), fewer rounds first, then
    fewer rivals (the likeliest kept), said where it cuts. One run left for several contenders reads the
    one chosen from the readings at hand, alone (the run --trials kept for the verification, not left
    unspent: its peak in a process of its own, and a longer reading)."""
    records = records_of(search.study)
    runs = search.cost.verifications(records)
    if runs == math.inf:
        return contenders, ROUNDS
    if runs < min(len(contenders), 2):  # no side-by-side round left: chosen from the readings at hand
        why = _unaffordable(search, min(len(contenders), 2)) or "what is left"
        if runs < 1:
            search.reporter.note(
                f"the verification measures none of the {len(contenders)} contenders again: {why}"
            )
            return contenders, 0
        # the run kept for the verification reads the one chosen from the readings at hand, alone: its peak
        # in a process of its own, settled, and a longer reading of its speed
        chosen = choose(
            records,
            contenders,
            model_of(records, search.savings, limit=search.limit, fixed_savings=search.fixed_savings).noise,
        )
        search.reporter.note(
            f"the verification measures {chosen.label} alone, chosen from the readings at hand over "
            f"{len(contenders) - 1} rival{'s' if len(contenders) > 2 else ''}: {why}"
        )
        return [chosen], 1
    kept = contenders[: max(min(len(contenders), int(runs)), 1)]
    rounds = max(min(ROUNDS, int(runs) // len(kept)), 1)
    if (len(kept), rounds) != (len(contenders), ROUNDS):
        why = _unaffordable(search, len(contenders) * ROUNDS) or "what is left"
        search.reporter.note(
            f"the verification compares {len(kept)} of {len(contenders)} contenders in {rounds} of {ROUNDS} "
            f"rounds: {why}"
        )
    return kept, rounds


def _fitting(search: Search, config: Configuration) -> TrialRecord | None:
    """The fastest trial of ``config`` measured in the search that fits."""
    return best_record(
        [r for r in records_of(search.study) if (r.batch_size, r.plan) == config], search.limit
    )


def _fitting_configs(search: Search, records: list[TrialRecord]) -> list[tuple[Configuration, Interval]]:
    """Configurations with a fitting trial, not over the limit by the majority of their readings (a
    verification's included) nor failed in a verification, fastest first by all their readings (then the
    smaller batch: a stable order)."""
    failed = {
        Configuration(x.batch_size, x.plan)
        for x in search.store.leases(search.name, kinds=(LeaseKind.VERIFY,))
        if x.state is LeaseState.FAILED
    }
    configs = {
        r.config
        for r in records
        if r.config is not None
        and r.kind in (TrialKind.MEASURED, TrialKind.WARM_START)
        and r.fits(search.limit)
    }
    failed |= {c for c in configs if peak_verdict(records, c, search.limit) is False}
    readings = speeds(records)
    ranked = [(c, readings[c]) for c in configs - failed if c in readings]
    return sorted(ranked, key=lambda pair: (-pair[1].mid, pair[0]))


def _rivals(search: Search, leader: Configuration, records: list[TrialRecord]) -> list[Configuration]:
    return rivals(leader, _fitting_configs(search, records), records, search.forward_shares, search.transfer)


def _disproved(
    search: Search, leader: Configuration, result: TrialResult, records: list[TrialRecord]
) -> Configuration | None:
    return disproved(leader, result.throughput, _fitting_configs(search, records))


def _store(search: Search, lease: Lease, config: Configuration, records: list[TrialRecord]) -> BestRow:
    speed = speeds(records)[config]
    every, records = records, [r for r in records if (r.batch_size, r.plan) == config]
    out = noise.overruled(every)  # readings the speed left out
    heavy = superseded(
        every, search.limit
    )  # warm readings over the limit of one read in a process of its own
    trial = best_record(records, search.limit)
    assert trial is not None  # a contender has a fitting trial
    checks = [r for r in records if r.kind is TrialKind.VERIFICATION and r.outcome is not None]
    best = BestRow(
        search.name,
        trial.number,
        config.batch_size,
        config.plan,
        trial.peak_bytes or 0,
        trial.samples_per_sec or 0.0,
        # the largest peak of any of its readings: a first trial pays torch.compile's compilation (its
        # warm-up), later ones read the workload's cache; the user's job starts as the first did (not a warm
        # process's, where a process of its own read it: records.superseded)
        max(r.peak_bytes or 0 for r in [*checks, *records] if r.measured and r.number not in heavy),
        speed.mid,
        speed.low,
        speed.high,
        len([r for r in records if r.samples_per_sec and r.number not in out]),
        noise.certainty(every, config),
    )
    search.store.save_best(best)
    search.store.set_job_state(search.name, JobState.DONE)
    search.store.end_lease(lease.id, LeaseState.DONE)
    return best


def _failed(search: Search, lease: Lease, config: Configuration) -> None:
    """End ``lease``: its configuration (``config``, or every contender) is over the limit by its readings."""
    peaks = [
        r
        for r in records_of(search.study)
        if (r.batch_size, r.plan) == config and r.kind in READINGS and r.measured
    ]
    over = [r for r in peaks if not r.fits(search.limit)]
    largest = max((with_rise(r.peak_bytes, r.rising_bytes) or 0 for r in over), default=0)
    why = f"{len(over)} of its {len(peaks)} peaks over the limit, up to {format_bytes(largest)}"
    if rising := [r for r in over if r.rising_bytes]:
        why += f" with room for {format_bytes(max(r.rising_bytes or 0 for r in rising))} more: still rising"
    search.store.end_lease(lease.id, LeaseState.FAILED, f"verification: {why}")
    search.reporter.note(
        f"{config.label} failed verification ({why}): the search goes on from its peaks "
        "(within --trials), then verifies the next leader"
    )


def _run_verification(
    search: Search,
    lease: Lease,
    config: Configuration,
    settings: TrialSettings,
    what: str,
    retried: bool = False,
) -> TrialResult:
    """A longer trial of ``config``, asked, run and told (kind ``verification``); ``what`` is its note, with
    ``{trial}`` for the configuration's fitting trial ("trial 7"; its name where it has none, as a challenger
    whose readings were all warm and over the limit: issue 43 found "re-measures trial ?"). One whose machine
    was lost (a cluster node) is failed as interrupted and run once more."""
    batch, plan = config
    first = _fitting(search, config)
    note = what.format(trial=f"trial {first.number}" if first is not None else config.label)
    trial = search.ask_fixed(batch, plan)
    for key, value in {
        "kind": TrialKind.VERIFICATION.value,
        "proposed_by": ProposedBy.VERIFICATION.value,
        "note": note,
        "worker": search.worker,
        "lease": lease.id,
        "device": search.device,
    }.items():
        trial.set_user_attr(key, value)
    search.store.set_lease_trial(lease.id, trial.number)
    search.cost.spend()
    if settings.settle_steps:
        # it need not wait for its peak to settle where the limit has room for its rise, and its peak settles
        # within half what the time limit leaves: start-up and measured steps take the rest
        left = search.cost.seconds_left()
        settings = dataclasses.replace(
            settings,
            settle_limit=search.limit,
            settle_seconds=min(settings.settle_seconds, max(left / 2, 1.0)),
        )
    if search.cost.trials is not None:  # the status line: this run's trial runs against --trials
        search.reporter.searching(search.cost.spent, search.cost.trials, None)
    search.reporter.trial_started(trial.number, batch, plan, note)
    try:
        result = search.runner(
            batch,
            plan,
            poll=search.reporter.trial_progress,
            settings=settings,
            interruptible=search.shield.allow,
            grad_accum=search.space.grad_accum(batch),
        )
    except StopRequested:
        search.recovery.release(lease, trial.number)
        raise
    except StorageFault as e:
        search.recovery.give_back(lease, trial.number, e)
        raise
    except KeyboardInterrupt:  # a verification is not retried here: the next run verifies again
        fail_trial(search.study, trial.number, "interrupted")
        search.store.forget_lease(lease.id)
        raise
    except TrialLost as e:
        fail_trial(search.study, trial.number, f"interrupted: {e}" + ("" if retried else "; retried once"))
        if retried or search.cost.trials_left() < 1:
            search.store.forget_lease(lease.id)
            raise
        search.reporter.note(f"verification trial {trial.number} interrupted: {e}; retried once")
        return _run_verification(search, lease, config, settings, what, retried=True)
    tell_result(search.study, trial, result, search.limit)
    search.reporter.trial_finished(records_of(search.study)[trial.number], first)
    return result


def _no_fit_message(search: Search, records: list[TrialRecord]) -> str:
    return no_fit_message(records, search.limit, search.budget_for)


def no_fit_message(records: list[TrialRecord], limit: int, budget_for: Callable[[int], str]) -> str:
    """Why nothing is answered, as a hopeless search says it (autotune.search.loop.Search._check_hopeless):
    the smallest peak measured, here or for another budget, and the budget it would need. A trial stopped
    as it passed the budget (or out of memory) read a bound, not a peak: the smallest of the completed ones
    speaks where there is one (CI: a trial stopped at 50.16 MiB of a 50 MiB budget was "the smallest peak
    measured", and 52.80 MiB the budget it "needs", for a configuration that peaks at 104 MiB)."""
    measured = [r for r in records if r.measured and r.peak_bytes is not None]
    if not measured:
        return f"no configuration fits {format_bytes(limit)} (budget minus headroom): no trial completed"
    complete = [r for r in measured if r.outcome is Outcome.COMPLETE]
    smallest = min(complete or measured, key=lambda r: r.peak_bytes or 0)
    bound = "" if smallest.outcome is Outcome.COMPLETE else " at least"
    where = f"trial {smallest.number}" + (
        " (measured for another budget)" if smallest.kind is TrialKind.WARM_START else ""
    )
    return (
        f"no configuration fits {format_bytes(limit)} (budget minus headroom): the smallest peak measured was"
        f"{bound} {format_bytes(smallest.peak_bytes or 0)} (batch {smallest.batch_size}, plan {smallest.plan}, "
        f"{where}); it needs a budget of at least {budget_for(smallest.peak_bytes or 0)}; every trial is kept"
    )
