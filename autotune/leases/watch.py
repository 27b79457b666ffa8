"""Which running leases belong to dead workers, and how long a worker's beats may stop before it is."""

from __future__ import annotations

import time

from autotune.core.environment import seconds
from autotune.leases.identity import WorkerState, host_name, worker_state
from autotune.storage import Lease

DEFAULT_GRACE_SECONDS = 60.0  # a lease whose beats stop this long belongs to a dead worker
HEARTBEAT_SECONDS = 10.0  # how often workers beat at most (the grace period spans several beats)


def grace_seconds() -> float:
    """How long a lease's beats may stop before its worker is taken for dead (AUTOTUNE_HEARTBEAT_GRACE)."""
    return seconds("AUTOTUNE_HEARTBEAT_GRACE", DEFAULT_GRACE_SECONDS)


def heartbeat_seconds() -> float:
    """A beat every sixth of the grace period (at most HEARTBEAT_SECONDS): a few lost beats are harmless."""
    return min(HEARTBEAT_SECONDS, grace_seconds() / 6)


class LeaseWatch:
    """Which running leases belong to dead workers.

    On this host a worker's pid (with its start time) answers at once. Another host's worker is dead when
    its lease's beat counter has not moved for ``grace`` seconds *as seen by this process*: counters and
    this process's monotonic clock, so hosts' clocks never have to agree."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.host = host_name()
        self._seen: dict[int, tuple[int, float]] = {}  # lease id -> (beats, when they were first seen)

    def dead(self, lease: Lease) -> str | None:
        """Why ``lease``'s worker is dead, or None while it may be alive."""
        state = worker_state(lease.worker or "", self.host)
        if state is WorkerState.ALIVE:
            return None
        if state is WorkerState.DEAD:
            return f"worker {lease.worker} died"
        now = time.monotonic()
        beats, since = self._seen.get(lease.id, (None, now))
        if beats != lease.beats:
            self._seen[lease.id] = (lease.beats, now)
            return None
        if now - since >= self.grace:
            return f"worker {lease.worker} stopped heartbeating for {self.grace:g}s"
        return None
