"""How busy the machine was during a trial: what a reading of its speed can be trusted for.

A trial's steps agree with each other to ±1% while two trials of one configuration, minutes apart on a shared
machine, read 62.5 and 1.3 samples/s (docs/reliability.md): the load that matters comes and goes *between* trials.
Measured here (2 cores): a 2-thread torch step ran 3x slower beside one process burning a core, and the
kernel's CPU pressure (``/proc/pressure/cpu``, "some": the share of time at least one runnable task waited
for a CPU) read 0.33 over that trial against 0.003-0.013 alone. The load average moves over a minute, far
too slowly to say which trial a burst hit; it is kept for people. Steal is the hypervisor's share.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from autotune.core.pressure import pressure_total

STAT_PATH = "/proc/stat"


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

    @classmethod
    def now(cls) -> LoadSnapshot:
        steal, total = _stat()
        return cls(time.monotonic(), pressure_total(), steal, total)

    def until(self, later: LoadSnapshot) -> Load:
        wall = later.at - self.at
        pressure = None
        if self.pressure_us is not None and later.pressure_us is not None and wall > 0:
            pressure = min(max((later.pressure_us - self.pressure_us) / 1e6 / wall, 0.0), 1.0)
        steal = None
        if None not in (self.steal_ticks, self.total_ticks, later.steal_ticks, later.total_ticks):
            ticks = (later.total_ticks or 0) - (self.total_ticks or 0)
            if ticks > 0:
                steal = max(((later.steal_ticks or 0) - (self.steal_ticks or 0)) / ticks, 0.0)
        return Load(pressure, steal, os.getloadavg()[0], os.cpu_count() or 1)


def _share(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def _stat() -> tuple[int | None, int | None]:
    """(steal, all) CPU time of the whole machine in clock ticks, from /proc/stat's first line."""
    try:
        with open(STAT_PATH) as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None, None
    return (ticks[7] if len(ticks) > 7 else None), sum(ticks[:8])
