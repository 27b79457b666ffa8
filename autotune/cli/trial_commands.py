"""Commands that run one trial, or check the machine: ``measure``, ``probe``, ``doctor``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from autotune import api
from autotune.cli.main import cli, exit_with
from autotune.cli.options import (
    AS_JSON,
    BACKEND,
    GLOBAL_BATCH,
    GRAD_ACCUM,
    backend_option,
    cache_dir_option,
    settings_of,
    trial_options,
)
from autotune.core.errors import InputError
from autotune.core.protocol import Outcome
from autotune.trials.settings import TrialSettings


@cli.command()
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
@click.option(
    "--batch-size", "-b", type=click.IntRange(min=1), required=True, help="Batch size of the trial."
)
@click.option(
    "--plan", "-p", default="none", show_default=True, help="Recompute plan: none, all, or Class[:ratio],..."
)
@click.option("--budget", help="Also say whether the peak fits this budget (40GB, 40GiB, 90%, ...).")
@GLOBAL_BATCH
@GRAD_ACCUM
@AS_JSON
@BACKEND
@trial_options
def measure(
    command: tuple[str, ...],
    batch_size: int,
    plan: str,
    backend: str,
    budget: str | None,
    global_batch: int | None,
    grad_accum: int | None,
    as_json: bool,
    **options: object,
) -> None:
    """Run one measured trial: peak memory, samples/s, step times.

    COMMAND is a script and its arguments (SCRIPT [-- ARGS]) or, after --, any command line in which
    {batch_size} (and {grad_accum}) is replaced (-- python train.py --bs {batch_size}). Exits 0 when the
    trial completed (and fits --budget, if given), 1 otherwise.
    """
    from autotune.cli.render_trial import measured
    from autotune.trials.measurement import measure_spec
    from autotune.trials.result import misconfigured

    spec = measure_spec(
        command,
        batch_size,
        plan=plan,
        backend=backend,
        budget=budget,
        settings=settings_of(options),
        device=str(options["device"]),
        cache_dir=options["cache_dir"],  # type: ignore[arg-type]
        global_batch=global_batch,
        grad_accum=grad_accum,
    )
    result = api.measure(spec, environ=os.environ)
    click.echo(json.dumps(result.to_dict(), indent=2) if as_json else measured(result))
    if (why := misconfigured(result)) is not None:
        raise InputError(why)
    exit_with(result.outcome is Outcome.COMPLETE and result.fits_budget is not False)


@cli.command()
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
@click.option(
    "--batch-size",
    "-b",
    type=click.IntRange(min=1),
    default=api.PROBE_BATCH_SIZE,
    show_default=True,
    help="Batch size of the instrumented trial.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the candidates as JSON.")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option(
    "--timeout",
    type=float,
    default=TrialSettings.timeout,
    show_default=True,
    help="Seconds the trial may run.",
)
@cache_dir_option("Where trial logs go (default: the user cache dir).")
@BACKEND
def probe(
    command: tuple[str, ...],
    batch_size: int,
    as_json: bool,
    backend: str,
    device: str,
    timeout: float,
    cache_dir: Path | None,
) -> None:
    """List the recompute candidates of a model with their measured savings (one instrumented trial).

    Module level: each repeated module class; operator level: the op kinds inside the outermost
    repeated class. Each row is a plan string that measure, run --plans and best accept.
    """
    from autotune.cli.console import console
    from autotune.cli.render_trial import probed

    result = api.probe(
        command,
        batch_size=batch_size,
        device=device,
        timeout=timeout,
        backend=backend,
        cache_dir=cache_dir,
        environ=os.environ,
    )
    probed(console(), result, as_json)
    exit_with(result.outcome is Outcome.COMPLETE)


@cli.command()
@AS_JSON
@click.option(
    "--ray-address",
    default=None,
    help="The Ray cluster to report on (default: RAY_ADDRESS, else one running here).",
)
@backend_option(
    "ort: also train a step with ORTModule (a fresh machine first builds its C++ extension, about a minute); "
    "torch: ORT is only looked up."
)
def doctor(as_json: bool, ray_address: str | None, backend: str) -> None:
    """Check what works on this machine (torch, GPU memory through NVML, storage drivers, the Ray cluster,
    backends) and say what to do about what does not. Exits 1 if autotune cannot tune here at all."""
    from autotune.cli.console import as_json as json_text
    from autotune.cli.console import console
    from autotune.cli.render_trial import check_lines

    out = console()
    found = api.doctor(ray_address, backend, on_check=None if as_json else lambda c: check_lines(out, c))
    if as_json:
        out.print(json_text([c.to_dict() for c in found]), markup=False)
    exit_with(not any(c.required and not c.ok for c in found))
