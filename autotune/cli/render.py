"""What ``run``, ``best``, ``studies`` and ``show`` print."""

from __future__ import annotations

import dataclasses
import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console
from rich.table import Table

from autotune.cli.console import as_json, key_value_grid
from autotune.cli.fit import PlanNames, clip, plan_width
from autotune.cli.render_trial import own_text
from autotune.cli.tables import checks_table, prediction_summary, trials_table
from autotune.core.budget import format_bytes
from autotune.core.paths import location_words
from autotune.core.protocol import Outcome
from autotune.core.stats import Interval
from autotune.results.listing import not_run_line
from autotune.runtime.inputs import varied_lengths
from autotune.search.records import (
    Configuration,
    KeptOut,
    TrialKind,
    TrialRecord,
    kept_out_by_headroom,
    lengths_of,
    phase_peaks_of,
)
from autotune.trials.command import SCRIPT_SUFFIXES
from autotune.trials.settle import SETTLE_WINDOW

if TYPE_CHECKING:  # `autotune best` must not import the search to print an answer
    from autotune.results.best import BestAnswer
    from autotune.results.listing import StudyReport, StudySummary
    from autotune.search.spec import TuneResult


def tuned(out: Console, result: TuneResult, command: Sequence[str], budget: str, as_json_flag: bool) -> None:
    """The end of ``autotune run``: all trials, the prediction quality, the chosen configuration, its use."""
    best = result.best
    lengths = lengths_of(result.records, (best.batch_size, best.plan))
    phases = phase_peaks_of(result.records, (best.batch_size, best.plan))
    own = next((r.own_checkpointing for r in result.records if r.own_checkpointing), None)
    if as_json_flag:
        out.print(as_json_text(result), markup=False)
        return
    names = PlanNames(plan_width(out.width))
    if not result.cached:
        table, below = trials_table(result.records, result.limit_bytes, out.width, names)
        out.print(table)
        for line in (*below, not_run_line(result.records), prediction_summary(result.records)):
            if line:
                out.print(line, markup=False, soft_wrap=False)  # prose: wrapped at words, never cut
        if result.stopped:
            out.print(result.stopped, markup=False, soft_wrap=False)
    out.print(
        key_value_grid(
            [
                ("study", f"{result.study_name} ({result.storage})"),
                ("trials", trials_text(result.records, result.new_trials)),
                ("batch size", _batch_text(best.batch_size, result.grad_accum, result.global_batch)),
                ("plan", best.plan),
                *([("own recompute", own_text(own, best.plan))] if own else []),
                (
                    "peak",
                    f"{format_bytes(best.verified_peak_bytes)}, the largest of its trials, a longer one included "
                    f"(budget {format_bytes(result.budget_bytes)}, limit with headroom {format_bytes(result.limit_bytes)})"
                    + _over_limit_text(result)
                    + _rising_text(result),
                ),
                ("throughput", speed_text(best.throughput, best.readings)),
                *([("headroom", kept)] if (kept := _kept_out_text(result)) else []),
                *([("certainty", best.certainty)] if best.certainty else []),
                *([("inputs", inputs)] if (inputs := _inputs_text(result, lengths)) else []),
                *([("phases", _phases_text(phases))] if phases else []),
                *([("time", time_text(result))] if result.seconds is not None and not result.cached else []),
            ]
        ),
        markup=False,
    )
    where = location_words(result.storage)  # --cache-dir / --storage, where the database is not the default
    hint = best_command(command, budget, result.global_batch, result.max_seq_len, where)
    exe = autotune_executable()
    formats = shlex.join([*exe, "best", "--study", result.study_name, *where, "--format", "hf"])
    # commands to paste: never broken by the console (a break inside a word or a quoted path would not
    # paste back); the terminal folds them where they do not fit
    out.print(f'\nuse it:  eval "$({hint})"', markup=False, soft_wrap=True)
    out.print(f"         {formats}  # or lightning, torchrun", markup=False, soft_wrap=True)
    out.print(
        f"see it:  {shlex.join([*exe, 'report', result.study_name, *where])}", markup=False, soft_wrap=True
    )


