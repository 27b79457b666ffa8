"""``autotune.tune(spec)``: the product's main job, from a script and a budget to a verified, stored plan.

1. Fingerprint the workload; its first trial is the probe (plan ``none``, smallest batch, instrumented): the
   model's repeated module classes and operator kinds define the default plan space, and the savings it
   predicts seed the memory model.
2. The study key (workload, budget, headroom, space, trial lengths) names the study. A study with a stored
   winner answers at once with zero trials (``force`` re-tunes from scratch).
3. A new study starts from what is known: the trials measured for other budgets of the same workload. A study interrupted earlier resumes: its dead trials are failed and retried once.
4. :class:`~autotune.search.loop.Search` runs until the study holds ``trials`` counted trials.
5. The fastest fitting configuration is re-run longer and must stay under budget minus headroom before it
   is stored as the best plan; if it does not, the next one is verified.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TextIO, cast

import optuna

from autotune.backends import probe
from autotune.core.budget import Budget, format_bytes
from autotune.trials.command import TrialCommand
from autotune.hardware.devices import Device, resolve_device
from autotune.core.errors import InputError, NoFitError, ScriptError, StorageError
from autotune.trials.workload import Workload, check_study_name, default_study_name, study_key, workload_of
from autotune.leases.heartbeat import Heartbeat, grace_seconds
from autotune.trials.interrupts import StopRequested
from autotune.workers.jobs import job_row
from autotune.trials.measurement import TrialResult, TrialSettings, run_trial
from autotune.hardware.meters import MemoryMeter, make_meter
from autotune.hardware.nvml import load_nvml
from autotune.core.paths import cache_dir, default_storage_url
from autotune.core.plans import parse_backend_plan
from autotune.core.protocol import Outcome
from autotune.search.records import TrialRecord, constraint_mib
from autotune.search.reporting import Reporter, SilentReporter
from autotune.search.loop import (
    LeaseWatch,
    Search,
    Step,
    best_record,
    fail_trial,
    records_of,
    tell_result,
    worker_id,
)
from autotune.search.space import SearchSpace, build_space, parse_batch_sizes
from autotune.storage import BestRow, Lease, Store, StudyRow, open_store

MAX_VERIFICATIONS = 3


@dataclass(frozen=True)
class TuneSpec:
    """One tuning job. Build it from CLI options or directly; values are validated here."""

    command: TrialCommand
    budget: Budget
    trials: int = 16
    batch_sizes: tuple[int, ...] = field(default_factory=lambda: parse_batch_sizes(None))
    plans: tuple[str, ...] | None = None  # None: derived from the model's repeated classes
    settings: TrialSettings = field(default_factory=TrialSettings)
    headroom: float = 0.05
    seed: int | None = 0
    device: str = "auto"
    cache_dir: Path | None = None
    storage: str | None = None  # SQLAlchemy URL; None: SQLite in the cache dir
    study: str | None = None
    force: bool = False
    backend: str = "torch"
    # Devices that run trials of this job beside ``device``, in this process (daemon.Worker threads).
    # None: with device "auto", every other visible GPU; () none. Not part of the job: workers bring theirs.
    helpers: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.trials < 1:
            raise InputError(f"--trials must be at least 1, got {self.trials}")
        if not 0 <= self.headroom < 1:
            raise InputError(f"headroom must be in [0, 1), got {self.headroom}")
        if self.study is not None:
            check_study_name(self.study)

    @property
    def verify_settings(self) -> TrialSettings:
        return dataclasses.replace(self.settings, measured_steps=max(3 * self.settings.measured_steps, 10))


@dataclass(frozen=True)
class TuneResult:
    study_name: str
    storage: str  # the database, password hidden
    device_name: str
    budget_bytes: int
    limit_bytes: int  # budget minus headroom: what the winner's verified peak must stay under
    best: BestRow
    records: tuple[TrialRecord, ...]
    cached: bool  # answered from the database with zero trials
    new_trials: int
    exhausted: bool  # the search stopped early: nothing new was left to try


@dataclass(frozen=True)
class _Job:
    """A tuning job resolved against this machine and database, before any search."""

    device: Device
    budget: int
    limit: int
    store: Store
    workload: Workload
    space: SearchSpace
    study_row: StudyRow
    savings: dict[str, float]
    run: (
        Any  # _run_config bound to the job: run(batch, plan, poll=, settings=, probe=, interruptible=, stop=)
    )
    probes_run: int  # trials the probe took in this process (0 or 1)

    def search(
        self, study: optuna.Study, spec: TuneSpec, reporter: Reporter, worker: str, stop: Any = None
    ) -> Search:
        run = self.run
        return Search(
            study,
            self.space,
            self.limit,
            lambda b, p, poll, allow: run(b, p, poll=poll, interruptible=allow, stop=stop),
            spec.trials,
            reporter,
            self.store,
            str(self.device),
            self.savings,
            grace=grace_seconds(),
            worker=worker,
        )

    def result(
        self, best: BestRow, study: optuna.Study, new_trials: int, exhausted: bool, cached: bool = False
    ) -> TuneResult:
        return TuneResult(
            study_name=self.study_row.study_name,
            storage=self.store.display_url,
            device_name=self.device.name,
            budget_bytes=self.budget,
            limit_bytes=self.limit,
            best=best,
            records=tuple(records_of(study)),
            cached=cached,
            new_trials=new_trials,
            exhausted=exhausted,
        )


def tune(
    spec: TuneSpec,
    environ: Mapping[str, str] | None = None,
    reporter: Reporter | None = None,
    nvml: Any = None,
) -> TuneResult:
    """Find, verify and store the fastest configuration whose measured peak fits ``spec.budget``.

    The job is recorded in the database while it runs, so workers (``autotune worker``) on this or other
    hosts can help with it; without them it runs here, one trial at a time.

    Raises:
        InputError, DeviceError: bad spec or device. StorageError: the database.
        ScriptError: the script failed in its trials. NoFitError: nothing fits (every trial is kept).
    """
    reporter = reporter or SilentReporter()
    worker = worker_id()
    job = resolve(spec, dict(os.environ if environ is None else environ), reporter, nvml, worker)
    name = job.study_row.study_name
    if spec.force:
        job.store.forget_study(name)
    elif (cached := job.store.best(name)) is not None:
        reporter.note(f"answered from {job.store.display_url} (study {name}): zero trials; --force re-tunes")
        study = optuna.load_study(study_name=name, storage=job.store.optuna)
        return job.result(cached, study, new_trials=0, exhausted=False, cached=True)
    study = open_study(job.store, job.study_row, spec.seed, job.workload, job.limit)
    job.store.submit_job(job_row(spec, name, worker, "running"))
    job.store.set_job_state(name, "running")
    search = job.search(study, spec, reporter, worker)
    if recovered := search.recover():
        reporter.note(
            f"resuming study {name}: {recovered} interrupted trial(s) failed and queued for one retry"
        )
    env = dict(os.environ if environ is None else environ)
    helpers = _helper_devices(spec, job.device, env, nvml)
    with Heartbeat(job.store, worker), search.shield, _helping(spec, name, helpers, env, reporter, nvml):
        try:
            exhausted = search.run()
            best = verify(search, partial(job.run, settings=spec.verify_settings))
        except (ScriptError, NoFitError) as e:
            job.store.set_job_state(name, "failed", str(e))
            raise
    return job.result(best, study, search.trials_run + job.probes_run, exhausted)


def _helper_devices(spec: TuneSpec, device: Device, env: dict[str, str], nvml: Any) -> tuple[str, ...]:
    """``spec.helpers``, or with ``--device auto`` on a GPU every other visible GPU."""
    if spec.helpers is not None:
        return spec.helpers
    if spec.device.strip().lower() != "auto" or device.kind != "cuda":
        return ()
    from autotune.workers.worker import gpu_count

    return tuple(f"cuda:{i}" for i in range(1, gpu_count(env, nvml)))


@contextlib.contextmanager
def _helping(
    spec: TuneSpec, study: str, devices: tuple[str, ...], env: dict[str, str], reporter: Reporter, nvml: Any
) -> Iterator[None]:
    """Run this job's trials on ``devices`` too while the block runs: a ``daemon.Worker`` restricted to
    the job, in a thread of this process, sharing the work through the leases like any other worker.
    On leaving (done, error or Ctrl-C) its running trials are stopped and released."""
    if not devices:
        yield
        return
    from autotune.workers.worker import Worker

    helper = Worker(
        spec.storage or default_storage_url(cache_dir(spec.cache_dir)),
        list(devices),
        spec.cache_dir,
        env,
        once=True,
        jobs=(study,),
        out=cast(TextIO, _NoteStream(reporter)),
        nvml=nvml,
    )

    def work() -> None:
        try:
            helper.run()
        except Exception as e:  # a helper device that cannot work must not stop the run
            reporter.note(f"helper devices {', '.join(devices)} stopped: {e}")

    thread = threading.Thread(target=work, name="autotune-helpers")
    thread.start()
    try:
        yield
    finally:
        helper.stop.set()
        thread.join()


class _NoteStream(io.TextIOBase):
    """A text stream whose lines become ``reporter.note`` calls (the helpers' lines in ``run``'s output)."""

    def __init__(self, reporter: Reporter) -> None:
        self.reporter, self.pending = reporter, ""

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            if line.strip():
                self.reporter.note(line)
        return len(text)


def resolve(
    spec: TuneSpec,
    env: dict[str, str],
    reporter: Reporter,
    nvml: Any,
    worker: str,
    stop: Any = None,
    store: Store | None = None,
) -> _Job:
    """Device, budget, database, workload, probe (run if new), search space and study name of ``spec``.

    ``store``: the database already open on ``spec.storage`` (a worker's, shared by all its jobs: one
    engine and connection pool per process, not one per job); opened here if None.
    """
    device = resolve_device(spec.device, env, (lambda: nvml) if nvml is not None else load_nvml)
    budget = spec.budget.resolve(device.total_bytes)
    store = store or open_store(spec.storage or default_storage_url(cache_dir(spec.cache_dir)))
    workload = workload_of(spec.command, device, spec.backend)
    store.add_workload(
        workload.fingerprint, workload.script, str(spec.command), device.name, workload.details
    )
    run = partial(_run_config, spec, device, make_meter(device, nvml), cache_dir(spec.cache_dir), env)
    discovery, probes_run = _discover(
        store, workload, spec, partial(run, stop=stop), reporter, worker, str(device)
    )
    probe_data = discovery.get("probe")
    space = build_space(
        spec.batch_sizes,
        spec.plans,
        probe_data.get("candidates", []) if probe_data else [],
        probe.operator_plans(probe_data) if probe_data else (),
        probe_data,
    )
    steps = (spec.settings.warmup_steps, spec.settings.measured_steps)
    key = study_key(workload, budget, spec.headroom, space.as_dict(), steps)
    row = StudyRow(
        spec.study or default_study_name(workload, key),
        workload.fingerprint,
        key,
        budget,
        spec.headroom,
        space.as_dict(),
    )
    limit = int(budget * (1 - spec.headroom))
    return _Job(
        device, budget, limit, store, workload, space, row, _savings(probe_data, space), run, probes_run
    )


def _run_config(
    spec: TuneSpec,
    device: Device,
    meter: MemoryMeter,
    root: Path,
    env: dict[str, str],
    batch: int,
    plan: str,
    poll: Any = None,
    settings: TrialSettings | None = None,
    probe: bool = False,
    interruptible: Any = None,
    stop: Any = None,
) -> TrialResult:
    return run_trial(
        spec.command,
        batch,
        parse_backend_plan(plan, spec.backend),
        device,
        meter,
        settings or spec.settings,
        root,
        env,
        spec.backend,
        on_poll=poll,
        probe=probe,
        interruptible=interruptible,
        stop=stop,
    )


def _discover(
    store: Store, workload: Workload, spec: TuneSpec, run: Any, reporter: Reporter, worker: str, device: str
) -> tuple[dict[str, Any], int]:
    """The workload's probe (its repeated module classes and what recomputing them saves), measured by
    its first trial — once per fingerprint, again with ``force`` — and how many trials that took here.

    Workers racing on a new workload lease the probe (key ``workload-<fingerprint>``): one runs it, the
    others wait for its result; a probe whose worker dies is retried once. The probe's trial is
    instrumented, so its peak and speed are not stored as a measurement."""
    key = f"workload-{workload.fingerprint}"
    if spec.force:
        store.forget_leases(key)
    elif (row := store.workload(workload.fingerprint)) and row["discovery"] is not None:
        return dict(row["discovery"]), 0
    watch = LeaseWatch(grace_seconds())
    batch = spec.batch_sizes[0]
    while True:
        row = store.workload(workload.fingerprint)
        fresh = row and row["discovery"] is not None and not (spec.force and not store.leases(key, ("done",)))
        if fresh:
            return dict(row["discovery"]), 0
        lease = store.take_queued(key, worker, device) or store.claim(
            key, "probe", batch, "none", 0, worker, device
        )
        if lease is not None:
            return _probe(store, workload, lease, run, reporter), 1
        for other in store.leases(key):
            if other.state == "failed" and other.note and other.note.startswith("script: "):
                raise ScriptError(
                    f"the script's first trial failed on worker {other.worker}: {other.note[8:]}"
                )
            why = watch.dead(other) if other.state == "running" and other.worker != worker else None
            if why is not None and store.fail_if_silent(other.id, other.beats, why):
                if other.attempt > 0:
                    raise ScriptError(f"the probe's worker died twice ({why})")
                store.queue(key, "probe", other.batch_size, other.plan, 1, why)
        time.sleep(0.5)


def _probe(store: Store, workload: Workload, lease: Lease, run: Any, reporter: Reporter) -> dict[str, Any]:
    reporter.trial_started(-1, lease.batch_size, "none", "probe")
    try:
        result: TrialResult = run(lease.batch_size, "none", poll=reporter.trial_progress, probe=True)
    except StopRequested:
        store.release(lease.id, "released by a stopping worker")
        raise
    except BaseException:
        store.end_lease(lease.id, "failed", "interrupted")
        raise
    if result.outcome in (Outcome.FAILED, Outcome.TIMEOUT):
        error = (result.error or "").strip().splitlines()
        store.end_lease(lease.id, "failed", "script: " + (error[0] if error else result.outcome.value))
        raise ScriptError(
            f"the script's first trial {result.outcome.value} (logs: {result.log_dir}):\n{result.error}"
        )
    discovery = {"probe": result.probe, "outcome": result.outcome.value, "log_dir": result.log_dir}
    store.set_discovery(workload.fingerprint, result.candidates or [], discovery)
    store.end_lease(lease.id, "done")
    if result.probe and result.probe.get("backend") == "ort":
        found = f"ORT recompute plans: {len(result.probe['plans'])}"
    else:
        found = "repeated modules: " + (", ".join(c["cls"] for c in result.candidates or []) or "none found")
    reporter.note(f"probe: batch {lease.batch_size}: {result.outcome.value}; {found}")
    return discovery


def _savings(probe_data: dict[str, Any] | None, space: SearchSpace) -> dict[str, float]:
    """The probe's predicted saving per sample of every plan in the space (none without a probe)."""
    if not probe_data:
        return {}
    return {plan: probe.saving_per_sample(probe_data, plan) for plan in space.plans if plan != "none"}


