"""When a verification's peak has stopped growing: the tuner's side of a trial that runs on past its measured
steps (autotune.core.protocol.TrialRequest.settle_steps).

A peak can grow long after the first steps: the allocator's cache fills as rarer shapes arrive, a LoRA
model's optimizer state and fragmentation build up. Measured (#32): Llama with LoRA through Trainer verified
at 969.05 MiB (limit 972.80) peaked at 985.93 over 60 steps; T5 at batch 24 read 727.65 / 729.64 / 753.18
MiB after 5 / 15 / 100 steps. A verification therefore goes on until the peak, as the meter samples it,
rose by no more than the memory noise over the last ``SETTLE_WINDOW`` steps, or until as long again as the
trial took to reach the end of its measured steps has passed (SETTLE_MIN_SECONDS at least, ``settle_seconds``
at most), or the trial's own cap of extra steps: a verification at most doubles. (A cap of 120 s alone let
each verification of a compiled script whose CPU memory creeps run two more minutes: CI's compatibility
phase went 11 -> 14 min.)

It ends sooner where waiting could change no verdict: once the limit it is judged by has room for its peak's
rise over the last ``SETTLE_WINDOW`` steps to go on at that rate for the steps its time cap still allows, and
for that window's rise once more, which is what a run that reached its cap still rising must leave room for
(:func:`still_rising`). A run to the cap would be judged by the same rule unless its peak rose faster than it
had. Issue 41's GPT-2 on the CPU (bench/time_to_answer.py's model) waited 16 steps of 2.3 s, 37 s of a 122 s
answer, to settle a peak of 2.0 GiB under a limit of 2.15 GiB: a fresh run at batch 7 reads 2010, 2045, 2052
and 2080 MiB of resident peak after 2, 4, 18 and 26 steps (glibc's heap stepping up now and then): ten
more steps could read it settled or still rising, and the answer is the same either way where the limit has
room for the rise.

Where the limit has room, its rate needs no full window: from the end of the measured steps it is read over
the steps since warm-up (``RATE_MIN_STEPS`` at least, the window at most) and counted per ``SETTLE_WINDOW``
steps (:func:`recent_rise`). A verification thus measures the search's five steps, not ten, and ends there
where the limit has room; a peak still creeping after warm-up reads a steeper rate over fewer steps, so it
waits, never fits on less room. Issue 41's GPT-2 waited 13 steps of 2.2 s, 36 s of a 76 s answer, for a
window whose verdict the limit's 130 MiB of room had decided by step 8.

The tuner then writes, at the request's ``settled_path``, the step at which the trial ends: the step a single
process is in, or a step every rank has yet to finish, so that no rank leaves a collective the others still
wait in.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from autotune.core.protocol import rank_files, write_settled

# steps over which the peak must not have grown: a verification measures at least 10, so a peak reached in
# its first steps (the usual case: weights, optimizer state, the allocator's cache) costs no step more
SETTLE_WINDOW = 10
# the rise that counts as no growth: the meter's own noise (an RSS page or two, NVML's 2 MiB granularity)
SETTLE_TOLERANCE_BYTES = 2 * 2**20
SETTLE_TOLERANCE_SHARE = 0.002
SETTLE_MIN_SECONDS = 10.0  # the time cap of a short trial: enough for a few steps more of a quick script
# steps past the tuner's last reading at which the trial ends: its ranks' slowest (core.protocol.read_progress)
# may be a step behind the others, and none may leave a collective another still waits in; a single process
# ends at the step it is in (2.3 s a step on issue 41's GPT-2 on the CPU)
END_MARGIN = 2
ROOM = "rising with room to spare"  # why a verification ended before its peak settled: Settle.room
# the fewest steps past warm-up a peak's rate is read over (recent_rise): one or two steps' rise is a page
# the allocator took or not
RATE_MIN_STEPS = 3


@dataclass
class Settle:
    """A verification's settling, watched by the launcher: where to write the end, the steps its measured
    part takes, and the time cap past those."""

    path: Path
    measured: int  # warm-up and measured steps: settling starts once the trial has finished these
    seconds: float
    limit: int | None = None  # the limit its peak is judged by (bytes): with room to rise, it need not wait
    progress: Path | None = None  # the trial's progress file: where ranks write their own, END_MARGIN applies
    started: float | None = None  # when the trial finished its measured steps (monotonic)
    first: tuple[float, int] | None = None  # the first poll that saw a finished step: when, and the steps
    cap: float = 0.0  # seconds it may settle for: as long as it took to get there (see the module docstring)
    written: bool = False
    warmup: int = 0  # the warm-up steps asked: a peak's rate is read over the steps after them (recent_rise)

    def watch(self, steps: int, by_step: Mapping[int, int], elapsed: float) -> None:
        """At each poll (``elapsed``: seconds since the trial was launched): once the trial has run its
        measured steps, write the end when the peak has settled, the limit has room for its rise (:meth:`room`)
        or the time cap has passed."""
        if self.written or not steps:
            return
        now = time.monotonic()
        if self.first is None:
            self.first = (now, steps)
        if steps < self.measured:
            return
        if self.started is None:
            self.started, self.cap = now, min(self.seconds, max(elapsed, SETTLE_MIN_SECONDS))
        rise, rate = growth(by_step, steps), recent_rise(by_step, steps, self.warmup)
        if rise is not None and rise[0] <= tolerance(rise[1]):
            self._write(steps, "settled", rise[0])
        elif rate is not None and self.room(*rate, steps, now):
            self._write(steps, ROOM, rate[0])
        elif now - self.started > self.cap:
            self._write(steps, "time cap", rate[0] if rate else None)

    def room(self, rise: int, peak: int, steps: int, now: float) -> bool:
        """Whether the limit holds the peak's ``rise`` a window (:func:`recent_rise`: per SETTLE_WINDOW
        steps) going on at that rate for the steps the time cap still allows (at the pace of the steps since
        the first poll), and that window's rise once more (see the module docstring)."""
        if self.limit is None or self.first is None or self.started is None or steps <= self.first[1]:
            return False
        pace = (now - self.first[0]) / (steps - self.first[1])  # seconds a step
        ahead = max(self.cap - (now - self.started), 0.0) / pace if pace > 0 else float("inf")
        return peak + rise * (ahead / SETTLE_WINDOW + 1) <= self.limit

    def _write(self, steps: int, reason: str, rise: int | None) -> None:
        ranks = self.progress is not None and bool(rank_files(self.progress))
        write_settled(self.path, steps + (END_MARGIN if ranks else 1), reason, rise)
        self.written = True


