"""Optuna glue: a study's trials read as TrialRecords, asked with fixed parameters, told a measurement, or
failed. Workers race on these writes; each function says how it settles the race."""

from __future__ import annotations

import contextlib
import json
import warnings
from pathlib import Path

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.exceptions import ExperimentalWarning, UpdateFinishedTrialError
from optuna.trial import TrialState

from autotune.core.budget import with_rise
from autotune.core.protocol import Outcome
from autotune.search.longest import MAX_SEQ_LEN_ATTR, at_longest
from autotune.search.records import DamagedTrial, TrialRecord, constraint_mib
from autotune.search.space import SearchSpace
from autotune.storage.base import say_once
from autotune.trials.result import TrialResult

# Fixing a trial's parameters for one ask is all autotune uses it for; the class is stable since optuna 2.4.
warnings.filterwarnings("ignore", message="PartialFixedSampler is experimental", category=ExperimentalWarning)


# The memory constraint is stored in Optuna's list form, system attribute ``constraints`` = [MiB over the limit],
# not through ``Trial.set_constraint`` (``constraints:memory``): optuna-dashboard reads only the list form and
# showed out-of-memory trials as feasible. Optuna reads the list as constraint "0"; writing both forms would give
# every trial two constraints, and the constraint's violation would count twice in TPE's feasibility model.
CONSTRAINTS_ATTR = "constraints"


def constraint_attrs(mib: float) -> dict[str, list[float]]:
    """The system attributes that carry a trial's memory constraint (<= 0: feasible)."""
    return {CONSTRAINTS_ATTR: [mib]}


def set_memory_constraint(trial: optuna.Trial, mib: float) -> None:
    """Set a running trial's memory constraint, before it is told (the samplers read it then)."""
    trial.storage.set_trial_system_attr(trial._trial_id, CONSTRAINTS_ATTR, [mib])


def records_of(study: optuna.Study, *, as_measured: bool = False) -> list[TrialRecord]:
    """The study's trials (a damaged one skipped, with one line); where the job declared its longest inputs
    (--max-seq-len), every peak is read at that length (autotune.search.longest) unless ``as_measured``."""
    records = []
    for trial in study.get_trials(deepcopy=False):
        try:
            records.append(TrialRecord.from_frozen(trial))
        except DamagedTrial as e:  # a writer of the database edited it: it is no reading of ours
            say_once(f"study {study.study_name!r}: skipping trial {trial.number}, which is damaged: {e}")
    longest = None if as_measured else study.user_attrs.get(MAX_SEQ_LEN_ATTR)  # set as it was created
    return at_longest(records, longest) if longest else records


def distributions(space: SearchSpace) -> dict[str, BaseDistribution]:
    """The search space as Optuna sees it: two categorical parameters."""
    return {
        "batch_size": CategoricalDistribution(space.batch_sizes),
        "plan": CategoricalDistribution(space.plans),
    }


def ask_fixed(study: optuna.Study, space: dict[str, BaseDistribution], batch: int, plan: str) -> optuna.Trial:
    """A new trial with these parameters: Optuna's PartialFixedSampler for this one ask, in this process
    only (unlike ``enqueue_trial``, whose shared queue other workers also pop)."""
    sampler = study.sampler
    study.sampler = optuna.samplers.PartialFixedSampler({"batch_size": batch, "plan": plan}, sampler)
    try:
        return study.ask(space)
    finally:
        study.sampler = sampler


def fail_trial(study: optuna.Study, number: int, note: str) -> bool:
    """Fail a RUNNING trial with a note; False if it was found finished.

    Workers race to fail a dead worker's trial (one fails the lease, another sees the trial orphaned by
    it): whichever writes second finds it finished in the database, inside its own write, and leaves
    it to the first. The check before the writes cannot settle it: the other may write in between."""
    frozen = study.trials[number]
    if frozen.state is not TrialState.RUNNING:
        return False
    try:
        optuna.trial.Trial(study, frozen._trial_id).set_user_attr("note", note)
        study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
    except UpdateFinishedTrialError:
        return False
    return True