def open_study(store: Store, row: StudyRow, seed: int | None, workload: Workload, limit: int) -> optuna.Study:
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=5)
    existing = store.study(row.study_name)
    if existing is not None and existing.study_key != row.study_key:
        raise StorageError(
            f"study {row.study_name!r} belongs to another job (different script, device, budget or "
            "search space): choose another --study or drop --study"
        )
    study = optuna.create_study(
        storage=store.optuna,
        study_name=row.study_name,
        direction="maximize",
        sampler=sampler,
        load_if_exists=True,
    )
    if study.direction != optuna.study.StudyDirection.MAXIMIZE:
        raise StorageError(f"study {row.study_name!r} exists and minimizes: it is not an autotune study")
    if existing is None:
        store.add_study(row)
        _warm_start(study, store, row, workload, limit)
    return study


def _warm_start(study: optuna.Study, store: Store, row: StudyRow, workload: Workload, limit: int) -> None:
    """Seed a new study with this workload's trials measured for other budgets."""
    space = SearchSpace(tuple(row.space["batch_sizes"]), tuple(row.space["plans"]))
    known: list[tuple[str, dict[str, Any]]] = []
    for other in store.studies(workload.fingerprint):
        if other.study_name != row.study_name:
            for r in records_of(optuna.load_study(study_name=other.study_name, storage=store.optuna)):
                if r.measured and r.kind in ("measured", "verification"):
                    known.append(
                        ("warm-start", {**dataclasses.asdict(r), "note": f"from study {other.study_name}"})
                    )
    for kind, data in known:
        if (
            data["batch_size"] in space.batch_sizes
            and data["plan"] in space.plans
            and data["outcome"] in ("complete", "oom")
        ):
            study.add_trial(_as_trial(kind, data, space, limit))


