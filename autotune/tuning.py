"""``autotune.tune(spec)``: the product's main job, from a script and a budget to a verified, stored plan.

1. Fingerprint the workload; its first trial is the probe (plan ``none``, smallest batch, instrumented): the
   model's repeated module classes and operator kinds define the default plan space, and the savings it
   predicts seed the memory model.
2. The study key (workload, budget, headroom, space, trial lengths) names the study. A study with a stored
   winner answers at once with zero trials (``force`` re-tunes from scratch).
3. A new study starts from what is known: the trials measured for other budgets of the same workload. A study interrupted earlier resumes: its dead trials are failed and retried once.
4. :class:`~autotune.search.Search` runs until the study holds ``trials`` counted trials.
5. The fastest fitting configuration is re-run longer and must stay under budget minus headroom before it
   is stored as the best plan; if it does not, the next one is verified.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune import probe
from autotune.budget import Budget, format_bytes
from autotune.command import TrialCommand
from autotune.devices import Device, resolve_device
from autotune.errors import InputError, NoFitError, ScriptError, StorageError
from autotune.fingerprint import Workload, check_study_name, default_study_name, study_key, workload_of
from autotune.measurement import TrialResult, TrialSettings, run_trial
from autotune.meters import MemoryMeter, make_meter
from autotune.nvml import load_nvml
from autotune.paths import cache_dir, default_storage_url
from autotune.plans import parse_plan
from autotune.protocol import Outcome
from autotune.records import TrialRecord, constraint_mib
from autotune.reporting import Reporter, SilentReporter
from autotune.search import Search, best_record, records_of, tell_result
from autotune.space import SearchSpace, build_space, parse_batch_sizes
from autotune.storage import BestRow, Store, StudyRow, open_store

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
    run: Any  # _run_config bound to the job: run(batch, plan, poll=, settings=, probe=, interruptible=)
    probes_run: int  # trials the probe took in this process (0 or 1)

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

    Raises:
        InputError, DeviceError: bad spec or device. StorageError: the database.
        ScriptError: the script failed in its trials. NoFitError: nothing fits (every trial is kept).
    """
    reporter = reporter or SilentReporter()
    job = _resolve(spec, dict(os.environ if environ is None else environ), reporter, nvml)
    name = job.study_row.study_name
    if spec.force:
        job.store.forget_study(name)
    elif (cached := job.store.best(name)) is not None:
        reporter.note(f"answered from {job.store.display_url} (study {name}): zero trials; --force re-tunes")
        study = optuna.load_study(study_name=name, storage=job.store.optuna)
        return job.result(cached, study, new_trials=0, exhausted=False, cached=True)
    study = _open_study(job.store, job.study_row, spec.seed, job.workload, job.limit)
    run = job.run
    search = Search(
        study,
        job.space,
        job.limit,
        lambda b, p, poll, allow: run(b, p, poll=poll, interruptible=allow),
        spec.trials,
        reporter,
        job.savings,
    )
    if recovered := search.recover_interrupted():
        reporter.note(
            f"resuming study {name}: {recovered} interrupted trial(s) failed and queued for one retry"
        )
    with search.shield:
        exhausted = search.run()
        best = _verify(search, partial(run, settings=spec.verify_settings), reporter)
        job.store.save_best(best)
    return job.result(best, study, search.trials_run + job.probes_run, exhausted)


def _resolve(spec: TuneSpec, env: dict[str, str], reporter: Reporter, nvml: Any) -> _Job:
    """Device, budget, database, workload, probe (run if new), search space and study name of ``spec``."""
    device = resolve_device(spec.device, env, (lambda: nvml) if nvml is not None else load_nvml)
    budget = spec.budget.resolve(device.total_bytes)
    store = open_store(spec.storage or default_storage_url(cache_dir(spec.cache_dir)))
    workload = workload_of(spec.command, device, spec.backend)
    store.add_workload(
        workload.fingerprint, workload.script, str(spec.command), device.name, workload.details
    )
    run = partial(_run_config, spec, device, make_meter(device, nvml), cache_dir(spec.cache_dir), env)
    discovery, probes_run = _discover(store, workload, spec, run, reporter)
    probe_data = discovery.get("probe")
    space = build_space(
        spec.batch_sizes,
        spec.plans,
        probe_data["candidates"] if probe_data else [],
        probe.operator_plans(probe_data) if probe_data else (),
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
) -> TrialResult:
    return run_trial(
        spec.command,
        batch,
        parse_plan(plan),
        device,
        meter,
        settings or spec.settings,
        root,
        env,
        spec.backend,
        on_poll=poll,
        probe=probe,
        interruptible=interruptible,
    )


