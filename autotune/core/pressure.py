"""The kernel's CPU pressure, step by step: which of a trial's measured steps a busy machine slowed, so that
its speed is read from the others.

Linux counts the microseconds at least one runnable task waited for a CPU ("some" in ``/proc/pressure/cpu``,
PSI). Measured here (2 cores, examples/gpt.py's model at batch 32, a neighbour burning a core in bursts of
1-6 s): the steps a burst overlapped read 31-57 samples/s at a pressure of 0.43-0.50 of their time, the
steps between bursts 90-115 at 0.00-0.02, the quiet machine's 107-118 at 0.00-0.01. A trial's speed is
the median over its *quiet* steps, those within STEP_LOADED of its quietest step's pressure: a burst that
covered half a verification's steps no longer halves its reading, and the search need not measure it again
(issue 41: beside such a neighbour the demo ran 12-15 trials where a quiet machine runs 5). Where the
kernel says nothing (no PSI) or fewer than MIN_QUIET_STEPS steps are quiet, every step counts, as before,
and the reading is as disturbed as its trial (autotune.search.noise).

The trial's runtime reads the counter at every step's end (one small file, ~10 µs); the tuner reads it
around each trial (autotune.hardware.load). ``$AUTOTUNE_CPU_PRESSURE_PATH`` points both elsewhere: a
cgroup v2 container's own cpu.pressure judges the load on that container; the test suite points it at a
quiet file for every process it starts.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence

PRESSURE_PATH = "/proc/pressure/cpu"
PRESSURE_ENV = "AUTOTUNE_CPU_PRESSURE_PATH"
STEP_LOADED = 0.05  # a step whose pressure is this much above its trial's quietest step's: a busy moment
MIN_QUIET_STEPS = 3  # fewer quiet steps than this: the reading takes every step (and is disturbed)
# A step that waited this share of its time for a CPU is a busy moment in itself (busy_now): the steps a
# neighbour's burst overlapped read 0.43-1.0 here, while a quiet machine's 30-60 ms steps read up to 0.12 (the
# tuner's own sampling, a few milliseconds of a short step) and stopped measuring on for nothing.
STEP_BUSY = 0.25


def pressure_total() -> int | None:
    """Microseconds some task waited for a CPU since boot (None without PSI: an old kernel, or disabled)."""
    try:
        with open(os.environ.get(PRESSURE_ENV) or PRESSURE_PATH) as f:
            return int(f.readline().split("total=")[1])
    except (OSError, IndexError, ValueError):
        return None


def quiet_steps(pressures: Sequence[float], steps: int) -> list[int]:
    """The indices of the ``steps`` measured steps a reading is taken from: those whose pressure is within
    STEP_LOADED of the quietest's; all of them where the pressure of each is not known (``pressures`` not
    one per step) or fewer than MIN_QUIET_STEPS are quiet."""
    if len(pressures) != steps or not steps:
        return list(range(steps))
    quiet = _near_quietest(pressures)
    return quiet if len(quiet) >= MIN_QUIET_STEPS else list(range(steps))


def burst(pressures: Sequence[float], steps: int) -> bool:
    """Whether a busy moment took the ``steps`` measured steps but for fewer than MIN_QUIET_STEPS: some
    read more than STEP_LOADED above the quietest, and too few are quiet to read a speed from (the trial
    measures on a little, for the burst to pass: autotune.runtime.settling)."""
    if len(pressures) != steps or not steps:
        return False
    quiet = _near_quietest(pressures)
    return len(pressures) > len(quiet) and len(quiet) < MIN_QUIET_STEPS


def busy_now(pressures: Sequence[float], steps: int) -> bool:
    """Whether the last of the ``steps`` measured steps read more than STEP_LOADED above the quietest, and
    at least STEP_BUSY: a busy moment has come (False where the pressure of each step is not known). The
    steps it slows are set aside from the reading, so measuring through it tightens nothing
    (autotune.runtime.settling.measuring_on)."""
    if len(pressures) != steps or not steps:
        return False
    return pressures[-1] > min(pressures) + STEP_LOADED and pressures[-1] >= STEP_BUSY


def _near_quietest(pressures: Sequence[float]) -> list[int]:
    """The indices of the steps within STEP_LOADED of the quietest step's pressure."""
    floor = min(pressures) + STEP_LOADED
    return [i for i, p in enumerate(pressures) if p <= floor]


def quiet_rates(counts: Sequence[int], seconds: Sequence[float], pressures: Sequence[float]) -> list[float]:
    """Per-step rates (``counts`` per second: samples, tokens) of the quiet steps (:func:`quiet_steps`)."""
    if len(counts) != len(seconds):
        return []
    return [counts[i] / seconds[i] for i in quiet_steps(pressures, len(seconds)) if seconds[i] > 0]


def set_aside(pressures: Sequence[float], steps: int) -> tuple[int, float | None]:
    """How many of the ``steps`` measured steps a reading left out as busy, and the mean pressure over the
    ones it kept (None where the pressure of each is not known)."""
    kept = quiet_steps(pressures, steps)
    if len(pressures) != steps or not kept:
        return 0, None
    return steps - len(kept), statistics.fmean(pressures[i] for i in kept)