def _as_trial(kind: str, data: dict[str, Any], space: SearchSpace, limit: int) -> optuna.trial.FrozenTrial:
    attrs = {k: data.get(k) for k in ("outcome", "peak_bytes", "samples_per_sec", "log_dir", "note")}
    return optuna.trial.create_trial(
        params={"batch_size": data["batch_size"], "plan": data["plan"]},
        distributions={
            "batch_size": optuna.distributions.CategoricalDistribution(space.batch_sizes),
            "plan": optuna.distributions.CategoricalDistribution(space.plans),
        },
        value=data.get("samples_per_sec") or 0.0,
        user_attrs={**attrs, "kind": kind},
        constraints={"memory": constraint_mib(data["peak_bytes"], limit, data["outcome"] == "complete")},
    )


def verify(search: Search, run_long: Any, poll_seconds: float = 0.5) -> BestRow:
    """Verify until the study has a best plan (this worker or another stores it)."""
    while True:
        step, best = verify_step(search, run_long)
        if best is not None:
            return best
        if step is Step.BUSY:
            time.sleep(poll_seconds)


def verify_step(search: Search, run_long: Any) -> tuple[Step, BestRow | None]:
    """One round of verification: the fastest fitting configurations, in order, are re-run longer
    (``run_long``) until one stays under the limit; that one is stored as the best plan.

    Verifications are leased like trials (kind ``verify``): one worker verifies each configuration, a
    dead verifier's configuration is verified once more, and the others wait (``Step.BUSY``).

    Raises:
        NoFitError: MAX_VERIFICATIONS configurations failed verification, or none fits.
    """
    store, study, limit, name = search.store, search.study, search.limit, search.name
    if (stored := store.best(name)) is not None:
        return Step.FINISHED, stored
    search.recover()  # verify leases of dead workers too: failed, queued once more
    leases = store.leases(name, kinds=("verify",))
    lease = store.take_queued(name, search.worker, search.device, kinds=("verify",))
    if lease is None:
        if any(x.state in ("running", "queued") for x in store.leases(name, kinds=("verify",))):
            return Step.BUSY, None
        records = records_of(study)
        tried = {(x.batch_size, x.plan) for x in leases}
        candidate = best_record([r for r in records if (r.batch_size, r.plan) not in tried], limit)
        if len(tried) >= MAX_VERIFICATIONS or candidate is None:
            raise NoFitError(_no_fit_message(records, limit))
        assert candidate.batch_size is not None and candidate.plan is not None
        lease = store.claim(
            name, "verify", candidate.batch_size, candidate.plan, 0, search.worker, search.device
        )
        if lease is None:
            return Step.MISSED, None
    return Step.RAN, _verify_lease(search, lease, run_long)