def growth(by_step: Mapping[int, int], steps: int, window: int = SETTLE_WINDOW) -> tuple[int, int] | None:
    """How much the peak rose over the last ``window`` steps finished, and the peak now; None before the
    trial has finished that many, or while the meter took no sample in those steps (a sampler a busy machine
    starved read no rise there: a peak growing 1 MiB a step "settled after 15 steps" beside three busy
    neighbours)."""
    if steps < window or not any(steps - window < s <= steps for s in by_step):
        return None
    peak_now = max((p for s, p in by_step.items() if s <= steps), default=0)
    peak_then = max((p for s, p in by_step.items() if s <= steps - window), default=0)
    return peak_now - peak_then, peak_now


def recent_rise(by_step: Mapping[int, int], steps: int, warmup: int) -> tuple[int, int] | None:
    """The peak's rise per SETTLE_WINDOW steps at the rate of the last SETTLE_WINDOW steps finished, or of
    the steps since warm-up where fewer (RATE_MIN_STEPS at least; never the first step, which allocates
    everything), and the peak now; None where :func:`growth` can say nothing over those steps."""
    window = min(SETTLE_WINDOW, steps - max(warmup, 1))
    if window < RATE_MIN_STEPS:
        return None
    rise = growth(by_step, steps, window)
    return None if rise is None else (rise[0] * SETTLE_WINDOW // window, rise[1])


def still_rising(by_step: Mapping[int, int], steps: int, settled: str | None, warmup: int = 0) -> int | None:
    """How much the peak of a verification that ended unsettled (``settled``: a cap, the limit's room or the
    script's end, not "settled") rose per SETTLE_WINDOW steps at the end of its run (:func:`recent_rise`:
    over its last steps past ``warmup``), where that is more than the meter's noise (None otherwise, or
    where the meter cannot say). Its answer must leave room for as much again below the limit
    (autotune.search.records.TrialRecord.fits): a peak still creeping when the run ended has not shown that
    it holds (#43)."""
    if settled is None or settled.startswith("settled"):
        return None
    rise = recent_rise(by_step, steps, warmup)
    return rise[0] if rise is not None and rise[0] > tolerance(rise[1]) else None


def tolerance(peak: int) -> int:
    return max(SETTLE_TOLERANCE_BYTES, int(SETTLE_TOLERANCE_SHARE * peak))