def _over_limit_text(result: TuneResult) -> str:
    """Where some of the answer's readings passed the limit (most did not: it fits by the majority of its
    peaks, records.peak_verdict), how many, and that the headroom is what took them."""
    config = (result.best.batch_size, result.best.plan)
    peaks = [
        r.peak_bytes
        for r in result.records
        if (r.batch_size, r.plan) == config and r.outcome is Outcome.COMPLETE and r.peak_bytes is not None
    ]
    over = sum(p > result.limit_bytes for p in peaks)
    if not over:
        return ""
    within = (
        "all within the budget" if max(peaks) <= result.budget_bytes else "the largest over the budget too"
    )
    return f"; {over} of its {len(peaks)} readings passed the limit, {within}: the memory noise the headroom is for"


def _kept_out(result: TuneResult) -> KeptOut | None:
    """A faster configuration that only the headroom kept out (records.kept_out_by_headroom)."""
    best = result.best
    return kept_out_by_headroom(
        result.records,
        Configuration(best.batch_size, best.plan),
        best.throughput,
        result.limit_bytes,
        result.budget_bytes,
    )


def _kept_out_text(result: TuneResult) -> str | None:
    """What a faster configuration only the headroom kept out read, and the ``--headroom`` under which it
    could be the answer."""
    best, kept = result.best, _kept_out(result)
    if kept is None:
        return None
    return (
        f"{kept.config.label} read {kept.speed:,.1f} samples/s, "
        f"{kept.speed / best.throughput.mid:.2f}x the answer, at a peak of {format_bytes(kept.peak)}: over the "
        f"limit, within the budget; with --headroom {kept.headroom:.0%} it could be the answer (the headroom "
        "is room for the memory noise and for a longer job's peak)"
    )


def _rising_text(result: TuneResult) -> str:
    """Where the answer's longest run ended with its peak still rising (autotune.trials.settle.still_rising):
    by how much, and that the limit holds as much again: a longer job may need more."""
    config = (result.best.batch_size, result.best.plan)
    rises = [r.rising_bytes for r in result.records if (r.batch_size, r.plan) == config and r.rising_bytes]
    if not rises:
        return ""
    return (
        f"; still rising {format_bytes(max(rises))} per {SETTLE_WINDOW} steps at the end of its longest run, "
        "which the limit holds room for once more: a much longer job may need more"
    )


def _phases_text(phases: dict[str, int]) -> str:
    """``eval 1.20 GiB, save 900.00 MiB (sampled in each trial after its steps; within the peak)``."""
    names = {"eval": "evaluation", "save": "checkpoint save"}
    listed = ", ".join(f"{names.get(n, n)} {format_bytes(p)}" for n, p in sorted(phases.items()))
    return f"{listed}: run once after each trial's measured steps, within the peak above"


def _batch_text(batch_size: int, grad_accum: int | None, global_batch: int | None) -> str:
    if grad_accum is None:
        return str(batch_size)
    of = f" (global batch {global_batch})" if global_batch is not None else ""
    return f"{batch_size}, accumulated {grad_accum}x per optimizer step{of}"


def speed_text(speed: Interval, readings: int | None) -> str:
    """``594.4 samples/s (590.1-598.7 over 3 readings)``: a throughput is never one bare number."""
    over = f" over {readings} readings" if readings and readings > 1 else ""
    return f"{speed.mid:,.1f} samples/s ({speed.low:,.1f}-{speed.high:,.1f}{over})"


def trials_text(records: Sequence[TrialRecord], new: int) -> str:
    """What the trials were: ``4 configurations measured; 4 re-measurements of the leaders, to verify the
    winner; 9 trial runs (the probe's included) in this run, each counted toward --trials``."""
    counted = sum(r.counted for r in records)
    second = sum(r.remeasured and r.outcome is not None for r in records)
    again = sum(r.kind is TrialKind.VERIFICATION for r in records)
    warm = sum(r.kind is TrialKind.WARM_START for r in records)
    parts = [f"{counted} configurations measured"]
    if second:
        parts.append(f"{second} measured again because their readings disagreed or a busy machine took them")
    if again:
        parts.append(f"{again} re-measurement{'s' if again > 1 else ''} of the leaders, to verify the winner")
    if warm:
        parts.append(f"{warm} taken from the studies of other budgets (not run)")
    parts.append(
        f"{new} trial run{'s' if new != 1 else ''} (the probe's included) in this run, each counted toward --trials"
    )
    return "; ".join(parts)


