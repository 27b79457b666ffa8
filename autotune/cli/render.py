"""How the CLI draws things: trial lines and the live status of the running trial, tables, summaries.

rich handles terminal width, colour and non-terminal output (CI logs get plain lines, no spinner).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.status import Status
from rich.table import Table

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
        self.console.print(f"{_trial_line(record)}  {best_text}", highlight=False)

    def skipped(self, record: TrialRecord) -> None:
        self.console.print(f"{_trial_line(record)}", style="dim", highlight=False)

    def note(self, text: str) -> None:
        self._stop_status()
        self.console.print(text, highlight=False)

    def _stop_status(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None


def _trial_line(r: TrialRecord) -> str:
    peak = format_bytes(r.peak_bytes) if r.peak_bytes is not None else "-"
    predicted = f" (pred {format_bytes(r.predicted_peak_bytes)})" if r.predicted_peak_bytes else ""
    speed = f"{r.samples_per_sec:,.1f} samples/s" if r.samples_per_sec else "-"
    outcome = r.outcome or r.kind
    return f"trial {r.number:>3}  batch {r.batch_size!s:>5}  {r.plan!s:<24} peak {peak}{predicted}  {speed}  {outcome}"


def trials_table(records: Sequence[TrialRecord], limit: int | None = None, workers: bool = False) -> Table:
    """Every trial that ran (skipped and copied proposals are only counted: see not_run_line); with
    ``workers``, which worker (host:pid) and device ran each one."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    columns = ("#", "batch", "plan", "outcome", "peak", "predicted", "samples/s", "note")
    for column in columns[:-1] + (("worker",) if workers else ()) + columns[-1:]:
        numeric = column in ("#", "batch", "peak", "predicted", "samples/s")
        table.add_column(column, justify="right" if numeric else "left", no_wrap=column != "note")
    for r in records:
        if r.kind in ("skipped", "copy"):
            continue
        fits = "" if limit is None or not r.measured else (" ok" if r.fits(limit) else " over")
        predicted = ""
        if r.peak_bytes and r.predicted_peak_bytes:
            error = (r.predicted_peak_bytes - r.peak_bytes) / r.peak_bytes
            predicted = f"{format_bytes(r.predicted_peak_bytes)} {error:+.0%}"
        note = r.note or r.error or ""
        if r.kind not in ("measured", "verification"):
            note = f"{r.kind}: {note}" if note else r.kind
        cells = [
            str(r.number),
            str(r.batch_size),
            r.plan or "",
            (r.outcome or r.state.lower()) + fits,
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
    skipped = sum(r.kind == "skipped" for r in records)
    copies = sum(r.kind == "copy" for r in records)
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
        if r.kind == "measured" and r.outcome == "complete" and r.peak_bytes and r.predicted_peak_bytes
    )
    if not errors:
        return None
    return (
        f"memory model: median error {errors[len(errors) // 2]:.1%}, worst {errors[-1]:.1%} "
        f"over {len(errors)} predicted trial(s)"
    )


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
        soft_wrap=True,
        stderr=stderr,
        width=None if Console(stderr=stderr).is_terminal else 120,
    )


def tuned(out: Console, result: Any, command: Sequence[str], budget: str, as_json: bool) -> None:
    """The end of ``autotune run``: all trials, the prediction quality, the chosen configuration, its use."""
    best = result.best
    if as_json:
        out.print(as_json_text(result), markup=False)
        return
    if not result.cached:
        out.print(trials_table(result.records, result.limit_bytes))
        for line in (not_run_line(result.records), prediction_summary(result.records)):
            if line:
                out.print(line)
        if result.exhausted:
            out.print(
                "stopped early: every configuration left is predicted not to fit or was measured already"
            )
    out.print(
        key_values(
            [
                ("study", f"{result.study_name} ({result.storage})"),
                (
                    "trials",
                    f"{sum(r.counted for r in result.records)} counted, {result.new_trials} new in this run",
                ),
                ("batch size", str(best.batch_size)),
                ("plan", best.plan),
                (
                    "peak",
                    f"{format_bytes(best.verified_peak_bytes)} verified over a longer run "
                    f"(budget {format_bytes(result.budget_bytes)}, limit with headroom {format_bytes(result.limit_bytes)})",
                ),
                ("throughput", f"{best.verified_samples_per_sec:,.1f} samples/s"),
            ]
        ),
        markup=False,
    )
    out.print(f'\nuse it:  eval "$({best_command(command, budget)})"', markup=False)


