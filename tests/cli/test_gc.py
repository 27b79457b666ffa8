"""`autotune gc` (issue 27, item 8): the trial folders of finished studies are removed, except those of trials
that ended with an error (`show` and `report` print their log's path), and a study still running is not
touched; `show` and `best` answer as before. Real runs, a real SQLite file, real folders."""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path

from conftest import AUTOTUNE, SYNTHETIC, cli_in_a_fresh_interpreter


def autotune(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([AUTOTUNE, *argv], capture_output=True, text=True, timeout=300)


def tuned(cache: Path, study: str, *script: str) -> None:
    done = autotune("run", "--device", "cpu", "--budget", "300MiB", "--batch-sizes", "2,8", "--plans", "none",
                    "--exhaustive", "--trials", "4", "--steps", "2", "--warmup-steps", "1", "--study", study,
                    "--cache-dir", str(cache), str(SYNTHETIC), "--", "--base-mib", "8", *script)  # fmt: skip
    assert done.returncode == 0, done.stderr


def folders(cache: Path, study: str) -> dict[int, bool]:
    """Each trial's folder (by trial number), and whether it is still there."""
    with sqlite3.connect(cache / "autotune.db") as conn:
        rows = conn.execute(
            "SELECT t.number, a.value_json FROM trials t JOIN studies s USING (study_id) "
            "JOIN trial_user_attributes a USING (trial_id) WHERE s.study_name = ? AND a.key = 'log_dir'",
            (study,),
        ).fetchall()
    return {number: Path(value.strip('"')).is_dir() for number, value in rows}


def test_gc_removes_finished_studies_trial_folders_but_failed_trials_and_leaves_running_studies(
    tmp_path: Path,
) -> None:
    tuned(tmp_path, "finished", "--crash-at", "1", "--crash-above", "4")  # batch 8 fails: its log is kept
    tuned(tmp_path, "running", "--step-seconds", "0.02")
    with sqlite3.connect(tmp_path / "autotune.db") as conn:
        conn.execute("UPDATE autotune_jobs SET state = 'running' WHERE study_name = 'running'")
    before = {study: folders(tmp_path, study) for study in ("finished", "running")}
    shown = autotune("show", "finished", "--cache-dir", str(tmp_path)).stdout

    dry = autotune("gc", "--dry-run", "--cache-dir", str(tmp_path))
    assert {study: folders(tmp_path, study) for study in before} == before  # nothing removed
    collected = autotune("gc", "--cache-dir", str(tmp_path))

    assert collected.returncode == 0, collected.stderr
    after = folders(tmp_path, "finished")
    assert all(before["finished"].values()) and sum(after.values()) == 1  # the failed trial's folder is left
    removed = len(after) - 1
    assert removed >= 2 and dry.stdout.startswith(f"would remove {removed} trial folder(s) (")
    assert collected.stdout.startswith(f"removed {removed} trial folder(s) (")
    assert collected.stdout.rstrip().endswith(
        "of 1 finished study; kept 1 of trials that ended with an error; 1 open or running study not touched"
    )
    assert folders(tmp_path, "running") == before["running"]  # a running study's folders are its own
    assert autotune("show", "finished", "--cache-dir", str(tmp_path)).stdout == shown
    assert autotune("best", "--study", "finished", "--cache-dir", str(tmp_path)).returncode == 0
    again = cli_in_a_fresh_interpreter(["gc", "--cache-dir", str(tmp_path)], not_imported=("torch",))
    assert again.startswith("removed 0 trial folder(s) (0 B)")  # and a command that runs no trial: no torch
