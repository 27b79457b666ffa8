"""autotune's Optuna storage reads the same trials as Optuna's own, with what they have in common shared:
one distribution object per distinct distribution, one string per short repeated value (a long `run` keeps
every trial of its study cached: bench/study_cache_memory.py, bench/soak.py --run)."""

from __future__ import annotations

import optuna
from optuna.distributions import CategoricalDistribution

from autotune.storage.optuna_storage import RetryingRDBStorage


def test_trials_read_back_equal_and_share_their_distributions_and_short_strings(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    space = {
        "batch_size": CategoricalDistribution((1, 2, 4, 8)),
        "plan": CategoricalDistribution(("none", "Block:0.5", "Block:1")),
    }
    study = optuna.create_study(study_name="s", storage=url, direction="maximize")
    for i in range(6):
        study.add_trial(
            optuna.trial.create_trial(
                params={"batch_size": (1, 2, 4, 8)[i % 4], "plan": ("none", "Block:1")[i % 2]},
                distributions=space,
                value=float(i),
                user_attrs={"worker": "host:1:2", "log_dir": f"/logs/trial-{i}" + "x" * 80},
                system_attrs={"constraints": [float(i - 3)]},
            )
        )
    plain = optuna.storages.RDBStorage(url)
    ours = RetryingRDBStorage(url)
    study_id = plain.get_study_id_from_name("s")
    expected = plain.get_all_trials(study_id)
    got = ours.get_all_trials(study_id)
    assert got == expected  # same numbers, params, values, attributes, constraints
    assert [t.constraints for t in got] == [{"0": float(i - 3)} for i in range(6)]
    first, *rest = got
    for trial in rest:
        assert trial.distributions["plan"] is first.distributions["plan"]
        assert trial.distributions["batch_size"] is first.distributions["batch_size"]
        assert trial.user_attrs["worker"] is first.user_attrs["worker"]
    # the plain storage builds a new object for every trial: what the sharing saves
    assert expected[1].distributions["plan"] is not expected[0].distributions["plan"]
