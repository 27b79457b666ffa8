"""The terminal: one rich Console per stream, key-value blocks, JSON, and the live trial reporter.

rich handles terminal width, colour and non-terminal output (CI logs get plain lines, no spinner).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.status import Status

from autotune.core.budget import format_bytes
from autotune.search.records import TrialRecord


class ConsoleReporter:
    """A line per finished trial, and a status line with steps and seconds for the running one."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.status: Status | None = None
        self.label = ""

    def trial_started(self, number: int, batch_size: int, plan: str, why: str) -> None:
        self.label = f"trial {number if number >= 0 else '-'}: batch {batch_size}, plan {plan} ({why})"
        if self.console.is_terminal:
            self.status = self.console.status(self.label)
            self.status.start()

    def trial_progress(self, steps: int, elapsed: float) -> None:
        if self.status is not None:
            self.status.update(f"{self.label}: {steps} steps, {elapsed:.0f}s")

    def trial_finished(self, record: TrialRecord, best: TrialRecord | None) -> None:
        self._stop_status()
        best_text = (
            f"best {best.samples_per_sec:,.1f}/s (#{best.number})"
            if best and best.samples_per_sec
            else "best -"
        )
        self.console.print(f"{trial_line(record)}  {best_text}", highlight=False)

    def skipped(self, record: TrialRecord) -> None:
        self.console.print(f"{trial_line(record)}", style="dim", highlight=False)

    def note(self, text: str) -> None:
        self._stop_status()
        self.console.print(text, highlight=False)

    def _stop_status(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None


def trial_line(r: TrialRecord) -> str:
    peak = format_bytes(r.peak_bytes) if r.peak_bytes is not None else "-"
    predicted = f" (pred {format_bytes(r.predicted_peak_bytes)})" if r.predicted_peak_bytes else ""
    speed = f"{r.samples_per_sec:,.1f} samples/s" if r.samples_per_sec else "-"
    outcome = r.outcome or r.kind
    batch = f"{r.batch_size}x{r.grad_accum}" if r.grad_accum else str(r.batch_size)
    return f"trial {r.number:>3}  batch {batch:>5}  {r.plan!s:<24} peak {peak}{predicted}  {speed}  {outcome}"


def key_values(rows: Sequence[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def as_json(data: Any) -> str:
    return json.dumps(data, indent=2, default=str)


def console(stderr: bool = False) -> Console:
    """Results go to stdout; progress (trial lines, the live status) to stderr, so --json stays parseable.
    Logs and pipes get 120 columns, not rich's 80: the trial table should not lose its last column there."""
    return Console(
        highlight=False,
        emoji=False,  # a plan or an argument like "48:A:1" is text, never ":a:" drawn as an emoji
        soft_wrap=True,
        stderr=stderr,
        width=None if Console(stderr=stderr).is_terminal else 120,
    )


def signed_bytes(size: float) -> str:
    return ("-" if size < 0 else "") + format_bytes(abs(size))
