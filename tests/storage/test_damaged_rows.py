"""Damaged rows (issue 27, item 2): a job or study row that is not what autotune wrote — by a bug, a disk, or
anyone who can write the database — is skipped with one line, never fatal to a worker, `studies` or
`report` (before: `worker --once` exited 1 with a traceback, `studies` crashed, and a study named
../../../x made `report` write outside its folder). Real processes on a real SQLite file."""

from __future__ import annotations

import datetime as dt
import sqlite3
import subprocess
from pathlib import Path

from conftest import AUTOTUNE, SYNTHETIC, synthetic_study

QUICK = ["--budget", "300MiB", "--trials", "2", "--batch-sizes", "1-4", "--plans", "none", "--steps", "2",
         "--warmup-steps", "1"]  # fmt: skip
STAMP = dt.datetime(2030, 1, 1).isoformat(" ")  # newer than every real row


def autotune(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([AUTOTUNE, *argv], capture_output=True, text=True, timeout=300, cwd=cwd)


def insert_job(db: Path, name: str, spec: str, state: str = "open") -> None:
    with sqlite3.connect(db) as conn:
        conn.execute(
            "INSERT INTO autotune_jobs (study_name, script, spec, state, submitted_by, created_at, updated_at) "
            "VALUES (?, 'train.py', ?, ?, 'someone', ?, ?)",
            (name, spec, state, STAMP, STAMP),
        )


def test_damaged_job_rows_are_skipped_with_one_line_and_the_good_job_runs(tmp_path: Path) -> None:
    db = tmp_path / "autotune.db"
    storage = f"sqlite:///{db}"
    submitted = autotune("submit", *QUICK, "--study", "good", "--storage", storage, str(SYNTHETIC))
    assert submitted.returncode == 0, submitted.stderr
    insert_job(db, "not-json", "{not json")
    insert_job(db, "bad-state", "{}", state="bogus")
    insert_job(db, "../../../x", "{}")
    insert_job(db, "no-command", '{"budget": "1GiB"}')  # unsigned: run only by --allow-unsigned, then refused

    worked = autotune("worker", "--once", "--allow-unsigned", "--devices", "cpu", "--storage", storage,
                      "--cache-dir", str(tmp_path))  # fmt: skip
    listed = autotune("studies", "--storage", storage)

    assert worked.returncode == 0 and "Traceback" not in worked.stderr, worked.stderr
    lines = worked.stderr.splitlines()
    skipped = [line for line in lines if "skipping job" in line]
    assert skipped == [
        f"database {storage}: skipping job 'not-json': its spec is not JSON (Expecting property name enclosed in "
        "double quotes at character 1)",
        f"database {storage}: skipping job '../../../x': invalid study name '../../../x': no control or format "
        "characters, '/' or '..'",
    ]  # each once, though the worker read the table many times; 'bad-state' is in no state a worker reads
    assert "[cpu] refused: job no-command: its stored spec is damaged (KeyError: 'command')" in lines
    assert lines[-1].startswith("worker: ") and "jobs done: good;" in lines[-1]

    assert listed.returncode == 0, listed.stderr
    assert sorted(listed.stderr.splitlines()) == [
        f"database {storage}: skipping job '../../../x': invalid study name '../../../x': no control or format "
        "characters, '/' or '..'",
        f"database {storage}: skipping job 'bad-state': its state 'bogus' is not a job state",
        f"database {storage}: skipping job 'not-json': its spec is not JSON (Expecting property name enclosed in "
        "double quotes at character 1)",
    ]
    names = [line.split()[0] for line in listed.stdout.splitlines() if line.strip()]
    assert "good" in names and "no-command" in names and "not-json" not in names


def test_a_study_row_named_out_of_its_folder_is_skipped_and_report_writes_only_where_asked(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "cache"
    good = synthetic_study(cache, "none", "--base-mib", "8", "--per-sample-mib", "1")
    with sqlite3.connect(cache / "autotune.db") as conn:  # a newer copy of the study's row, renamed
        columns = [r[1] for r in conn.execute("PRAGMA table_info(autotune_studies)")]
        picked = ", ".join(
            "'../../x'" if c == "study_name" else "?" if c == "created_at" else c for c in columns
        )
        conn.execute(
            f"INSERT INTO autotune_studies ({', '.join(columns)}) SELECT {picked} FROM autotune_studies "
            "WHERE study_name = ?",
            (STAMP, good),
        )
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)

    reported = autotune("report", "--cache-dir", str(cache), cwd=work)
    asked = autotune("report", "../../x", "--cache-dir", str(cache), cwd=work)

    skipped = (
        f"database sqlite:///{cache / 'autotune.db'}: skipping study '../../x': invalid study name '../../x': no "
        "control or format characters, '/' or '..'"
    )
    assert (reported.returncode, reported.stderr.splitlines()[0]) == (0, skipped), reported.stderr
    assert reported.stdout.startswith(f"wrote {good}.html ")
    assert asked.returncode == 2
    assert (
        asked.stderr == "Error: invalid study name '../../x': no control or format characters, '/' or '..'\n"
    )
    assert sorted(p.name for p in tmp_path.rglob("*.html")) == [f"{good}.html"]
    assert (work / f"{good}.html").is_file()
