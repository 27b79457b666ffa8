"""Safe to share, round 2 (issue 40): an attacker who can write the shared database but holds no job key.

Every row a worker, ``run``, ``best``, ``report`` or ``gc`` reads that the job's signature does not cover is
planted or edited here, as such a writer would, on a real SQLite file and on the suite's PostgreSQL server
(where the shared role owns the tables and can change a column's type first). Real ``autotune submit`` and
``autotune worker`` processes; each test names what happened before the change."""

from __future__ import annotations

import datetime as dt
import re
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy
from workers.test_signed_jobs import engine, submitted, worker

from autotune.core.errors import InputError
from autotune.core.plans import Backend, parse_plan
from autotune.hardware.devices import cpu_device
from autotune.hardware.meters import RssMeter
from autotune.leases.identity import host_name
from autotune.storage.database import parse_url, redact
from autotune.trials.command import TrialCommand, fill
from autotune.trials.measurement import run_trial
from autotune.trials.settings import TrialSettings
from autotune.trials.workload import workload_of
from autotune.workers.signing import JobKey

from conftest import SYNTHETIC, TEST_JOB_KEY


def shell_template(tmp_path: Path) -> list[str]:
    """A signed template that passes ``{batch_size}`` through a shell, as a user's ``bash -c`` job does."""
    script = tmp_path / "train.py"
    script.write_text(SYNTHETIC.read_text())
    return ["sh", "-c", f"{sys.executable} {script} --base-mib 8 --seed {{batch_size}}"]


def plant_lease(storage: str, study: str, kind: str, batch: Any, plan: str = "none", **more: Any) -> None:
    """A lease row as a writer of the database inserts it (any value in any column)."""
    row = {"study_name": study, "kind": kind, "batch_size": batch, "plan": plan, "attempt": 0,
           "state": "queued", "worker": None, "device": None, "trial_number": None, "beats": 0,
           "note": "planted", "updated_at": dt.datetime(2026, 1, 1), **more}  # fmt: skip
    names = ", ".join(row)
    values = ", ".join(f":{k}" for k in row)
    with engine(storage).begin() as conn:
        conn.execute(sqlalchemy.text(f"INSERT INTO autotune_leases ({names}) VALUES ({values})"), row)


def probe_key(command: list[str]) -> str:
    """The probe lease's key of ``command`` on this CPU (autotune.search.probing)."""
    return f"workload-{workload_of(TrialCommand.parse(command), cpu_device(), Backend.TORCH).fingerprint}"


def display(storage: str) -> str:
    """How autotune names the database in a line (the password hidden)."""
    return redact(parse_url(storage))


def job_state(storage: str, study: str) -> str:
    with engine(storage).connect() as conn:
        query = "SELECT state FROM autotune_jobs WHERE study_name = :s"
        return str(conn.execute(sqlalchemy.text(query), {"s": study}).scalar_one())


def text_column(storage: str) -> None:
    """On PostgreSQL, what the shared role can do first: make the batch column take text."""
    if storage.startswith("postgresql"):
        with engine(storage).begin() as conn:
            conn.execute(sqlalchemy.text("ALTER TABLE autotune_leases ALTER COLUMN batch_size TYPE text"))


def test_a_probe_lease_planted_with_a_shell_command_for_batch_runs_nothing(
    tmp_path: Path, storage: str
) -> None:
    """Before: the worker said "signature verified" and ran ``touch PWNED`` through the signed template."""
    canary = tmp_path / "PWNED"
    command = shell_template(tmp_path)
    submitted(storage, "shell-job", *command)
    text_column(storage)
    plant_lease(storage, probe_key(command), "probe", f"1; touch {canary} #")

    lines = worker(storage, tmp_path / "cache")

    assert not canary.exists()
    damaged = (f"[cpu] job shell-job failed: database {display(storage)}: lease 1 of study "
               f"'{probe_key(command)}' is damaged: its batch_size '1; touch {canary} #' is not a whole "
               "number >= 1")  # fmt: skip
    assert damaged in lines, lines
    assert lines[-1] == "worker: 0 trial(s); jobs done: -; failed: shell-job; refused: -"
    assert job_state(storage, "shell-job") == "failed"