def _discover(
    store: Store, workload: Workload, spec: TuneSpec, run: Any, reporter: Reporter
) -> tuple[dict[str, Any], int]:
    """The workload's probe (its repeated module classes and what recomputing them saves), measured by
    its first trial — once per fingerprint, again with ``force`` — and how many trials that took (0 or 1).

    The probe's trial is instrumented, so its peak and speed are not stored as a measurement."""
    row = store.workload(workload.fingerprint)
    if row and row["discovery"] is not None and not spec.force:
        return dict(row["discovery"]), 0
    batch = spec.batch_sizes[0]
    reporter.trial_started(-1, batch, "none", "probe")
    result: TrialResult = run(batch, "none", poll=reporter.trial_progress, probe=True)
    if result.outcome in (Outcome.FAILED, Outcome.TIMEOUT):
        raise ScriptError(
            f"the script's first trial {result.outcome.value} (logs: {result.log_dir}):\n{result.error}"
        )
    discovery = {"probe": result.probe, "outcome": result.outcome.value, "log_dir": result.log_dir}
    store.set_discovery(workload.fingerprint, result.candidates or [], discovery)
    classes = ", ".join(c["cls"] for c in result.candidates or []) or "none found"
    reporter.note(f"probe: batch {batch}: {result.outcome.value}; repeated modules: {classes}")
    return discovery, 1


def _savings(probe_data: dict[str, Any] | None, space: SearchSpace) -> dict[str, float]:
    """The probe's predicted saving per sample of every plan in the space (none without a probe)."""
    if not probe_data:
        return {}
    return {plan: probe.saving_per_sample(probe_data, plan) for plan in space.plans if plan != "none"}


def _open_study(
    store: Store, row: StudyRow, seed: int | None, workload: Workload, limit: int
) -> optuna.Study:
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


def _verify(search: Search, run_long: Any, reporter: Reporter) -> BestRow:
    """Re-run the fastest fitting configurations longer until one stays under the limit."""
    study, limit = search.study, search.limit
    records = records_of(study)
    tried: set[tuple[int | None, str | None]] = set()
    for _ in range(MAX_VERIFICATIONS):
        candidate = best_record([r for r in records if (r.batch_size, r.plan) not in tried], limit)
        if candidate is None or candidate.batch_size is None or candidate.plan is None:
            break
        tried.add((candidate.batch_size, candidate.plan))
        study.enqueue_trial(
            {"batch_size": candidate.batch_size, "plan": candidate.plan},
            user_attrs={
                "kind": "verification",
                "proposed_by": "verification",
                "note": f"verifies trial {candidate.number}",
            },
        )
        trial = study.ask(search.distributions)
        reporter.trial_started(
            trial.number, candidate.batch_size, candidate.plan, f"verifying trial {candidate.number}"
        )
        try:
            result = run_long(
                candidate.batch_size,
                candidate.plan,
                poll=reporter.trial_progress,
                interruptible=search.shield.allow,
            )
        except KeyboardInterrupt:
            study.tell(
                trial, state=TrialState.FAIL
            )  # a verification is not retried: the next run verifies again
            raise
        tell_result(study, trial, result, limit)
        reporter.trial_finished(records_of(study)[trial.number], candidate)
        if result.outcome is Outcome.COMPLETE and result.peak_bytes <= limit and result.samples_per_sec:
            return BestRow(
                study.study_name,
                candidate.number,
                candidate.batch_size,
                candidate.plan,
                candidate.peak_bytes or 0,
                candidate.samples_per_sec or 0.0,
                result.peak_bytes,
                result.samples_per_sec,
            )
        reporter.note(
            f"trial {candidate.number} failed verification ({result.outcome.value}, peak "
            f"{format_bytes(result.peak_bytes)}); trying the next configuration"
        )
    raise NoFitError(_no_fit_message(records_of(study), limit))


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