def tell_result(study: optuna.Study, trial: optuna.Trial, result: TrialResult, limit: int) -> None:
    """Store a measured trial: every attribute first, then the value and constraint (or FAIL).

    The storage retries every write while the database is locked or unreachable (RetryingRDBStorage):
    a finished measurement is never dropped for a transient error. If another worker failed the trial
    meanwhile (it took this worker for dead), the measurement is added as a trial of its own."""
    attrs = _measurement(result)
    if result.log_dir:
        claim_folder(Path(result.log_dir), study.study_name, trial.number)
    constraint: dict[str, list[float]] = {}
    value, state = None, TrialState.FAIL
    if result.outcome is Outcome.COMPLETE or result.outcome.out_of_memory:
        constraint = constraint_attrs(
            constraint_mib(
                with_rise(result.peak_bytes, result.rising_bytes) or 0,
                limit,
                result.outcome is Outcome.COMPLETE,
            )
        )
        value, state = result.samples_per_sec or 0.0, TrialState.COMPLETE
    try:
        for name, attr in attrs.items():
            trial.set_user_attr(name, attr)
        for name, mibs in constraint.items():
            trial.storage.set_trial_system_attr(trial._trial_id, name, mibs)
        study.tell(trial, value, state=state, skip_if_finished=True)
    except UpdateFinishedTrialError:  # failed as stale, or a retried tell whose first attempt committed
        pass
    stored = trial.storage.get_trial(trial._trial_id)
    if stored.state is state or state is TrialState.FAIL:
        return
    study.add_trial(
        optuna.trial.create_trial(
            params=stored.params,
            distributions=stored.distributions,
            value=value,
            user_attrs={
                **stored.user_attrs,
                **attrs,
                "note": f"late result of trial {stored.number}, failed as stale",
            },
            # the sampler's own attributes; the constraint is this measurement's, whether or not it was set
            system_attrs={
                **{k: v for k, v in stored.system_attrs.items() if not k.startswith(CONSTRAINTS_ATTR)},
                **constraint,
            },
        )
    )


OWNERS_FILE = "trials.txt"  # in a trial's folder: the study and trial number of each trial it measured


def claim_folder(folder: Path, study: str, number: int) -> None:
    """Write in the trial's ``folder`` that trial ``number`` of ``study`` measured there (a sweep's process
    measures several). ``autotune gc`` removes a folder only where this says so (autotune.results.cleanup):
    a trial's stored ``log_dir`` is a row any writer of the database can point at another folder."""
    # a folder that is gone (removed by hand) has nothing left to prove
    with contextlib.suppress(OSError), (folder / OWNERS_FILE).open("a", encoding="utf-8") as f:
        f.write(f"{json.dumps([study, number])}\n")


def folder_claims(folder: Path) -> set[tuple[str, int]]:
    """The (study, trial number) pairs ``claim_folder`` wrote in ``folder``."""
    try:
        lines = (folder / OWNERS_FILE).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return set()
    claims = set()
    for line in lines:
        with contextlib.suppress(ValueError, TypeError):
            study, number = json.loads(line)
            claims.add((str(study), int(number)))
    return claims


def _measurement(result: TrialResult) -> dict[str, object]:
    """The user attributes a measured trial carries."""
    return {
        "outcome": result.outcome.value,
        "peak_bytes": result.peak_bytes,
        "memory_method": result.memory_method,
        "samples_per_sec": result.samples_per_sec,
        "samples_per_sec_low": result.samples_per_sec_low,
        "samples_per_sec_high": result.samples_per_sec_high,
        "log_dir": result.log_dir,
        "error": result.error.strip().splitlines()[0][:500] if result.error else None,
        "grad_accum": result.grad_accum,
        "micro_batches": result.micro_batches,
        "compile_cache": result.compile_cache,
        "warmup_peak_bytes": result.warmup_peak_bytes,
        "steady_peak_bytes": result.steady_peak_bytes,
        "load": result.load.to_dict() if result.load is not None else None,
        "tokens_per_sec": result.tokens_per_sec,
        "lengths": list(result.lengths) if result.lengths is not None else None,
        "batch_seen": result.batch_seen,
        **({"phase_peaks": result.phase_peaks} if result.phase_peaks else {}),
        **({"phase_seconds": result.phase_seconds} if result.phase_seconds else {}),
        **({"own_checkpointing": result.own_checkpointing} if result.own_checkpointing else {}),
        **({"settled": result.settled} if result.settled else {}),
        **({"rising_bytes": result.rising_bytes} if result.rising_bytes else {}),
        **({"shifted": result.shifted} if result.shifted else {}),
        **({"slow_start": result.slow_start} if result.slow_start else {}),
        "startup_seconds": result.startup_seconds,
        "measured_seconds": result.measured_seconds,
        **({"ranks": [r.to_dict() for r in result.ranks]} if result.ranks else {}),
        **({"placement": [p.to_dict() for p in result.placement]} if result.placement else {}),
        **({"warm_run": result.warm_run} if result.warm_run else {}),
    }