def test_a_batch_that_is_not_a_whole_number_reaches_no_command_whoever_asks(tmp_path: Path) -> None:
    """fill() and the trial launcher refuse it themselves, before anything starts (the lease check above is
    one caller of many)."""
    template = ["sh", "-c", "python train.py --bs {batch_size}"]
    for bad in ("1; touch x #", "1", 0, -2, True, 1.0):
        with pytest.raises(InputError, match=r"^a trial's batch size must be a whole number >= 1, got "):
            fill(template, bad, None)  # type: ignore[arg-type]
        with pytest.raises(InputError, match=r"^a trial's batch size must be a whole number >= 1, got "):
            run_trial(TrialCommand.parse(template), bad, parse_plan("none"), cpu_device(), RssMeter(),  # type: ignore[arg-type]
                      TrialSettings(), tmp_path, {})  # fmt: skip
    with pytest.raises(
        InputError, match=r"^a trial's gradient accumulation must be a whole number >= 1, got '2'"
    ):
        fill(template, 4, "2")  # type: ignore[arg-type]
    assert fill(template, 4, None) == ["sh", "-c", "python train.py --bs 4"]
    assert not (tmp_path / "trials").exists()


def test_a_clean_job_completes_beside_every_bad_row_and_the_worker_serves_on(
    tmp_path: Path, storage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: each bad row ended the worker (exit 1 or 2) and the clean job was never served."""
    script = tmp_path / "train.py"
    script.write_text(SYNTHETIC.read_text())
    for study in (
        "b-mac",
        "c-outside",
        "d-kind",
        "e-superscript",
        "f-optuna",
        "z-clean",
    ):  # z-clean: served last
        submitted(storage, study, str(script), "--base-mib", "8")
    # a signature whose MAC is not ASCII (hmac.compare_digest raised TypeError)
    with engine(storage).begin() as conn:
        conn.execute(sqlalchemy.text("UPDATE autotune_jobs SET signature = :s WHERE study_name = 'b-mac'"),
                     {"s": f"v1:{JobKey(TEST_JOB_KEY.encode(), '').key_id}:{'é' * 64}"})  # fmt: skip
    plant_lease(storage, "c-outside", "trial", 7)  # a batch the job's space (1-4) does not hold
    plant_lease(storage, "d-kind", "evil", 1)  # a kind no autotune writes
    plant_lease(storage, "e-superscript", "trial", 2, state="running", worker=f"{host_name()}:²:1")
    optuna.create_study(
        study_name="f-optuna", storage=storage.replace("postgresql://", "postgresql+psycopg://")
    )
    monkeypatch.setenv("AUTOTUNE_HEARTBEAT_GRACE", "3")  # the superscript worker's lease: dead after 3 s

    lines = worker(storage, tmp_path / "cache")

    db = display(storage)
    failed = [
        line for line in lines if line.startswith("[cpu]") and (" failed: " in line or "refused: " in line)
    ]
    assert failed == [
        "[cpu] refused: job b-mac: its signature is not one this autotune writes (v1:<key id>:<hmac>)",
        "[cpu] job c-outside failed: study 'c-outside': lease 1 from the database names batch 7 and plan 'none', "
        "which are not in the job's search space (the database was edited)",
        f"[cpu] job d-kind failed: database {db}: lease 2 of study 'd-kind' is damaged: its kind 'evil' is not a "
        "lease kind",
        f"[cpu] job f-optuna failed: study 'f-optuna' in {db} was not created by autotune, which never writes to "
        "it: choose another --study",
    ], lines
    summary = re.fullmatch(r"worker: \d+ trial\(s\); jobs done: (.*); failed: (.*); refused: (.*)", lines[-1])
    assert summary is not None, lines
    assert (sorted(summary[1].split(", ")), summary[2], summary[3]) == (
        ["e-superscript", "z-clean"], "c-outside, d-kind, f-optuna", "b-mac")  # fmt: skip
    assert [job_state(storage, s) for s in ("c-outside", "d-kind", "e-superscript", "z-clean")] == [
        "failed", "failed", "done", "done"]  # fmt: skip
    # the superscript worker's lease was taken for a dead worker's and its configuration retried
    assert any(re.fullmatch(r"\[cpu\] trial \d+: batch 2, plan none \(retry\)", line) for line in lines), (
        lines
    )
