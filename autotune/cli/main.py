"""The ``autotune`` command group: the one place that turns errors into exit codes and ``Error: <one
line>`` (``--debug`` shows the traceback). Commands that run no trial never import torch."""

from __future__ import annotations

from typing import Any, NoReturn

import click

from autotune.core.environment import check_environment
from autotune.core.errors import AutotuneError
from autotune.core.text import visible
from autotune.trials.interrupts import TrialInterrupted

EXIT_INTERRUPTED = 130
_NO_ARGS = getattr(click.exceptions, "NoArgsIsHelpError", ())  # Click 8.2+


class _Group(click.Group):
    """Maps AutotuneError to one line on stderr and its exit code; a usage error (a bad option value, an
    unknown option or command) to one line and exit 2, instead of Click's usage block; Ctrl-C to 130."""

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except click.UsageError as e:
            _usage_error(e)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as e:
            _usage_error(e)
        except AutotuneError as e:
            if ctx.params.get("debug"):
                raise
            click.echo(f"Error: {visible(str(e), keep_newlines=True)}", err=True)  # it may quote the database
            ctx.exit(e.exit_code)
        except KeyboardInterrupt as e:
            stopped = (
                "the running trial was stopped" if isinstance(e, TrialInterrupted) else "no trial was running"
            )
            resumes = (
                " The same command resumes the run: the trials that finished are stored."
                if ctx.invoked_subcommand == "run"
                else ""
            )
            click.echo(f"Interrupted: {stopped}.{resumes}", err=True)
            ctx.exit(EXIT_INTERRUPTED)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="autotune", message="autotune %(version)s")  # the installed metadata's
@click.option("--debug", is_flag=True, help="Show the full traceback of an error.")
def cli(debug: bool) -> None:
    """autotune: the fastest batch size and recompute plan that fit a memory budget, measured."""
    check_environment()  # a bad AUTOTUNE_* value: one line, before anything runs


def _usage_error(error: click.UsageError) -> NoReturn:
    """One line: what was wrong and where the command's help is (exit 2, as Click's own). A command given
    no arguments at all shows its help, as Click does."""
    if isinstance(error, _NO_ARGS):  # Click 8.2+: a UsageError that carries the help
        click.echo(error.format_message())
        raise SystemExit(0)
    command = error.ctx.command_path if error.ctx is not None else "autotune"
    click.echo(f"Error: {error.format_message()} (see {command} --help)", err=True)
    raise SystemExit(2)


def quiet_optuna() -> None:
    """autotune reports its own trials; Optuna's INFO lines (re-armed when it is imported) would repeat them."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


def exit_with(ok: bool) -> None:
    """Exit 0 when ``ok``, else 1 (a trial that did not complete, or does not fit)."""
    click.get_current_context().exit(0 if ok else 1)
