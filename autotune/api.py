"""The library API: each ``autotune`` command is one call here, and a notebook can make the same calls.

    import autotune
    result = autotune.tune(autotune.tune_spec(["train.py"], "40GB", trials=8))
    answer = autotune.best(["train.py"], budget="40GB")
    report = autotune.probe(["train.py"], batch_size=8)
    trial = autotune.measure(autotune.measure_spec(["train.py"], 32, plan="all", budget="40GB"))

Commands that answer from the database (best, studies, show) import neither torch nor Optuna to find a
verified winner; the rest import what their trials need, in the tuner, never torch itself.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.core.plans import Backend
from autotune.core.protocol import TRIAL_UMASK_ENV

PROBE_BATCH_SIZE = 4  # small: the probe's instruments cost memory, and its savings scale per sample

# Each function imports what it runs: `autotune best` must not pay for Optuna, numpy or the trial machinery.
if TYPE_CHECKING:
    from autotune.hardware.doctor import Check
    from autotune.results.best import BestAnswer
    from autotune.results.cleanup import Collected
    from autotune.results.listing import StudyReport, StudySummary
    from autotune.results.report import Written
    from autotune.search.reporting import Reporter
    from autotune.search.spec import TuneResult, TuneSpec
    from autotune.storage import JobRow
    from autotune.trials.measurement import MeasureSpec
    from autotune.trials.result import TrialResult
    from autotune.workers.worker import WorkerSummary


@contextlib.contextmanager
def _private(environ: Mapping[str, str] | None) -> Iterator[dict[str, str]]:
    """What autotune writes during the call is its user's alone, as the CLI makes it for its whole process
    (autotune.cli.main): the process's umask private (folders 0700, files 0600) until the call returns, and
    the user's own umask passed on for the trial's own files. Yields the environment trials inherit."""
    user = os.umask(0o077)
    os.umask(user | 0o077)
    env = dict(os.environ if environ is None else environ)
    env.setdefault(TRIAL_UMASK_ENV, f"{user:03o}")
    try:
        yield env
    finally:
        os.umask(user)


def tune(
    spec: TuneSpec, *, environ: Mapping[str, str] | None = None, reporter: Reporter | None = None
) -> TuneResult:
    """Find, verify and store the fastest configuration whose measured peak fits ``spec.budget``.

    Args:
        spec: the job (build it with :func:`autotune.tune_spec`).
        environ: the environment trials inherit (default: this process's).
        reporter: told of each trial as it starts and ends (default: nothing is reported).

    Returns:
        The verified winner, every trial of the study, and whether it was answered with zero trials.

    Raises:
        InputError, DeviceError: bad spec or device. StorageError: the database.
        ScriptError: the script failed in its trials. NoFitError: nothing fits (every trial is kept).
    """
    import optuna

    from autotune.workers.tune import tune as run_job

    # autotune reports its trials (``reporter``); Optuna's INFO lines ("A new study created") would repeat them
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with _private(environ) as env:
        return run_job(spec, env, reporter)


def measure(spec: MeasureSpec, *, environ: Mapping[str, str] | None = None) -> TrialResult:
    """Run one measured trial: peak memory, samples/s, step times (and whether it fits ``spec.budget``).

    Args:
        spec: the trial (build it with :func:`autotune.measure_spec`).
        environ: the environment the trial inherits (default: this process's).

    Returns:
        What the trial measured; ``fits_budget`` says whether it fits the spec's budget, if it has one.

    Raises:
        InputError, DeviceError: bad spec, device or budget (before the trial runs).
        TrialError: the trial could not be started.
    """
    from autotune.trials.measurement import measure as run_trial

    with _private(environ) as env:
        return run_trial(spec, env)


def probe(
    command: Sequence[str],
    *,
    batch_size: int = PROBE_BATCH_SIZE,
    device: str = "auto",
    timeout: float | None = None,
    backend: str | Backend = Backend.TORCH,
    cache_dir: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> TrialResult:
    """One instrumented trial: the model's recompute candidates and what each would save.

    Args:
        command: SCRIPT [ARGS...] or a command template with ``{batch_size}``.
        batch_size: the probed batch size; ``timeout``: seconds the trial may run (default: a trial's).

    Returns:
        The trial's result; its ``probe`` is the report (autotune.backends.probe.rows tabulates it), None
        if the script trained no torch module.

    Raises:
        InputError, DeviceError: bad command or device. TrialError: the trial could not be started.
    """
    from autotune.trials.measurement import measure, measure_spec
    from autotune.trials.settings import TrialSettings

    spec = measure_spec(
        command,
        batch_size,
        backend=backend,
        settings=TrialSettings(1, 3, timeout or TrialSettings.timeout, timeout or TrialSettings.timeout),
        device=device,
        cache_dir=cache_dir,
    )
    with _private(environ) as env:
        return measure(spec, env, probe=True)


def best(
    command: Sequence[str] | None = None,
    *,
    budget: str | None = None,
    study: str | None = None,
    device: str = "auto",
    backend: str | Backend = Backend.TORCH,
    storage: str | None = None,
    cache_dir: Path | None = None,
    environ: Mapping[str, str] | None = None,
    global_batch: int | None = None,
    max_seq_len: int | None = None,
) -> BestAnswer:
    """The best stored plan, from the database alone (no trial runs): of ``study``, of ``command`` on
    ``device`` (at ``budget``, tuned for ``global_batch`` if given, with ``max_seq_len`` as --max-seq-len
    or without), or the most recent.

    Returns:
        The answer; ``verified`` is False for a budget with no verified winner (the fastest measured
        trial of the same workload that fits), and ``env()`` gives the variables to train with it.

    Raises:
        InputError: no such study or workload, or a bad budget. NoFitError: nothing stored fits.
        StorageError: the database.
    """
    from autotune.core.budget import parse_budget
    from autotune.results import best as answers
    from autotune.trials.command import TrialCommand

    parsed = parse_budget(budget) if budget is not None else None
    store = answers.open_default(
        storage, cache_dir, must_exist=True
    )  # imports Optuna only if it reads trials
    return answers.best(
        store,
        TrialCommand.parse(command) if command else None,
        parsed,
        study,
        device,
        os.environ if environ is None else environ,
        Backend.parse(backend),
        cache_dir,
        global_batch,
        max_seq_len,
    )


def studies(*, storage: str | None = None, cache_dir: Path | None = None) -> list[StudySummary]:
    """Every stored study, and every submitted job no worker has started yet.

    Raises:
        StorageError: the database.
    """
    from autotune.results.best import open_default
    from autotune.results.listing import studies as list_studies

    return list_studies(open_default(storage, cache_dir))


def gc(*, dry_run: bool = False, storage: str | None = None, cache_dir: Path | None = None) -> Collected:
    """Remove the trial folders of finished studies from the cache dir, keeping those of trials that ended
    with an error (``show`` and ``report`` point to their logs); ``dry_run`` counts them only.

    Raises:
        InputError: no database there. StorageError: the database.
    """
    from autotune.core.paths import cache_dir as default_cache_dir
    from autotune.results.best import open_default
    from autotune.results.cleanup import collect

    store = open_default(storage, cache_dir, must_exist=True)
    return collect(store, default_cache_dir(cache_dir, create=False), dry_run)


def show(study: str, *, storage: str | None = None, cache_dir: Path | None = None) -> StudyReport:
    """A study's trials, with each plan's saving as the probe predicted it and as its trials measured it.

    Raises:
        InputError: no study of that name. StorageError: the database.
    """
    from autotune.results.best import open_default
    from autotune.results.listing import show as show_study

    return show_study(open_default(storage, cache_dir), study)


def report(
    study: str | None,
    out: Path | None = None,
    *,
    png: bool = False,
    storage: str | None = None,
    cache_dir: Path | None = None,
) -> Written:
    """Write STUDY's HTML report (the most recent study's without one) to ``out`` (default: ``<study>.html``
    here) and, with ``png``, its Pareto plot beside it as ``<out>.png``.

    Raises:
        InputError: no such study, or none stored. StorageError: the database.
    """
    from autotune.core.errors import InputError
    from autotune.core.names import check_study_name
    from autotune.results.best import open_default
    from autotune.results.report import write_report

    if study is not None:
        check_study_name(study)  # the default file name is the study's: never a path out of this folder
    store = open_default(storage, cache_dir)
    if study is None:
        rows = store.studies()  # checked as read: a name a database writer set is skipped
        if not rows:
            raise InputError(f"no study in {store.display_url}: run autotune run first")
        study = rows[-1].study_name
    out = out if out is not None else Path(f"{study}.html")
    return write_report(store, study, out, out.with_suffix(".png") if png else None)


def submit(spec: TuneSpec, *, unsigned: bool = False, environ: Mapping[str, str] | None = None) -> JobRow:
    """Record ``spec`` as a job for workers and return at once (the same job again returns the stored one),
    signed with the job key ``environ`` gives (AUTOTUNE_JOB_KEY, AUTOTUNE_JOB_KEY_FILE, or the user's
    job.key: autotune.workers.signing); ``unsigned`` for workers started with ``allow_unsigned``.

    Raises:
        InputError: no job key (and not ``unsigned``), a bad key file, or another job of that name exists.
        StorageError: the database.
    """
    from autotune.workers.signing import load_key
    from autotune.workers.submit import submit as submit_job

    with _private(environ) as env:
        return submit_job(spec, load_key(env), unsigned)


def work(
    *,
    storage: str | None = None,
    devices: str = "auto",
    gpus_per_trial: int = 1,
    once: bool = False,
    studies: Sequence[str] = (),
    cache_dir: Path | None = None,
    environ: Mapping[str, str] | None = None,
    say: Callable[[str], None] | None = None,
    allow_unsigned: bool = False,
) -> WorkerSummary:
    """Run the trials of the database's open jobs on ``devices`` until stopped (SIGTERM/SIGINT in the main
    thread), or with ``once`` until no open job is left that this worker can run.

    Args:
        devices: ``auto`` (every GPU, else the CPU), ``cpu``, or GPU indices ``0,1``.
        gpus_per_trial: the devices in groups of this many, one trial at a time on each group (jobs that
            ask for another number are refused here).
        studies: only these jobs. ``say``: receives the worker's lines (default: none).
        allow_unsigned: run unsigned jobs too (a database only you can write); signed ones are verified
            whenever ``environ`` gives a job key.

    Returns:
        The trials measured and the jobs done, failed and refused here.

    Raises:
        InputError: bad devices; no job key and not ``allow_unsigned``; a bad key file. StorageError: the
            database.
    """
    from autotune.core.paths import cache_dir as default_cache_dir
    from autotune.core.paths import default_storage_url
    from autotune.hardware.devices import device_groups
    from autotune.workers.signing import Trust, load_key
    from autotune.workers.worker import Worker, parse_devices

    with _private(environ) as env:
        trust = Trust(load_key(env), allow_unsigned)  # checked before the database is opened
        url = storage or default_storage_url(default_cache_dir(cache_dir))
        groups = device_groups(parse_devices(devices, env), gpus_per_trial)
        worker = Worker(url, groups, cache_dir, env, once, tuple(studies) or None, say, trust=trust)
        return worker.run()


def doctor(
    ray_address: str | None = None,
    backend: str = "torch",
    on_check: Callable[[Check], None] | None = None,
) -> list[Check]:
    """What works on this machine (torch, NVML, storage drivers, the Ray cluster, backends), each with what to
    do if not (``ray_address``: the Ray cluster to look at; None: RAY_ADDRESS, else one running here;
    ``backend="ort"``: ORTModule trains a step, else ORT is only looked up). ``on_check`` is called with each
    check as soon as it is done (the CLI prints it then)."""
    from autotune.hardware.doctor import checks

    found = []
    for check in checks(ray_address, ort=backend == "ort"):
        found.append(check)
        if on_check is not None:
            on_check(check)
    return found
