"""Answers from the database, with no trial and no torch: ``best``, ``studies``, ``show``.

A verified winner is answered from autotune's own tables; Optuna (and its storage) is imported only to read
trials: an unverified answer, ``studies``' counts, ``show``. ``autotune best`` stays well under a second.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from autotune.core.budget import Budget, format_bytes
from autotune.trials.command import TrialCommand
from autotune.hardware.devices import resolve_device
from autotune.core.errors import InputError, NoFitError
from autotune.trials.workload import workload_of
from autotune.core.paths import cache_dir, default_storage_url
from autotune.backends.probe import saving_per_sample
from autotune.core.protocol import BACKEND_ENV, BATCH_SIZE_ENV, PLAN_ENV
from autotune.search.records import TrialRecord
from autotune.storage import Store, StudyRow, open_store

DEFAULT_HEADROOM = 0.05


@dataclass(frozen=True)
class BestAnswer:
    study: str
    script: str
    batch_size: int
    plan: str
    peak_bytes: int  # the verified peak when verified, else the measured one
    samples_per_sec: float
    budget_bytes: int
    verified: bool
    source: str  # where the answer comes from, for humans
    backend: str = "torch"
    fingerprint: str = ""  # the workload's
    cache: str = ""  # autotune's cache dir, where an ORT plan's files live

    def env(self) -> dict[str, str]:
        """What a script needs to train with this configuration outside autotune. For the ORT backend also
        ORT's own variables: the plan as ORTMODULE_MEMORY_OPT_CONFIG's file (written under the cache dir),
        the fallback policy and the workload's export cache; the script calls ``autotune.prepare(model)``."""
        env = {BATCH_SIZE_ENV: str(self.batch_size), PLAN_ENV: self.plan}
        if self.backend == "ort":
            from autotune.backends import ort_plans

            cache = Path(self.cache)
            plan_file = cache / "ort-plans" / f"{self.study}.json"
            env[BACKEND_ENV] = "ort"
            env.update(
                ort_plans.environment(ort_plans.parse_ort_plan(self.plan), plan_file, cache, self.fingerprint)
            )
        return env

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "env": self.env()}


@dataclass(frozen=True)
class PlanCheck:
    """The probe's predicted saving of a plan beside the saving its measured trials show (bytes per sample)."""

    plan: str
    predicted: float
    measured: float | None  # None until the plan (and none) have been measured
    flagged: bool  # measured and more than FLAG_TOLERANCE away from the prediction


FLAG_TOLERANCE = 0.25


@dataclass(frozen=True)
class StudySummary:
    name: str
    script: str
    budget_bytes: int
    trials: int  # counted trials
    best_samples_per_sec: float | None
    state: str  # the job's (open, running, done, failed); without a job: done (winner stored) or open
    budget_text: str = ""  # as submitted, for a job no worker has started yet (budget_bytes 0)


def open_default(storage: str | None, cache: Path | None) -> Store:
    return open_store(storage or default_storage_url(cache_dir(cache)), answering=True)


def best(
    store: Store,
    command: TrialCommand | None = None,
    budget: Budget | None = None,
    study: str | None = None,
    device: str = "auto",
    environ: Mapping[str, str] | None = None,
    backend: str = "torch",
    cache: Path | None = None,
) -> BestAnswer:
    """The best stored plan: of ``study``, of ``command`` (at ``budget``), or the most recent one.

    For a budget with no verified winner, the fastest measured trial of the same workload that fits is
    returned with ``verified=False``.

    Raises:
        InputError: no such study or workload. NoFitError: nothing stored fits.
    """
    answer = _best(
        store, command, budget, study, device, dict(os.environ if environ is None else environ), backend
    )
    row = store.study(answer.study)
    workload = store.workload(row.fingerprint) if row is not None else None
    details = (workload or {}).get("details") or {}
    return dataclasses.replace(
        answer,
        backend=details.get("backend", "torch"),
        fingerprint=row.fingerprint if row is not None else "",
        cache=str(cache_dir(cache)),
    )


