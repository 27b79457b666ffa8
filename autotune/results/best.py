"""``autotune best``: the best stored plan, from the database alone, with no trial and no torch.

A verified winner is answered from autotune's own tables; Optuna (and its storage) is imported only to read
trials, for a budget with no verified winner. ``autotune best`` stays well under a second.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from autotune.core.budget import DEFAULT_HEADROOM, Budget, Limit, format_bytes
from autotune.core.errors import InputError, NoFitError
from autotune.core.paths import cache_dir, default_storage_url
from autotune.core.plans import Backend
from autotune.core.protocol import BACKEND_ENV, BATCH_SIZE_ENV, GRAD_ACCUM_ENV, PLAN_ENV
from autotune.core.stats import Interval
from autotune.hardware.devices import resolve_device
from autotune.results.records import study_records
from autotune.search.records import TrialRecord, best_record
from autotune.storage import Store, StudyRow, open_store
from autotune.trials.command import TrialCommand
from autotune.trials.workload import workload_of


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
    backend: Backend = Backend.TORCH
    fingerprint: str = ""  # the workload's
    cache: str = ""  # autotune's cache dir, where an ORT plan's files live
    samples_per_sec_low: float | None = None  # the interval of samples_per_sec (autotune.core.stats)
    samples_per_sec_high: float | None = None
    readings: int | None = None  # how many readings it pools
    certainty: str | None = None  # how noisy the tuning was (None: quiet, or not known)
    grad_accum: int | None = None  # micro-batches per optimizer step (a global batch, or --grad-accum)
    command: tuple[str, ...] = ()  # the study's command template, or the script and its arguments
    template: bool = False  # whether ``command`` is a template ({batch_size}) rather than a script's
    outermost: tuple[str, ...] = ()  # the probe's outermost repeated classes (the model's blocks)
    layers: dict[str, int] = field(default_factory=dict)  # instances of each repeated class, by the probe
    # the checkpointing the script does by itself, as the probe saw it (None: none): the plan adds to it
    own_checkpointing: str | None = None
    # why ``command`` is not printed as the tuned command, or how far it was checked ("": its job's signature
    # verified under the key this process holds): the command is printed ready to paste, so it comes from
    # the study's signed job row, never from a row any writer of the database could have changed
    command_check: str = ""

    @property
    def throughput(self) -> Interval:
        return Interval.stored(self.samples_per_sec, self.samples_per_sec_low, self.samples_per_sec_high)

    def env(self) -> dict[str, str]:
        """What a script needs to train with this configuration outside autotune. For the ORT backend also
        ORT's own variables: the plan as ORTMODULE_MEMORY_OPT_CONFIG's file (written under the cache dir),
        the fallback policy and the workload's export cache; the script calls ``autotune.prepare(model)``."""
        env = {BATCH_SIZE_ENV: str(self.batch_size), PLAN_ENV: self.plan}
        if self.grad_accum is not None:
            env[GRAD_ACCUM_ENV] = str(self.grad_accum)
        if self.backend is Backend.ORT:
            from autotune.backends import ort_plans

            cache = Path(self.cache)
            plan_file = cache / "ort-plans" / f"{self.study}.json"
            env[BACKEND_ENV] = Backend.ORT.value
            env.update(
                ort_plans.environment(ort_plans.parse_ort_plan(self.plan), plan_file, cache, self.fingerprint)
            )
        return env

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "backend": self.backend.value, "env": self.env()}


def open_default(storage: str | None, cache: Path | None, *, must_exist: bool = False) -> Store:
    """The database answers are read from (opened for answering: no creation lock, Optuna only if needed).
    ``must_exist``: a SQLite database that is not there is an error and nothing is created (``best``: issue
    27); ``studies`` and ``show`` create (or upgrade) it, as they always did."""
    if must_exist:
        return open_store(
            storage or default_storage_url(cache_dir(cache, create=False)), answering=True, must_exist=True
        )
    return open_store(storage or default_storage_url(cache_dir(cache)), answering=True)


