"""The tuner as a real process: racing first starts, reading while writing, kill -9 and resume, Ctrl-C."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from optuna.trial import TrialState

from autotune.storage import LeaseKind, LeaseState, open_store
from autotune.storage.schema import HEAD_REVISION

from conftest import (
    AUTOTUNE,
    SECOND_OPINIONS,
    SYNTHETIC,
    alive,
    signal_as_a_trial_starts,
    stored_trials,
    trial_pids,
    trial_summary,
    wait_for,
)

SLOW = [
    "--",
    "--base-mib",
    "20",
    "--per-sample-mib",
    "4",
    "--step-seconds",
    "0.25",
    "--plan-effects",
    "A=0.5:0.25",
]


def tuner(cache: Path, study: str, trials: int, storage: str | None = None) -> subprocess.Popen[str]:
    options = (
        f"--budget 300MiB --trials {trials} --exhaustive --study {study} --plans none;A --batch-sizes 1-64"
    )
    options += " --steps 2"
    options += f" --warmup-steps 1 --device cpu --cache-dir {cache}"
    argv = [
        AUTOTUNE,
        "run",
        *options.split(),
        *(["--storage", storage] if storage else []),
        str(SYNTHETIC),
        *SLOW,
    ]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def trials_of(cache: Path, study: str, storage: str | None = None) -> list[optuna.trial.FrozenTrial]:
    return stored_trials(storage or f"sqlite:///{cache / 'autotune.db'}", study)


def test_eight_processes_racing_to_create_a_fresh_database(storage) -> None:
    argv = [AUTOTUNE, "studies", "--storage", storage]
    procs = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(8)
    ]
    outcomes = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    assert [code for code, _ in outcomes] == [0] * 8, outcomes
    engine = sqlalchemy.create_engine(storage.replace("postgresql://", "postgresql+psycopg://"))
    with engine.connect() as conn:
        assert conn.execute(sqlalchemy.text("SELECT version_num FROM autotune_alembic_version")).all() == [
            (HEAD_REVISION,)
        ]
        assert conn.execute(sqlalchemy.text("SELECT count(*) FROM alembic_version")).one() == (
            1,
        )  # optuna's own
    engine.dispose()


KINDS = ("measured", "verification")


def test_kill_9_mid_trial_then_resume(tmp_path, storage) -> None:
    # 7 trial runs: the probe, 5 search trials, the verification's 1; the kill lands on the third or, on a
    # loaded machine where that one started before the signal was armed, the fourth: a search trial either way
    first = tuner(tmp_path, "resume", trials=7, storage=storage)
    counted = lambda: sum("outcome" in t.user_attrs for t in trials_of(tmp_path, "resume", storage))  # noqa: E731
    measuring = lambda: [  # noqa: E731
        t
        for t in trials_of(tmp_path, "resume", storage)
        if t.state == TrialState.RUNNING and t.user_attrs.get("kind") == "measured"
    ]
    wait_for(lambda: counted() >= 2)

    # `best` from a second process while the run writes (not verified yet: answered from fitting trials),
    # started beside the kill rather than before it: waiting for it, on a loaded machine, let the run
    # reach its verification, and the kill hit that instead of a measured trial.
    best = [AUTOTUNE, "best", "--study", "resume", "--storage", storage, "--json"]
    answer = subprocess.Popen(best, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    signal_as_a_trial_starts(first, signal.SIGKILL, tmp_path)
    first.wait()
    out, err = answer.communicate(timeout=60)
    assert answer.returncode == 0, err
    assert json.loads(out)["verified"] is False

    running = measuring()
    assert len(running) == 1, trial_summary(trials_of(tmp_path, "resume", storage))  # the one it interrupted
    interrupted = running[0]
    time.sleep(1.0)
    assert [pid for pid in trial_pids(tmp_path) if alive(pid)] == []

    second = tuner(tmp_path, "resume", trials=5, storage=storage)
    _, err = second.communicate(timeout=300)
    assert second.returncode == 0, err
    assert "1 interrupted trial(s) failed and queued for one retry" in err
    trials = trials_of(tmp_path, "resume", storage)
    assert [t.number for t in trials] == list(range(len(trials)))  # numbering continues
    assert trials[interrupted.number].state == TrialState.FAIL
    assert re.fullmatch(
        rf"worker {re.escape(socket.gethostname())}:{first.pid}:\d+ died; retried once",
        trials[interrupted.number].user_attrs["note"],
    )
    retries = [t for t in trials if t.user_attrs.get("retry_of") == interrupted.number]
    assert len(retries) == 1
    assert retries[0].params == interrupted.params
    assert retries[0].user_attrs["outcome"] == "complete"
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    # the second run's trial runs, the retry among them, within its --trials 5 (how many of them the search
    # takes depends on where the kill fell: the third search trial, or on a loaded machine the fourth)
    second_runs = [t for t in trials if t.number > interrupted.number and t.user_attrs.get("kind") in KINDS]
    assert len(second_runs) <= 5 and all("outcome" in t.user_attrs for t in second_runs)
    assert {t.user_attrs["kind"] for t in second_runs} == set(KINDS)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_stops_the_trial_and_keeps_what_was_measured(tmp_path, sig: int) -> None:
    """SIGTERM, what a batch scheduler sends, is a Ctrl-C too (issue 27: `run` died at once, its trial
    left RUNNING)."""
    proc = tuner(tmp_path, "interrupt", trials=6)
    wait_for(lambda: sum("outcome" in t.user_attrs for t in trials_of(tmp_path, "interrupt")) >= 2)
    signal_as_a_trial_starts(proc, sig, tmp_path)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "Interrupted: the running trial was stopped. The same command resumes the run" in err
    assert trial_pids(tmp_path) == []
    trials = trials_of(tmp_path, "interrupt")
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    (failed,) = [t for t in trials if t.state == TrialState.FAIL]
    # a search trial's configuration is retried by the next run; a verification is not (the next run
    # verifies again): on a loaded machine the signal can fall on the verification
    retried = "" if failed.user_attrs.get("kind") == "verification" else "; retried once"
    assert failed.user_attrs["note"] == "interrupted" + retried, failed.user_attrs
    assert sum("outcome" in t.user_attrs for t in trials) >= 2  # kept


def test_a_second_run_of_a_study_being_tuned_shares_the_work(tmp_path, storage) -> None:
    """Two runs of one study at once (the same code path as two workers): every configuration is
    measured once, and both report the same verified winner."""
    first = tuner(tmp_path, "shared", trials=8, storage=storage)
    wait_for(
        lambda: (
            first.poll() is not None
            or any(t.state == TrialState.RUNNING for t in trials_of(tmp_path, "shared", storage))
        )
    )
    assert first.poll() is None, first.communicate()  # it ended before its first trial: say why
    second = tuner(tmp_path, "shared", trials=8, storage=storage)
    outputs = [p.communicate(timeout=300) for p in (first, second)]
    assert [first.returncode, second.returncode] == [0, 0], outputs
    trials = trials_of(tmp_path, "shared", storage)
    measured = [
        (t.params["batch_size"], t.params["plan"])
        for t in trials
        if t.user_attrs["kind"] == "measured" and t.user_attrs.get("proposed_by") not in SECOND_OPINIONS
    ]
    summary = trial_summary(trials)
    assert len(measured) == len(set(measured)) == 8, summary
    workers = {t.user_attrs["worker"].split(":")[1] for t in trials if t.user_attrs["kind"] == "measured"}
    assert workers == {str(first.pid), str(second.pid)}, summary
    assert [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)] == []
    verified = [t for t in trials if t.user_attrs["kind"] == "verification"]
    # One verification at a time (its rivals re-measured beside it when it has any: here none@48 and A:1@48
    # tie), shared by both runs: one that ends done; before it, only leaders whose verification failed
    # (a loaded machine's runs once took two leases, the first of them not done).
    leases = sorted(open_store(storage).leases("shared", kinds=(LeaseKind.VERIFY,)), key=lambda x: x.id)
    states = [x.state for x in leases]
    shown = [(x.id, x.batch_size, x.plan, x.attempt, x.state.value, x.worker, x.note) for x in leases]
    assert states == [LeaseState.FAILED] * (len(leases) - 1) + [LeaseState.DONE], shown
    assert {t.user_attrs["lease"] for t in verified} <= {x.id for x in leases}, summary
    answer = subprocess.run(
        [AUTOTUNE, "best", "--study", "shared", "--storage", storage, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    data = json.loads(answer.stdout)
    assert data["verified"] and (data["batch_size"], data["plan"]) in {
        tuple(t.params.values()) for t in verified
    }
