"""A database that stays locked or unreachable (issue 27, item 6): its errors are retried, saying what is
waited for and until when, up to a deadline (AUTOTUNE_STORAGE_DEADLINE, 10 min by default), then the run
ends in one line, exit 5 (before: retried without end, one line at the start and then silence). The next
run resumes what was stored. A real SQLite file locked by another connection while a trial runs."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import time
from pathlib import Path

from conftest import AUTOTUNE, SYNTHETIC, wait_for

RUN = ["run", "--device", "cpu", "--budget", "300MiB", "--batch-sizes", "1-8", "--plans", "none", "--trials", "3",
       "--exhaustive", "--steps", "4", "--warmup-steps", "1", "--study", "locked"]  # fmt: skip


def test_a_database_locked_past_the_deadline_ends_the_run_in_one_line_and_the_next_run_resumes(
    tmp_path: Path,
) -> None:
    path = tmp_path / "autotune.db"
    argv = [AUTOTUNE, *RUN, "--cache-dir", str(tmp_path), str(SYNTHETIC), "--", "--step-seconds", "0.25"]
    env = {**os.environ, "AUTOTUNE_STORAGE_DEADLINE": "2", "AUTOTUNE_BUSY_TIMEOUT": "0.5"}
    run = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: len(list((tmp_path / "trials").glob("*"))) >= 2, timeout=120)  # past the probe
    outside = sqlite3.connect(path, isolation_level=None)
    outside.execute("BEGIN EXCLUSIVE")  # no one else writes until it ends
    started = time.monotonic()
    try:
        _, err = run.communicate(timeout=120)
        held = time.monotonic() - started
    finally:
        outside.execute("ROLLBACK")
        outside.close()

    lines = err.strip().splitlines()
    assert run.returncode == 5, err
    assert f"the database {path} is busy or unreachable, retrying for up to 2 s: (sqlite3.OperationalError) " \
        "database is locked" in lines  # fmt: skip
    assert lines[-1].startswith(f"Error: the database {path} stayed busy or unreachable for ")
    assert lines[-1].endswith(" s (AUTOTUNE_STORAGE_DEADLINE): (sqlite3.OperationalError) database is locked")
    assert held < 30  # the deadline, its busy timeouts and the trial's stop: not a wait without end
    again = subprocess.run([AUTOTUNE, *RUN, "--cache-dir", str(tmp_path), str(SYNTHETIC), "--", "--step-seconds",
                            "0.25"], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert again.returncode == 0, again.stderr
    with sqlite3.connect(path) as conn:
        states = [s for (s,) in conn.execute("SELECT state FROM trials")]
    assert "RUNNING" not in states and states.count("COMPLETE") >= 3
