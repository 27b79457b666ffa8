"""The host's memory, beside the device's: what a trial's process tree holds, what the host has left, and
the host budget no trial may pass (a GPU trial's pinned host memory, activation offload's above all, can
grow until the kernel's out-of-memory killer ends it and its launcher; issue 31 measured ~69 GB pinned by
one offload trial on an H100 host).

Read from /proc (Linux); elsewhere nothing is known and nothing is stopped."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from autotune.core.budget import Budget
from autotune.core.errors import InputError
from autotune.hardware.meters import proportional_bytes, resident_bytes

# The host budget by default: what the host has available as the run starts, less this share of it (other
# processes, the page cache a training job's data loader needs, the tuner itself).
HOST_MARGIN = 0.1
# The host watch samples a trial's tree every this many of the launcher's polls (about 4 times a second):
# pinned memory grows with the saved tensors of a step, over tenths of a second, not microseconds.
HOST_EVERY = 5


def meminfo(field: str) -> int | None:
    """A /proc/meminfo field in bytes (None where unreadable)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        return None
    return None


def default_host_budget() -> int | None:
    """The host memory a trial may hold: what is available now, less HOST_MARGIN (None: unknown)."""
    available = meminfo("MemAvailable")
    return None if available is None else int(available * (1 - HOST_MARGIN))


def host_budget_of(budget: Budget | None) -> int | None:
    """``--host-budget`` in bytes (a percentage: of the host's memory); None given: the default.

    Raises:
        InputError: more than the host has, or a percentage where its memory is unknown."""
    if budget is None:
        return default_host_budget()
    total = meminfo("MemTotal")
    if budget.fraction is not None:
        if total is None:
            raise InputError(
                f"--host-budget {budget.text!r} is a percentage, but this host's memory is unknown"
            )
        return int(total * budget.fraction)
    assert budget.absolute_bytes is not None
    if total is not None and budget.absolute_bytes > total:
        raise InputError(f"--host-budget {budget.text!r} is more than this host has ({mib(total)})")
    return budget.absolute_bytes


def tree_bytes(pids: Iterable[int]) -> int:
    """The resident memory of a process tree, each process's proportional share where there are several
    (a forked DataLoader worker's pages shared with its parent count once), its RSS alone otherwise: as
    the CPU meter reads a tree (autotune.hardware.meters)."""
    pids = list(pids)
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for pid in pids:
        size = proportional_bytes(pid) if len(pids) > 1 else None
        total += size if size is not None else (resident_bytes(pid, page) or 0)
    return total


@dataclass
class HostWatch:
    """A trial's host memory while it runs: the last sample and the largest, against ``budget`` (bytes;
    None: watched, never stopped)."""

    processes: Callable[[], Iterable[int]]
    budget: int | None = None
    last: int = 0
    peak: int = 0
    polls: int = 0

    def poll(self) -> bool:
        """Sample every HOST_EVERY polls; True once the tree holds more than the budget."""
        self.polls += 1
        if self.polls % HOST_EVERY != 1:
            return False
        self.last = tree_bytes(self.processes())
        self.peak = max(self.peak, self.last)
        return self.budget is not None and self.last > self.budget


def mib(value: int | None) -> str:
    return "?" if value is None else f"{value / 2**20:,.0f} MiB"


def kill_cause(peak: int, pinned: int | None) -> str:
    """Why a trial killed by a signal nobody in autotune sent most likely died, with what was read of it
    (``peak``: the most host memory its processes were sampled holding)."""
    available, total = meminfo("MemAvailable"), meminfo("MemTotal")
    held = f"its processes held up to {mib(peak)} of host memory as sampled"
    if pinned:
        held += f", {mib(pinned)} of it pinned by CUDA"
    return (
        f"most likely the kernel's out-of-memory killer: {held}; the host has {mib(total)}, "
        f"{mib(available)} available now"
    )
