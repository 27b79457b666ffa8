"""When a trial's measurement ends (autotune.runtime.trial): warm-up that adapts to a slow first measured
step, a measurement that goes on while its throughput's interval is wide, a verification that runs on
while its peak may still grow. None of them in a multi-process job, whose ranks must stop at the same step."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from autotune.core.pressure import STEP_BUSY, burst, busy_now, quiet_rates
from autotune.core.protocol import read_settled
from autotune.core.stats import median_interval
from autotune.runtime.state import TrialState

SETTLE_FACTOR = 1.5  # measured steps at the start this much slower than the steps after them are warm-up
# A trial a burst took all but a step or two of measures on this long (at most measure_cap) for it to pass:
# a neighbour's bursts on this 2-core machine lasted 1-6 s, and the search would otherwise measure the
# configuration again (a warm configuration's warm-up and steps, ~2-5 s here, with another chance of a burst).
BURST_WAIT = 4.0
TREND = 0.6  # Kendall's S over the pairs of measured steps at which they are getting faster (speeding_up)


def peak_settling(trial: TrialState) -> bool:
    """Whether a verification runs on while its peak may still grow (autotune.trials.settle): until
    the step the tuner wrote, or ``settle_steps`` past the measured ones."""
    if not trial.request.settle_steps:
        return False
    end = read_settled(trial.request.settled_path)
    if end is not None:
        trial.settled = end[1]
        return trial.steps < end[0]
    past = len(trial.step_seconds) - trial.request.measured_steps
    if past >= trial.request.settle_steps:
        trial.settled = "step cap"
        return False
    return True


def measuring_on(trial: TrialState) -> bool:
    """Whether the throughput's interval (over its quiet steps: autotune.core.pressure) is still wider than
    the request's ``tight`` and the trial may measure longer: its measured steps have taken less than
    ``measure_share`` of its start-up (to the end of its warm-up) and ``measure_cap`` seconds, and the load
    has not changed as it ran (``shifted``). A trial that took 18 s to start is worth more than 0.35 s of
    measured steps. While its steps are still getting faster (``speeding_up``: a slow start that has not
    ended) and its warm-up can still grow, outside a settling verification, the bound is what the trial has
    cost so far, its whole start-up, not a share of it: the slow steps then become warm-up
    (:func:`unsettled`) and the reading is the steady ones'. A trial a burst took all but a step or two of
    (``burst``) measures on for up to BURST_WAIT seconds of steps, whatever its start-up; otherwise a busy
    step ends the measuring on (``busy_now``): the reading sets aside the steps a busy moment slows, so
    measuring through one tightens nothing (issue 42: examples/gpt.py at batch 1 beside four bursting
    neighbours read six quiet steps of 0.02 s, then measured on through seven busy ones, 0.05-2.5 s each,
    for 5.8 s; none of them entered its reading). Not in a multi-process job: each rank would decide alone,
    and one that stopped a step before another would leave it waiting in a collective."""
    if not trial.request.tight or trial.rank is not None or not trial.step_seconds:
        return False
    spent = sum(trial.step_seconds)
    if spent >= trial.request.measure_cap:
        return False
    pressures = trial.measured_pressure()
    if burst(pressures, len(trial.step_seconds)) and spent < BURST_WAIT:
        return True  # too few quiet steps to read a speed from: a little longer, for the burst to pass
    if busy_now(pressures, len(trial.step_seconds)):
        return False
    startup = max(trial.startup_seconds(), trial.process_startup)  # the process's start-up
    rates = quiet_rates(trial.step_samples, trial.step_seconds, pressures)
    share = 1.0 if _slow_start_pending(trial, rates) else trial.request.measure_share
    if spent >= share * startup:
        return False
    speed = median_interval(rates)
    if speed is None or speed.noise <= trial.request.tight:
        return False
    if (why := shifted(rates, trial.request.measured_steps)) is not None:
        trial.shifted = why
        return False
    return True


def _slow_start_pending(trial: TrialState, rates: list[float]) -> bool:
    """Whether measuring on may yet turn a slow start into warm-up: its steps are getting faster, its warm-up
    can still grow (:func:`unsettled`), and it is no settling verification (which runs 15 steps and more:
    a slow start is cut from those; past them its longer run is for its peak, not its speed)."""
    if trial.request.settle_steps or not _warmup_room(trial):
        return False
    return speeding_up(rates, trial.request.tight)


def speeding_up(rates: list[float], tight: float) -> bool:
    """Whether the measured steps are getting faster: the later half reads faster than the earlier half, by
    their medians, by more than ``tight``, and the steps rise in order (Kendall's S, over every pair of
    steps, at least TREND of the pairs: five steps noisy around one speed reach it in 14 of their 120
    orders, a slow start settling in every one). A slow start that may not have ended (issue 43: a script
    that checkpoints every other block itself took 0.40-0.67 s a step for its first ~7 steps at batch 12
    and 0.21-0.23 s after; its five measured steps, all slow, were its reading, 21.3 samples/s where it
    runs at 52.9)."""
    half = len(rates) // 2
    if half < 2 or statistics.median(rates[half:]) <= (1 + tight) * statistics.median(rates[:half]):
        return False
    pairs = [(a, b) for i, a in enumerate(rates) for b in rates[i + 1 :]]
    rising = sum((b > a) - (b < a) for a, b in pairs)
    return rising >= TREND * len(pairs)


def shifted(rates: list[float], measured_steps: int) -> str | None:
    """Why measuring longer buys nothing, None while it may: once the measurement has run twice its steps,
    its later half reads slower than its earlier half, beyond both their intervals. Load only slows a step,
    and a load that came as the trial ran does not average out by measuring on (issue 42: on a busy 2-core
    machine verifications measured for 26-91 s each and still disagreed); the search measures such a
    configuration again, interleaved with the others (autotune.search.noise.disturbed). A later half that
    reads faster is a slow start settling, which measuring on does help."""
    half = len(rates) // 2
    if half < max(measured_steps, 2):
        return None
    early, late = median_interval(rates[:half]), median_interval(rates[half:])
    if early is None or late is None or late.high >= early.low:
        return None
    return (
        f"the load changed as it measured: its later {len(rates) - half} steps read {late.mid:,.1f} samples/s, "
        f"its first {half} {early.mid:,.1f}"
    )


def unsettled(trial: TrialState) -> bool:
    """Whether the measured steps start with steps still warming up (:func:`slow_prefix`): then they become
    warm-up (up to the cap) and as many more are measured. A prefix of two steps or more is a slow start the
    trial says it measured past (``slow_start``)."""
    # Not in a multi-process job: each rank would decide alone, and a rank that stopped a step before
    # another would leave it waiting in a collective.
    if trial.rank is not None or not (room := _warmup_room(trial)):
        return False
    k = slow_prefix(trial.step_seconds, room)
    if not k or waited(trial.measured_pressure(), k):
        return False
    slowest = max(trial.step_seconds[:k])
    trial.slowest_warmup = max(trial.slowest_warmup, slowest)
    trial.warmup_steps += k
    if trial.warmup_steps - trial.request.warmup_steps >= 2:
        trial.slow_start = (
            f"a slow start: its first {trial.warmup_steps} steps were warm-up ({trial.request.warmup_steps} "
            f"asked), up to {trial.slowest_warmup:.3g} s a step where the steady ones took "
            f"{_lower_median(trial.step_seconds[k:]):.3g} s"
        )
    if len(trial.step_pressure) == len(trial.step_seconds):
        del trial.step_pressure[:k]
    del trial.step_seconds[:k], trial.step_samples[:k]
    if len(trial.step_tokens) > len(trial.step_seconds):
        del trial.step_tokens[: len(trial.step_tokens) - len(trial.step_seconds)]
    return True


def waited(pressures: Sequence[float], k: int) -> bool:
    """Whether each of the first ``k`` measured steps waited at least STEP_BUSY of its time for a CPU (a
    neighbour's burst: autotune.core.pressure): load explains their being slow, and a slow start cannot be
    told from it. They stay measured steps, which the reading sets aside where enough others are quiet
    (quiet_rates); made warm-up, as many more steps were measured, each as likely a burst's. Issue 42,
    beside four bursting neighbours: examples/gpt.py's none@32 made its first 7 steps warm-up (1 asked),
    up to 3.48 s a step where the steady ones took 1 s, 31 s for a trial whose measured steps took 8; the
    rule exists for a script's own slow start (issue 43), on a machine that may be quiet. False where any
    step's pressure is unknown."""
    return len(pressures) >= k > 0 and all(p >= STEP_BUSY for p in pressures[:k])


def slow_prefix(seconds: list[float], most: int) -> int:
    """The length of the longest prefix of the measured steps (at most ``most``, with at least two steps
    after it) each of whose steps took more than SETTLE_FACTOR times the lower median of the steps after
    it; 0 where there is none. A first step that is an outlier is a prefix of one; a slow start of several
    steps (issue 43) is found once a few steady steps follow it, however many the slow ones are."""
    for k in range(min(most, len(seconds) - 2), 0, -1):
        if min(seconds[:k]) > SETTLE_FACTOR * _lower_median(seconds[k:]):
            return k
    return 0


def _warmup_room(trial: TrialState) -> int:
    """The steps the trial's warm-up may still grow by (up to the request's ``warmup_max``; none in a sweep's
    later segment, whose warm-up counts from the trial's first step)."""
    return max(max(trial.request.warmup_max, trial.request.warmup_steps) - trial.warmup_steps, 0)


def _lower_median(values: list[float]) -> float:
    return sorted(values)[(len(values) - 1) // 2]
