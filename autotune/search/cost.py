"""What a run may spend (issue 42): trial runs of every kind (``--trials``) and wall-clock time
(``--time-limit``).

``--trials N`` bounds the trial runs ``autotune run`` starts: its probe (a stored probe is not run again),
the search's trials, their re-measurements and the verifications, each a call of the runner (a sweep's plans
share one; a warm process's configurations are one each), so the run never starts more than N trial
processes. The time limit bounds the run from its start to its answer. The search stops proposing while
what is left of either still pays for the verification (``Cost.search_stop``: ``reserve()`` trial runs; one
more search trial and a verification in time), and the verification measures whole interleaved rounds
within what is left (``Cost.verifications``, ``verify._within_cost``); each says so when it is what ended
them. Time estimates come from the study's own trials (``trial_seconds``), with SLACK for a busy machine.

On a busy 2-core machine ``--trials 16`` once started 37 trial processes (8 readings taken again for
disagreeing, 12 re-measurements to verify) in 515 s, and the demo took 329 s and 767 s to answer:
``--trials`` bounded the configurations, not the cost.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from autotune.search.records import TrialKind, TrialRecord

DEFAULT_SECONDS = 180.0  # the default limit's floor: the demo and the examples, on a busy 2-core machine
DEFAULT_PROBES = 10  # ... or this many times what the probe took, whichever is longer
VERIFY_RESERVE = 3  # trial runs the search leaves to the verification: the leader's, a round beside a rival
VERIFY_FACTOR = 3  # a verification's measured steps to a search trial's: 2x the steps, then its peak settles
SLACK = 1.25  # what a trial may take beyond its estimate (a busy machine's start-up, the records around it)
SLACK_SECONDS = 1.0


@dataclass
class Cost:
    """A run's ceilings: ``trials`` runs of every kind (None: none), the run's ``probes`` among them, with
    ``spent`` counting those started; and the monotonic ``deadline`` (None: no time limit) of
    ``limit_seconds``. Shared by the run's searches (the threads of ``--executor ray`` spend from it too)."""

    deadline: float | None = None
    limit_seconds: float | None = None
    trials: int | None = None
    probes: int = 0
    spent: int = field(init=False)
    in_flight: int = field(init=False, default=0)  # runs ``take``/``take_run`` paid for, not ended yet
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.spent = self.probes

    def spend(self, runs: int = 1) -> None:
        """Count ``runs`` trial runs as started (before they run: one that crashes was paid for)."""
        with self._lock:
            self.spent += runs

    def take(self, records: list[TrialRecord]) -> str | None:
        """Pay for one search trial run, None; or why the search may start no more (``search_stop``). One
        check and payment, so the run's parallel searches (``--executor ray``) cannot both take the last."""
        with self._lock:
            why = self.search_stop(records)
            if why is None:
                self.spent += 1
                self.in_flight += 1
            return why

    def ended(self, ran: bool) -> None:
        """A search run paid for by ``take`` or ``take_run`` is over: refunded if it ran nothing."""
        with self._lock:
            self.in_flight -= 1
            if not ran:
                self.spent -= 1

    def take_run(self) -> bool:
        """Pay for one search trial run beyond the verification's reserve, if one is left (no time check:
        a queued lease is a trial already under way once)."""
        with self._lock:
            if self.trials_left() <= self.reserve():
                return False
            self.spent += 1
            self.in_flight += 1
            return True

    def trials_left(self) -> float:
        return math.inf if self.trials is None else max(self.trials - self.spent, 0)

    def reserve(self) -> int:
        """Trial runs the search leaves to the verification: one while --trials leaves fewer than 10 after
        the probe (the leader measured again alone), two up to 14, then VERIFY_RESERVE (the leader's, then a
        round of it beside its likeliest rival); none where it leaves one (that reading is answered
        unverified, and said). Small, because the search most often stops by its own rule, well short of
        --trials, and the verification then has what is left: the reserve only takes from a search that
        would have run to the ceiling."""
        after_probe = (self.trials or 0) - self.probes
        return 0 if after_probe <= 1 else min(VERIFY_RESERVE, max(1, after_probe // 5))

    def seconds_left(self) -> float:
        return math.inf if self.deadline is None else self.deadline - time.monotonic()

    def search_stop(self, records: list[TrialRecord]) -> str | None:
        """Why the search may start no more trial runs, None while it may: what is left of --trials or of
        the time limit is the verification's. Without a reading yet, one is taken while a trial run is left
        beyond the reserve, whatever the time."""
        if self.trials_left() <= self.reserve():
            left = self.trials_left()
            return f"--trials {self.trials} counts every trial run, the probe's and the verification's: " + (
                f"the {left:g} left {'are' if left > 1 else 'is'} kept for the verification"
                if left
                else "none is left"
            )
        if not any(r.kind is TrialKind.MEASURED and r.measured for r in records):
            return None
        if self.deadline is not None:
            needed = search_seconds(records) + verification_seconds(records)
            if needed > self.seconds_left():
                return f"{self._time()}, kept for the verification"
        return None

    def unaffordable(self, records: list[TrialRecord], runs: int = 1) -> str | None:
        """Why ``runs`` more verification runs cannot be paid for, None while they can."""
        if self.trials_left() < runs:
            left = self.trials_left()
            return (
                f"--trials {self.trials} leaves {left:g} trial run{'s' if left != 1 else ''} "
                f"({self.spent} started, the probe's included)"
            )
        if self.deadline is not None and runs * verification_seconds(records) > self.seconds_left():
            return self._time()
        return None

    def verifications(self, records: list[TrialRecord]) -> float:
        """How many verification runs what is left pays for (inf: no ceiling)."""
        seconds = math.inf
        if self.deadline is not None:
            seconds = math.floor(max(self.seconds_left(), 0) / verification_seconds(records))
        return min(self.trials_left(), seconds)

    def _time(self) -> str:
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