def best_command(command: Sequence[str], budget: str) -> str:
    """The `autotune best ... --env` line for a run's command (options before the script's own `--`)."""
    import shlex

    words = ["autotune", "best", "--budget", budget, "--env"]
    if command[0].endswith(".py"):  # SCRIPT [-- ARGS]
        words.append(command[0])
        command = command[1:]
    return shlex.join([*words, "--", *command] if command else words)


def as_json_text(result: Any) -> str:
    return as_json(
        {
            "study": result.study_name,
            "cached": result.cached,
            "new_trials": result.new_trials,
            "budget_bytes": result.budget_bytes,
            "limit_bytes": result.limit_bytes,
            "batch_size": result.best.batch_size,
            "plan": result.best.plan,
            "peak_bytes": result.best.verified_peak_bytes,
            "samples_per_sec": result.best.verified_samples_per_sec,
            "trials": [r.__dict__ for r in result.records],
        }
    )


def best(out: Console, answer: Any, as_json_flag: bool, as_env: bool) -> None:
    import shlex

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
                ("throughput", f"{answer.samples_per_sec:,.1f} samples/s"),
                ("budget", format_bytes(answer.budget_bytes)),
                ("source", answer.source),
            ]
        ),
        markup=False,
    )


def studies(out: Console, summaries: Sequence[Any]) -> None:
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
            s.state,
        )
    out.print(table)


