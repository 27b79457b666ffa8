"""Commands that tune: ``run`` (here), ``submit`` (for workers) and ``worker``."""

from __future__ import annotations

import json
import os
from functools import partial
from pathlib import Path
from typing import Any

import click

from autotune import api
from autotune.cli.main import cli, quiet_optuna
from autotune.cli.options import (
    GPUS_PER_TRIAL,
    TuningCommand,
    cache_dir_option,
    search_options,
    settings_of,
    storage_option,
)


def _tune_spec(options: dict[str, Any]) -> Any:
    """The TuneSpec the options of ``run`` and ``submit`` describe (validated before any trial)."""
    from autotune.search.spec import tune_spec

    return tune_spec(
        options["command"],
        options["budget"],
        batch_sizes=options["batch_sizes"],
        plans=options["plans"],
        headroom=options["headroom"],
        backend=options["backend"],
        trials=options["trials"],
        time_limit=options["time_limit"],
        settings=settings_of(options),
        seed=options["seed"],
        device=options["device"],
        cache_dir=options["cache_dir"],
        storage=options["storage"],
        study=options["study"],
        force=options["force"],
        exhaustive=options["exhaustive"],
        global_batch=options["global_batch"],
        grad_accum=options["grad_accum"],
        gpus_per_trial=options["gpus_per_trial"],
        host_budget=options["host_budget"],
        max_seq_len=options["max_seq_len"],
        sweep=options["sweep"],
        warm=options["warm"],
        executor=options.get("executor", "local"),
        ray_address=options.get("ray_address"),
        nodes_per_trial=options.get("nodes_per_trial", 1),
    )


@cli.command(cls=TuningCommand)
@search_options
@click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="Where trials run: local (this machine; workers sharing the database help), or ray (each trial "
    "placed on a Ray cluster in a placement group of --gpus-per-trial GPUs on --nodes-per-trial nodes; "
    "pip install 'autotune[ray]').",
)
@click.option(
    "--ray-address",
    default=None,
    help="The Ray cluster's address (default: RAY_ADDRESS, a cluster started here with ray start, else a new "
    "local one).",
)
@click.option(
    "--nodes-per-trial",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Under --executor ray: the nodes each trial spans (a torchrun --nnodes N template; its rendezvous "
    "is set per trial).",
)
def run(**options: Any) -> None:
    """Find the fastest batch size and recompute plan whose measured peak fits the budget, and store it.

    COMMAND is a script that reads autotune.batch_size() (SCRIPT [-- ARGS]), or any command with
    {batch_size} where the batch size goes (-- COMMAND). The same command again answers from the database
    with zero trials; an interrupted run resumes.

    \b
    Examples:
      autotune run --budget 40GB train.py
      autotune run --budget 12GiB -- python train.py --bs {batch_size}
      autotune run --budget 90% --trials 20 train.py -- --epochs 1
    """
    from autotune.cli import render
    from autotune.cli.console import ConsoleReporter, console

    spec = _tune_spec(options)
    quiet_optuna()
    with ConsoleReporter(console(stderr=True)) as reporter:
        result = api.tune(spec, environ=os.environ, reporter=reporter)
    render.tuned(console(), result, options["command"], options["budget"], options["as_json"])


@cli.command(cls=TuningCommand)
@search_options
@click.option(
    "--unsigned",
    is_flag=True,
    help="Store the job unsigned, for workers started with --allow-unsigned (a database only you can write).",
)
def submit(unsigned: bool, **options: Any) -> None:
    """Record a tuning job for workers (autotune worker) and return at once; prints the job's study name.

    Takes the options of run. The job is signed with the job key (AUTOTUNE_JOB_KEY, AUTOTUNE_JOB_KEY_FILE,
    or the file autotune keygen writes): workers run only jobs signed with the key they hold. Workers
    sharing --storage take it; autotune best --study NAME answers once it is done. --device is ignored:
    each worker measures on its own devices.
    """
    quiet_optuna()
    job = api.submit(_tune_spec(options), unsigned=unsigned, environ=os.environ)
    if options["as_json"]:
        click.echo(json.dumps({"study": job.study_name, "state": job.state.value, "script": job.script}))
    else:
        click.echo(f"job {job.study_name}: {job.state}")


@cli.command()
@storage_option(
    "SQLAlchemy URL of the shared database (postgresql://... for several hosts; default: SQLite in the cache dir)."
)
@click.option(
    "--devices",
    default="auto",
    show_default=True,
    help="Devices to run trials on, one at a time each: auto (every GPU, else the CPU), cpu, or 0,1,...",
)
@GPUS_PER_TRIAL
@click.option("--once", is_flag=True, help="Exit when no open job is left (for batch schedulers and tests).")
@click.option("--study", "studies_", multiple=True, help="Only work on these jobs.")
@click.option(
    "--allow-unsigned",
    is_flag=True,
    help="Also run unsigned jobs (submit --unsigned): only on a database no one else can write.",
)
@cache_dir_option("Trial logs and the default database.")
def worker(
    storage: str | None,
    devices: str,
    gpus_per_trial: int,
    once: bool,
    studies_: tuple[str, ...],
    allow_unsigned: bool,
    cache_dir: Path | None,
) -> None:
    """Run the trials of the database's open jobs until stopped (SIGTERM/SIGINT: running trials are
    stopped and released, nothing is left running). Several workers, on any hosts, share the jobs.

    A worker runs only jobs signed with the job key it holds (AUTOTUNE_JOB_KEY, AUTOTUNE_JOB_KEY_FILE, or
    the file autotune keygen writes) and whose scripts hash here as they did when submitted; it refuses any
    other in one line, and prints the command of each job it runs."""
    quiet_optuna()
    summary = api.work(
        allow_unsigned=allow_unsigned,
        storage=storage,
        devices=devices,
        gpus_per_trial=gpus_per_trial,
        once=once,
        studies=studies_,
        cache_dir=cache_dir,
        environ=os.environ,
        say=partial(click.echo, err=True),
    )
    click.echo(
        f"worker: {summary.trials} trial(s); jobs done: {', '.join(summary.jobs_done) or '-'}; "
        f"failed: {', '.join(summary.jobs_failed) or '-'}; refused: {', '.join(summary.refused) or '-'}"
        + ("; stopped" if summary.stopped else ""),
        err=True,
    )


@cli.command()
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the key (default: job.key in your config dir, which autotune reads by itself).",
)
@click.option(
    "--force", is_flag=True, help="Replace an existing key file (jobs signed with it stop verifying)."
)
def keygen(output: Path | None, force: bool) -> None:
    """Write a new job key (256 random bits, mode 0600): submit signs jobs with it, and workers run only
    jobs signed with the key they hold. Copy it to every submitting and worker host, to the same path or
    through AUTOTUNE_JOB_KEY_FILE / AUTOTUNE_JOB_KEY; whoever holds it can make workers run commands."""
    from autotune.workers.signing import default_key_file, write_key_file

    key = write_key_file(output or default_key_file(), force)
    click.echo(f"wrote job key {key.key_id} to {key.source} (mode 600)")