def autotune_executable() -> list[str]:
    """How to call autotune again from this shell, as words: ``autotune`` when that is this autotune on the
    PATH, else the path of this one (``.venv/bin/autotune`` after ``make``, whose environment is not
    activated), else this Python with ``-m autotune``."""
    ours = (
        Path(sys.argv[0])
        if Path(sys.argv[0]).name == "autotune"
        else Path(sys.executable).with_name("autotune")
    )
    found = shutil.which("autotune")
    if found is not None and Path(found).resolve() == ours.resolve():
        return ["autotune"]
    if not ours.exists():
        return [sys.executable, "-m", "autotune"]
    try:
        return [str(ours.absolute().relative_to(Path.cwd()))]
    except ValueError:
        return [str(ours)]


def best_command(
    command: Sequence[str],
    budget: str,
    global_batch: int | None = None,
    max_seq_len: int | None = None,
    where: Sequence[str] = (),
) -> str:
    """The `autotune best ... --env` line for a run's command (options before the script's own `--`;
    ``where``: the database's options, autotune.core.paths.location_words)."""
    words = [*autotune_executable(), "best", "--budget", budget, *where, "--env"]
    if global_batch is not None:
        words += ["--global-batch", str(global_batch)]
    if max_seq_len is not None:
        words += ["--max-seq-len", str(max_seq_len)]
    if command[0].endswith(".py"):  # SCRIPT [-- ARGS]
        words.append(command[0])
        command = command[1:]
    return shlex.join([*words, "--", *command] if command else words)


def time_text(result: TuneResult) -> str:
    """This run's time to its answer, and where its trials' time went (issue 31: trials spent ~18 s starting
    for 0.35 s of measured steps)."""
    timed = [r for r in result.records if r.startup_seconds is not None]
    text = f"{result.seconds:,.0f} s to answer"
    if result.stages:
        text += " (" + ", ".join(f"{name} {seconds:,.0f} s" for name, seconds in result.stages) + ")"
    if timed:
        starting = sum(r.startup_seconds or 0.0 for r in timed)
        measuring = sum(r.measured_seconds or 0.0 for r in timed)
        processes = len({r.log_dir for r in timed if r.log_dir})
        text += (
            f"; the study's {len(timed)} trials, in {processes} processes, spent {starting:,.1f} s starting "
            f"(to the end of their first step) and {measuring:,.1f} s in measured steps"
        )
    return text


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
            "certainty": result.best.certainty,
            "seconds": result.seconds,
            "stages": dict(result.stages),
            "lengths": lengths_of(result.records, (result.best.batch_size, result.best.plan)),
            "max_seq_len": result.max_seq_len,
            "phase_peaks": phase_peaks_of(result.records, (result.best.batch_size, result.best.plan)) or None,
            "kept_out_by_headroom": _kept_out_json(result),
            "trials": [r.__dict__ for r in result.records],
        }
    )


def _kept_out_json(result: TuneResult) -> dict[str, object] | None:
    kept = _kept_out(result)
    if kept is None:
        return None
    return {
        "batch_size": kept.config.batch_size,
        "plan": kept.config.plan,
        "samples_per_sec": kept.speed,
        "peak_bytes": kept.peak,
        "headroom": kept.headroom,
    }


def _inputs_text(result: TuneResult, lengths: tuple[int, int] | None) -> str | None:
    """What the answer's peak covers of the job's inputs: read at --max-seq-len from shorter trials, or a
    warning where the trials' lengths varied and neither --max-seq-len nor worst-case inputs covered the
    longest."""
    if result.max_seq_len is not None and lengths is not None:
        if lengths[1] >= result.max_seq_len:
            return f"the trials fed length {lengths[1]}: --max-seq-len {result.max_seq_len} is covered as measured"
        config = (result.best.batch_size, result.best.plan)
        measured = max(
            (
                r.measured_peak_bytes
                for r in result.records
                if (r.batch_size, r.plan) == config and r.measured_peak_bytes
            ),
            default=None,
        )
        read = f" (measured up to {format_bytes(measured)})" if measured is not None else ""
        return (
            f"peaks read at --max-seq-len {result.max_seq_len} from the trials' longest input, length "
            f"{lengths[1]}, and the memory per token they measured{read}"
        )
    if lengths is not None and lengths[0] != lengths[1]:
        return varied_lengths(lengths)
    return None


