"""A reading worth its trial (issue 31): a trial measures past its 5 steps while its throughput's interval
is wider than TrialSettings.tight (3%), for at most a quarter of its start-up (and 10 s). On an H100 a trial
took ~18 s to start and measured 5 steps in 0.35 s; readings of one configuration ranged 27.5-37.9 samples/s.

The rule is replayed exactly on each trial's steps: every count it measured on at was still wide, and where
it stopped the interval was tight or a quarter of its start-up was spent; the trial's start-up and measured
seconds are reported. Measuring longer stops where it buys nothing (issue 42): once the later half of the
steps reads slower than the earlier half beyond both intervals, the load changed as it ran."""

from __future__ import annotations

from autotune.core.protocol import Outcome
from autotune.core.stats import median_interval
from autotune.runtime.settling import shifted
from autotune.trials.settings import TrialSettings

STARTUP = 4.0  # seconds the script sleeps before its first step
TIGHT = TrialSettings().tight


def noise(steps: list[float], batch: int) -> float:
    interval = median_interval([batch / s for s in steps])
    assert interval is not None
    return interval.noise


def replay(result, measured: int) -> None:
    steps = list(result.step_seconds)
    assert len(steps) >= measured
    for k in range(measured, len(steps)):  # it measured on: still wide, and its time not spent
        assert noise(steps[:k], result.batch_size) > TIGHT, (k, steps)
        assert sum(steps[:k]) < 0.25 * result.startup_seconds, (k, steps)
    # it stopped: tight, or a quarter of its start-up (at least STARTUP: the runtime's own count) spent
    assert noise(steps, result.batch_size) <= TIGHT or sum(steps) >= 0.25 * STARTUP, steps
    assert result.measured_seconds == sum(steps)
    assert STARTUP < result.startup_seconds < result.wall_seconds


def test_noisy_steps_are_measured_longer_and_steady_ones_are_not(synthetic) -> None:
    common = ("--startup-seconds", str(STARTUP), "--step-seconds", "0.05")
    noisy = synthetic(4, *common, "--noise", "0.6", "--seed", "1", measured_steps=5)
    assert noisy.outcome is Outcome.COMPLETE
    assert len(noisy.step_seconds) > 5  # five steps spread ±60% are no reading
    replay(noisy, 5)
    steady = synthetic(4, *common, measured_steps=5)
    assert steady.outcome is Outcome.COMPLETE
    replay(steady, 5)
    assert len(steady.step_seconds) < len(noisy.step_seconds)
    assert noisy.shifted is None and steady.shifted is None  # noise that stays is measured on


def test_a_load_that_arrives_as_the_trial_measures_on_ends_its_lengthening(synthetic) -> None:
    """Noisy steps (±60%), measured on for a tighter reading, and from step 9 each takes 4x longer: once
    the later half of the steps reads slower than the earlier beyond both intervals, measuring on stops,
    short of the quarter of its start-up it could have spent, and the trial says why."""
    common = ("--startup-seconds", str(STARTUP), "--step-seconds", "0.02", "--noise", "0.6", "--seed", "1")
    result = synthetic(4, *common, "--slow-from", "9=4", measured_steps=5)
    assert result.outcome is Outcome.COMPLETE
    steps = list(result.step_seconds)
    assert result.shifted is not None and result.shifted.startswith(
        "the load changed as it measured: its later"
    )
    assert shifted([4 / s for s in steps], 5) is not None  # the rule, replayed on its steps
    assert all(shifted([4 / s for s in steps[:k]], 5) is None for k in range(5, len(steps)))  # not before
    assert sum(steps) < 0.25 * STARTUP  # it stopped before its time was spent
    assert len(steps) >= 10 and max(steps[-3:]) > 2 * min(steps[:5])


def test_what_reads_as_a_load_that_came_and_what_as_a_slow_start() -> None:
    """The rule itself: halves read at one speed (noise that stays) or faster later (a slow start settling,
    which measuring on helps) measure on; a later half slower beyond both intervals is a load that came."""
    steady = [100.0, 90.0, 110.0, 95.0, 105.0, 100.0, 92.0, 108.0, 97.0, 103.0]
    assert shifted(steady, 5) is None
    assert shifted([50.0] * 2 + [48.0, 52.0, 51.0] + [100.0, 98.0, 101.0, 99.0, 102.0], 5) is None
    slower = [100.0, 98.0, 101.0, 99.0, 102.0, 50.0, 48.0, 52.0, 51.0, 49.0]
    assert shifted(slower, 5) == (
        "the load changed as it measured: its later 5 steps read 50.0 samples/s, its first 5 100.0"
    )
    assert shifted(slower[:9], 5) is None  # before twice its steps: too few to tell


def test_a_fixed_count_where_tight_is_zero(synthetic) -> None:
    common = ("--startup-seconds", str(STARTUP), "--noise", "0.6", "--seed", "1")
    result = synthetic(4, *common, measured_steps=5, tight=0.0)
    assert len(result.step_seconds) == 5


def test_a_script_that_ends_while_the_trial_measures_on_is_read_from_the_steps_it_ran(synthetic) -> None:
    """A probe on a loaded machine: the script's 100 steps of a tiny model took a millisecond each, their
    interval never came within 3%, and the script ended of itself while the trial measured on for a tighter
    reading: the trial failed, "the script ended after 100 of 5 steps". Its measured steps are its reading.
    (A `tight` no real steps reach keeps the trial measuring on, load or not.) A script that ends before
    the measured steps asked for still fails, saying so."""
    common = ("--startup-seconds", str(STARTUP), "--step-seconds", "0.01")
    ended = synthetic(4, *common, "--steps", "9", measured_steps=5, tight=1e-9)
    assert (ended.outcome, ended.error) == (Outcome.COMPLETE, None)
    assert ended.warmup_steps is not None and len(ended.step_seconds) + ended.warmup_steps == 9  # all counted
    assert len(ended.step_seconds) >= 5
    short = synthetic(4, *common, "--steps", "4", measured_steps=5, tight=1e-9)
    assert (short.outcome, short.error) == (Outcome.FAILED, "the script ended after 4 of 6 steps")
