"""A study's trials read through Optuna, for the answers that need more than autotune's own tables."""

from __future__ import annotations

from autotune.search.records import TrialRecord
from autotune.storage import Store


def study_records(store: Store, name: str) -> list[TrialRecord]:
    """The trials of study ``name`` ([] if Optuna has no such study). Imports Optuna: only answers that
    read trials pay for it."""
    import optuna

    from autotune.search.optuna_trials import records_of

    try:
        return records_of(optuna.load_study(study_name=name, storage=store.optuna))
    except KeyError:
        return []
