"""Options shared by several commands. Their defaults are the library's own (TrialSettings, TuneSpec,
DEFAULT_HEADROOM): each default is written once, where the value is used."""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from autotune.core.budget import DEFAULT_HEADROOM, parse_budget
from autotune.core.errors import InputError
from autotune.core.protocol import STORAGE_ENV
from autotune.search import DEFAULT_SEED, DEFAULT_TRIALS, MIN_TRIALS
from autotune.trials.settings import TrialSettings

F = TypeVar("F", bound=Callable[..., Any])


class SectionedCommand(click.Command):
    """A command whose --help lists its options in sections, the everyday ones first (issue 44: ``run
    --help`` was 110 lines with --budget, the one required option, tenth, and no example). ``sections``:
    (title, option names) in order; an option named in none goes to the last section."""

    sections: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        records = {param.name: param.get_help_record(ctx) for param in self.get_params(ctx)}
        placed: set[str | None] = set()
        for title, names in self.sections:
            rows = [row for n in names if (row := records.get(n)) is not None]
            placed.update(names)
            if title == self.sections[-1][0]:
                rows += [r for n, r in records.items() if n not in placed and r is not None]
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


RUN_SECTIONS = (
    (
        "Options",
        ("budget", "trials", "time_limit", "batch_sizes", "plans", "device", "cache_dir", "as_json"),
    ),
    (
        "Each trial",
        (
            "steps",
            "warmup_steps",
            "warmup_max",
            "tight",
            "with_eval",
            "with_save",
            "timeout",
            "startup_timeout",
            "log_limit",
            "max_seq_len",
        ),
    ),
    (
        "The search",
        (
            "headroom",
            "host_budget",
            "global_batch",
            "grad_accum",
            "backend",
            "seed",
            "exhaustive",
            "sweep",
            "warm",
            "study",
            "force",
        ),
    ),
    ("Sharing the work", ("storage", "executor", "ray_address", "nodes_per_trial", "gpus_per_trial")),
)


class TuningCommand(SectionedCommand):
    """``run`` and ``submit``: the options of a tuning job, in sections."""

    sections = RUN_SECTIONS


def _apply(command: F, options: list[Callable[[F], F]]) -> F:
    for option in reversed(options):
        command = option(command)
    return command


def cache_dir_option(help_text: str) -> Callable[[F], F]:
    return click.option(
        "--cache-dir", envvar="AUTOTUNE_CACHE_DIR", type=click.Path(path_type=Path), help=help_text
    )


def storage_option(
    help_text: str = "SQLAlchemy URL of the database (default: SQLite in the cache dir).",
) -> Callable[[F], F]:
    return click.option("--storage", envvar=STORAGE_ENV, help=help_text, callback=_warn_of_a_password)


