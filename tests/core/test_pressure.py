"""Which of a trial's measured steps its speed is read from (autotune.core.pressure): the ones a busy moment
did not slow, by the CPU pressure the runtime read over each."""

from __future__ import annotations

from autotune.core.pressure import MIN_QUIET_STEPS, STEP_LOADED, quiet_rates, quiet_steps, set_aside


def test_the_steps_within_a_few_percent_of_the_quietest_step_s_pressure_are_kept() -> None:
    # the run of issue 41 beside a bursting neighbour: 0.00-0.02 between bursts, 0.13-0.50 in them
    pressures = [0.00, 0.01, 0.02, 0.00, 0.43, 0.49, 0.50, 0.13, 0.01]
    assert quiet_steps(pressures, 9) == [0, 1, 2, 3, 8]
    assert set_aside(pressures, 9) == (4, (0.00 + 0.01 + 0.02 + 0.00 + 0.01) / 5)
    # the floor is the trial's own quietest step: a machine whose quiet reads 0.08 keeps 0.08-0.13
    assert quiet_steps([0.08, 0.10, 0.65, 0.13, 0.14], 5) == [0, 1, 3]
    assert STEP_LOADED == 0.05


def test_a_reading_takes_every_step_where_too_few_are_quiet_or_the_kernel_does_not_say() -> None:
    assert MIN_QUIET_STEPS == 3
    assert quiet_steps([0.0, 0.0, 0.5, 0.5, 0.5], 5) == [0, 1, 2, 3, 4]  # two quiet steps are no reading
    assert set_aside([0.0, 0.0, 0.5, 0.5, 0.5], 5) == (0, 0.3)  # then its pressure is all its steps'
    assert quiet_steps([], 4) == [0, 1, 2, 3]  # no PSI
    assert quiet_steps([0.0, 0.5], 3) == [0, 1, 2]  # not one per step (a step's counter was unreadable)
    assert set_aside([], 4) == (0, None)
    assert quiet_steps([], 0) == [] and set_aside([], 0) == (0, None)


def test_the_rates_are_the_quiet_steps_counts_per_second() -> None:
    samples, seconds = [8, 8, 8, 8], [0.1, 0.4, 0.2, 0.1]
    assert quiet_rates(samples, seconds, [0.0, 0.6, 0.01, 0.02]) == [80.0, 40.0, 80.0]
    assert quiet_rates(samples, seconds, []) == [80.0, 20.0, 40.0, 80.0]


def test_a_burst_is_too_few_quiet_steps_beside_busy_ones() -> None:
    from autotune.core.pressure import burst

    assert burst([0.03, 0.17, 0.50, 0.52, 0.25], 5)  # the demo's batch 4 beside a neighbour: one quiet step
    assert not burst([0.03, 0.02, 0.01, 0.52, 0.50], 5)  # three quiet ones: a reading
    assert not burst([0.50, 0.52, 0.49, 0.51, 0.50], 5)  # busy throughout: nothing to wait for
    assert not burst([], 5) and not burst([0.0, 0.5], 3)  # the kernel does not say
