"""What an open study's trials cost in a tuner's RSS: Optuna's cache holds every trial of a study it has
read (its sampler reads them all), so a long `autotune run` grows with its study (bench/soak.py --run).

    .venv/bin/python bench/study_cache_memory.py [TRIALS]

Writes TRIALS trials shaped like autotune's (two categorical parameters over a 25 x 42 space, twelve user
attributes, a constraint) into a temporary SQLite study; then fresh processes (as a tuner reads them) load
them twice, and print what the second load's cache added: to the Python heap (tracemalloc, exact), and to
the RSS (three processes: it moves in pymalloc's arenas).
"""

from __future__ import annotations

import subprocess
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
                    # what autotune stores: a few values repeated by every trial, a few unique to each
                    user_attrs={
                        name: f"{name}-{i}" if name in ("log_dir", "lease") else name for name in ATTRS
                    },
                    constraints={"memory": -1.0},
                )
            )
        # tracemalloc's own bookkeeping inflates RSS: the heap is measured in one process, RSS in others.
        # Optuna's own RDBStorage and autotune's (which shares distributions and short strings between
        # trials), interleaved.
        for storage in ("optuna", "autotune"):
            subprocess.run([sys.executable, __file__, "--heap", url, storage], check=True)
        for _ in range(3):  # RSS moves in pymalloc arenas: a few fresh processes
            for storage in ("optuna", "autotune"):
                subprocess.run([sys.executable, __file__, "--rss", url, storage], check=True)


def measure(url: str, heap: bool, storage: str) -> None:
    """In this fresh process: load the study once (imports, first caches), then again through a second
    study object and storage; what the second cache added to the Python heap (tracemalloc), or to the RSS."""
    import tracemalloc

    from autotune.storage.optuna_storage import RetryingRDBStorage

    kind = RetryingRDBStorage if storage == "autotune" else optuna.storages.RDBStorage
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.load_study(study_name="m", storage=kind(url)).get_trials(deepcopy=False)
    if heap:
        tracemalloc.start()
    before = rss_kib()
    held = optuna.load_study(study_name="m", storage=kind(url)).get_trials(deepcopy=False)
    grown = tracemalloc.get_traced_memory()[0] // 1024 if heap else rss_kib() - before
    what = "Python heap (tracemalloc)" if heap else "RSS"
    print(
        f"{storage:>8}: {len(held)} trials cached: {what} +{grown} KiB, {grown / len(held):.1f} KiB a trial"
    )


if __name__ == "__main__":
    if sys.argv[1:2] in (["--heap"], ["--rss"]):
        measure(sys.argv[2], heap=sys.argv[1] == "--heap", storage=sys.argv[3])
    else:
        main()
