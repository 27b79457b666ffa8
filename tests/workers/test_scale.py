"""Many workers sharing jobs through one database (docs/reliability.md: the 60 s busy timeout was needed at 32
workers): 32 `autotune worker` processes on SQLite and 8 on PostgreSQL, 320 counted trials each, synthetic
trials of a fraction of a second. Exactly the configured trials complete, no configuration is measured
twice, nothing is left FAIL, RUNNING or WAITING, and no worker dies.

Marked ``scale``: `make test` leaves it out and `make test-scale` (CI's second phase) runs it alone.
"""

from __future__ import annotations

import collections
import subprocess
from pathlib import Path

import pytest
from optuna.trial import TrialState

from conftest import AUTOTUNE, SYNTHETIC, stored_trials, trial_summary

pytestmark = pytest.mark.scale

BATCHES = ",".join(str(b) for b in range(1, 33))  # 32 batch sizes x 2 plans: 64 configurations a job


def submit_jobs(storage: str, jobs: int, trials: int) -> list[str]:
    names = [f"scale-{j}" for j in range(jobs)]
    for j, name in enumerate(names):
        argv = [
            AUTOTUNE,
            "submit",
            "--budget",
            "2GiB",
            "--trials",
            str(trials),
            "--exhaustive",
            "--study",
            name,
        ]
        argv += ["--plans", "none;A", "--batch-sizes", BATCHES, "--steps", "1", "--warmup-steps", "1"]
        argv += ["--storage", storage, str(SYNTHETIC), "--", "--base-mib", "4", "--per-sample-mib", "0.05"]
        argv += ["--step-seconds", f"{0.01 + j / 10000:.4f}", "--plan-effects", "A=0.5:0.2"]  # own workloads
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
    return names


def work(storage: str, cache: Path, workers: int) -> list[tuple[int, str]]:
    argv = [AUTOTUNE, "worker", "--once", "--devices", "cpu", "--storage", storage, "--cache-dir", str(cache)]
    procs = [
        subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for _ in range(workers)
    ]
    return [(p.wait(timeout=900), p.stderr.read()) for p in procs]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("backend", "workers", "jobs", "trials"),
    [("sqlite", 32, 16, 20), pytest.param("postgres", 8, 8, 40, marks=pytest.mark.postgres)],
)
def test_many_workers_share_many_trials_exactly(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str, workers: int, jobs: int, trials: int
) -> None:
    if backend == "sqlite":
        storage = f"sqlite:///{tmp_path / 'autotune.db'}"
    else:
        storage = request.getfixturevalue("postgres_url")
    names = submit_jobs(storage, jobs, trials)
    outcomes = work(storage, tmp_path, workers)
    assert [code for code, _ in outcomes] == [0] * workers, [err[-2000:] for code, err in outcomes if code]
    for name in names:
        found = stored_trials(storage, name)
        summary = trial_summary(found)
        counted = [t for t in found if t.user_attrs.get("kind") == "measured" and "outcome" in t.user_attrs]
        assert len(counted) == trials, summary
        configs = collections.Counter((t.params["batch_size"], t.params["plan"]) for t in counted)
        assert max(configs.values()) == 1, summary  # each configuration measured once
        assert [
            t for t in found if t.state in (TrialState.FAIL, TrialState.RUNNING, TrialState.WAITING)
        ] == []
        assert all(t.user_attrs["outcome"] == "complete" for t in counted), summary
