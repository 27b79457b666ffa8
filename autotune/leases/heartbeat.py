"""Heartbeats: a thread that bumps the beat counter of every lease this process holds.

Optuna's own heartbeat thread dies on the first database error (a 2.5 s write lock was enough here,
docs/reliability.md §6), after which another worker fails the still-running trial. This one's beats go
through the Store, which retries locks and lost connections; any other error is logged and the next
beat comes as usual: the thread never stops before its process does.
"""

from __future__ import annotations

import logging
import threading
from types import TracebackType

from autotune.leases.watch import heartbeat_seconds
from autotune.storage import Store

log = logging.getLogger(__name__)


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
