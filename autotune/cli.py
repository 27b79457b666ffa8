"""The ``autotune`` command line: each command builds a spec, makes one library call, prints.

Only this module turns errors into exit codes and ``Error: <one line>`` (``--debug`` shows the
traceback). Commands that run no trial never import torch.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import click

from autotune.budget import format_bytes, parse_budget
from autotune.errors import AutotuneError
from autotune.plans import parse_plan

EXIT_INTERRUPTED = 130


class _Group(click.Group):
    """Maps AutotuneError to one line on stderr and its exit code; Ctrl-C to exit code 130."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except AutotuneError as e:
            if ctx.params.get("debug"):
                raise
            click.echo(f"Error: {e}", err=True)
            ctx.exit(e.exit_code)
        except KeyboardInterrupt:
            click.echo("Interrupted: the running trial was stopped.", err=True)
            ctx.exit(EXIT_INTERRUPTED)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show the full traceback of an error.")
def cli(debug: bool) -> None:
    """autotune: the fastest batch size and recompute plan that fit a memory budget, measured."""


def _parse_or_raise(parser: Any, value: str | None) -> Any:
    return None if value is None else parser(value)


@cli.command(context_settings={"ignore_unknown_options": False})
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
@click.option(
    "--batch-size", "-b", type=click.IntRange(min=1), required=True, help="Batch size of the trial."
)
@click.option(
    "--plan", "-p", default="none", show_default=True, help="Recompute plan: none, all, or Class[:ratio],..."
)
@click.option("--steps", type=click.IntRange(min=1), default=5, show_default=True, help="Measured steps.")
@click.option(
    "--warmup-steps",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="Warm-up steps (not timed).",
)
@click.option("--budget", help="Also say whether the peak fits this budget (40GB, 40GiB, 90%, ...).")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option(
    "--timeout", type=float, default=900, show_default=True, help="Seconds the whole trial may run."
)
@click.option(
    "--startup-timeout", type=float, default=300, show_default=True, help="Seconds until the first step."
)
@click.option(
    "--cache-dir", envvar="AUTOTUNE_CACHE_DIR", help="Where trial logs go (default: the user cache dir)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def measure(
    command: tuple[str, ...],
    batch_size: int,
    plan: str,
    steps: int,
    warmup_steps: int,
    budget: str | None,
    device: str,
    timeout: float,
    startup_timeout: float,
    cache_dir: str | None,
    as_json: bool,
) -> None:
    """Run one measured trial: peak memory, samples/s, step times.

    COMMAND is a script and its arguments (SCRIPT [-- ARGS]) or, after --, any command line in which
    {batch_size} is replaced (-- python train.py --bs {batch_size}). Exits 0 when the trial completed
    (and fits --budget, if given), 1 otherwise.
    """
    from autotune.command import TrialCommand
    from autotune.measurement import MeasureSpec, TrialSettings
    from autotune.measurement import measure as run_measure

    parsed_budget = _parse_or_raise(parse_budget, budget)
    spec = MeasureSpec(
        command=TrialCommand.parse(command),
        batch_size=batch_size,
        plan=parse_plan(plan),
        device=device,
        settings=TrialSettings(warmup_steps, steps, startup_timeout, timeout),
        cache_dir=Path(cache_dir) if cache_dir else None,
    )
    result = run_measure(spec, os.environ)
    budget_bytes = parsed_budget.resolve(_device_total(result.device)) if parsed_budget else None
    fits = None if budget_bytes is None else result.fits(budget_bytes)
    if as_json:
        click.echo(json.dumps({**result.to_dict(), "budget_bytes": budget_bytes, "fits": fits}, indent=2))
    else:
        _print_result(result, budget_bytes, fits)
    ok = result.outcome.value == "complete" and fits is not False
    click.get_current_context().exit(0 if ok else 1)


def _device_total(device: str) -> int:
    from autotune.devices import resolve_device

    return resolve_device(device, os.environ).total_bytes


def _print_result(result: Any, budget_bytes: int | None, fits: bool | None) -> None:
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
                f"median {_ms(times[len(times) // 2])}, min {_ms(times[0])}, max {_ms(times[-1])}"
                f" over {len(times)} steps",
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
        margin = budget_bytes - result.peak_bytes
        if result.outcome.value != "complete":
            verdict = f"unknown: the trial did not complete ({result.outcome.value})"
        else:
            spare = f"{format_bytes(abs(margin))} {'to spare' if margin >= 0 else 'over'}"
            verdict = f"{'fits' if fits else 'does not fit'} ({spare})"
        rows.append(("budget", f"{format_bytes(budget_bytes)}: {verdict}"))
    if result.memory_note:
        rows.append(("note", result.memory_note))
    rows.append(("logs", result.log_dir))
    for key, value in rows:
        click.echo(f"{key:<12} {value}")
    if result.error:
        click.echo(f"\n{result.error}")


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="autotune")
