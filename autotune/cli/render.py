"""What ``run``, ``best``, ``studies`` and ``show`` print."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from autotune.cli.console import as_json, key_values
from autotune.cli.tables import checks_table, not_run_line, prediction_summary, trials_table
from autotune.core.budget import format_bytes
from autotune.core.stats import Interval

if TYPE_CHECKING:  # `autotune best` must not import the search to print an answer
    from autotune.results.best import BestAnswer
    from autotune.results.listing import StudyReport, StudySummary
    from autotune.search.spec import TuneResult


def tuned(out: Console, result: TuneResult, command: Sequence[str], budget: str, as_json_flag: bool) -> None:
    """The end of ``autotune run``: all trials, the prediction quality, the chosen configuration, its use."""
    best = result.best
    if as_json_flag:
        out.print(as_json_text(result), markup=False)
        return
    if not result.cached:
        out.print(trials_table(result.records, result.limit_bytes))
        for line in (not_run_line(result.records), prediction_summary(result.records)):
            if line:
                out.print(line)
        if result.stopped:
            out.print(result.stopped, markup=False)
    out.print(
        key_values(
            [
                ("study", f"{result.study_name} ({result.storage})"),
                (
                    "trials",
                    f"{sum(r.counted for r in result.records)} counted, {result.new_trials} new in this run",
                ),
                ("batch size", _batch_text(best.batch_size, result.grad_accum, result.global_batch)),
                ("plan", best.plan),
                (
                    "peak",
                    f"{format_bytes(best.verified_peak_bytes)} verified over a longer run "
                    f"(budget {format_bytes(result.budget_bytes)}, limit with headroom {format_bytes(result.limit_bytes)})",
                ),
                ("throughput", speed_text(best.throughput, best.readings)),
            ]
        ),
        markup=False,
    )
    hint = best_command(command, budget, result.global_batch)
    out.print(f'\nuse it:  eval "$({hint})"', markup=False)


def _batch_text(batch_size: int, grad_accum: int | None, global_batch: int | None) -> str:
    if grad_accum is None:
        return str(batch_size)
    of = f" (global batch {global_batch})" if global_batch is not None else ""
    return f"{batch_size}, accumulated {grad_accum}x per optimizer step{of}"


def speed_text(speed: Interval, readings: int | None) -> str:
    """``594.4 samples/s (590.1-598.7 over 3 readings)``: a throughput is never one bare number."""
    over = f" over {readings} readings" if readings and readings > 1 else ""
    return f"{speed.mid:,.1f} samples/s ({speed.low:,.1f}-{speed.high:,.1f}{over})"


def best_command(command: Sequence[str], budget: str, global_batch: int | None = None) -> str:
    """The `autotune best ... --env` line for a run's command (options before the script's own `--`)."""
    words = ["autotune", "best", "--budget", budget, "--env"]
    if global_batch is not None:
        words += ["--global-batch", str(global_batch)]
    if command[0].endswith(".py"):  # SCRIPT [-- ARGS]
        words.append(command[0])
        command = command[1:]
    return shlex.join([*words, "--", *command] if command else words)


def as_json_text(result: TuneResult) -> str:
    return as_json(
        {
            "study": result.study_name,
            "cached": result.cached,
            "new_trials": result.new_trials,
            "stopped": result.stopped,
            "budget_bytes": result.budget_bytes,
            "limit_bytes": result.limit_bytes,
            "batch_size": result.best.batch_size,
            "grad_accum": result.grad_accum,
            "global_batch": result.global_batch,
            "plan": result.best.plan,
            "peak_bytes": result.best.verified_peak_bytes,
            "samples_per_sec": result.best.verified_samples_per_sec,
            "samples_per_sec_low": result.best.throughput.low,
            "samples_per_sec_high": result.best.throughput.high,
            "readings": result.best.readings,
            "trials": [r.__dict__ for r in result.records],
        }
    )


def best(out: Console, answer: BestAnswer, as_json_flag: bool, as_env: bool) -> None:
    if as_env:
        for name, value in answer.env().items():
            out.print(f"export {name}={shlex.quote(value)}", markup=False)
        return
    if as_json_flag:
        out.print(as_json(answer.to_dict()), markup=False)
        return
    out.print(
        key_values(
            [
                ("study", answer.study),
                ("script", answer.script),
                ("batch size", str(answer.batch_size)),
                ("plan", answer.plan),
                ("peak", format_bytes(answer.peak_bytes)),
                ("throughput", speed_text(answer.throughput, answer.readings)),
                ("budget", format_bytes(answer.budget_bytes)),
                ("source", answer.source),
            ]
        ),
        markup=False,
    )


def studies(out: Console, summaries: Sequence[StudySummary]) -> None:
    table = Table()
    for column in ("study", "script", "budget", "trials", "best samples/s", "state"):
        table.add_column(column)
    for s in summaries:
        table.add_row(
            s.name,
            s.script,
            format_bytes(s.budget_bytes) if s.budget_bytes else s.budget_text,
            str(s.trials),
            f"{s.best_samples_per_sec:,.1f}" if s.best_samples_per_sec else "-",
            str(s.state),
        )
    out.print(table)


def show(out: Console, report: StudyReport, as_json_flag: bool) -> None:
    row, records, checks, limit = report.row, report.records, report.checks, report.limit_bytes
    if as_json_flag:
        out.print(
            as_json(
                {
                    "study": row.study_name,
                    "budget_bytes": row.budget_bytes,
                    "limit_bytes": limit,
                    "best": report.best.__dict__ if report.best else None,
                    "trials": [r.__dict__ for r in records],
                    "plan_checks": [c.__dict__ for c in checks],
                }
            ),
            markup=False,
        )
        return
    out.print(
        f"study {row.study_name}: {row.script}, budget {format_bytes(row.budget_bytes)} "
        f"(limit {format_bytes(limit)})"
    )
    if report.best is not None:
        best = report.best
        out.print(
            f"best: batch {best.batch_size}, plan {best.plan}: {speed_text(best.throughput, best.readings)}, "
            f"verified peak {format_bytes(best.verified_peak_bytes)}",
            markup=False,
        )
    out.print(trials_table(records, limit, workers=True))
    for line in (not_run_line(records), prediction_summary(records)):
        if line:
            out.print(line)
    if checks:
        out.print(checks_table(checks))
