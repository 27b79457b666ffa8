"""Ctrl-C that never lands in the middle of a database write.

While an :class:`InterruptShield` is active, SIGINT raises ``KeyboardInterrupt`` only inside
``shield.allow()`` (around a running trial, which the launcher then stops cleanly); anywhere else it is
remembered and raised by ``shield.check()`` at the next safe point. Without it, a Ctrl-C between Optuna's
``ask`` and the trial's start, or during ``tell``, would leave a trial RUNNING or half stored.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType, TracebackType
from typing import Any


class StopRequested(BaseException):
    """Raised in a worker's trial thread once its trial has been stopped because the worker is stopping
    (SIGTERM/SIGINT). A BaseException, like KeyboardInterrupt, so no ``except Exception`` swallows it."""


class TrialInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a running trial (the launcher raises it once the trial is stopped cleanly); a plain
    KeyboardInterrupt means no trial was running."""


class InterruptShield:
    def __init__(self) -> None:
        self.pending = False
        self.open = False
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> InterruptShield:
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
            self._installed = True
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False
        if kind is None:
            self.check()  # a Ctrl-C held to the end is raised, never lost

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        if self.open:
            raise KeyboardInterrupt
        self.pending = True

    def check(self) -> None:
        """Raise the Ctrl-C that arrived while nothing could be interrupted safely."""
        if self.pending:
            self.pending = False
            raise KeyboardInterrupt

    @contextmanager
    def allow(self) -> Iterator[None]:
        """The region where Ctrl-C may interrupt at once (a running trial)."""
        self.check()
        self.open = True
        try:
            yield
        finally:
            self.open = False
