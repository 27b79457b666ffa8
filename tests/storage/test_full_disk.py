"""Storage faults (issue 27, item 6): a full disk or a read-only file system, under the trial files or under
the database, ends `autotune run` with one line naming the path and the cause, exit 5, at once (before: a
full database was retried in silence for 10+ minutes; full or read-only trial files ended as "the trial
launcher exited with code 120", the trial, lease and job left RUNNING). Once the storage is fixed, the
next run resumes with nothing lost.

Real faults: each case runs in a user and mount namespace (`unshare -rm`, no privileges needed) holding a
small tmpfs, filled with dd or remounted read-only while a trial runs."""

from __future__ import annotations

import shlex
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from conftest import AUTOTUNE, SYNTHETIC


def _namespaces() -> bool:
    if shutil.which("unshare") is None:
        return False
    done = subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=30)
    return done.returncode == 0


pytestmark = pytest.mark.skipif(
    not _namespaces(),
    reason="no unprivileged user and mount namespaces here (unshare -rm) to make a small disk",
)


JOB = ["--budget", "300MiB", "--batch-sizes", "1-8", "--plans", "none", "--trials", "3", "--exhaustive", "--steps",
       "4", "--warmup-steps", "1", "--study", "faulted"]  # fmt: skip
SCRIPT = [
    str(SYNTHETIC),
    "--",
    "--base-mib",
    "8",
    "--step-seconds",
    "0.25",
]  # a second a trial: time to fault one


def tune(cache: Path, storage: Path) -> str:
    """The shell words of a small run."""
    where = ["--cache-dir", str(cache), "--storage", f"sqlite:///{storage / 'autotune.db'}"]
    return shlex.join([AUTOTUNE, "run", "--device", "cpu", *JOB, *where, *SCRIPT])


def work(cache: Path, storage: Path) -> str:
    """The shell words of a worker on the submitted job."""
    where = ["--cache-dir", str(cache), "--storage", f"sqlite:///{storage / 'autotune.db'}"]
    return shlex.join([AUTOTUNE, "worker", "--once", "--devices", "cpu", *where])


def in_namespace(
    tmp_path: Path, fault: str, on: str, worker: bool = False
) -> tuple[int, list[str], int, str]:
    """Mount a 4 MiB tmpfs at ``tmp_path/small``; run the tune with ``on`` (``trials``: the cache dir, or
    ``database``) there and the other on this disk; once its second trial has started, ``fault`` the tmpfs
    (``full``: dd fills it; ``read-only``: mounted read-only over itself). Then undo the fault and run the tune again.
    With ``worker``, the first is a worker on the job submitted before. Returns both runs' exit codes and the
    first run's stderr lines, with the second's last line; the database as it was between them is mid.db."""
    small, disk = tmp_path / "small", tmp_path / "disk"
    small.mkdir()
    disk.mkdir(exist_ok=True)  # a worker's job was submitted there before
    cache, storage = (small, disk) if on == "trials" else (disk, small)
    if fault == "full":
        act, undo = f"dd if=/dev/zero of={small}/filler bs=64k 2>/dev/null", f"rm -f {small}/filler"
    else:  # a read-only mount over it (a remount would fail "busy": the trial's logs are open for writing)
        act, undo = f"mount --bind {small} {small} && mount -o remount,bind,ro {small}", f"umount {small}"
    script = f"""
mount -t tmpfs -o size=4m tmpfs {small} || exit 90
{work(cache, storage) if worker else tune(cache, storage)} > {tmp_path}/first.out 2> {tmp_path}/first.err &
pid=$!
while [ "$(ls {cache}/trials 2>/dev/null | wc -l)" -lt 2 ] && kill -0 $pid 2>/dev/null; do sleep 0.1; done
sleep 0.3
{act}
wait $pid; echo $? > {tmp_path}/first.rc
{undo}
cp {storage}/autotune.db {tmp_path}/mid.db
{tune(cache, storage)} > {tmp_path}/second.out 2> {tmp_path}/second.err; echo $? > {tmp_path}/second.rc
cp {storage}/autotune.db {tmp_path}/after.db
"""
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    first, second = (int((tmp_path / f"{run}.rc").read_text()) for run in ("first", "second"))
    second_err = (tmp_path / "second.err").read_text().strip().splitlines()
    return (
        first,
        (tmp_path / "first.err").read_text().strip().splitlines(),
        second,
        second_err[-1] if second_err else "",
    )


def stored(tmp_path: Path) -> tuple[list[tuple[str, str]], str]:
    """The states of the study's trials (with their notes), and the job's state, once both runs are over."""
    with sqlite3.connect(tmp_path / "after.db") as conn:
        states = conn.execute("SELECT state FROM trials ORDER BY number").fetchall()
        job = conn.execute("SELECT state FROM autotune_jobs WHERE study_name = 'faulted'").fetchone()[0]
    return [s[0] for s in states], job


@pytest.mark.parametrize("fault", ["full", "read-only"])
def test_trial_files_that_cannot_be_written_end_the_run_in_one_line_and_the_next_run_resumes(
    tmp_path: Path, fault: str
) -> None:
    first, err, second, last = in_namespace(tmp_path, fault, on="trials")
    cause = "No space left on device" if fault == "full" else "Read-only file system"
    assert first == 5, err
    assert err[-1].startswith(f"Error: cannot write the trial files in {tmp_path / 'small' / 'trials'}")
    assert err[-1].endswith(
        f": {cause}; free space or make it writable, then run again: what was stored is kept"
    )
    assert not any("Traceback" in line for line in err)
    assert second == 0, last
    states, job = stored(tmp_path)
    assert "RUNNING" not in states and job == "done"
    assert states.count("COMPLETE") >= 3  # the released trial measured again, nothing lost


def test_a_database_on_a_full_disk_ends_the_run_in_one_line_at_once_and_the_next_run_resumes(
    tmp_path: Path,
) -> None:
    first, err, second, last = in_namespace(tmp_path, "full", on="database")
    assert first == 5, err
    assert err[-1] == (
        f"Error: the database {tmp_path / 'small' / 'autotune.db'} cannot be written: database or disk is full; "
        "free space or make it writable, then run again: what was stored is kept"
    )
    assert not any("retrying" in line or "Traceback" in line for line in err)  # not retried: said at once
    assert second == 0, last
    states, job = stored(tmp_path)
    assert "RUNNING" not in states and job == "done"


def test_a_worker_on_a_full_disk_ends_in_one_line_and_leaves_the_job_open_for_the_next(
    tmp_path: Path,
) -> None:
    (tmp_path / "disk").mkdir()
    storage = f"sqlite:///{tmp_path / 'disk' / 'autotune.db'}"
    submitted = subprocess.run([AUTOTUNE, "submit", *JOB, "--storage", storage, *SCRIPT], capture_output=True, text=True,
                               timeout=60)  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    first, err, second, last = in_namespace(tmp_path, "full", on="trials", worker=True)
    assert first == 5, err
    assert err[-1].startswith(f"Error: cannot write the trial files in {tmp_path / 'small' / 'trials'}")
    with sqlite3.connect(tmp_path / "mid.db") as conn:  # as the worker left it
        job = conn.execute("SELECT state, error FROM autotune_jobs WHERE study_name = 'faulted'").fetchone()
        running = conn.execute("SELECT count(*) FROM trials WHERE state = 'RUNNING'").fetchone()[0]
    assert job[0] == "open" and job[1] == "interrupted: " + err[-1].removeprefix("Error: ")
    assert running == 0
    assert second == 0, last  # a run of the same job finishes it
    states, state = stored(tmp_path)
    assert "RUNNING" not in states and state == "done"
