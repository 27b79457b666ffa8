"""The ``autotune`` command line: each command builds a spec, makes one library call, prints.

Only this module turns errors into exit codes and ``Error: <one line>`` (``--debug`` shows the
traceback). Commands that run no trial never import torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from autotune.core.budget import parse_budget
from autotune.core.errors import AutotuneError, InputError
from autotune.core.plans import parse_backend_plan

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


def _quiet_optuna() -> None:
    """autotune reports its own trials; Optuna's INFO lines (re-armed when it is imported) would repeat them."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


def trial_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Options every command that runs trials takes."""
    options = [
        click.option(
            "--steps",
            type=click.IntRange(min=1),
            default=5,
            show_default=True,
            help="Measured steps per trial.",
        ),
        click.option(
            "--warmup-steps",
            type=click.IntRange(min=1),
            default=2,
            show_default=True,
            help="Warm-up steps per trial (not timed).",
        ),
        click.option(
            "--device",
            default="auto",
            show_default=True,
            help="auto (run: every visible GPU, one trial at a time each; else the CPU), cpu, cuda or cuda:N.",
        ),
        click.option(
            "--timeout", type=float, default=900, show_default=True, help="Seconds one trial may run."
        ),
        click.option(
            "--startup-timeout",
            type=float,
            default=300,
            show_default=True,
            help="Seconds until a trial's first step.",
        ),
        click.option(
            "--cache-dir",
            envvar="AUTOTUNE_CACHE_DIR",
            type=click.Path(path_type=Path),
            help="Database and trial logs (default: the user cache dir).",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def storage_options(command: Callable[..., Any]) -> Callable[..., Any]:
    command = click.option(
        "--storage",
        envvar="AUTOTUNE_STORAGE",
        help="SQLAlchemy URL of the database (default: SQLite in the cache dir).",
    )(command)
    return click.option(
        "--cache-dir",
        envvar="AUTOTUNE_CACHE_DIR",
        type=click.Path(path_type=Path),
        help="Where the default database lives.",
    )(command)


COMMAND = click.argument("command", nargs=-1, type=click.UNPROCESSED)
BACKEND = click.option(
    "--backend",
    type=click.Choice(["torch", "ort"]),
    default="torch",
    show_default=True,
    help="Recompute backend: torch (checkpointing), or ort (ONNX Runtime's ORTModule memory optimizer; "
    "pip install 'autotune[ort]').",
)


@cli.command()
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
@click.option(
    "--batch-size", "-b", type=click.IntRange(min=1), required=True, help="Batch size of the trial."
)
@click.option(
    "--plan", "-p", default="none", show_default=True, help="Recompute plan: none, all, or Class[:ratio],..."
)
@click.option("--budget", help="Also say whether the peak fits this budget (40GB, 40GiB, 90%, ...).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@BACKEND
@trial_options
def measure(
    command: tuple[str, ...],
    batch_size: int,
    plan: str,
    backend: str,
    budget: str | None,
    as_json: bool,
    steps: int,
    warmup_steps: int,
    device: str,
    timeout: float,
    startup_timeout: float,
    cache_dir: Path | None,
) -> None:
    """Run one measured trial: peak memory, samples/s, step times.

    COMMAND is a script and its arguments (SCRIPT [-- ARGS]) or, after --, any command line in which
    {batch_size} is replaced (-- python train.py --bs {batch_size}). Exits 0 when the trial completed
    (and fits --budget, if given), 1 otherwise.
    """
    from autotune.trials.command import TrialCommand
    from autotune.trials.measurement import MeasureSpec, TrialSettings
    from autotune.trials.measurement import measure as run_measure

    parsed_budget = parse_budget(budget) if budget is not None else None
    spec = MeasureSpec(
        command=TrialCommand.parse(command),
        batch_size=batch_size,
        plan=parse_backend_plan(plan, backend),
        device=device,
        settings=TrialSettings(warmup_steps, steps, startup_timeout, timeout),
        cache_dir=cache_dir,
        backend=backend,
    )
    result = run_measure(spec, os.environ)
    budget_bytes = parsed_budget.resolve(_device_total(result.device)) if parsed_budget else None
    fits = None if budget_bytes is None else result.fits(budget_bytes)
    if as_json:
        click.echo(json.dumps({**result.to_dict(), "budget_bytes": budget_bytes, "fits": fits}, indent=2))
    else:
        from autotune.cli.render import measured

        click.echo(measured(result, budget_bytes, fits))
    ok = result.outcome.value == "complete" and fits is not False
    click.get_current_context().exit(0 if ok else 1)


def search_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Options of the commands that define a tuning job (``run`` and ``submit``)."""
    options = [
        click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True),
        click.option(
            "--budget", required=True, help="Memory budget: 40GB, 40GiB, 0.5TiB, 90% of the device, ..."
        ),
        click.option(
            "--trials",
            type=click.IntRange(min=1),
            default=16,
            show_default=True,
            help="Trials the study should hold (counted over resumed runs and all workers).",
        ),
        click.option(
            "--batch-sizes",
            help="A range (8-512: powers of two and midpoints within) or a list (8,16,24). "
            "Default: 1 up, pruned by the memory model.",
        ),
        click.option(
            "--plans",
            multiple=True,
            help="Plans to search, ';'-separated or repeated (default: from the model).",
        ),
        click.option(
            "--headroom",
            default="5%",
            show_default=True,
            help="Margin the winner's verified peak keeps under the budget.",
        ),
        click.option("--seed", type=int, default=0, show_default=True, help="Sampler seed."),
        click.option("--study", help="Study name (default: derived from the script and the search)."),
        click.option("--force", is_flag=True, help="Forget the stored study and tune again."),
        BACKEND,
        click.option(
            "--storage",
            envvar="AUTOTUNE_STORAGE",
            help="SQLAlchemy URL of the database (default: SQLite in the cache dir).",
        ),
        click.option("--json", "as_json", is_flag=True, help="Print the result as JSON."),
    ]
    for option in reversed(options):
        command = option(command)
    return trial_options(command)


