"""Signed jobs (issue 27, item 1): a worker runs only a job whose signature verifies under the key it holds
and whose scripts hash here as submitted. Real `autotune submit` and `autotune worker` processes, a real
SQLite file and the suite's PostgreSQL server; each way the probes found to make a worker run a command
(before: every one of them ran) is a row tampered with here, and is refused in one line with nothing run."""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import sqlalchemy

from autotune import api as autotune_api
from autotune.search.spec import tune_spec
from autotune.workers.signing import JobKey

from conftest import AUTOTUNE, SYNTHETIC, TEST_JOB_KEY

OTHER_KEY = "fedcba9876543210" * 4
QUICK = ["--budget", "300MiB", "--trials", "2", "--batch-sizes", "1-4", "--plans", "none", "--steps", "2",
         "--warmup-steps", "1"]  # fmt: skip


def autotune(*argv: str, **env: str | None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
    return subprocess.run([AUTOTUNE, *argv], capture_output=True, text=True, timeout=120, env=environ)


def submit(
    storage: str, study: str, *command: str, key: str | None = TEST_JOB_KEY, unsigned: bool = False
) -> None:
    flags = ["--unsigned"] if unsigned else []
    done = autotune(
        "submit", *QUICK, *flags, "--study", study, "--storage", storage, *command, AUTOTUNE_JOB_KEY=key
    )
    assert (done.returncode, done.stdout) == (0, f"job {study}: open\n"), done.stderr


def submitted(
    storage: str, study: str, *command: str, key: str = TEST_JOB_KEY, unsigned: bool = False
) -> None:
    """What `autotune submit` stores, from its own code in this process (the worker is what is tested)."""
    spec = tune_spec(
        command, "300MiB", batch_sizes="1-4", plans=["none"], trials=2, storage=storage, study=study
    )
    assert (
        autotune_api.submit(spec, unsigned=unsigned, environ={"AUTOTUNE_JOB_KEY": key}).state.value == "open"
    )


def worker(storage: str, cache: Path, *flags: str, key: str | None = TEST_JOB_KEY) -> list[str]:
    """A worker's stderr lines, after a run of `worker --once` that exited 0."""
    done = autotune("worker", "--once", "--devices", "cpu", "--storage", storage, "--cache-dir", str(cache), *flags,
                    AUTOTUNE_JOB_KEY=key)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return done.stderr.splitlines()


def engine(storage: str) -> sqlalchemy.Engine:
    return sqlalchemy.create_engine(storage.replace("postgresql://", "postgresql+psycopg://"))


def edit(storage: str, study: str, **columns: Any) -> None:
    """What anyone who can write the database can do: set a job row's columns."""
    values = {k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in columns.items()}
    sets = ", ".join(f"{k} = :{k}" for k in values)
    with engine(storage).begin() as conn:
        conn.execute(
            sqlalchemy.text(f"UPDATE autotune_jobs SET {sets} WHERE study_name = :s"), {**values, "s": study}
        )


def stored(storage: str, study: str) -> dict[str, Any]:
    with engine(storage).connect() as conn:
        row = conn.execute(
            sqlalchemy.text("SELECT CAST(spec AS TEXT), state FROM autotune_jobs WHERE study_name = :s"),
            {"s": study},
        ).one()
    return {"spec": json.loads(row[0]), "state": row[1]}


def test_every_way_of_tampering_with_a_job_is_refused_in_one_line_and_nothing_runs(
    tmp_path: Path, storage: str
) -> None:
    script, plugin, pwned = tmp_path / "train.py", tmp_path / "plugin.py", tmp_path / "pwned"
    script.write_text(SYNTHETIC.read_text())
    plugin.write_text("# a second script the command names\n")
    for study in ("edited", "unhashed", "unsigned"):
        submitted(storage, study, str(script))
    submitted(storage, "foreign-key", str(script), key=OTHER_KEY)
    submitted(
        storage,
        "two-scripts",
        sys.executable,
        str(script),
        "--batch-size",
        "{batch_size}",
        f"--plugin={plugin}",
    )
    submitted(storage, "injected", "sh", "-c", f"touch {pwned}; echo {{batch_size}}", unsigned=True)
    # an SQL edit that runs another command and keeps the real script as a trailing argument
    spec = stored(storage, "edited")["spec"]
    edit(
        storage,
        "edited",
        spec={**spec, "command": ["sh", "-c", f"touch {pwned}", str(script)], "is_template": True},
    )
    edit(storage, "unhashed", script_sha256=None, scripts=None)
    edit(storage, "unsigned", signature=None)
    plugin.write_text("import os; os.system('touch pwned')\n")  # changed on this host after it was submitted

    lines = worker(storage, tmp_path)

    refused = sorted(line for line in lines if line.startswith("[cpu] refused: "))
    changed = "it was changed after it was signed (its command, options or script hashes are not what was submitted)"
    not_signed = ("it is not signed (submitted without a job key): submit it again with the key this worker holds, or "
                  "start the worker with --allow-unsigned on a database only you can write")  # fmt: skip
    plugin_hash = hashlib.sha256(b"# a second script the command names\n").hexdigest()[:12]
    assert refused == [
        f"[cpu] refused: job edited: {changed}",
        f"[cpu] refused: job foreign-key: it was signed with another key (id {key_id(OTHER_KEY)}; this worker holds "
        f"{key_id(TEST_JOB_KEY)}, from AUTOTUNE_JOB_KEY): give submitters and workers the same key (a job of autotune "
        "run without a shared key runs on that run's devices only)",
        f"[cpu] refused: job injected: {not_signed}",
        f"[cpu] refused: job two-scripts: this host's {plugin} differs from the submitted script (sha256 "
        f"{plugin_hash}...): copy the same script here, or submit it again",
        f"[cpu] refused: job unhashed: {changed}",
        f"[cpu] refused: job unsigned: {not_signed}",
    ]
    summary = re.fullmatch(r"worker: 0 trial\(s\); jobs done: -; failed: -; refused: (.*)", lines[-1])
    assert summary and sorted(summary[1].split(", ")) == [line.split()[3][:-1] for line in refused]
    assert not pwned.exists() and not (tmp_path / "pwned").exists()
    for study in ("edited", "unhashed", "unsigned", "foreign-key", "two-scripts", "injected"):
        assert stored(storage, study)["state"] == "open"  # left for a worker that can verify it


def key_id(secret: str) -> str:
    return JobKey(secret.encode(), "").key_id


def test_without_a_key_submit_and_worker_stop_in_one_line_and_create_nothing(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'autotune.db'}"
    submitted = autotune("submit", *QUICK, "--storage", storage, str(SYNTHETIC), AUTOTUNE_JOB_KEY=None)
    assert (submitted.returncode, submitted.stderr) == (2, (
        "Error: autotune submit signs the job for workers and holds no job key: set AUTOTUNE_JOB_KEY or "
        "AUTOTUNE_JOB_KEY_FILE (autotune keygen writes one; workers need the same), or pass --unsigned for workers "
        "started with --allow-unsigned\n"
    ))  # fmt: skip
    working = autotune(
        "worker", "--once", "--storage", storage, "--cache-dir", str(tmp_path), AUTOTUNE_JOB_KEY=None
    )
    assert (working.returncode, working.stderr) == (2, (
        "Error: autotune worker runs only signed jobs and holds no job key: set AUTOTUNE_JOB_KEY or "
        "AUTOTUNE_JOB_KEY_FILE to the submitters' key (autotune keygen writes one), or pass --allow-unsigned on a "
        "database only you can write\n"
    ))  # fmt: skip
    short = autotune("worker", "--once", "--storage", storage, AUTOTUNE_JOB_KEY="secret")
    assert (short.returncode, short.stderr) == (2, (
        "Error: AUTOTUNE_JOB_KEY: a job key must be 64 hex digits as autotune keygen writes them (a chosen key "
        "can be guessed from the signatures stored in the database), got 6 characters\n"
    ))  # fmt: skip
    assert list(tmp_path.iterdir()) == []


def test_keygen_writes_a_private_key_that_submit_and_worker_find_by_themselves(
    tmp_path: Path, job_key: str
) -> None:
    storage = f"sqlite:///{tmp_path / 'autotune.db'}"
    made = autotune("keygen", AUTOTUNE_JOB_KEY=None)
    path = Path(os.environ["XDG_CONFIG_HOME"]) / "autotune" / "job.key"
    key = JobKey(path.read_text().strip().encode(), str(path))
    assert (made.returncode, made.stdout) == (0, f"wrote job key {key.key_id} to {path} (mode 600)\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(path.read_text().strip()) == 64
    again = autotune("keygen", AUTOTUNE_JOB_KEY=None)
    assert (again.returncode, again.stderr) == (2, (
        f"Error: a job key file exists at {path} (--force replaces it; jobs signed with the old key then stop "
        "verifying)\n"
    ))  # fmt: skip
    submit(storage, "mine", str(SYNTHETIC), key=None)
    lines = worker(storage, tmp_path, key=None)
    assert (
        f"[cpu] job mine: signature verified (key {key.key_id}); runs {SYNTHETIC} (in {os.getcwd()})" in lines
    )
    path.chmod(0o644)
    loose = autotune("worker", "--once", "--storage", storage, AUTOTUNE_JOB_KEY=None)
    assert (loose.returncode, loose.stderr) == (2, (
        f"Error: the job key file {path} can be read by others (mode 644): chmod 600 {path}\n"
    ))  # fmt: skip
    path.unlink()


def test_allow_unsigned_runs_an_unsigned_job_and_still_refuses_a_tampered_signed_one(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'autotune.db'}"
    submit(storage, "mine", str(SYNTHETIC), unsigned=True)
    submit(storage, "theirs", str(SYNTHETIC))
    spec = stored(storage, "theirs")["spec"]
    edit(storage, "theirs", spec={**spec, "command": [*spec["command"], "--crash-at", "1"]})

    lines = worker(storage, tmp_path, "--allow-unsigned")

    assert (
        f"[cpu] job mine: unsigned, run as --allow-unsigned says; runs {SYNTHETIC} (in {os.getcwd()})"
        in lines
    )
    assert stored(storage, "mine")["state"] == "done"
    assert "[cpu] refused: job theirs: it was changed after it was signed (its command, options or script hashes are " \
        "not what was submitted)" in lines  # fmt: skip
    assert stored(storage, "theirs")["state"] == "open"
