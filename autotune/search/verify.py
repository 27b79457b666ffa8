"""Verification: the winner is chosen on repeated, longer readings, never on one.

The fastest fitting configuration (the *leader*) is re-run longer (twice the measured steps, at least 10). The
configurations whose throughput interval overlaps the leader's are its *rivals* (at most two); so is the
next best when the leader's verified reading falls below that configuration's interval (a busy machine
once made a one-reading winner of a configuration that verified at half its speed). With rivals, every
contender is re-run longer, interleaved (A B C A B C: a load that comes and goes falls on all of them),
up to ROUNDS times (a round decides where none of its readings was disturbed and every contender ties
with the fastest or lies below it beyond both intervals: :func:`_decided`); so is the leader whose longer
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
(``Step.BUSY``).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable

from autotune.core.budget import format_bytes, with_rise
from autotune.core.errors import DamagedData, NoFitError, StorageFault, TrialLost
from autotune.core.protocol import Outcome
from autotune.core.stats import Interval
from autotune.search import noise
from autotune.search.loop import Search, Step
from autotune.search.optuna_trials import fail_trial, records_of, tell_result
from autotune.search.propose import Configuration, model_of, speed_of
from autotune.search.records import (
    READINGS,
    TIE,
    ProposedBy,
    TrialKind,
    TrialRecord,
    best_record,
    peak_verdict,
    superseded,
)
from autotune.search.throughput_model import dominates, outranks
from autotune.storage import BestRow, JobState, Lease, LeaseKind, LeaseState
from autotune.trials.interrupts import StopRequested
from autotune.trials.result import TrialResult
from autotune.trials.settings import TrialSettings

MAX_VERIFICATIONS = 3  # leaders verified before the search gives up
MAX_SETTLING = 2  # longer runs of a contender whose peaks split evenly over the limit (one decides)
MAX_CONTENDERS = 3  # the leader and at most two rivals are measured again
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
        names = " and ".join(_name(c) for c in stronger)
        one = len(stronger) == 1
        search.reporter.note(
            f"{_name(leader)} leads on readings a busy machine took; {names} {'fits' if one else 'fit'} and "
            f"cannot be slower by the throughput model's structure: measured in its place ({_name(leader)} "
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
                f"{_name(leader)} verified at {result.throughput} samples/s, which its search reading "
                "contradicts (the machine was busy): nothing it does not dominate could be faster, so a "
                "reading more would move the speed reported, not the answer"
            )
            return _store(search, lease, leader, records)
        named = " and ".join(_name(c) for c in rivals_)
        if overtaken:
            why = f"below {_name(overtaken)}'s interval"
        else:  # its own readings disagree: nothing is answered from them
            why = "which its search reading contradicts (the machine was busy for one of them)"
        search.reporter.note(
            f"{_name(leader)} verified at {result.throughput} samples/s, {why}: it is measured again"
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
            ended = _decided(records_of(search.study), left, latest, bool(stronger)) or _unaffordable(
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
        names = " and ".join(_name(c) for c in contenders)
        search.reporter.note(f"{names} did not fit: {_name(leader)} is verified")
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
    names = " and ".join(_name(c) for c in measured)
    search.reporter.note(
        f"{names} did not fit in {'its' if len(measured) == 1 else 'their'} verification, and {spent}: "
        f"{_name(kept)} is answered unverified, on its search readings"
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
    note = f"{_name(chosen)} answered unverified: {spent} before its verification"
    if chosen != leader:
        note += f" (over {_name(leader)}, which it dominates by the throughput model's structure, read busy)"
    search.reporter.note(note)
    return _store(search, lease, chosen, records)


def unverified(
    leader: Configuration, stronger: list[Configuration], records: list[TrialRecord], memory_noise: float
) -> Configuration:
    """The answer of a run that can pay for no verification: the leader, or, where a busy machine took the
    readings of fitting configurations that dominate it (``stronger``: :func:`dominating`), the one
    :func:`choose` takes from them all, which is never one another dominates: what a verification would
    have answered had its side-by-side readings been as busy. Measured (#42): beside four bursting
    neighbours, examples/gpt.py's run reached its time limit with none@1 (one quiet reading, 37.1)
    leading none@32 (27.3 by the median of three readings, 78.2 the quiet one) and answered none@1,
    unverified, at 0.4 of none@32's speed."""
    return choose(records, [leader, *stronger], memory_noise) if stronger else leader


def standing(
    asked: list[Configuration],
    measured: list[Configuration],
    records: list[TrialRecord],
    limit: int,
    memory_noise: float,
) -> Configuration | None:
    """The answer where a verification that could pay for fewer runs than its contenders (``asked``, the
    leader first) measured only some of them (``measured``), and none of those fitted: the one :func:`choose`
    takes from the others that fit by their readings (records.peak_verdict), unverified; None where none
    does. They were not shown not to fit: failing the leader with what its stand-in read drops a
    configuration that fits. Measured (#42): examples/mlp.py at 700 MB, quiet, --trials 10, one run left:
    none@256 led (777 samples/s), none@384 (732, dominating it, the two not read side by side) was read
    alone in its place at 635.95 MiB against a 634.19 MiB limit, and none@256's verification failed with
    "0 of its 1 peaks over the limit"; none@384's split peaks failed the next, and none@64 was answered,
    unverified, at 0.77 of none@256's reading."""
    left = [c for c in dict.fromkeys(asked) if c not in measured and peak_verdict(records, c, limit) is True]
    return choose(records, left, memory_noise) if left else None


def in_place(
    leader: Configuration, stronger: list[Configuration], rivals_: list[Configuration]
) -> list[Configuration]:
    """The contenders a verification measures (at most MAX_CONTENDERS): the leader and its rivals; where fitting
    configurations dominate it and a busy machine took the readings (``stronger``: :func:`dominating`),
    those in its place, with the rivals none of them dominates. :func:`choose` takes no configuration
    another contender dominates once a busy machine took any of their readings, so the leader, and a rival
    one of them dominates, could only be answered if none of them fits: the leader is then verified after
    them (:func:`_verify_lease`). Measured (#42): beside four bursting neighbours on 2 cores, examples/gpt.py's
    verifications measured a dominated leader beside none@32 in most runs, 7-20 s each, for a reading that
    could not change the answer."""
    if not stronger:
        return list(dict.fromkeys([leader, *rivals_]))[:MAX_CONTENDERS]
    free = [c for c in rivals_ if c != leader and not any(dominates(s, c) for s in stronger)]
    return list(dict.fromkeys([*stronger, *free]))[:MAX_CONTENDERS]


def _decided(
    records: list[TrialRecord], contenders: list[Configuration], latest: set[int], in_place_: bool = False
) -> str | None:
    """Why another round of side-by-side readings would not change the answer, None while it could: no
    reading of the last round (``latest``: their numbers) was taken while the machine was busy
    (autotune.search.noise.disturbed), and one contender is left (a leader measured again because its own
    readings disagreed: the median of three) or each contender either ties with the fastest by all its
    readings (within TIE: :func:`choose` then decides on peaks and the model's structure, which a reading
    more does not move) or lies below it beyond both intervals. The second round is for a load that comes
    and goes; on a quiet machine the first decides (issue 41: verification took 35 of a quiet demo's 56 s,
    two rounds of three contenders).

    A disturbed round decides where one contender dominates every other by the throughput model's
    structure (:func:`dominates`): under load :func:`choose` drops the dominated and the readings order
    nothing else, so a round more buys nothing (issue 42's heavy demo measured none@32 five times for
    --trials 10, with none@24 and Block:0.25@32 beside it); so does a round of one contender measured in the
    place of a leader it dominates (``in_place_``: :func:`in_place`), which is the answer where it fits
    whatever it reads; and so does a round of a lone leader measured again because its own readings
    disagreed (what it dominates left out of the round: :func:`_verify_lease`): a busy reading more moves
    the speed reported, and the certainty line already says the machine was busy, not the answer."""
    if noise.disturbed(records) & latest:
        top = _undominated(contenders)
        if len(contenders) > 1 and len(top) == 1:
            return (
                f"the machine was busy, and {_name(top[0])} dominates every other contender by the "
                "throughput model's structure (readings taken busy order nothing else)"
            )
        if in_place_ and len(contenders) == 1:
            return (
                f"the machine was busy, and {_name(contenders[0])} dominates the leader by the throughput "
                "model's structure (readings taken busy order nothing else)"
            )
        if len(contenders) == 1:
            return (
                "the machine was busy, and one contender is left: a reading more would move the speed "
                "reported, not the answer"
            )
        return None
    if len(contenders) < 2:  # its own readings disagreed: a third, undisturbed, makes their median
        return "its reading was not disturbed, and one contender is left"
    readings = _readings(records)
    fastest = max(contenders, key=lambda c: readings[c].mid)
    bar = readings[fastest].mid * (1 - min(readings[fastest].noise, TIE))
    if any(bar > readings[c].mid and readings[c].high >= readings[fastest].low for c in contenders):
        return None
    return (
        f"none of its readings was disturbed, and each contender ties with {_name(fastest)} or lies below "
        "it beyond both intervals"
    )


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
            f"the verification measures {_name(chosen)} alone, chosen from the readings at hand over "
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


def _readings(records: list[TrialRecord]) -> dict[Configuration, Interval]:
    """Every configuration's throughput over all its readings (search, warm start and verifications)."""
    return speed_of(records).pooled


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
    readings = _readings(records)
    ranked = [(c, readings[c]) for c in configs - failed if c in readings]
    return sorted(ranked, key=lambda pair: (-pair[1].mid, pair[0]))


def _rivals(search: Search, leader: Configuration, records: list[TrialRecord]) -> list[Configuration]:
    return rivals(leader, _fitting_configs(search, records), records, search.forward_shares, search.transfer)


def rivals(
    leader: Configuration,
    ranked: list[tuple[Configuration, Interval]],
    records: list[TrialRecord],
    forward_shares: dict[str, float],
    transfer: dict[str, float] | None = None,
) -> list[Configuration]:
    """The configurations that could be as fast as the leader (at most MAX_CONTENDERS - 1, the likeliest
    first; ``ranked``: the fitting configurations with their readings, fastest first): their readings'
    interval overlaps the leader's, or the throughput model fitted to every *other* configuration's
    readings predicts them within it (a slow reading of a configuration the rest of the
    landscape says is fast is the machine's noise, not the configuration's speed) and the model's own
    structure does not rank them below the leader (:func:`dominates`: the leader's plan at a smaller batch
    is never faster than the leader, whatever a fit extrapolated below the batches it was fitted on says).
    A configuration the leader dominates whose readings put it below the leader too is no rival, however
    its interval overlaps: readings and structure agree; one that reads as fast as the leader or faster is,
    where they disagree, and so is a smaller batch of the leader's plan within TIE of it, which
    :func:`choose` takes from a tie for its smaller peak.

    Measured (#32): a loop whose throughput is flat from batch 4 to 24 had batch 1 (20.3 samples/s) re-measured
    twice against the 32.7 leader, none@24, on a fit of batches 4-24 that put batch 1 at the leader's speed.
    Measured (#41): bench/time_to_answer.py's GPT-2 on the CPU spent 65 of its 188 s verifying
    GPT2Block:0.25@7 (3.68 samples/s, its interval overlapping) beside the leader none@7 (3.80), which
    recomputes nothing at the same batch and was answered."""
    own = dict(ranked).get(leader)
    if own is None:
        return []
    likely: dict[Configuration, float] = {}
    for config, reading in ranked:
        others = speed_of([r for r in records if (r.batch_size, r.plan) != config], forward_shares, transfer)
        # Only what the others measured predicts a configuration: its plan's overhead or the curve itself.
        known = config.plan == others.reference or config.plan in others.overhead
        predicted = (others.predict(*config) or 0.0) if known else 0.0
        below = dominates(leader, config)  # by the model's structure
        plausible = predicted >= own.low and not below
        # and by its readings, unless it ties and choose() would take it for its smaller peak
        tied = not outranks(leader, config) and reading.mid >= own.mid * (1 - TIE)
        agreed = below and reading.mid < own.mid and not tied
        if config != leader and not agreed and (reading.overlaps(own) or plausible):
            likely[config] = max(reading.mid, predicted)
    return sorted(likely, key=lambda c: -likely[c])[: MAX_CONTENDERS - 1]


def settled_alone(
    leader: Configuration,
    overtaken: Configuration | None,
    rivals_: list[Configuration],
    records: list[TrialRecord],
) -> bool:
    """Whether a verified leader whose own readings disagree is answered without another: nothing overtook
    it, it has no rival (:func:`challengers`: where a busy machine took its readings, none it dominates is
    one), and a busy machine took them. Another reading would make the median of three, which moves the
    speed reported (the certainty line says the machine was busy), not the answer. Issue 42: beside four
    bursting neighbours, examples/gpt.py's none@32, read 76.2 in its search and 24.8 verified, was
    verified again alone (24.1, 19 s of a 96 s run)."""
    return overtaken is None and not rivals_ and _loaded(records, [leader])


def _disproved(
    search: Search, leader: Configuration, result: TrialResult, records: list[TrialRecord]
) -> Configuration | None:
    return disproved(leader, result.throughput, _fitting_configs(search, records))


def disproved(
    leader: Configuration, verified: Interval | None, ranked: list[tuple[Configuration, Interval]]
) -> Configuration | None:
    """The best other configuration (``ranked``: the fitting ones with their readings, fastest first) whose
    interval lies above the leader's ``verified`` reading, if any; not one the leader dominates by the
    throughput model's structure (:func:`dominates`): that one reading faster says the leader's reading was
    slowed, which :func:`noise.disagreeing` asks about. Issue 42: beside four bursting neighbours,
    examples/gpt.py's none@32 verified at 14.0 (94.7 in its search) was "below Block:0.25@32's interval"
    (73.5), a plan recomputing a quarter of the blocks at the same batch."""
    for config, speed in ranked:
        if config == leader or dominates(leader, config):
            continue
        if verified is not None and verified.high < speed.low:
            return config
    return None


def challengers(
    leader: Configuration,
    ranked: list[tuple[Configuration, Interval]],
    records: list[TrialRecord],
    forward_shares: dict[str, float] | None = None,
) -> list[Configuration]:
    """The rivals of a leader its verification disproved (at most MAX_CONTENDERS - 1; ``ranked``: the
    fitting configurations with their readings): those that could be faster than it verified, by the
    throughput model fitted to every reading no verification overruled (autotune.search.noise.overruled),
    a configuration as fast as its own readings or the model say, whichever is more; first those that no
    other fitting configuration dominates by the model's structure (:func:`dominates`: the same plan at a
    larger batch, ``none`` at the same batch), the likeliest first. Not the next by its raw reading: on a
    busy machine that is another reading taken in a quiet gap.

    Where a busy machine took a reading of the leader, none it dominates is a rival: :func:`choose` drops
    it from a busy round, and a quiet one reads it no faster than the leader (which fits).

    Measured (issue 42): the demo's none@4, read at 103 in a quiet gap, verified at 10; its rival by raw
    reading was none@1 (40.6, another gap), and none@32, read twice at 23, was never compared: none@4 was
    answered at half of none@32's speed. And beside four bursting neighbours, examples/gpt.py's none@32,
    read 9.3, 23.7 and 90.6, was measured in a second round beside none@4 and none@1 (10-15 s each)."""
    verified = _readings(records).get(leader)
    floor = verified.low if verified is not None else 0.0
    model = speed_of(records, forward_shares)
    fitting = [c for c, _ in ranked]
    likely: dict[Configuration, float] = {}
    busy = _loaded(records, [leader])
    for config, reading in ranked:
        estimate = max(reading.mid, model.predict(*config) or 0.0)
        if busy and dominates(leader, config):
            continue
        if config != leader and max(reading.high, estimate) >= floor:
            likely[config] = estimate
    undominated = {c for c in likely if not any(dominates(o, c) for o in fitting if o != c)}
    order = sorted(likely, key=lambda c: (c not in undominated, -likely[c], c))
    return order[: MAX_CONTENDERS - 1]


def side_by_side(records: list[TrialRecord], contenders: list[Configuration]) -> bool:
    """Whether every one of several contenders was measured again by the verification (interleaved: a
    round), so that readings, not only the model's structure, may order them."""
    verified = {r.config for r in records if r.kind is TrialKind.VERIFICATION and r.throughput is not None}
    return len(contenders) < 2 or all(c in verified for c in contenders)


def _loaded(records: list[TrialRecord], configs: list[Configuration]) -> bool:
    """Whether a busy machine took any reading of ``configs`` (autotune.search.noise.disturbed)."""
    return not noise.read_busy(records).isdisjoint(configs)


def _undominated(configs: list[Configuration]) -> list[Configuration]:
    """``configs`` less those another of them dominates by the throughput model's structure, in order."""
    return [c for c in configs if not any(dominates(o, c) for o in configs)]


def dominating(
    leader: Configuration, fitting: list[Configuration], records: list[TrialRecord]
) -> list[Configuration]:
    """Where a busy machine took the readings of the leader or of a fitting configuration that dominates it
    by the throughput model's structure (:func:`autotune.search.throughput_model.dominates`: its plan at a
    larger batch, a plan recomputing less at its batch): those configurations, the ones no other of them
    dominates; they are verified beside it. Issue 42: beside four bursting neighbours on 2 cores, a larger
    batch read slower even side by side (every answer of examples/mlp.py at 700 MB was a smaller batch of
    ``none`` than the quiet optimum, none@384, at 0.53-0.86 of its quiet speed); and the demo beside two
    such neighbours read none@1 at 41 in a quiet moment and none@2 and none@4 at 2-24 in busy ones, and
    answered none@1 at half of none@32's speed."""
    above = [c for c in fitting if dominates(c, leader)]
    if not _loaded(records, [leader, *above]):
        return []
    return _undominated(above)[: MAX_CONTENDERS - 1]


def choose(records: list[TrialRecord], contenders: list[Configuration], memory_noise: float) -> Configuration:
    """The fastest contender by all its readings; among those within its noise (at most TIE of its speed):
    first, those that no tied contender recomputing less at the same batch outranks (:func:`outranks`:
    where readings cannot tell two plans apart, the recompute's cost can); of those, the ones whose peak
    (the median of its readings) is within the memory noise of the smallest; of those, the fastest. A
    larger batch of a tied contender's own plan does not outrank it: a tie is a curve that has flattened,
    and the smaller peak keeps the headroom (issue 43: the T5 script's batch 64 beat 48 at +2% and, verified
    at 1.85 GiB, reached 1958 MiB within 60 steps, past its 1945.6 MiB limit; the ViT's 128 beat 96 at +0.7%
    for ~300 MiB more).

    Measured on a busy machine (issue 25's bench): the smaller peak within the speed noise once chose a
    recompute plan 5% slower than ``none`` at the same batch size (a few MiB smaller by RSS: noise too);
    readings spread ±15% made batch 4 (105 samples/s by its median) a tie with batch 32 (114), and batch
    4's smaller peak won, at 0.77 of the optimum; and every reading of a run taken under load put batch 4,
    batch 32 and MLP:1@32 within 0.4% of each other.

    Where a busy machine took the contenders' readings, none that another contender dominates is chosen,
    whatever the readings say: under contention a larger batch, or ``none`` beside a plan that recomputes,
    reads slower than it runs on the machine the answer is for (torch's threads wait on one another when a
    core is taken from them), and readings taken side by side do not undo that. Nor where they were not
    read side by side (:func:`side_by_side`: a run that could pay for no round): a leader's longer run in a
    process of its own beside a rival's one search reading is no comparison, and nothing but the model's
    structure orders them (issue 41: bench/time_to_answer.py's GPT-2 verified none@7 at 2.69 samples/s
    against 3.01 in the search, the time limit left no round, and none@4's one reading, 2.85, tied the
    two's median: none@4 was answered, 0.89x the peer's speed where none@7 ran 1.04x).

    Where both hold (a busy machine took readings not taken side by side), the readings order nothing:
    the first of ``contenders`` that no other dominates is chosen, the leader (callers give it first: the
    configuration the search found, whose verification read its peak), or what dominates it. Issue 42:
    beside four bursting neighbours, examples/gpt.py's run spent its --trials on plans at batch 48 and
    verified none@32 at 29.4 against its search's 93.6; with no run left for a round, the one busy reading
    of CausalSelfAttention:1@48 (67.9) beat none@32's median and was answered, at 0.72 of none@32's quiet
    speed (Block:0.5@48 in another run, 0.71)."""
    apart = not side_by_side(records, contenders)
    if apart or _loaded(records, contenders):
        contenders = _undominated(contenders)
        if apart and _loaded(records, contenders):
            return contenders[0]
    readings = _readings(records)
    peaks = {
        c: statistics.median(
            [r.peak_bytes or 0 for r in records if (r.batch_size, r.plan) == c and r.measured]
        )
        for c in contenders
    }
    fastest = max(contenders, key=lambda c: readings[c].mid)
    bar = readings[fastest].mid * (1 - min(readings[fastest].noise, TIE))
    close = [c for c in contenders if readings[c].mid >= bar]
    undominated = [c for c in close if not any(outranks(o, c) for o in close)] or close
    smallest = min(peaks[c] for c in undominated)
    lean = [c for c in undominated if peaks[c] <= smallest + memory_noise]
    return max(lean, key=lambda c: (readings[c].mid, -peaks[c]))


def _store(search: Search, lease: Lease, config: Configuration, records: list[TrialRecord]) -> BestRow:
    speed = _readings(records)[config]
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
        f"{_name(config)} failed verification ({why}): the search goes on from its peaks "
        "(within --trials), then verifies the next leader"
    )


def _name(config: Configuration) -> str:
    return f"{config.plan}@{config.batch_size}"


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
    note = what.format(trial=f"trial {first.number}" if first is not None else _name(config))
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
