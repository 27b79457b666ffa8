"""When a trial's measurement ends (autotune.runtime.trial): warm-up that adapts to a slow first measured
step, a measurement that goes on while its throughput's interval is wide, a verification that runs on
while its peak may still grow. None of them in a multi-process job, whose ranks must stop at the same step."""

from __future__ import annotations

from autotune.core.pressure import burst, quiet_rates
from autotune.core.protocol import read_settled
from autotune.core.stats import median_interval
from autotune.runtime.state import TrialState

SETTLE_FACTOR = 1.5  # a first measured step this much slower than the median of the others is warm-up
# A trial a burst took all but a step or two of measures on this long (at most measure_cap) for it to pass:
# a neighbour's bursts on this 2-core machine lasted 1-6 s, and the search would otherwise measure the
# configuration again (a warm configuration's warm-up and steps, ~2-5 s here, with another chance of a burst).
BURST_WAIT = 4.0


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
    measured steps. A trial a burst took all but a step or two of (``burst``) measures on for up to
    BURST_WAIT seconds of steps, whatever its start-up. Not in a multi-process job: each rank would decide
    alone, and one that stopped a step before another would leave it waiting in a collective."""
    if not trial.request.tight or trial.rank is not None or not trial.step_seconds:
        return False
    spent = sum(trial.step_seconds)
    if spent >= trial.request.measure_cap:
        return False
    if burst(trial.measured_pressure(), len(trial.step_seconds)) and spent < BURST_WAIT:
        return True  # too few quiet steps to read a speed from: a little longer, for the burst to pass
    startup = max(trial.startup_seconds(), trial.process_startup)  # the process's start-up
    if spent >= trial.request.measure_share * startup:
        return False
    rates = quiet_rates(trial.step_samples, trial.step_seconds, trial.measured_pressure())
    speed = median_interval(rates)
    if speed is None or speed.noise <= trial.request.tight:
        return False
    if (why := shifted(rates, trial.request.measured_steps)) is not None:
        trial.shifted = why
        return False
    return True


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
    """Whether the first measured step is still warming up: then it becomes warm-up (up to the cap)."""
    cap = max(trial.request.warmup_max, trial.request.warmup_steps)
    # Not in a multi-process job: each rank would decide alone, and a rank that stopped a step before
    # another would leave it waiting in a collective.
    if trial.rank is not None or len(trial.step_seconds) < 3 or trial.warmup_steps >= cap:
        return False
    rest = sorted(trial.step_seconds[1:])
    if trial.step_seconds[0] <= SETTLE_FACTOR * rest[(len(rest) - 1) // 2]:  # the lower median
        return False
    trial.warmup_steps += 1
    if len(trial.step_pressure) == len(trial.step_seconds):
        del trial.step_pressure[0]
    del trial.step_seconds[0], trial.step_samples[0]
    if len(trial.step_tokens) > len(trial.step_seconds):
        del trial.step_tokens[0]
    return True