def _warn_of_a_password(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A password written in ``--storage`` on the command line is in ``ps`` for every user of the host, and
    in the shell's history: say so once, with the ways that keep it out (the URL itself still works)."""
    source = ctx.get_parameter_source(param.name or "storage")
    if value and source is click.core.ParameterSource.COMMANDLINE and _has_password(value):
        click.echo(
            f"Warning: the password in --storage can be read by every user of this host (ps) and stays in "
            f"your shell's history: give the URL in {STORAGE_ENV} instead, or leave the password out and put "
            "it in ~/.pgpass (or PGPASSWORD)",
            err=True,
        )
    return value


def _has_password(url: str) -> bool:
    try:
        return bool(urllib.parse.urlsplit(url).password)
    except ValueError:  # not a URL at all: the database's own check says so
        return False


def backend_option(help_text: str) -> Callable[[F], F]:
    return click.option(
        "--backend", type=click.Choice(["torch", "ort"]), default="torch", show_default=True, help=help_text
    )


BACKEND = backend_option(
    "Recompute backend: torch (checkpointing), or ort (ONNX Runtime's ORTModule memory optimizer; "
    "pip install 'autotune[ort]')."
)
COMMAND = click.argument("command", nargs=-1, type=click.UNPROCESSED)
GLOBAL_BATCH = click.option(
    "--global-batch",
    type=int,
    help="Samples per optimizer step, fixed: each trial's batch size is a micro-batch dividing it, "
    "accumulated GLOBAL/batch times ({grad_accum} in a command, autotune.grad_accum() in a script).",
)
GRAD_ACCUM = click.option(
    "--grad-accum",
    type=int,
    help="The script accumulates this many micro-batches per optimizer step on its own (default: counted "
    "from its forwards); samples/s counts them all.",
)
GPUS_PER_TRIAL = click.option(
    "--gpus-per-trial",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="GPUs each trial runs on (a torchrun job's ranks, --nproc-per-node); each rank is measured on its "
    "own device and the budget holds per device.",
)
AS_JSON = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")


STEPS = click.option(
    "--steps",
    type=click.IntRange(min=1),
    default=TrialSettings.measured_steps,
    show_default=True,
    help="Measured steps per trial.",
)
WARMUP_STEPS = click.option(
    "--warmup-steps",
    type=click.IntRange(min=1),
    default=TrialSettings.warmup_steps,
    show_default=True,
    help="Warm-up steps per trial (not timed).",
)
WARMUP_MAX = click.option(
    "--warmup-max",
    type=click.IntRange(min=1),
    default=TrialSettings.warmup_max,
    show_default=True,
    help="At most this many warm-up steps: a first measured step 1.5x slower than the others (a "
    "recompilation, autotuning) becomes warm-up and one more is measured, until then. --warmup-max 1: never.",
)


def _share(ctx: click.Context, param: click.Parameter, value: str) -> float:
    """``3%`` or ``0.03`` as a share in [0, 1)."""
    try:
        share = float(value[:-1]) / 100 if value.endswith("%") else float(value)
    except ValueError:
        raise click.BadParameter(f"expected a share such as 3% or 0.03, got {value!r}") from None
    if not 0 <= share < 1:
        raise click.BadParameter(f"expected a share from 0% up to below 100%, got {value!r}")
    return share


def _seconds(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """``90``, ``90s``, ``5m`` or ``1h`` as seconds (0: no limit); None: the default."""
    if value is None:
        return None
    scale = {"s": 1, "m": 60, "h": 3600}.get(value[-1:].lower(), 0)
    try:
        seconds = float(value[:-1] if scale else value) * (scale or 1)
    except ValueError:
        raise click.BadParameter(f"expected seconds such as 90, 90s, 5m or 1h, got {value!r}") from None
    if not seconds >= 0:
        raise click.BadParameter(f"expected 0 (no limit) or more seconds, got {value!r}")
    return seconds


TIGHT = click.option(
    "--tight",
    default=f"{TrialSettings.tight:.0%}",
    show_default=True,
    callback=_share,
    help="Past --steps, a trial measures on while its throughput's interval is wider than this, for at most "
    "a quarter of its start-up (10 s at most). 0: exactly --steps.",
)
WITH_EVAL = click.option(
    "--with-eval",
    is_flag=True,
    help="Each trial also runs the script's evaluation once after its measured steps, and its peak counts "
    "against the budget (a Trainer's evaluate and a Lightning validation loop are found; a loop of your own "
    "runs it when autotune.due('eval') is true, inside autotune.phase('eval')).",
)
WITH_SAVE = click.option(
    "--with-save",
    is_flag=True,
    help="Each trial also saves a checkpoint once after its measured steps (into the trial's folder, then "
    "deleted), and its peak counts against the budget; found like --with-eval (autotune.due('save')).",
)


def _log_limit(ctx: click.Context, param: click.Parameter, value: str) -> int:
    """``16MiB`` as bytes; ``0``: no limit."""
    if value.strip() == "0":
        return 0
    try:
        size = parse_budget(value)
    except InputError as e:
        raise click.BadParameter(str(e)) from None
    if size.absolute_bytes is None:
        raise click.BadParameter(f"expected a size such as 16MiB, got {value!r}")
    return size.absolute_bytes


LOG_LIMIT = click.option(
    "--log-limit",
    default="16MiB",
    show_default=True,
    callback=_log_limit,
    help="Keep the last this much of each trial's stdout and stderr (0: all of it).",
)
DEVICE = click.option(
    "--device",
    default="auto",
    show_default=True,
    help="auto (run: every visible GPU, one trial at a time each; else the CPU), cpu, cuda, cuda:N, or "
    "cuda:N+M (one trial on both).",
)
TIMEOUT = click.option(
    "--timeout",
    type=float,
    default=TrialSettings.timeout,
    show_default=True,
    help="Seconds one trial may run.",
)
STARTUP_TIMEOUT = click.option(
    "--startup-timeout",
    type=float,
    default=TrialSettings.startup_timeout,
    show_default=True,
    help="Seconds until a trial's first step.",
)


def trial_options(command: F) -> F:
    """Options every command that runs trials takes."""
    cache_dir = cache_dir_option("Database and trial logs (default: the user cache dir).")
    return _apply(
        command,
        [
            STEPS,
            WARMUP_STEPS,
            WARMUP_MAX,
            TIGHT,
            WITH_EVAL,
            WITH_SAVE,
            LOG_LIMIT,
            DEVICE,
            TIMEOUT,
            STARTUP_TIMEOUT,
            cache_dir,
        ],
    )


def search_options(command: F) -> F:
    """Options of the commands that define a tuning job (``run`` and ``submit``)."""
    command = _apply(
        command,
        [
            click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True),
            click.option(
                "--budget", required=True, help="Memory budget: 40GB, 40GiB, 0.5TiB, 90% of the device, ..."
            ),
            click.option(
                "--trials",
                type=click.IntRange(min=MIN_TRIALS),
                default=DEFAULT_TRIALS,
                show_default=True,
                help="The most trial runs the run starts, of every kind: the probe, the search's trials, "
                "their re-measurements and the verification (the search leaves the verification its "
                "share); the search stops sooner once nothing left can beat its best. A submitted job's "
                "workers hold its study to this many search trials.",
            ),
            click.option(
                "--time-limit",
                envvar="AUTOTUNE_TIME_LIMIT",
                callback=_seconds,
                metavar="SECONDS",
                help="The wall-clock time the run plans its answer within (90, 5m, 1h): the search stops "
                "proposing while the verification still fits, and says so; a trial already running is not "
                "cut short. Default: 3 minutes, or 10 times the probe, whichever is longer; 0: none. Also "
                "$AUTOTUNE_TIME_LIMIT.",
            ),
            click.option(
                "--batch-sizes",
                help="A range (8-512: powers of two and midpoints within) or a list "
                "(8,16,24). Default: 1 up, pruned by the memory model.",
            ),
            click.option(
                "--plans",
                multiple=True,
                help="Plans to search, ';'-separated or repeated (default: from the model). A plan per "
                "rank of a torchrun job: one entry per rank, '|'-separated (Block:1|none).",
            ),
            GPUS_PER_TRIAL,
            click.option(
                "--max-seq-len",
                type=click.IntRange(min=1),
                help="The job's longest sequence length, where the script cannot pad its trials' batches to "
                "it (autotune.worst_case()): every trial's peak is read at this length from the memory per "
                "token its trials measured. Needs (batch, length) token inputs.",
            ),
            click.option(
                "--headroom",
                default=f"{DEFAULT_HEADROOM:.0%}",
                show_default=True,
                help="Margin the winner's verified peak keeps under the budget.",
            ),
            click.option(
                "--host-budget",
                help="Host memory a trial's processes may hold (64GiB, 80% of the host); a trial passing it is "
                "stopped, and an offload plan is not proposed where its pinned memory would pass it. "
                "Default: what the host has available as the run starts, less 10%.",
            ),
            click.option("--seed", type=int, default=DEFAULT_SEED, show_default=True, help="Sampler seed."),
            click.option("--study", help="Study name (default: derived from the script and the search)."),
            click.option("--force", is_flag=True, help="Forget the stored study and tune again."),
            click.option(
                "--exhaustive",
                is_flag=True,
                help="No stopping rule: every plan's largest fitting batch, then the sampler, to --trials.",
            ),
            click.option(
                "--sweep/--no-sweep",
                default=None,
                help="Measure the plans without a reading at one batch size in one trial process, each plan "
                "switched between steps (one start-up for several plans). Default: on for GPU trials with "
                "--no-warm, else off.",
            ),
            click.option(
                "--warm/--no-warm",
                default=True,
                show_default=True,
                help="One trial process measures configuration after configuration, the script run again "
                "in it for each (imports, the CUDA context and compile caches kept); --no-warm: a process "
                "per trial. The winner is always verified in a process of its own.",
            ),
            GLOBAL_BATCH,
            GRAD_ACCUM,
            BACKEND,
            storage_option(),
            AS_JSON,
        ],
    )
    return trial_options(command)


def settings_of(options: dict[str, Any]) -> TrialSettings:
    """The TrialSettings that ``trial_options`` describe."""
    return TrialSettings(
        options["warmup_steps"],
        options["steps"],
        options["startup_timeout"],
        options["timeout"],
        warmup_max=options["warmup_max"],
        tight=options["tight"],
        log_limit=options["log_limit"],
        phases=tuple(
            phase
            for phase, asked in (("eval", options["with_eval"]), ("save", options["with_save"]))
            if asked
        ),
    )