def _tune_spec(options: dict[str, Any]) -> Any:
    from autotune.trials.command import TrialCommand
    from autotune.trials.measurement import TrialSettings
    from autotune.search.space import parse_batch_sizes, parse_plan_list
    from autotune.workers.tune import TuneSpec

    return TuneSpec(
        command=TrialCommand.parse(options["command"]),
        budget=parse_budget(options["budget"]),
        trials=options["trials"],
        batch_sizes=parse_batch_sizes(options["batch_sizes"]),
        plans=parse_plan_list(options["plans"], options["backend"]) if options["plans"] else None,
        settings=TrialSettings(
            options["warmup_steps"], options["steps"], options["startup_timeout"], options["timeout"]
        ),
        headroom=_fraction(options["headroom"]),
        seed=options["seed"],
        device=options["device"],
        cache_dir=options["cache_dir"],
        storage=options["storage"],
        study=options["study"],
        force=options["force"],
        backend=options["backend"],
    )


@cli.command()
@search_options
def run(**options: Any) -> None:
    """Find the fastest batch size and recompute plan whose measured peak fits BUDGET, and store it.

    COMMAND is SCRIPT [-- ARGS] or -- COMMAND with {batch_size}. The same command again answers from the
    database with zero trials; an interrupted run resumes; workers (autotune worker) sharing the database
    help with it.
    """
    from autotune.cli import render
    from autotune.workers.tune import tune

    spec = _tune_spec(options)
    _quiet_optuna()
    result = tune(spec, os.environ, render.ConsoleReporter(render.console(stderr=True)))
    render.tuned(render.console(), result, options["command"], options["budget"], options["as_json"])


@cli.command()
@search_options
def submit(**options: Any) -> None:
    """Record a tuning job for workers (autotune worker) and return at once; prints the job's study name.

    Takes the options of run. Workers sharing --storage take it; autotune best --study NAME answers once
    it is done. --device is ignored: each worker measures on its own devices.
    """
    from autotune.workers import worker as daemon

    _quiet_optuna()
    job = daemon.submit(_tune_spec(options))
    if options["as_json"]:
        click.echo(json.dumps({"study": job.study_name, "state": job.state, "script": job.script}))
    else:
        click.echo(f"job {job.study_name}: {job.state}")


@cli.command()
@click.option(
    "--storage",
    envvar="AUTOTUNE_STORAGE",
    help="SQLAlchemy URL of the shared database (postgresql://... for several hosts; default: SQLite in "
    "the cache dir).",
)
@click.option(
    "--devices",
    default="auto",
    show_default=True,
    help="Devices to run trials on, one at a time each: auto (every GPU, else the CPU), cpu, or 0,1,...",
)
@click.option("--once", is_flag=True, help="Exit when no open job is left (for batch schedulers and tests).")
@click.option("--study", "studies_", multiple=True, help="Only work on these jobs.")
@click.option(
    "--cache-dir",
    envvar="AUTOTUNE_CACHE_DIR",
    type=click.Path(path_type=Path),
    help="Trial logs and the default database.",
)
def worker(
    storage: str | None, devices: str, once: bool, studies_: tuple[str, ...], cache_dir: Path | None
) -> None:
    """Run the trials of the database's open jobs until stopped (SIGTERM/SIGINT: running trials are
    stopped and released, nothing is left running). Several workers, on any hosts, share the jobs."""
    from autotune.workers import worker as daemon
    from autotune.core.paths import cache_dir as default_cache
    from autotune.core.paths import default_storage_url

    _quiet_optuna()
    url = storage or default_storage_url(default_cache(cache_dir))
    summary = daemon.Worker(
        url, daemon.parse_devices(devices, os.environ), cache_dir, os.environ, once, studies_ or None
    ).run()
    click.echo(
        f"worker: {summary.trials} trial(s); jobs done: {', '.join(summary.jobs_done) or '-'}; "
        f"failed: {', '.join(summary.jobs_failed) or '-'}; refused: {', '.join(summary.refused) or '-'}"
        + ("; stopped" if summary.stopped else ""),
        err=True,
    )


