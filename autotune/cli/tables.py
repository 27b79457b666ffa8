"""The tables ``run`` and ``show`` print: trials, what was not run, the memory model's accuracy, and the
probe's predicted savings beside the measured ones."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich import box
from rich.table import Table

from autotune.cli.console import signed_bytes
from autotune.core.budget import format_bytes
from autotune.core.protocol import Outcome
from autotune.search.records import TrialKind, TrialRecord

if TYPE_CHECKING:
    from autotune.results.listing import PlanCheck


def trials_table(records: Sequence[TrialRecord], limit: int | None = None, workers: bool = False) -> Table:
    """Every trial that ran (skipped and copied proposals are only counted: see not_run_line); with
    ``workers``, which worker (host:pid) and device ran each one."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    columns = ("#", "batch", "plan", "outcome", "peak", "predicted", "samples/s", "note")
    for column in columns[:-1] + (("worker",) if workers else ()) + columns[-1:]:
        numeric = column in ("#", "batch", "peak", "predicted", "samples/s")
        table.add_column(column, justify="right" if numeric else "left", no_wrap=column != "note")
    for r in records:
        if r.kind in (TrialKind.SKIPPED, TrialKind.COPY):
            continue
        fits = "" if limit is None or not r.measured else (" ok" if r.fits(limit) else " over")
        predicted = ""
        if r.peak_bytes and r.predicted_peak_bytes:
            error = (r.predicted_peak_bytes - r.peak_bytes) / r.peak_bytes
            predicted = f"{format_bytes(r.predicted_peak_bytes)} {error:+.0%}"
        note = r.note or r.error or ""
        if r.kind not in (TrialKind.MEASURED, TrialKind.VERIFICATION):
            note = f"{r.kind}: {note}" if note else str(r.kind)
        cells = [
            str(r.number),
            str(r.batch_size),
            r.plan or "",
            f"{r.outcome or r.state.lower()}{fits}",
            format_bytes(r.peak_bytes) if r.peak_bytes is not None else "",
            predicted,
            f"{r.samples_per_sec:,.1f}" if r.samples_per_sec else "",
        ]
        if workers:
            host_pid = ":".join((r.worker or "").split(":")[:2])
            cells.append(f"{host_pid} {r.device}" if r.device else host_pid)
        table.add_row(*cells, note)
    return table


def not_run_line(records: Sequence[TrialRecord]) -> str | None:
    skipped = sum(r.kind is TrialKind.SKIPPED for r in records)
    copies = sum(r.kind is TrialKind.COPY for r in records)
    if not skipped and not copies:
        return None
    return (
        f"not run: {skipped} sampler proposal(s) the memory model predicted cannot fit, "
        f"{copies} re-proposal(s) of a measured configuration"
    )


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


def checks_table(checks: Sequence[PlanCheck]) -> Table:
    """The honesty check: each plan's saving per sample, as the probe predicted it and as measured."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title="plan savings per sample: probe vs trials")
    for column in ("plan", "predicted", "measured", "check"):
        table.add_column(column, justify="left" if column in ("plan", "check") else "right")
    for c in checks:
        measured = signed_bytes(c.measured) if c.measured is not None else "not measured"
        verdict = "FAR FROM PREDICTION" if c.flagged else ("ok" if c.measured is not None else "")
        table.add_row(c.plan, signed_bytes(c.predicted), measured, verdict)
    return table
