"""The terminal: one rich Console per stream, key-value blocks, JSON, and the live trial reporter.

rich handles terminal width, colour and non-terminal output (CI logs get plain lines, no spinner).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.status import Status
from rich.table import Table
from rich.text import Text

from autotune.cli.fit import PlanNames, clip, plan_width
from autotune.cli.tables import prediction_error
from autotune.core.budget import format_bytes
from autotune.core.errors import first_line
from autotune.core.text import visible
from autotune.search.records import TrialRecord
from autotune.trials.settle import SETTLE_WINDOW


class ConsoleReporter:
    """A line per finished trial, and a live status line: the running trial's steps and seconds, and the
    whole run's trials, time, best so far and what the stop rule says is left. Everything fits the width."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.names = PlanNames(plan_width(console.width))
        self.status: Status | None = None
        self.label = ""
        self.started = time.monotonic()
        self.counted = 0
        self.target: int | None = None
        self.contenders: int | None = None
        self.best: TrialRecord | None = None
        self.legend_shown: str | None = None

    def __enter__(self) -> ConsoleReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        """Every way out of a run (an answer, an error, Ctrl-C): the spinner stops, its line is cleared and
        the cursor shown again, so that what is printed next starts a line of its own."""
        self._stop_status()

    def trial_started(self, number: int, batch_size: int, plan: str, why: str) -> None:
        name = f"trial {number}" if number >= 0 else "probe"
        self.label = f"{name}: {batch_size} x {self.names(plan)}" + ("" if number < 0 else f" ({why})")
        if self.console.is_terminal:
            self.status = self.console.status(self._status_text(0, 0.0))
            self.status.start()

    def trial_progress(self, steps: int, elapsed: float) -> None:
        if self.status is not None:
            self.status.update(self._status_text(steps, elapsed))

    def searching(self, counted: int, target: int, contenders: int | None) -> None:
        self.counted, self.target, self.contenders = counted, target, contenders

    def _status_text(self, steps: int, elapsed: float) -> str:
        """The run first (what a clip at a narrow width must keep), then the running trial."""
        run = [f"{self.counted} of ≤{self.target} trials" if self.target else "starting"]
        run.append(_duration(time.monotonic() - self.started))
        if self.best is not None and self.best.samples_per_sec:
            run.append(f"best {self.best.samples_per_sec:,.1f}/s")
        if self.contenders is not None:
            run.append(f"{self.contenders} may beat it")
        text = f"{', '.join(run)} | {self.label}, {steps} steps, {elapsed:.0f}s"
        return clip(text, self.console.width - 3)  # the spinner's room

    def trial_finished(self, record: TrialRecord, best: TrialRecord | None) -> None:
        self._stop_status()
        self.best = best
        best_text = f"best #{best.number}" if best is not None and best.samples_per_sec else ""
        self.console.print(trial_line(record, self.console.width, self.names, best_text), highlight=False)
        if record.slow_start:  # its reading starts past a slow start
            self.console.print(
                f"trial {record.number} measured past {record.slow_start}",
                style="dim",
                highlight=False,
                markup=False,
            )
        if record.rising_bytes:  # a verification's peak had not settled: the limit must hold as much again
            self.console.print(
                f"trial {record.number}'s peak was still rising, {format_bytes(record.rising_bytes)} per "
                f"{SETTLE_WINDOW} steps at the end ({record.settled}): it fits only with room for as much again",
                style="dim",
                highlight=False,
                markup=False,
            )
        if record.shifted:  # measuring longer stopped: it is measured again, interleaved, where it decides
            self.console.print(
                f"trial {record.number} measured no longer: {record.shifted}",
                style="dim",
                highlight=False,
                markup=False,
            )
        self._legend()

    def skipped(self, record: TrialRecord) -> None:
        self.console.print(trial_line(record, self.console.width, self.names), style="dim", highlight=False)
        self._legend()

    def note(self, text: str) -> None:
        self._stop_status()
        self.console.print(text, highlight=False, markup=False, soft_wrap=False)  # wrapped at words

    def _legend(self) -> None:
        legend = self.names.legend()
        if legend and legend != self.legend_shown:
            self.console.print(clip(legend, self.console.width), style="dim", highlight=False)
            self.legend_shown = legend

    def _stop_status(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None


def _home(path: str) -> str:
    home = os.path.expanduser("~")
    return "~" + path[len(home) :] if home != "/" and path.startswith(home + "/") else path


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def trial_line(r: TrialRecord, width: int = 100, names: PlanNames | None = None, tail: str = "") -> str:
    """One trial on one line of at most ``width`` columns: ``trial 12  16x4  Block:1  fits  268.57 MiB
    (pred +3%)  188.8 samples/s``; a failure's first line is clipped so that its log's path stays whole."""
    names = names or PlanNames(plan_width(width))
    batch = f"{r.batch_size}x{r.grad_accum}" if r.grad_accum else str(r.batch_size)
    head = f"trial {r.number:>3}  {batch:>5}  {names(r.plan):<{min(names.width, 16)}}"
    if r.error or (r.outcome is not None and r.outcome.value in ("failed", "timeout")):
        log = f"  log: {_home(r.log_dir)}" if r.log_dir else ""
        message = f"{r.outcome or r.kind}: {first_line(r.error)}"
        room = width - len(head) - len(log) - 2
        if room < 16:  # the path is what lets the user read the rest: it stays whole, even past the width
            message = str(r.outcome or r.kind)
            room = len(message)
        return f"{head}  {clip(message, room)}{log}"
    peak = format_bytes(r.peak_bytes) if r.peak_bytes is not None else "-"
    error = prediction_error(r)
    predicted = f" (pred {error})" if error else ""
    speed = f"{r.samples_per_sec:,.1f} samples/s" if r.samples_per_sec else "-"
    outcome = r.outcome_text(None) if r.outcome is not None else str(r.kind)
    times = (  # where its time went: starting, then its measured steps
        f"  {r.startup_seconds:.1f}s+{r.measured_seconds or 0.0:.1f}s"
        if r.startup_seconds is not None
        else ""
    )
    tail = f"  {tail}" if tail else ""
    # Where the whole line does not fit, its least needed parts go first, whole, never cut inside a word:
    # the best trial's number, the times; then samples/s is written /s; then the prediction goes.
    short = speed.replace(" samples/s", "/s")
    for parts in (
        (predicted, speed, times, tail),
        (predicted, speed, times, ""),
        (predicted, speed, "", ""),
        (predicted, short, "", ""),
        ("", short, "", ""),
    ):
        line = f"{head}  {outcome:<8} {peak:>10}{parts[0]}  {parts[1]}{parts[2]}{parts[3]}"
        if len(line) <= width:
            return line
    return clip(line, width)


def key_value_grid(rows: Sequence[tuple[str, str]]) -> Table:
    """Keys and values in two columns; a long value wraps at words under itself, never under its key."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    for key, value in rows:
        grid.add_row(Text(key), Text(value))
    return grid


def key_values(rows: Sequence[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def as_json(data: Any) -> str:
    return json.dumps(data, indent=2, default=str)


class _Visible(Console):
    """A Console whose every string, printed or in a table cell, shows its control and format characters as
    escapes (autotune.core.text): a note, a worker id or an error read from a shared database cannot set
    the terminal's title, clear its screen or move its cursor. Rich's own styling is not text, and is kept;
    line feeds are kept (autotune's multi-line messages)."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(visible(text, keep_newlines=True), **kwargs)


def console(stderr: bool = False) -> Console:
    """Results go to stdout; progress (trial lines, the live status) to stderr, so --json stays parseable.
    Logs and pipes get $COLUMNS, else 120 columns rather than rich's 80. Nothing printed is markup: what it
    shows comes from users, scripts and the database (a trial's error ``[/data/train.csv]`` once crashed
    ``run`` and ``show`` with a markup error, and ``[bold]st[red]`` printed as ``st``), table cells included."""
    return _Visible(
        markup=False,
        highlight=False,
        emoji=False,  # a plan or an argument like "48:A:1" is text, never ":a:" drawn as an emoji
        soft_wrap=True,
        stderr=stderr,
        width=None if Console(stderr=stderr).is_terminal or os.environ.get("COLUMNS") else 120,
    )