def _verify_lease(search: Search, lease: Lease, run_long: Any) -> BestRow | None:
    store, study, limit, reporter = search.store, search.study, search.limit, search.reporter
    candidate = best_record(
        [r for r in records_of(study) if (r.batch_size, r.plan) == (lease.batch_size, lease.plan)], limit
    )
    if candidate is None:  # only possible for a stale queued retry: nothing to verify any more
        store.end_lease(lease.id, "failed", "no fitting trial of this configuration")
        return None
    trial = search.ask_fixed(lease.batch_size, lease.plan)
    for key, value in {
        "kind": "verification",
        "proposed_by": "verification",
        "note": f"verifies trial {candidate.number}",
        "worker": search.worker,
        "lease": lease.id,
        "device": search.device,
    }.items():
        trial.set_user_attr(key, value)
    store.set_lease_trial(lease.id, trial.number)
    reporter.trial_started(trial.number, lease.batch_size, lease.plan, f"verifying trial {candidate.number}")
    try:
        result = run_long(
            lease.batch_size, lease.plan, poll=reporter.trial_progress, interruptible=search.shield.allow
        )
    except StopRequested:
        search.release(lease, trial.number)
        raise
    except KeyboardInterrupt:  # a verification is not retried here: the next run verifies again
        fail_trial(study, trial.number, "interrupted")
        store.forget_lease(lease.id)
        raise
    tell_result(study, trial, result, limit)
    reporter.trial_finished(records_of(study)[trial.number], candidate)
    if result.outcome is Outcome.COMPLETE and result.peak_bytes <= limit and result.samples_per_sec:
        best = BestRow(
            study.study_name,
            candidate.number,
            lease.batch_size,
            lease.plan,
            candidate.peak_bytes or 0,
            candidate.samples_per_sec or 0.0,
            result.peak_bytes,
            result.samples_per_sec,
        )
        store.save_best(best)
        store.set_job_state(study.study_name, "done")
        store.end_lease(lease.id, "done")
        return best
    store.end_lease(lease.id, "failed", f"verification {result.outcome.value}")
    reporter.note(
        f"trial {candidate.number} failed verification ({result.outcome.value}, peak "
        f"{format_bytes(result.peak_bytes)}); trying the next configuration"
    )
    return None


def _no_fit_message(records: list[TrialRecord], limit: int) -> str:
    measured = [r for r in records if r.measured and r.peak_bytes is not None]
    if not measured:
        return f"no configuration fits {format_bytes(limit)} (budget minus headroom): no trial completed"
    smallest = min(measured, key=lambda r: r.peak_bytes or 0)
    return (
        f"no configuration fits {format_bytes(limit)} (budget minus headroom): the smallest peak measured was "
        f"{format_bytes(smallest.peak_bytes or 0)} (batch {smallest.batch_size}, plan {smallest.plan}, trial "
        f"{smallest.number}); every trial is kept"
    )
