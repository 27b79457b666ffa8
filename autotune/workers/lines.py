"""Plain lines, one per event, prefixed with the device: how a worker (and ``run``'s helper devices) report
trials, readable from several threads and in logs."""

from __future__ import annotations

import threading
from collections.abc import Callable

from autotune.core.text import visible
from autotune.search.records import TrialRecord


class LineReporter:
    """A Reporter whose every line goes to ``say``, under ``lock`` (the device threads share one output)."""

    def __init__(self, device: str, say: Callable[[str], None], lock: threading.Lock) -> None:
        self.device, self.say, self.lock = device, say, lock

    def _line(self, text: str) -> None:
        """One line: what it quotes from the database (a job's name, a key id, an error) cannot break it, nor
        write to the terminal (autotune.core.text)."""
        with self.lock:
            self.say(f"[{self.device}] {visible(text)}")

    def trial_started(self, number: int, batch_size: int, plan: str, why: str) -> None:
        self._line(f"trial {number if number >= 0 else '-'}: batch {batch_size}, plan {plan} ({why})")

    def trial_progress(self, steps: int, elapsed: float) -> None:
        pass

    def trial_finished(self, record: TrialRecord, best: TrialRecord | None) -> None:
        peak = f"{(record.peak_bytes or 0) / 2**20:.0f} MiB"
        speed = f"{record.samples_per_sec:.1f} samples/s" if record.samples_per_sec else "-"
        outcome = record.outcome.value if record.outcome else None
        self._line(f"trial {record.number}: {outcome}, peak {peak}, {speed}")

    def skipped(self, record: TrialRecord) -> None:
        pass

    def note(self, text: str) -> None:
        self._line(text)

    def searching(self, counted: int, target: int, contenders: int | None) -> None:
        pass  # a line per trial is this reporter's progress
