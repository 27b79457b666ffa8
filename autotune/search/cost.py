"""What a run may spend in wall-clock time (issue 42, ``--time-limit``).

The limit bounds the run from its start to its answer: the search stops proposing while one more search
trial and a verification still fit in what is left (``Search._spent``), and the verification measures
whole interleaved rounds within it (``verify._within_cost``); each says so when it is what ended them. The
estimates come from the study's own trials (``trial_seconds``), with SLACK for a busy machine.

On a busy 2-core machine the demo took 329 s and 767 s to answer with no bound but ``--trials``.
"""

from __future__ import annotations

import math
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
    """From the study's timed trials: the longest start-up (launch to the end of the first step) and the
    longest measured steps of a search trial (0, 0 before any)."""
    timed = [r for r in records if r.kind is TrialKind.MEASURED and r.startup_seconds is not None]
    startup = max((r.startup_seconds or 0.0 for r in timed), default=0.0)
    measured = max((r.measured_seconds or 0.0 for r in timed), default=0.0)
    return startup, measured


def verification_seconds(records: Iterable[TrialRecord]) -> float:
    """What one verification is expected to take: a fresh process's start-up and VERIFY_FACTOR times a
    search trial's measured steps, with SLACK for what the tuner does around it (its records, a slow start)."""
    startup, measured = trial_seconds(records)
    return SLACK * (startup + VERIFY_FACTOR * measured) + SLACK_SECONDS


def search_seconds(records: Iterable[TrialRecord]) -> float:
    """What one more search trial is expected to take, at most (a warm one starts in less)."""
    startup, measured = trial_seconds(records)
    return SLACK * (startup + measured) + SLACK_SECONDS


def default_limit(probe_seconds: float, records: Iterable[TrialRecord]) -> float:
    """The time limit where the user gave none: DEFAULT_SECONDS, or DEFAULT_PROBES times the probe (or,
    where it was stored, the study's longest trial), whichever is longer."""
    startup, measured = trial_seconds(records)
    return max(DEFAULT_SECONDS, DEFAULT_PROBES * max(probe_seconds, startup + measured))