def _best(
    store: Store,
    command: TrialCommand | None,
    budget: Budget | None,
    study: str | None,
    device: str,
    env: dict[str, str],
    backend: str,
) -> BestAnswer:
    if study is not None:
        row = store.study(study)
        if row is None:
            raise InputError(f"no study named {study!r} in {store.display_url}")
        rows = [row]
    elif command is not None:
        dev = resolve_device(device, env)
        rows = store.studies(workload_of(command, dev, backend).fingerprint)
        if not rows:
            raise InputError(
                f"nothing stored for {command} on {dev.name} in {store.display_url}: run autotune run first"
            )
        if budget is not None:
            return _for_budget(store, rows, budget.resolve(dev.total_bytes))
    else:
        rows = store.studies()
        if not rows:
            raise InputError(f"no study in {store.display_url}: run autotune run first")
    answers = [a for a in (_stored(store, row) for row in rows) if a is not None]
    if not answers:
        return _from_trials(store, rows, rows[-1].budget_bytes, rows[-1].headroom)
    return answers[-1]  # the most recently created study with a winner


def _stored(store: Store, row: StudyRow) -> BestAnswer | None:
    found = store.best(row.study_name)
    if found is None:
        return None
    return BestAnswer(
        row.study_name,
        row.script,
        found.batch_size,
        found.plan,
        found.verified_peak_bytes,
        found.verified_samples_per_sec,
        row.budget_bytes,
        True,
        f"verified winner of study {row.study_name}",
    )


def _for_budget(store: Store, rows: list[StudyRow], budget_bytes: int) -> BestAnswer:
    exact = [a for a in (_stored(store, r) for r in rows if r.budget_bytes == budget_bytes) if a is not None]
    if exact:
        return max(exact, key=lambda a: a.samples_per_sec)
    return _from_trials(store, rows, budget_bytes, DEFAULT_HEADROOM)


def _from_trials(store: Store, rows: list[StudyRow], budget_bytes: int, headroom: float) -> BestAnswer:
    from autotune.search.loop import best_record

    limit = int(budget_bytes * (1 - headroom))
    found: list[tuple[TrialRecord, StudyRow]] = []
    for row in rows:
        record = best_record(_records(store, row.study_name), limit)
        if record is not None:
            found.append((record, row))
    if not found:
        raise NoFitError(f"no stored trial fits {format_bytes(budget_bytes)} minus {headroom:.0%} headroom")
    record, row = max(found, key=lambda pair: pair[0].samples_per_sec or 0.0)
    return BestAnswer(
        row.study_name,
        row.script,
        record.batch_size or 0,
        record.plan or "none",
        record.peak_bytes or 0,
        record.samples_per_sec or 0.0,
        budget_bytes,
        False,
        f"not verified: the fastest of the measured trials that fit (trial {record.number} of study "
        f"{row.study_name})",
    )


def studies(store: Store) -> list[StudySummary]:
    """Every study, and every submitted job that no worker has started yet."""
    jobs = {job.study_name: job for job in store.jobs()}
    summaries = []
    for row in store.studies():
        records = _records(store, row.study_name)
        stored = store.best(row.study_name)
        job = jobs.pop(row.study_name, None)
        summaries.append(
            StudySummary(
                row.study_name,
                row.script,
                row.budget_bytes,
                sum(r.counted for r in records),
                stored.verified_samples_per_sec if stored else None,
                job.state if job is not None else ("done" if stored else "open"),
            )
        )
    for job in jobs.values():
        summaries.append(StudySummary(job.study_name, job.script, 0, 0, None, job.state, job.spec["budget"]))
    return summaries


def show(store: Store, name: str) -> tuple[StudyRow, list[TrialRecord], list[PlanCheck]]:
    """A study's trials, and the honesty check of the probe's predictions against them."""
    row = store.study(name)
    if row is None:
        raise InputError(f"no study named {name!r} in {store.display_url}")
    records = _records(store, name)
    discovery = (store.workload(row.fingerprint) or {}).get("discovery") or {}
    return row, records, plan_checks(discovery.get("probe"), records, row.space["plans"])


def plan_checks(
    probe_data: dict[str, Any] | None, records: list[TrialRecord], plans: list[str]
) -> list[PlanCheck]:
    if not probe_data:
        return []
    from autotune.search.loop import model_of

    model = model_of(records)
    checks = []
    for plan in plans:
        if plan == "none":
            continue
        predicted = saving_per_sample(probe_data, plan)
        measured = model.measured_saving(plan)
        flagged = measured is not None and abs(predicted - measured) > FLAG_TOLERANCE * max(
            abs(measured), 2**20
        )
        checks.append(PlanCheck(plan, predicted, measured, flagged))
    return checks


def _records(store: Store, name: str) -> list[TrialRecord]:
    import optuna

    from autotune.search.loop import records_of

    try:
        return records_of(optuna.load_study(study_name=name, storage=store.optuna))
    except KeyError:
        return []
