"""What a run may spend (issue 42): wall-clock seconds, and trials of every kind.

``--time-limit`` bounds the run's wall clock from its start: the search stops proposing while a
verification still fits in what is left, and the verification measures whole interleaved rounds within
it; each says so when it is what ended them. ``Cost.trials`` bounds every trial that starts a process (the
search's, its re-measurements, the verifications, this run's probe); the search and the verification obey
it, but ``run`` does not set it yet: ``--trials`` still counts the search's trials only (issue 42's note).

On a busy 2-core machine, ``--trials 16`` once started 37 processes (8 readings taken again for disagreeing,
12 re-measurements to verify) in 515 s: ``--trials`` bounded the configurations, not the cost.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass

from autotune.search.records import TrialKind, TrialRecord

DEFAULT_SECONDS = (
    180.0  # the default --time-limit's floor: the demo and the examples, on a busy 2-core machine
)
DEFAULT_PROBES = 10  # ... or this many times what the probe took, whichever is longer
# trials the search leaves to the verification: the leader's longer run, and one round beside a rival
VERIFY_RESERVE = 3
VERIFY_FACTOR = 4  # a verification's measured steps to a search trial's: 3x the steps, then its peak settles
SLACK = 1.25  # what a trial may take beyond its estimate (a busy machine's start-up, the records around it)
SLACK_SECONDS = 1.0


@dataclass
class Cost:
    """A run's ceilings: ``trials`` (every kind, the probe of this run included: ``probes``) and the
    monotonic ``deadline`` (None: no time limit)."""

    trials: int | None  # None: no ceiling on trials of every kind
    probes: int = 0
    deadline: float | None = None
    limit_seconds: float | None = None  # the time limit as given (for what the run says)

    def spent(self, records: Iterable[TrialRecord]) -> int:
        """Trials that started a process: the probe's, and the study's measured ones and verifications that
        ran or are running (not skipped, copied, warm-started or still queued)."""
        ran = sum(
            1
            for r in records
            if r.kind in (TrialKind.MEASURED, TrialKind.VERIFICATION) and r.state not in ("WAITING",)
        )
        return ran + self.probes

    def left(self, records: Iterable[TrialRecord]) -> float:
        if self.trials is None:
            return math.inf
        return max(self.trials - self.spent(records), 0)

    def reserve(self) -> int:
        """Trials the search leaves to the verification: VERIFY_RESERVE, less where ``--trials`` is small
        (at least one search trial, and one verification, where two fit)."""
        if self.trials is None:
            return 0
        return max(
            min(VERIFY_RESERVE, (self.trials - self.probes) // 3), 1 if self.trials - self.probes > 1 else 0
        )

    def seconds_left(self) -> float:
        return math.inf if self.deadline is None else self.deadline - time.monotonic()

    def fits(self, seconds: float) -> bool:
        """Whether something expected to take ``seconds`` ends within the time limit."""
        return seconds <= self.seconds_left()


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
