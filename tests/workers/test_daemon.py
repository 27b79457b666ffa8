"""The daemon as real processes: `autotune submit` + `autotune worker` on SQLite and a real PostgreSQL,
with workers killed, stopped and locked out (docs/reliability.md's storage suite)."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from optuna.trial import TrialState

from autotune.core.budget import parse_budget
from autotune.search.spec import TuneSpec
from autotune.storage.schema import HEAD_REVISION
from autotune.trials.command import TrialCommand
from autotune.trials.settings import TrialSettings
from autotune.workers.signing import JobKey
from autotune.workers.tune import tune

from conftest import (
    AUTOTUNE,
    ROOT,
    SCRIPTS,
    SECOND_OPINIONS,
    SYNTHETIC,
    TEST_JOB_KEY,
    signal_as_a_trial_starts,
    stored_trials,
    trial_pids,
    trial_summary,
    wait_for,
)

MODEL = "--base-mib 20 --per-sample-mib 4 --plan-effects A=0.5:0.25,B=0.25:0.1"


def submit(storage: str, cache: Path, study: str, trials: int, step_seconds: float = 0.1) -> None:
    options = (
        f"--budget 300MiB --trials {trials} --exhaustive --study {study} --plans none;A;B --batch-sizes 1-64"
        " --steps 2"
    )
    argv = [AUTOTUNE, "submit", *options.split(), "--warmup-steps", "1", "--storage", storage]
    argv += [
        "--cache-dir",
        str(cache),
        str(SYNTHETIC),
        "--",
        *MODEL.split(),
        "--step-seconds",
        str(step_seconds),
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (0, f"job {study}: open\n"), proc.stderr


def worker(storage: str, cache: Path, host: str | None = None, once: bool = True, **env: str):
    argv = [AUTOTUNE, "worker", "--devices", "cpu", "--storage", storage, "--cache-dir", str(cache)]
    # 6 s (a beat every second): with 3 s, CI's loaded machine once starved a live worker's beats that long,
    # and the others took it for dead (its configuration retried, the retry then the killed trial)
    environ = {**os.environ, "AUTOTUNE_HEARTBEAT_GRACE": "6", **env}
    if host:
        environ["AUTOTUNE_WORKER_HOST"] = host
    return subprocess.Popen(
        argv + (["--once"] if once else []),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environ,
    )


def measured(trials: list[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    return [t for t in trials if t.user_attrs.get("kind") == "measured"]


def job_state(storage: str, study: str) -> str:
    engine = sqlalchemy.create_engine(storage.replace("postgresql://", "postgresql+psycopg://"))
    with engine.connect() as conn:
        state = conn.execute(
            sqlalchemy.text("SELECT state FROM autotune_jobs WHERE study_name = :s"), {"s": study}
        ).scalar_one()
    engine.dispose()
    return state


def assert_finished_cleanly(storage: str, study: str, trials: int) -> list[optuna.trial.FrozenTrial]:
    """The job is done: `trials` distinct configurations measured (second opinions aside), nothing RUNNING or WAITING, every
    verification complete, and `autotune best` answers with a verified configuration. (How many
    verifications depends on how close the rivals read: tests/search/test_noise.py counts them.)"""
    found = stored_trials(storage, study)
    assert [t.number for t in found if t.state in (TrialState.RUNNING, TrialState.WAITING)] == []
    counted = [
        t
        for t in measured(found)
        if t.state == TrialState.COMPLETE and t.user_attrs.get("proposed_by") not in SECOND_OPINIONS
    ]
    configs = [(t.params["batch_size"], t.params["plan"]) for t in counted]
    assert len(configs) == len(set(configs)) == trials, configs
    verifications = [t for t in found if t.user_attrs.get("kind") == "verification"]
    assert verifications and {t.state for t in verifications} == {TrialState.COMPLETE}
    assert job_state(storage, study) == "done"
    answer = subprocess.run(
        [AUTOTUNE, "best", "--study", study, "--storage", storage, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    data = json.loads(answer.stdout)
    assert data["verified"] is True
    assert (data["batch_size"], data["plan"]) in {
        (t.params["batch_size"], t.params["plan"]) for t in verifications
    }
    return found


def test_three_workers_share_a_job_with_nothing_lost_or_duplicated(tmp_path, storage) -> None:
    submit(storage, tmp_path, "shared", trials=12)
    workers = [worker(storage, tmp_path) for _ in range(3)]
    outputs = [w.communicate(timeout=300) for w in workers]
    assert [w.returncode for w in workers] == [0, 0, 0], outputs
    found = assert_finished_cleanly(storage, "shared", 12)
    assert [t.number for t in found if t.state == TrialState.FAIL] == []
    ran_by = {t.user_attrs["worker"] for t in measured(found)}
    assert len(ran_by) >= 2, ran_by  # the work was shared
    assert all("Traceback" not in err for _, err in outputs), outputs
    says = re.compile(  # every worker says what it runs, and that the job's signature verified
        rf"\[cpu\] job shared: signature verified \(key [0-9a-f]{{8}}\); runs {re.escape(str(SYNTHETIC))} "
        rf"{re.escape(MODEL)} --step-seconds 0\.1 \(in {re.escape(os.getcwd())}\)"
    )
    assert all(says.search(err) for _, err in outputs), outputs


def test_a_killed_worker_s_trial_is_retried_once_by_the_others(tmp_path, storage) -> None:
    """The Done-when: two workers (one on a simulated other host, judged by its heartbeat), a third
    started later; the other-host worker is SIGKILLed mid-trial."""
    submit(storage, tmp_path, "faults", trials=8, step_seconds=0.25)
    doomed = worker(storage, tmp_path, host="simulated-host")
    steady = worker(storage, tmp_path)

    def doomed_is_measuring():
        return [
            t
            for t in measured(stored_trials(storage, "faults"))
            if t.state == TrialState.RUNNING and t.user_attrs.get("worker", "").startswith("simulated-host:")
        ]

    wait_for(doomed_is_measuring)  # past the job's probe
    signal_as_a_trial_starts(doomed, signal.SIGKILL, tmp_path, started_by=doomed.pid)
    doomed.wait()
    running = doomed_is_measuring()  # its trial stays RUNNING until the others judge it dead (6 s)
    assert len(running) == 1, trial_summary(stored_trials(storage, "faults"))
    killed = running[0]
    time.sleep(1.0)
    assert trial_pids(tmp_path, doomed.pid) == []  # its trial died with it (PDEATHSIG)

    late = worker(storage, tmp_path)
    outputs = [w.communicate(timeout=300) for w in (steady, late)]
    assert [steady.returncode, late.returncode] == [0, 0], outputs

    found = stored_trials(storage, "faults")
    assert found[killed.number].state == TrialState.FAIL
    assert re.fullmatch(
        r"worker simulated-host:\d+:\d+ stopped heartbeating for 6s; retried once",
        found[killed.number].user_attrs["note"],
    )
    retries = [t for t in found if t.user_attrs.get("retry_of") == killed.number]
    assert len(retries) == 1 and retries[0].params == killed.params
    assert retries[0].state == TrialState.COMPLETE
    failed = [t.number for t in found if t.state == TrialState.FAIL]
    assert failed == [killed.number]
    # Every configuration measured once, the killed one twice (its failed run and its retry).
    assert_finished_cleanly(storage, "faults", 8)


def test_sigterm_stops_a_worker_cleanly_and_another_finishes_its_trial(tmp_path, storage) -> None:
    submit(storage, tmp_path, "stopped", trials=4, step_seconds=0.25)
    first = worker(storage, tmp_path)
    wait_for(
        lambda: [t for t in measured(stored_trials(storage, "stopped")) if t.state == TrialState.RUNNING]
    )
    signal_as_a_trial_starts(first, signal.SIGTERM, tmp_path, started_by=first.pid)
    _, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    assert "stopping (SIGTERM)" in err and "stopped" in err.splitlines()[-1]
    assert trial_pids(tmp_path, first.pid) == []
    found = stored_trials(storage, "stopped")
    assert [t.number for t in found if t.state == TrialState.RUNNING] == []
    released = [t for t in found if t.user_attrs.get("note") == "released: its worker was stopped"]
    assert len(released) == 1 and released[0].state == TrialState.FAIL, released
    stopped = released[0]
    assert stopped.user_attrs["kind"] == "measured"
    assert job_state(storage, "stopped") == "running"

    second = worker(storage, tmp_path)
    _, err = second.communicate(timeout=300)
    assert second.returncode == 0, err
    found = assert_finished_cleanly(storage, "stopped", 4)
    rerun = [t for t in measured(found) if t.params == stopped.params and t.state == TrialState.COMPLETE]
    assert len(rerun) == 1 and rerun[0].user_attrs["proposed_by"] == "released"


def test_an_outside_lock_held_for_twice_the_busy_timeout_loses_nothing(tmp_path, storage) -> None:
    submit(storage, tmp_path, "locked", trials=6, step_seconds=0.3)
    proc = worker(storage, tmp_path, AUTOTUNE_BUSY_TIMEOUT="2")
    wait_for(
        lambda: (
            len([t for t in measured(stored_trials(storage, "locked")) if t.state == TrialState.COMPLETE])
            >= 2
        )
    )
    if storage.startswith("sqlite"):
        conn = sqlite3.connect(storage.removeprefix("sqlite:///"), timeout=10)
        conn.execute("BEGIN EXCLUSIVE")
        time.sleep(4.0)  # 2x the worker's busy timeout: its writes fail with "database is locked"
        conn.rollback()
        conn.close()
    else:
        engine = sqlalchemy.create_engine(storage.replace("postgresql://", "postgresql+psycopg://"))
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SET lock_timeout = '10s'"))
            conn.execute(
                sqlalchemy.text(
                    "LOCK TABLE trials, trial_user_attributes, autotune_leases IN ACCESS EXCLUSIVE MODE"
                )
            )
            time.sleep(4.0)
            conn.rollback()
        engine.dispose()
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "AssertionError" not in err and "Traceback" not in err, err
    if storage.startswith("sqlite"):  # PostgreSQL waits for the lock instead of failing
        path = storage.removeprefix("sqlite:///")  # the line says what it waits for, and for how long at most
        assert (
            f"the database {path} is busy or unreachable, retrying for up to 10 min: "
            "(sqlite3.OperationalError) database is locked"
        ) in err
    found = assert_finished_cleanly(storage, "locked", 6)
    assert [t.number for t in found if t.state == TrialState.FAIL] == []


def test_a_worker_refuses_a_job_whose_script_differs_here(tmp_path) -> None:
    storage = f"sqlite:///{tmp_path / 'autotune.db'}"
    script = tmp_path / "train.py"
    script.write_text(SYNTHETIC.read_text())
    argv = [AUTOTUNE, "submit", "--budget", "300MiB", "--study", "theirs", "--storage", storage, str(script)]
    assert subprocess.run(argv, capture_output=True, timeout=60).returncode == 0
    script.write_text(SYNTHETIC.read_text() + "\n# edited on this host\n")
    proc = worker(storage, tmp_path)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert f"[cpu] refused: job theirs: this host's {script} differs from the submitted script" in err
    assert job_state(storage, "theirs") == "open"


def test_studies_lists_submitted_jobs_and_their_state(tmp_path) -> None:
    storage = f"sqlite:///{tmp_path / 'autotune.db'}"
    submit(storage, tmp_path, "queued", trials=3)
    listing = subprocess.run(
        [AUTOTUNE, "studies", "--storage", storage], capture_output=True, text=True, timeout=60
    )
    row = next(line for line in listing.stdout.splitlines() if "queued" in line)
    assert re.split(r"\s{2,}", row.strip())[1:5] == ["300MiB", "0", "-", "open"], row


def test_bad_devices_are_one_line() -> None:
    proc = subprocess.run(
        [AUTOTUNE, "worker", "--devices", "gpu0", "--once"], capture_output=True, text=True, timeout=60
    )
    assert (proc.returncode, proc.stderr) == (
        2,
        "Error: --devices: expected auto, cpu or GPU indices like 0,1, got 'gpu0'\n",
    )


@pytest.mark.scale  # a worker process for most of a minute: the scale phase's kind of test
def test_a_worker_soak_keeps_fds_and_memory_stable(tmp_path) -> None:
    """bench/soak.py with 80 trials in 8 jobs (its default, 500 in 20, is in bench/results/soak-cpu.txt).

    Per-job state kept by a worker after the job is done (an engine per job, each job's Optuna cache)
    grew the worker by 4 fds and 7 MiB over 20 jobs before it was fixed."""
    sys.path.insert(0, str(ROOT / "bench"))
    import soak

    samples, _, code = soak.soak(80, tmp_path, jobs=8)
    assert code == 0
    early, last = soak.steady(samples, 80)
    assert last.trials >= 80
    assert last.fds == early.fds, (early, last)
    assert abs(last.rss_kib - early.rss_kib) <= 0.05 * early.rss_kib, (early, last)
    assert max(s.zombies for s in samples) <= 1  # at most the trial being reaped at the sampling instant


def test_a_0001_database_is_backed_up_and_upgraded_keeping_its_trials(tmp_path) -> None:
    from autotune.storage import open_store

    path = tmp_path / "autotune.db"
    open_store(f"sqlite:///{path}")
    with sqlite3.connect(path) as conn:  # what autotune 0001 left: no jobs, no leases
        conn.execute("DROP TABLE autotune_leases")
        conn.execute("DROP TABLE autotune_jobs")
        for column in ("samples_per_sec_low", "samples_per_sec_high", "readings", "certainty"):  # 0003, 0005
            conn.execute(f"ALTER TABLE autotune_best DROP COLUMN {column}")
        conn.execute("UPDATE autotune_alembic_version SET version_num = '0001'")
    study = optuna.create_study(storage=f"sqlite:///{path}", study_name="old")

    def objective(trial: optuna.Trial) -> float:  # autotune <= 0003 stored its constraint this way
        trial.set_constraint("memory", [-1.0, 0.0, 2.5][trial.number])
        return trial.suggest_float("x", 0, 1)

    study.optimize(objective, n_trials=3)
    proc = subprocess.run(
        [AUTOTUNE, "studies", "--cache-dir", str(tmp_path)], capture_output=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT version_num FROM autotune_alembic_version").fetchall() == [("0006",)]
        assert conn.execute("SELECT count(*) FROM autotune_leases").fetchall() == [(0,)]
        # 0004: the constraint in the list form optuna-dashboard reads, and only there
        stored = "SELECT key, value_json FROM trial_system_attributes WHERE key LIKE 'constraints%' ORDER BY trial_id"
        assert conn.execute(stored).fetchall() == [
            ("constraints", "[-1.0]"),
            ("constraints", "[0.0]"),
            ("constraints", "[2.5]"),
        ]
    trials = optuna.load_study(study_name="old", storage=f"sqlite:///{path}").trials
    assert [t.constraints for t in trials] == [{"0": -1.0}, {"0": 0.0}, {"0": 2.5}]
    backups = list(tmp_path.glob("autotune.db.backup-0001-*"))
    assert len(backups) == 1
    with sqlite3.connect(backups[0]) as conn:
        assert conn.execute("SELECT count(*) FROM trials").fetchall() == [(3,)]
    upgraded = f"autotune upgraded its tables from schema 0001 to {HEAD_REVISION}; the old one is kept at {backups[0]}"
    assert upgraded in proc.stderr.decode().splitlines()  # one line says it, with the backup's path


def _overlapping(trials: list[optuna.trial.FrozenTrial]) -> bool:
    """Whether two of ``trials`` ran at the same time (a structural fact of their stored intervals)."""
    spans = sorted((t.datetime_start, t.datetime_complete) for t in trials if t.datetime_complete)
    return any(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans))


def test_run_with_helper_devices_runs_trials_of_its_job_in_parallel(tmp_path) -> None:
    """`run` on several devices: the extra ones are daemon.Worker threads of the same process, sharing the
    job through the leases and the run's --trials (two CPU 'devices' here; with --device auto on a GPU
    machine, every GPU)."""
    spec = TuneSpec(
        command=TrialCommand.parse(
            [str(SYNTHETIC), *"--base-mib 8 --per-sample-mib 1 --step-seconds 0.15".split()]
        ),
        budget=parse_budget("1GiB"),
        trials=10,  # of every kind, the helper's included: the probe's, 8 search trials, the verification's 1
        exhaustive=True,  # eight trials, whatever the stopping rule would say
        batch_sizes=(1, 2, 4, 8, 16, 32),
        plans=("none", "A"),
        settings=TrialSettings(1, 3, 60, 120),
        device="cpu",
        helpers=("cpu",),
        cache_dir=tmp_path,
        study="helped",
    )
    unkeyed = {k: v for k, v in os.environ.items() if k != "AUTOTUNE_JOB_KEY"}  # no shared key: run's own
    result = tune(spec, environ=unkeyed)
    trials = stored_trials(f"sqlite:///{tmp_path / 'autotune.db'}", "helped")
    measured = [t for t in trials if t.user_attrs.get("kind") == "measured" and "outcome" in t.user_attrs]
    assert len(measured) == 8
    configs = [(t.params["batch_size"], t.params["plan"]) for t in measured]
    assert len(set(configs)) == 8  # shared, never duplicated
    assert {t.state for t in trials} <= {TrialState.COMPLETE, TrialState.PRUNED}
    assert _overlapping(measured)  # the helper really ran beside the main search
    assert result.best.batch_size == 32
    assert trial_pids(tmp_path) == []
    with sqlite3.connect(tmp_path / "autotune.db") as db:  # signed with a key of the run's own, no one else's
        signature = db.execute("SELECT signature FROM autotune_jobs WHERE study_name = 'helped'").fetchone()[
            0
        ]
    assert signature.startswith("v1:") and signature.split(":")[1] != JobKey(TEST_JOB_KEY.encode(), "").key_id


def test_run_with_device_auto_uses_every_gpu(tmp_path) -> None:
    """FAKE NVML (tests/fake_nvml.py): two fake GPUs; `--device auto` measures on both, each trial on the
    GPU it was pinned to (CUDA_VISIBLE_DEVICES = that GPU's UUID), memory read from that GPU."""
    from fake_nvml import FakeGpu, FakeNvml

    nvml = FakeNvml(
        gpus=[
            FakeGpu("GPU-aaaa", usage_file=tmp_path / "GPU-aaaa"),
            FakeGpu("GPU-bbbb", usage_file=tmp_path / "GPU-bbbb"),
        ]
    )
    spec = TuneSpec(
        command=TrialCommand.parse(
            [str(SCRIPTS / "fake_gpu_trial.py"), *"--per-sample-mib 100 --step-seconds 0.15".split()]
        ),
        budget=parse_budget("1GiB"),
        trials=6,
        batch_sizes=(1, 2, 4, 8, 16),
        plans=("none",),
        settings=TrialSettings(1, 3, 60, 120),
        cache_dir=tmp_path / "cache",
        study="gpus",
    )
    environ = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    result = tune(spec, environ={**environ, "FAKE_GPU_USAGE_DIR": str(tmp_path)}, nvml=nvml)
    trials = stored_trials(f"sqlite:///{tmp_path / 'cache' / 'autotune.db'}", "gpus")
    measured = [t for t in trials if "outcome" in t.user_attrs and t.user_attrs.get("kind") == "measured"]
    assert {t.user_attrs["device"] for t in measured} == {"cuda:0", "cuda:1"}
    for t in measured:  # each trial's peak is its own batch's fake GPU memory, from the GPU it ran on
        assert t.user_attrs["peak_bytes"] == t.params["batch_size"] * 100 * 2**20
    assert (result.best.batch_size, result.best.plan) == (8, "none")  # 16 x 100 MiB > 1 GiB x 0.95
