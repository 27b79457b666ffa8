"""A job's Optuna study: created (or resumed) under the job's name, and a new one seeded with what is known
of the workload, the trials measured for its other budgets (``warm-start``)."""

from __future__ import annotations

import optuna

from autotune.core.errors import InputError, StorageError
from autotune.core.protocol import Outcome
from autotune.search.longest import MAX_SEQ_LEN_ATTR
from autotune.search.optuna_trials import constraint_attrs, distributions, records_of
from autotune.search.records import TrialKind, TrialRecord, constraint_mib
from autotune.search.space import SearchSpace
from autotune.storage import Store, StudyRow

SAMPLER_STARTUP_TRIALS = (
    0  # no random start: the calibration and model proposals before it are its warm start
)


def open_study(store: Store, row: StudyRow, seed: int | None, limit: int) -> optuna.Study:
    """The study named by ``row``: resumed if it exists for the same job, else created and warm-started.

    Raises:
        StorageError: a study of that name belongs to another job.
        InputError: a study of that name exists and autotune did not create it.
    """
    existing = store.study(row.study_name)
    if existing is not None and existing.study_key != row.study_key:
        raise StorageError(
            f"study {row.study_name!r} belongs to another job (different script, device, budget or "
            "search space): choose another --study or drop --study"
        )
    if existing is None:
        check_ours(store, row.study_name)
        store.add_study(row)  # before Optuna's study: an Optuna study without this row is someone else's
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=SAMPLER_STARTUP_TRIALS)
    study = optuna.create_study(
        storage=store.optuna,
        study_name=row.study_name,
        direction="maximize",
        sampler=sampler,
        load_if_exists=True,
    )
    if existing is None:
        if row.space.get(MAX_SEQ_LEN_ATTR):  # before any trial: every reading of its trials is carried to it
            study.set_user_attr(MAX_SEQ_LEN_ATTR, row.space[MAX_SEQ_LEN_ATTR])
        _warm_start(study, store, row, limit)
    return study


def check_ours(store: Store, name: str) -> None:
    """Refuse a study name that an Optuna study of the database has and autotune's tables do not: a user's
    own study, which autotune must never write to.

    Raises:
        InputError: naming the study.
    """
    if store.study(name) is not None:
        return
    try:
        store.optuna.get_study_id_from_name(name)
    except KeyError:
        return
    if store.study(name) is not None:  # another worker created both between the two reads (row first)
        return
    raise InputError(
        f"study {name!r} in {store.display_url} was not created by autotune, which never writes to it: "
        "choose another --study"
    )


def _warm_start(study: optuna.Study, store: Store, row: StudyRow, limit: int) -> None:
    """Seed a new study with this workload's trials measured for other budgets, inside its space."""
    space = SearchSpace.from_dict(row.space)
    for other in store.studies(row.fingerprint):
        # Another global batch (or accumulation) measures other samples/s at the same batch size.
        accumulation = SearchSpace.from_dict(other.space)
        if other.study_name == row.study_name or (accumulation.global_batch, accumulation.declared_accum) != (
            space.global_batch,
            space.declared_accum,
        ):
            continue
        for record in records_of(
            optuna.load_study(study_name=other.study_name, storage=store.optuna), as_measured=True
        ):
            if (
                record.measured
                and record.kind in (TrialKind.MEASURED, TrialKind.VERIFICATION)
                and record.batch_size in space.batch_sizes
                and record.plan in space.plans
            ):
                study.add_trial(_warm_trial(record, other.study_name, space, limit))


def _warm_trial(record: TrialRecord, origin: str, space: SearchSpace, limit: int) -> optuna.trial.FrozenTrial:
    peak = record.peak_bytes or 0
    return optuna.trial.create_trial(
        params={"batch_size": record.batch_size, "plan": record.plan},
        distributions=distributions(space),
        value=record.samples_per_sec or 0.0,
        user_attrs={
            "outcome": record.outcome.value if record.outcome else None,
            "peak_bytes": record.peak_bytes,
            "samples_per_sec": record.samples_per_sec,
            "samples_per_sec_low": record.samples_per_sec_low,
            "samples_per_sec_high": record.samples_per_sec_high,
            "log_dir": record.log_dir,
            "note": f"from study {origin}",
            "kind": TrialKind.WARM_START.value,
            **({"ranks": [r.to_dict() for r in record.ranks]} if record.ranks else {}),
            **({"lengths": list(record.lengths)} if record.lengths else {}),  # --max-seq-len carries them
        },
        system_attrs=constraint_attrs(constraint_mib(peak, limit, record.outcome is Outcome.COMPLETE)),
    )