def show(
    out: Console, row: Any, records: Sequence[TrialRecord], checks: Sequence[Any], as_json_flag: bool
) -> None:
    limit = int(row.budget_bytes * (1 - row.headroom))
    if as_json_flag:
        out.print(
            as_json(
                {
                    "study": row.study_name,
                    "budget_bytes": row.budget_bytes,
                    "limit_bytes": limit,
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
    out.print(trials_table(records, limit, workers=True))
    for line in (not_run_line(records), prediction_summary(records)):
        if line:
            out.print(line)
    if checks:
        out.print(checks_table(checks))


def checks_table(checks: Sequence[Any]) -> Table:
    """The honesty check: each plan's saving per sample, as the probe predicted it and as measured."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title="plan savings per sample: probe vs trials")
    for column in ("plan", "predicted", "measured", "check"):
        table.add_column(column, justify="left" if column in ("plan", "check") else "right")
    for c in checks:
        measured = _signed_bytes(c.measured) if c.measured is not None else "not measured"
        verdict = "FAR FROM PREDICTION" if c.flagged else ("ok" if c.measured is not None else "")
        table.add_row(c.plan, _signed_bytes(c.predicted), measured, verdict)
    return table


def measured(result: Any, budget_bytes: int | None, fits: bool | None) -> str:
    """``autotune measure``'s human output."""
    rows = [
        ("outcome", result.outcome.value),
        ("device", f"{result.device} ({result.device_name})"),
        ("batch size", str(result.batch_size)),
        ("plan", result.plan),
        ("peak memory", f"{format_bytes(result.peak_bytes)} ({result.memory_method})"),
    ]
    if result.samples_per_sec is not None:
        times = sorted(result.step_seconds)
        rows.append(("throughput", f"{result.samples_per_sec:,.1f} samples/s"))
        rows.append(
            (
                "step time",
                f"median {_ms(times[len(times) // 2])}, min {_ms(times[0])}, max {_ms(times[-1])} "
                f"over {len(times)} steps",
            )
        )
    if result.torch_peak_reserved is not None:
        rows.append(
            (
                "torch peak",
                f"{format_bytes(result.torch_peak_allocated)} allocated, "
                f"{format_bytes(result.torch_peak_reserved)} reserved",
            )
        )
    if budget_bytes is not None:
        rows.append(("budget", f"{format_bytes(budget_bytes)}: {_verdict(result, budget_bytes, fits)}"))
    if result.memory_note:
        rows.append(("note", result.memory_note))
    rows.append(("logs", result.log_dir))
    text = key_values(rows)
    return f"{text}\n\n{result.error}" if result.error else text


def _verdict(result: Any, budget_bytes: int, fits: bool | None) -> str:
    if result.outcome.value != "complete":
        return f"unknown: the trial did not complete ({result.outcome.value})"
    margin = budget_bytes - result.peak_bytes
    return f"{'fits' if fits else 'does not fit'} ({format_bytes(abs(margin))} {'to spare' if margin >= 0 else 'over'})"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def probed(out: Console, result: Any, as_json_flag: bool) -> None:
    """``autotune probe``: fixed memory, activations per sample, and the candidate table."""
    from autotune.backends import probe

    data = result.probe
    if result.outcome.value != "complete":
        out.print(f"probe trial {result.outcome.value}: {result.error}\nlogs: {result.log_dir}", markup=False)
        return
    if data is None:
        out.print("nothing to probe: the script never ran the forward of a torch module", markup=False)
        return
    table_rows = probe.rows(data)
    if as_json_flag:
        out.print(
            as_json(
                {
                    "outcome": result.outcome.value,
                    "batch_size": data["batch_size"],
                    "peak_bytes": result.peak_bytes,
                    **probe.summary(data),
                    "candidates": [row.__dict__ for row in table_rows],
                }
            ),
            markup=False,
        )
        return
    fixed = probe.summary(data)
    if data.get("backend") == "ort":
        out.print(
            f"ONNX Runtime: {len(table_rows)} recompute plan(s) from ORTModule's memory optimizer "
            f"(savings at batch {data['batch_size']}); peak {format_bytes(result.peak_bytes)} "
            f"({result.memory_method}, probe trial)",
            markup=False,
        )
    else:
        _torch_probe_header(out, data, fixed, result)
    if not table_rows:
        out.print("no repeated modules found: only the plan none applies to this model", markup=False)
        return
    _probe_table(out, data, table_rows)


def _torch_probe_header(out: Console, data: dict[str, Any], fixed: dict[str, Any], result: Any) -> None:
    state = fixed["optimizer_state_bytes"]
    out.print(
        key_values(
            [
                (
                    "fixed",
                    f"weights {format_bytes(data['weights_bytes'])}, gradients {format_bytes(data['gradients_bytes'])}, "
                    f"optimizer state {format_bytes(state) if state is not None else 'unknown (no torch.optim)'}",
                ),
                (
                    "activations",
                    f"{format_bytes(data['activation_bytes'] / data['batch_size'])} per sample kept for backward "
                    f"({format_bytes(data['activation_bytes'])} at batch {data['batch_size']})",
                ),
                ("peak", f"{format_bytes(result.peak_bytes)} ({result.memory_method}, instrumented trial)"),
            ]
        ),
        markup=False,
    )


def _probe_table(out: Console, data: dict[str, Any], table_rows: list[Any]) -> None:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for column in (
        "level",
        "plan",
        "freq",
        f"saved @{data['batch_size']}",
        "per sample",
        "recomputes",
        "note",
    ):
        table.add_column(
            column,
            justify="right"
            if column in ("freq", "per sample", "recomputes") or column.startswith("saved")
            else "left",
        )
    for row in table_rows:
        table.add_row(
            row.level,
            row.plan,
            str(row.frequency),
            _signed_bytes(row.saving_bytes),
            _signed_bytes(row.saving_per_sample),
            f"{row.forward_share:.0%} of fwd" if row.forward_share is not None else "-",
            row.detail,
        )
    out.print(table)


def _signed_bytes(size: float) -> str:
    return ("-" if size < 0 else "") + format_bytes(abs(size))


def doctor(out: Console, checks: Sequence[Any], as_json_flag: bool) -> None:
    if as_json_flag:
        out.print(as_json([c.to_dict() for c in checks]), markup=False)
        return
    for c in checks:
        out.print(f"{'ok ' if c.ok else 'no '} {c.name}: {c.detail}", markup=False)
        if c.hint:
            out.print(f"     -> {c.hint}", markup=False)
