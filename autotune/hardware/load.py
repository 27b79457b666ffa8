"""How busy the machine was during a trial: what a reading of its speed can be trusted for.

A trial's steps agree with each other to ±1% while two trials of one configuration, minutes apart on a shared
machine, read 62.5 and 1.3 samples/s (docs/reliability.md): the load that matters comes and goes *between* trials.
Measured here (2 cores): a 2-thread torch step ran 3x slower beside one process burning a core, and the
kernel's CPU pressure (``/proc/pressure/cpu``, "some": the share of time at least one runnable task waited
for a CPU) read 0.33 over that trial against 0.003-0.013 alone. The load average moves over a minute, far
too slowly to say which trial a burst hit; it is kept for people. Steal is the hypervisor's share.

Pressure says that something waited for a CPU, not who made it wait: a trial whose own processes outnumber
the cores (a DataLoader's workers beside torch's threads) makes that pressure itself, and on an idle machine
issue 43 found "7 of 10 trials ran while the machine was busy (CPU pressure up to 12%)" (a ViT with two
workers). So each trial also records what *others* used: the machine's busy CPU time (``/proc/stat``) less
the tuner's own and the trial's (its process tree: the tuner's reaped children for a process that ended, a
warm process's own count at rest for one that lives on), per second of wall time. A neighbour is there when
others used more than NEIGHBOUR_SHARE of the cores (autotune.search.noise: a reading whose pressure no
neighbour explains is not disturbed).
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from typing import Any

from autotune.core.pressure import pressure_total

STAT_PATH = "/proc/stat"
# CPU time used by neither the trial nor the tuner, as a share of the cores' time, above which a neighbour
# was at work: an idle machine's kernel threads and daemons use a few thousandths; a neighbour burning one
# of 2 cores in bursts half the time, 0.25
NEIGHBOUR_SHARE = 0.05
TICK_SECONDS = 1 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


@dataclass(frozen=True)
class Load:
    """The machine's load over one trial. ``cpu_pressure`` and ``steal`` are shares of its wall time (None
    where the kernel does not say); ``loadavg`` is the 1-minute load average at its end; ``cpu_per_wall``
    the CPU seconds the trial's main process (and the children it reaped) used per second of wall time.
    ``steps_pressure``: the mean pressure over the measured steps its speed was read from, and ``set_aside``
    the measured steps left out as busy (autotune.core.pressure); None and 0 where the trial's runtime
    could not say."""

    cpu_pressure: float | None
    steal: float | None
    loadavg: float
    cores: int
    cpu_per_wall: float | None = None
    steps_pressure: float | None = None
    set_aside: int = 0
    others: float | None = None  # CPU-s per s neither the trial nor the tuner used (None: unknown)

    @property
    def neighbour(self) -> bool:
        """Whether a neighbour was at work: others used more than NEIGHBOUR_SHARE of the cores (unknown: as
        if one was, the pressure alone judging)."""
        return self.others is None or self.others > NEIGHBOUR_SHARE * max(self.cores, 1)

    @property
    def reading_pressure(self) -> float | None:
        """The pressure that says how far its speed reading can be trusted: over the steps it was read from
        where known, else over the whole trial (start-up included)."""
        return self.steps_pressure if self.steps_pressure is not None else self.cpu_pressure

    def to_dict(self) -> dict[str, Any]:
        return {
            "cpu_pressure": self.cpu_pressure,
            "steal": self.steal,
            "loadavg": self.loadavg,
            "cores": self.cores,
            "cpu_per_wall": self.cpu_per_wall,
            "steps_pressure": self.steps_pressure,
            "set_aside": self.set_aside,
            "others": self.others,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Load | None:
        if not isinstance(data, dict):
            return None
        try:
            return cls(
                _share(data.get("cpu_pressure")),
                _share(data.get("steal")),
                float(data.get("loadavg") or 0.0),
                int(data.get("cores") or 0),
                _share(data.get("cpu_per_wall")),
                _share(data.get("steps_pressure")),
                int(data.get("set_aside") or 0),
                _share(data.get("others")),
            )
        except (TypeError, ValueError):
            return None

    def __str__(self) -> str:
        parts = [] if self.cpu_pressure is None else [f"CPU pressure {100 * self.cpu_pressure:.0f}%"]
        if self.steal:
            parts.append(f"steal {100 * self.steal:.0f}%")
        parts.append(f"load {self.loadavg:.1f} on {self.cores} cores")
        if self.cpu_per_wall is not None:
            parts.append(f"the trial used {self.cpu_per_wall:.1f} CPU-s per s")
        if self.others is not None:
            parts.append(f"others used {self.others:.2f} CPU-s per s")
        if self.set_aside:
            parts.append(
                f"{self.set_aside} busy step{'s' if self.set_aside != 1 else ''} left out of its speed"
            )
        return ", ".join(parts)


@dataclass(frozen=True)
class LoadSnapshot:
    """Cumulative counters at one moment; two of them give the Load between."""

    at: float
    pressure_us: int | None
    steal_ticks: int | None
    total_ticks: int | None
    busy_ticks: int | None = None  # the machine's CPU time not idle (nor waiting on I/O, nor stolen)
    own_seconds: float = 0.0  # the tuner's CPU time: its own and its reaped children's (trial processes)

    @classmethod
    def now(cls) -> LoadSnapshot:
        steal, total, busy = _stat()
        return cls(time.monotonic(), pressure_total(), steal, total, busy, _own_seconds())

    def until(self, later: LoadSnapshot, trial_seconds: float = 0.0) -> Load:
        """The load between this snapshot and ``later``; ``trial_seconds``: the trial's CPU time in that
        interval that the tuner's own count misses (a warm process alive at ``later``: its CPU since its
        last rest; one that ended and was reaped in it: minus what it used before, which the reaped count
        holds too)."""
        wall = later.at - self.at
        pressure = None
        if self.pressure_us is not None and later.pressure_us is not None and wall > 0:
            pressure = min(max((later.pressure_us - self.pressure_us) / 1e6 / wall, 0.0), 1.0)
        steal = None
        if None not in (self.steal_ticks, self.total_ticks, later.steal_ticks, later.total_ticks):
            ticks = (later.total_ticks or 0) - (self.total_ticks or 0)
            if ticks > 0:
                steal = max(((later.steal_ticks or 0) - (self.steal_ticks or 0)) / ticks, 0.0)
        others = None
        if self.busy_ticks is not None and later.busy_ticks is not None and wall > 0:
            ours = later.own_seconds - self.own_seconds + trial_seconds
            others = max(((later.busy_ticks - self.busy_ticks) * TICK_SECONDS - ours) / wall, 0.0)
        return Load(pressure, steal, os.getloadavg()[0], os.cpu_count() or 1, others=others)


def _share(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def _stat() -> tuple[int | None, int | None, int | None]:
    """(steal, all, busy) CPU time of the whole machine in clock ticks, from /proc/stat's first line: user,
    nice, system, idle, iowait, irq, softirq, steal (guest time is in user); busy is user, nice, system, irq
    and softirq."""
    try:
        with open(STAT_PATH) as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None, None, None
    if len(ticks) < 7:
        return None, None, None
    busy = ticks[0] + ticks[1] + ticks[2] + ticks[5] + ticks[6]
    return (ticks[7] if len(ticks) > 7 else None), sum(ticks[:8]), busy


def _own_seconds() -> float:
    """The tuner's CPU seconds: its threads', and its reaped children's (a trial's launcher, the trial and
    the descendants each reaped)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
