"""Optuna's RDB storage, retried: imported only by what reads or writes trials (importing Optuna and
building its storage is most of what a command answering from autotune's own tables would otherwise cost)."""

from __future__ import annotations

import sys
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from autotune.storage.database import retried


class RetryingRDBStorage(optuna.storages.RDBStorage):
    """Optuna's RDBStorage whose every call is retried while the database is locked or unreachable
    (autotune.storage.database.retrying): a lock held past the busy timeout, or a PostgreSQL restart, delays
    a worker instead of failing its live trial or losing its result. Still an RDBStorage, so Optuna
    keeps its trial cache in front of it.

    The trials it reads share what they have in common: Optuna builds a new distribution object for every
    parameter of every trial it reads (an autotune space's plan choices are dozens of strings), and a new
    string for every attribute value, and its cache keeps them all for as long as a study is open. Here each
    distinct distribution, and each short repeated string (a worker, a device, an outcome), is one object for
    the whole storage (bench/study_cache_memory.py measures what that saves a long `run`)."""

    def _build_frozen_trial_from_trial_model(self, trial: Any) -> FrozenTrial:
        frozen = super()._build_frozen_trial_from_trial_model(trial)
        shared = self.__dict__.setdefault("_autotune_shared", {})
        frozen._distributions = {
            sys.intern(name): shared.setdefault(dist, dist) for name, dist in frozen._distributions.items()
        }
        frozen._params = {sys.intern(name): _shared_value(value) for name, value in frozen._params.items()}
        frozen._user_attrs = {sys.intern(key): _shared_value(v) for key, v in frozen._user_attrs.items()}
        frozen._system_attrs = {sys.intern(key): v for key, v in frozen._system_attrs.items()}
        return frozen


def _shared_value(value: Any) -> Any:
    """A short string as the one interned object of its text (a study repeats a handful of them)."""
    return sys.intern(value) if isinstance(value, str) and len(value) <= 64 else value


for _name in (
    "create_new_study",
    "create_new_trial",
    "delete_study",
    "get_all_studies",
    "get_all_trials",
    "get_best_trial",
    "get_study_directions",
    "get_study_id_from_name",
    "get_study_name_from_id",
    "get_study_system_attrs",
    "get_study_user_attrs",
    "get_trial",
    "get_trial_id_from_study_id_trial_number",
    "get_trial_param",
    "get_trial_system_attrs",
    "get_trial_user_attrs",
    "set_study_system_attr",
    "set_study_user_attr",
    "set_trial_intermediate_value",
    "set_trial_param",
    "set_trial_state_values",
    "set_trial_system_attr",
    "set_trial_user_attr",
    # Optuna's _CachedStorage (what optuna.create_study wraps an RDBStorage in) calls these private
    # methods of its backend directly: a study.ask() that met a lock failed there without a retry.
    "_create_new_trial",
    "_set_trial_param",
    "_get_best_trial_id",
    "_get_trials",
    "_get_stale_trial_ids",
):
    setattr(RetryingRDBStorage, _name, retried(getattr(optuna.storages.RDBStorage, _name)))
