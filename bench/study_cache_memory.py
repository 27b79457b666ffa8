"""What an open study's trials cost in a tuner's RSS: Optuna's cache holds every trial of a study it has
read (its sampler reads them all), so a long `autotune run` grows with its study (bench/soak.py --run).

    .venv/bin/python bench/study_cache_memory.py [TRIALS]

Writes TRIALS trials shaped like autotune's (two categorical parameters over a 25 x 42 space, twelve user
attributes, a constraint) into a temporary SQLite study, then loads them through a second study object in
the same process and prints the RSS it added, per trial.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import optuna
from optuna.distributions import CategoricalDistribution

ATTRS = ("outcome", "peak_bytes", "samples_per_sec", "log_dir", "error", "worker", "device", "note", "kind")
ATTRS += ("proposed_by", "lease", "memory_method")


def rss_kib() -> int:
    return int(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmRSS")))


def main() -> None:
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = {
        "batch_size": CategoricalDistribution(tuple(range(1, 26))),
        "plan": CategoricalDistribution(("none", *(f"L{i}" for i in range(1, 42)))),
    }
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'study.db'}"
        study = optuna.create_study(study_name="m", storage=url, direction="maximize")
        for i in range(trials):
            study.add_trial(
                optuna.trial.create_trial(
                    params={"batch_size": 1 + i % 25, "plan": "none"},
                    distributions=space,
                    value=1.0,
                    user_attrs={name: "x" * 20 for name in ATTRS},
                    constraints={"memory": -1.0},
                )
            )
        optuna.load_study(study_name="m", storage=url).get_trials(deepcopy=False)  # warm: imports, caches
        before = rss_kib()
        held = optuna.load_study(study_name="m", storage=url).get_trials(deepcopy=False)
        grown = rss_kib() - before
    print(
        f"{len(held)} trials cached by a study object: +{grown} KiB RSS, {grown / len(held):.1f} KiB a trial"
    )


if __name__ == "__main__":
    main()
