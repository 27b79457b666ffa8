"""Heartbeats: a thread that bumps the beat counter of every lease this process holds.

Optuna's own heartbeat thread dies on the first database error (a 2.5 s write lock was enough here,
RELIABILITY.md §6), after which another worker fails the still-running trial. This one's beats go
through the Store, which retries locks and lost connections; any other error is logged and the next
beat comes as usual: the thread never stops before its process does.
"""

from __future__ import annotations

import logging
import os
import threading
from types import TracebackType

from autotune.search.loop import DEFAULT_GRACE_SECONDS, HEARTBEAT_SECONDS
from autotune.storage import Store

log = logging.getLogger("autotune.leases.heartbeat")


def grace_seconds() -> float:
    """How long a lease's beats may stop before its worker is taken for dead (AUTOTUNE_HEARTBEAT_GRACE)."""
    text = os.environ.get("AUTOTUNE_HEARTBEAT_GRACE", "")
    try:
        return float(text) if text and float(text) > 0 else DEFAULT_GRACE_SECONDS
    except ValueError:
        return DEFAULT_GRACE_SECONDS


def heartbeat_seconds() -> float:
    """A beat every sixth of the grace period (at most HEARTBEAT_SECONDS): a few lost beats are harmless."""
    return min(HEARTBEAT_SECONDS, grace_seconds() / 6)


class Heartbeat:
    """``with Heartbeat(store, worker):`` beats for ``worker``'s running leases until the block ends."""

    def __init__(self, store: Store, worker: str, interval: float | None = None) -> None:
        self.store = store
        self.worker = worker
        self.interval = interval or heartbeat_seconds()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="autotune-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.store.beat(self.worker)  # waits out locks and outages: the Store retries them
            except Exception as e:
                log.warning("heartbeat failed (next beat in %gs): %s", self.interval, str(e).splitlines()[0])
