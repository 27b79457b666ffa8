"""Commands that answer from the database, with no trial and no torch: ``best``, ``studies``, ``show``."""

from __future__ import annotations

import os
from pathlib import Path

import click

from autotune import api
from autotune.cli.main import cli, quiet_optuna
from autotune.cli.options import AS_JSON, BACKEND, COMMAND, cache_dir_option, storage_option
from autotune.results.formats import FORMATS

DEFAULT_DB = cache_dir_option("Where the default database lives.")


@cli.command()
@COMMAND
@click.option("--budget", help="The budget the plan was tuned for (default: the most recent).")
@click.option("--study", help="Answer from this study.")
@click.option("--device", default="auto", show_default=True, help="The device the plan was tuned on.")
@click.option(
    "--global-batch", type=int, help="The global batch the plan was tuned for (run --global-batch)."
)
@click.option(
    "--max-seq-len", type=int, help="The longest sequence length the plan was tuned for (run --max-seq-len)."
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    help="Print the answer as: env (shell exports for a script using autotune's API), json, hf (Hugging Face "
    "TrainingArguments), lightning (Trainer arguments), torchrun (the run's own command, filled in).",
)
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
@click.option("--env", "as_env", is_flag=True, help="Same as --format env.")
@BACKEND
@storage_option()
@DEFAULT_DB
def best(
    command: tuple[str, ...],
    budget: str | None,
    study: str | None,
    device: str,
    global_batch: int | None,
    max_seq_len: int | None,
    backend: str,
    fmt: str | None,
    as_json: bool,
    as_env: bool,
    storage: str | None,
    cache_dir: Path | None,
) -> None:
    """The best stored plan, from the database alone (no trial is run).

    With a SCRIPT, the plan tuned for it on this device; with --study, that study's; with neither, the
    most recent. A budget with no verified winner is answered from the measured trials that fit, and says so.
    """
    from autotune.cli import render
    from autotune.cli.console import console

    answer = api.best(
        command or None,
        budget=budget,
        study=study,
        device=device,
        backend=backend,
        storage=storage,
        cache_dir=cache_dir,
        environ=os.environ,
        global_batch=global_batch,
        max_seq_len=max_seq_len,
    )
    render.best(console(), answer, fmt or ("json" if as_json else "env" if as_env else None))


@cli.command()
@AS_JSON
@storage_option()
@DEFAULT_DB
def studies(as_json: bool, storage: str | None, cache_dir: Path | None) -> None:
    """List the stored studies: script, budget, trials, best samples/s, state."""
    from autotune.cli import render
    from autotune.cli.console import console

    quiet_optuna()
    summaries = api.studies(storage=storage, cache_dir=cache_dir)
    if as_json:
        render.studies_json(console(), summaries)
    else:
        render.studies(console(), summaries)


@cli.command()
@click.argument("study")
@AS_JSON
@storage_option()
@DEFAULT_DB
def show(study: str, as_json: bool, storage: str | None, cache_dir: Path | None) -> None:
    """List the trials of STUDY, with the memory model's predictions beside the measured peaks, and each
    plan's saving as the probe predicted it beside the saving its trials measured."""
    from autotune.cli import render
    from autotune.cli.console import console

    quiet_optuna()
    render.show(console(), api.show(study, storage=storage, cache_dir=cache_dir), as_json)


@cli.command()
@click.argument("study", required=False)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The HTML file to write (default: STUDY.html in this directory).",
)
@click.option("--png", is_flag=True, help="Also write the memory-speed plot as a PNG beside the HTML file.")
@storage_option()
@DEFAULT_DB
def report(
    study: str | None, output: Path | None, png: bool, storage: str | None, cache_dir: Path | None
) -> None:
    """Write one self-contained HTML file about STUDY (the most recent without one): the memory-speed plot
    with the budget and the winner, the answer for your framework, every trial, the probe's predictions
    against the measured savings, and Optuna's own plots. It opens offline; send it to a colleague."""
    from autotune.cli.console import console

    quiet_optuna()
    written = api.report(study, output, png=png, storage=storage, cache_dir=cache_dir)
    out = console()
    out.print(f"wrote {written.html} ({written.plotted})", markup=False)
    if written.png is not None:
        out.print(f"wrote {written.png}", markup=False)


@cli.command()
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@storage_option()
@DEFAULT_DB
def gc(dry_run: bool, storage: str | None, cache_dir: Path | None) -> None:
    """Remove the trial folders of finished studies (done or failed) from the cache dir. The folders of
    trials that ended with an error are kept (show and report point to their logs), and a study still
    open or running is not touched; answers, reports and show read the database, not these folders."""
    from autotune.core.budget import format_bytes

    quiet_optuna()
    done = api.gc(dry_run=dry_run, storage=storage, cache_dir=cache_dir)
    verb = "would remove" if dry_run else "removed"
    click.echo(
        f"{verb} {done.removed} trial folder(s) ({format_bytes(done.bytes)}) of {done.studies} finished "
        f"stud{'y' if done.studies == 1 else 'ies'}; kept {done.kept} of trials that ended with an error; "
        f"{len(done.unfinished)} open or running stud{'y' if len(done.unfinished) == 1 else 'ies'} not touched"
    )