@cli.command()
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
@click.option(
    "--batch-size",
    "-b",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="Batch size of the instrumented trial.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the candidates as JSON.")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--timeout", type=float, default=900, show_default=True, help="Seconds the trial may run.")
@click.option(
    "--cache-dir",
    envvar="AUTOTUNE_CACHE_DIR",
    type=click.Path(path_type=Path),
    help="Where trial logs go (default: the user cache dir).",
)
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
    from autotune.cli import render
    from autotune.trials.command import TrialCommand
    from autotune.trials.measurement import MeasureSpec, TrialSettings
    from autotune.trials.measurement import measure as run_measure

    spec = MeasureSpec(
        command=TrialCommand.parse(command),
        batch_size=batch_size,
        device=device,
        settings=TrialSettings(1, 3, timeout, timeout),
        cache_dir=cache_dir,
        backend=backend,
    )
    result = run_measure(spec, os.environ, probe=True)
    render.probed(render.console(), result, as_json)
    click.get_current_context().exit(0 if result.outcome.value == "complete" else 1)


@cli.command()
@COMMAND
@click.option("--budget", help="The budget the plan was tuned for (default: the most recent).")
@click.option("--study", help="Answer from this study.")
@click.option("--device", default="auto", show_default=True, help="The device the plan was tuned on.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSON (batch_size, plan, peak_bytes, samples_per_sec, ...)."
)
@click.option(
    "--env", "as_env", is_flag=True, help="Print shell exports to train with the plan outside autotune."
)
@BACKEND
@storage_options
def best(
    command: tuple[str, ...],
    budget: str | None,
    study: str | None,
    device: str,
    backend: str,
    as_json: bool,
    as_env: bool,
    storage: str | None,
    cache_dir: Path | None,
) -> None:
    """The best stored plan, from the database alone (no trial is run).

    With a SCRIPT, the plan tuned for it on this device; with --study, that study's; with neither, the
    most recent. A budget with no verified winner is answered from the measured trials that fit, and says so.
    """
    from autotune.results import answers
    from autotune.cli import render
    from autotune.trials.command import TrialCommand

    store = answers.open_default(storage, cache_dir)  # imports Optuna only if it must read trials
    answer = answers.best(
        store,
        TrialCommand.parse(command) if command else None,
        parse_budget(budget) if budget else None,
        study,
        device,
        os.environ,
        backend,
        cache_dir,
    )
    render.best(render.console(), answer, as_json, as_env)


@cli.command()
@storage_options
def studies(storage: str | None, cache_dir: Path | None) -> None:
    """List the stored studies: script, budget, trials, best samples/s, state."""
    from autotune.results import answers
    from autotune.cli import render

    _quiet_optuna()
    render.studies(render.console(), answers.studies(answers.open_default(storage, cache_dir)))


@cli.command()
@click.argument("study")
@click.option("--json", "as_json", is_flag=True, help="Print the trials as JSON.")
@storage_options
def show(study: str, as_json: bool, storage: str | None, cache_dir: Path | None) -> None:
    """List the trials of STUDY, with the memory model's predictions beside the measured peaks, and each
    plan's saving as the probe predicted it beside the saving its trials measured."""
    from autotune.results import answers
    from autotune.cli import render

    _quiet_optuna()
    row, records, checks = answers.show(answers.open_default(storage, cache_dir), study)
    render.show(render.console(), row, records, checks, as_json)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
def doctor(as_json: bool) -> None:
    """Check what works on this machine (torch, GPU memory through NVML, storage drivers, backends) and
    say what to do about what does not. Exits 1 if autotune cannot tune here at all."""
    from autotune.hardware import doctor as checks_module
    from autotune.cli import render

    found = checks_module.checks()
    render.doctor(render.console(), found, as_json)
    click.get_current_context().exit(1 if any(c.required and not c.ok for c in found) else 0)


def _fraction(text: str) -> float:
    """'5%' or '0.05' -> 0.05."""
    try:
        value = float(text[:-1]) / 100 if text.strip().endswith("%") else float(text)
    except ValueError:
        raise InputError(
            f"invalid headroom {text!r}: expected a percentage such as 5% or a fraction such as 0.05"
        ) from None
    return value


def _device_total(device: str) -> int:
    from autotune.hardware.devices import resolve_device

    return resolve_device(device, os.environ).total_bytes


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="autotune")
