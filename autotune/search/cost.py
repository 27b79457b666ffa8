"""What a run may spend in wall-clock time (issue 42, ``--time-limit``).

The limit bounds the run from its start to its answer: the search stops proposing while one more search
trial and a verification still fit in what is left (``Search._spent``), and the verification measures
whole interleaved rounds within it (``verify._within_cost``); each says so when it is what ended them. The
estimates come from the study's own trials (``trial_seconds``), with SLACK for a busy machine.

On a busy 2-core machine the demo took 329 s and 767 s to answer with no bound but ``--trials``.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass

from autotune.search.records import TrialKind, TrialRecord

DEFAULT_SECONDS = 180.0  # the default limit's floor: the demo and the examples, on a busy 2-core machine
DEFAULT_PROBES = 10  # ... or this many times what the probe took, whichever is longer
VERIFY_FACTOR = 4  # a verification's measured steps to a search trial's: 3x the steps, then its peak settles
SLACK = 1.25  # what a trial may take beyond its estimate (a busy machine's start-up, the records around it)
SLACK_SECONDS = 1.0


@dataclass(frozen=True)
class Cost:
    """A run's time limit: the monotonic ``deadline`` (None: none) and the ``limit_seconds`` it came from."""

    deadline: float | None = None
    limit_seconds: float | None = None

    def seconds_left(self) -> float:
        return math.inf if self.deadline is None else self.deadline - time.monotonic()

    def fits(self, seconds: float) -> bool:
        """Whether something expected to take ``seconds`` ends within the time limit."""
        return seconds <= self.seconds_left()

    def why_not(self, seconds: float) -> str | None:
        """Why something expected to take ``seconds`` cannot start (None: it fits)."""
        if self.fits(seconds):
            return None
        return (
            f"the time limit ({self.limit_seconds or 0:,.0f} s, --time-limit) leaves "
            f"{max(self.seconds_left(), 0):,.0f} s"
        )


def trial_seconds(records: Iterable[TrialRecord]) -> tuple[float, float]:
    """From the study's timed search trials: the median start-up of a process (launch to the end of its first
    step; a warm process's later configurations start in less) and the median measured steps (0, 0 before
    any). Medians, not the longest: on a busy machine the longest readings of the demo (6.7 s starting, 12.6 s
    measuring) priced a verification at 72 s where each took 13 s, and cut its rivals."""
    timed = [r for r in records if r.kind is TrialKind.MEASURED and r.startup_seconds is not None]
    fresh = [r.startup_seconds or 0.0 for r in timed if r.warm_run in (None, 1)]
    startup = statistics.median(fresh) if fresh else 0.0
    measured = statistics.median(r.measured_seconds or 0.0 for r in timed) if timed else 0.0
    return startup, measured


def verification_seconds(records: Iterable[TrialRecord]) -> float:
    """What one verification is expected to take: the median of the study's verifications, else a fresh
    process's start-up and VERIFY_FACTOR times a search trial's measured steps; with SLACK for what the
    tuner does around it (its records, a slow start)."""
    records = list(records)
    done = [
        r.startup_seconds + r.measured_seconds
        for r in records
        if r.kind is TrialKind.VERIFICATION
        and r.startup_seconds is not None
        and r.measured_seconds is not None
    ]
    if done:
        return SLACK * statistics.median(done) + SLACK_SECONDS
    startup, measured = trial_seconds(records)
    return SLACK * (startup + VERIFY_FACTOR * measured) + SLACK_SECONDS


def search_seconds(records: Iterable[TrialRecord]) -> float:
    """What one more search trial is expected to take (a warm one starts in less)."""
    startup, measured = trial_seconds(records)
    return SLACK * (startup + measured) + SLACK_SECONDS


def default_limit(probe_seconds: float, records: Iterable[TrialRecord]) -> float:
    """The time limit where the user gave none: DEFAULT_SECONDS, or DEFAULT_PROBES times the probe (or,
    where it was stored, a trial of the study (its median)), whichever is longer."""
    startup, measured = trial_seconds(records)
    return max(DEFAULT_SECONDS, DEFAULT_PROBES * max(probe_seconds, startup + measured))