def best(out: Console, answer: BestAnswer, fmt: str | None) -> None:
    """The answer as a table for people, or in ``fmt`` (autotune.results.formats) for a tool or a paste."""
    if fmt is not None:
        from autotune.results import formats

        out.print(formats.render(answer, fmt), markup=False, soft_wrap=True)
        return
    out.print(
        key_value_grid(
            [
                ("study", answer.study),
                ("script", answer.script),
                ("batch size", str(answer.batch_size)),
                ("plan", answer.plan),
                *(
                    [("own recompute", own_text(answer.own_checkpointing, answer.plan))]
                    if answer.own_checkpointing
                    else []
                ),
                ("peak", format_bytes(answer.peak_bytes)),
                ("throughput", speed_text(answer.throughput, answer.readings)),
                *([("certainty", answer.certainty)] if answer.certainty else []),
                ("budget", format_bytes(answer.budget_bytes)),
                ("source", answer.source),
            ]
        ),
        markup=False,
    )


def studies_json(out: Console, summaries: Sequence[StudySummary]) -> None:
    """``studies --json``: one object per study, as ``show --json`` and ``best --json`` print theirs."""
    out.print(as_json([dataclasses.asdict(s) for s in summaries]), markup=False, soft_wrap=True)


def studies(out: Console, summaries: Sequence[StudySummary]) -> None:
    """One line per study; its command last (the one cell that may be long: a template's, or the script and
    its arguments), scripts by their file names (``show`` has the whole path), cut at its end."""
    rows = [
        [
            s.name,
            format_bytes(s.budget_bytes) if s.budget_bytes else s.budget_text,
            str(s.trials),
            f"{s.best_samples_per_sec:,.1f}" if s.best_samples_per_sec else "-",
            str(s.state),
            _short_command(s.command or s.script),
        ]
        for s in summaries
    ]
    columns = ("study", "budget", "trials", "samples/s", "state", "command")  # samples/s: the winner's
    widths = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]
    room = max(out.width - sum(w + 3 for w in widths[:-1]) - 1, 10)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for i, column in enumerate(columns):
        numeric = column in ("budget", "trials", "samples/s")
        last = column == "command"
        table.add_column(
            column,
            justify="right" if numeric else "left",
            no_wrap=True,
            min_width=None if last else widths[i],
            max_width=room if last else None,
        )
    for r in rows:
        r[-1] = clip(r[-1], room)
        table.add_row(*r)
    out.print(table)


def _short_command(command: str) -> str:
    """``python train.py --bs {batch_size}`` for ``python /home/me/jobs/train.py --bs {batch_size}``: each
    script by its file name, the rest as written."""
    return " ".join(
        Path(w).name if w.endswith(SCRIPT_SUFFIXES) and "/" in w else w for w in command.split(" ")
    )


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
        f"(limit {format_bytes(limit)}: the budget less headroom)",
        markup=False,
        soft_wrap=False,
    )
    if report.best is not None:
        best = report.best
        out.print(
            f"best: batch {best.batch_size}, plan {best.plan}: {speed_text(best.throughput, best.readings)}, "
            f"verified peak {format_bytes(best.verified_peak_bytes)}",
            markup=False,
            soft_wrap=False,
        )
    names = PlanNames(plan_width(out.width))
    table, below = trials_table(records, limit, out.width, names, workers=True)
    out.print(table)
    for line in (*below, not_run_line(records), prediction_summary(records)):
        if line:
            out.print(line, markup=False, soft_wrap=False)  # prose: wrapped at words, never cut
    if checks:
        checks_shown, notes = checks_table(checks, names)
        out.print(checks_shown)
        for line in notes:
            out.print(line, markup=False, soft_wrap=False)
