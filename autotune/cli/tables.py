"""The tables ``run`` and ``show`` print: trials, what was not run, the memory model's accuracy, and the
probe's predicted savings beside the measured ones."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich import box
from rich.table import Table

from autotune.cli.fit import PlanNames, clip
from autotune.core.budget import format_bytes, signed_bytes
from autotune.core.protocol import Outcome
from autotune.results.listing import FLAG_MEANING
from autotune.search.records import TrialKind, TrialRecord

if TYPE_CHECKING:
    from autotune.results.listing import PlanCheck


def prediction_error(r: TrialRecord) -> str:
    """The memory model's error on this trial's peak, ``+27%`` (predicted above the measured peak)."""
    if not (r.peak_bytes and r.predicted_peak_bytes):
        return ""
    return f"{(r.predicted_peak_bytes - r.peak_bytes) / r.peak_bytes:+.0%}"


NOTE_MIN = 24  # narrower than this, notes go below the table, one line each


def trials_table(
    records: Sequence[TrialRecord],
    limit: int | None,
    width: int,
    names: PlanNames,
    workers: bool = False,
) -> tuple[Table, list[str]]:
    """Every trial that ran (skipped and copied proposals are only counted: see not_run_line), one line each,
    fitting ``width`` columns, and the lines to print under it: notes that did not fit, where the trials ran
    when one worker ran them all, and what each failed trial's log is. With ``workers``, which worker
    (host:pid) and device ran each one."""
    shown = [r for r in records if r.kind not in (TrialKind.SKIPPED, TrialKind.COPY)]
    ran_on = {_worker(r) for r in shown if r.worker}
    worker_column = workers and len(ran_on) > 1
    rows = []
    for r in shown:
        row = {
            "#": str(r.number),
            "batch": f"{r.batch_size}x{r.grad_accum}" if r.grad_accum else str(r.batch_size),
            "plan": names(r.plan),
            "outcome": r.outcome_text(limit),
            "peak": format_bytes(r.peak_bytes) if r.peak_bytes is not None else "",
            "pred.": prediction_error(r),
            "samples/s": f"{r.samples_per_sec:,.1f}" if r.samples_per_sec else "",
        }
        if worker_column:
            row["worker"] = _worker(r)
        row["note"] = r.note_text
        rows.append(row)
    columns = (
        list(rows[0]) if rows else ["#", "batch", "plan", "outcome", "peak", "pred.", "samples/s", "note"]
    )
    widths = {c: max([len(c), *(len(row[c]) for row in rows)]) for c in columns}
    # each column costs its width, its padding and a separator
    fixed = sum(widths[c] + 3 for c in columns if c != "note")
    note_room = width - fixed - 1
    below: list[str] = []
    if note_room < NOTE_MIN:  # the notes go under the table, by trial number: every other column stays whole
        columns.remove("note")
        below += [clip(f"trial {row['#']}: {row['note']}", width) for row in rows if row["note"]]
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for column in columns:
        numeric = column in ("#", "batch", "peak", "pred.", "samples/s")
        table.add_column(
            column,
            justify="right" if numeric else "left",
            no_wrap=True,
            overflow="ellipsis",
            min_width=None if column == "note" else widths[column],
            max_width=max(note_room, 4) if column == "note" else None,
        )
    for row in rows:
        table.add_row(*(row[c] for c in columns))
    if workers and len(ran_on) == 1:
        below.append(f"every trial ran on {next(iter(ran_on))}")
    for r in shown:
        if r.error and r.log_dir:
            below.append(clip(f"trial {r.number}'s log: {r.log_dir}", max(width, len(r.log_dir) + 20)))
    legend = names.legend()
    if legend:
        below.append(legend)
    return table, below


def _worker(r: TrialRecord) -> str:
    host_pid = ":".join((r.worker or "").split(":")[:2])
    return f"{host_pid} {r.device}" if r.device else host_pid


def prediction_summary(records: Sequence[TrialRecord]) -> str | None:
    """How good the memory model was: the median error of its predictions over the measured trials."""
    errors = sorted(
        abs(r.predicted_peak_bytes - r.peak_bytes) / r.peak_bytes
        for r in records
        if r.kind is TrialKind.MEASURED
        and r.outcome is Outcome.COMPLETE
        and r.peak_bytes
        and r.predicted_peak_bytes
    )
    if not errors:
        return None
    return (
        f"memory model: median error {errors[len(errors) // 2]:.1%}, worst {errors[-1]:.1%} "
        f"over {len(errors)} predicted trial(s)"
    )


def checks_table(checks: Sequence[PlanCheck], names: PlanNames) -> tuple[Table, list[str]]:
    """The honesty check: each plan's saving per sample, as the probe predicted it and as measured; and,
    when a plan is flagged, what the flag means and what to do about it."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title="plan savings per sample: probe vs trials")
    checked = any(c.measured is not None for c in checks)  # no column of blanks before any plan was measured
    for column in ("plan", "predicted", "measured", *(["check"] if checked else [])):
        table.add_column(column, justify="left" if column in ("plan", "check") else "right", no_wrap=True)
    for c in checks:
        measured = signed_bytes(c.measured) if c.measured is not None else "not measured"
        verdict = c.verdict
        table.add_row(names(c.plan), signed_bytes(c.predicted), measured, *([verdict] if checked else []))
    return table, [FLAG_MEANING] if any(c.flagged for c in checks) else []