def best(
    store: Store,
    command: TrialCommand | None = None,
    budget: Budget | None = None,
    study: str | None = None,
    device: str = "auto",
    environ: Mapping[str, str] | None = None,
    backend: Backend = Backend.TORCH,
    cache: Path | None = None,
    global_batch: int | None = None,
    max_seq_len: int | None = None,
) -> BestAnswer:
    """The best stored plan: of ``study``, of ``command`` (at ``budget``; of the studies tuned with
    ``max_seq_len`` as --max-seq-len, or without it), or the most recent one.

    For a budget with no verified winner, the fastest measured trial of the same workload that fits is
    returned with ``verified=False``.

    Raises:
        InputError: no such study or workload. NoFitError: nothing stored fits.
    """
    env = dict(os.environ if environ is None else environ)
    answer = _best(store, command, budget, study, device, env, backend, global_batch, max_seq_len)
    row = store.study(answer.study)
    workload = store.workload(row.fingerprint) if row is not None else None
    probe = ((workload.discovery or {}).get("probe") or {}) if workload is not None else {}
    words, template, check = _signed_command(store, answer.study, env)
    return dataclasses.replace(
        answer,
        command=words,
        template=template,
        command_check=check,
        outermost=tuple(c["cls"] for c in probe.get("candidates", ()) if c.get("outermost")),
        layers={c["cls"]: int(c["count"]) for c in probe.get("candidates", ()) if c.get("count")},
        own_checkpointing=probe.get("own_checkpointing"),
        backend=Backend.parse(workload.backend) if workload is not None else Backend.TORCH,
        fingerprint=row.fingerprint if row is not None else "",
        cache=str(cache_dir(cache)),
        grad_accum=_grad_accum(row, answer.batch_size) if row is not None else None,
    )


def _signed_command(store: Store, study: str, env: Mapping[str, str]) -> tuple[tuple[str, ...], bool, str]:
    """The study's command as its job row holds it (the script and its arguments, or the template), whether
    it is a template, and how far it was checked: its signature verified under the job key ``env`` gives
    (""), or why it is not printed (no command then)."""
    from autotune.workers.signing import load_key, signature_error

    job = store.job(study)
    words = job.spec.get("command") if job is not None else None
    if job is None or not isinstance(words, list) or not all(isinstance(w, str) for w in words) or not words:
        return (), False, "no signed job of this study is stored: no command to print"
    template = job.spec.get("is_template") is True
    command = tuple(words)  # a script's command starts with the script's absolute path
    if job.signature is None:
        return (), template, "the study's job is unsigned: its stored command is not printed"
    try:
        key = load_key(env)
    except InputError as e:
        return command, template, f"not verified ({e})"
    if key is None:
        return command, template, "not verified: this shell holds no job key (AUTOTUNE_JOB_KEY)"
    why = signature_error(key, job.signature, job.study_name, job.spec, job.scripts)
    if why is not None:
        return (), template, f"the study's job does not verify: {why}; its stored command is not printed"
    return command, template, ""


def _grad_accum(row: StudyRow, batch_size: int) -> int | None:
    """The winner's accumulation: its study's global batch over its batch size, or the declared one."""
    if row.space.get("global_batch") and batch_size:
        return int(row.space["global_batch"]) // batch_size
    declared = row.space.get("grad_accum")
    return int(declared) if declared is not None else None


def _best(
    store: Store,
    command: TrialCommand | None,
    budget: Budget | None,
    study: str | None,
    device: str,
    env: dict[str, str],
    backend: Backend,
    global_batch: int | None = None,
    max_seq_len: int | None = None,
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
        if global_batch is not None:
            rows = [r for r in rows if r.space.get("global_batch") == global_batch]
            if not rows:
                raise InputError(
                    f"nothing stored for {command} with --global-batch {global_batch} on {dev.name}: "
                    "run autotune run --global-batch first"
                )
        rows = [r for r in rows if r.space.get("max_seq_len") == max_seq_len]  # peaks read at another length
        if not rows:
            asked = f"--max-seq-len {max_seq_len}" if max_seq_len is not None else "no --max-seq-len"
            raise InputError(
                f"nothing stored for {command} with {asked} on {dev.name}: run autotune run with the same "
                "--max-seq-len first"
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
        samples_per_sec_low=found.throughput.low,
        samples_per_sec_high=found.throughput.high,
        readings=found.readings,
        certainty=found.certainty,
    )


def _for_budget(store: Store, rows: list[StudyRow], budget_bytes: int) -> BestAnswer:
    exact = [a for a in (_stored(store, r) for r in rows if r.budget_bytes == budget_bytes) if a is not None]
    if exact:
        return max(exact, key=lambda a: a.samples_per_sec)
    return _from_trials(store, rows, budget_bytes, DEFAULT_HEADROOM)


def _from_trials(store: Store, rows: list[StudyRow], budget_bytes: int, headroom: float) -> BestAnswer:
    limit = Limit(budget_bytes, headroom).bytes
    found: list[tuple[TrialRecord, StudyRow]] = []
    for row in rows:
        record = best_record(study_records(store, row.study_name), limit)
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
        samples_per_sec_low=record.samples_per_sec_low,
        samples_per_sec_high=record.samples_per_sec_high,
        readings=1,
    )
