"""Storage faults are one line and exit 5 (2 for a bad --cache-dir), never a traceback or a hang, and no
password appears anywhere, --debug included. Each case below once hung or printed a traceback."""

from __future__ import annotations

import os
import re
import socket
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import AUTOTUNE, SYNTHETIC

SECRET = "s3cret-pw"


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP server on loopback that accepts connections and never says a word (a hung database)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not done.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    done.set()
    thread.join()
    for conn in [*held, server]:
        conn.close()


def autotune(
    *argv: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AUTOTUNE, *argv], capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The error's one line (after the warning a password in --storage gets: tests/workers/test_database_writer.py)."""
    lines = [
        x for x in proc.stderr.strip().splitlines() if not x.startswith("Warning: the password in --storage ")
    ]
    assert len(lines) == 1, proc.stderr
    assert SECRET not in proc.stdout + proc.stderr
    return lines[0]


def test_a_server_that_never_answers_is_a_one_line_timeout(silent_server: int, tmp_path: Path) -> None:
    url = f"postgresql://autotune:{SECRET}@127.0.0.1:{silent_server}/autotune"
    env = {"AUTOTUNE_CONNECT_TIMEOUT": "1"}
    for argv in (
        ["studies"],
        ["best", "--study", "x"],
        ["run", "--budget", "1GB", "--device", "cpu", str(SYNTHETIC)],
    ):
        started = time.monotonic()
        proc = autotune(*argv, "--storage", url, "--cache-dir", str(tmp_path), env=env)
        assert time.monotonic() - started < 20, argv  # not the 90 s (or forever) it once waited
        assert proc.returncode == 5, proc.stderr
        line = one_line(proc)
        assert line.startswith(
            f"Error: cannot open the database postgresql+psycopg://autotune:***@127.0.0.1:{silent_server}"
        )
        assert "timeout" in line.lower()


def test_a_missing_driver_names_what_installs_it(tmp_path: Path) -> None:
    proc = autotune("studies", "--storage", f"mysql://autotune:{SECRET}@127.0.0.1/autotune")
    assert proc.returncode == 5
    assert one_line(proc) == (
        "Error: cannot open the database mysql://autotune:***@127.0.0.1/autotune: its mysql driver is not "
        "installed: pip install pymysql and use mysql+pymysql://"
    )


def test_an_unparseable_url_says_how_to_percent_encode_and_hides_the_password_even_with_debug() -> None:
    url = f"postgresql://autotune:{SECRET}%{{}}@127.0.0.1:notaport/autotune"
    proc = autotune("studies", "--storage", url)
    assert proc.returncode == 5
    assert "percent-encode characters such as @ : / % { }" in one_line(proc)
    debug = autotune("--debug", "studies", "--storage", url)
    assert debug.returncode != 0 and "StorageError" in debug.stderr
    assert SECRET not in debug.stdout + debug.stderr


def test_a_sqlite_path_in_a_missing_directory_is_refused_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "dir"
    proc = autotune("studies", "--storage", f"sqlite:///{missing / 'x.db'}")
    assert proc.returncode == 5
    assert (
        one_line(proc)
        == f"Error: cannot open the database {missing / 'x.db'}: the directory {missing} does not exist"
    )
    assert not (tmp_path / "no").exists()


def test_a_cache_dir_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    file = tmp_path / "a-file"
    file.write_text("")
    for argv in (["studies"], ["run", "--budget", "1GB", str(SYNTHETIC)]):
        proc = autotune(*argv, "--cache-dir", str(file))
        assert proc.returncode == 2
        assert (
            one_line(proc)
            == f"Error: the cache dir {file} is a file, not a directory (--cache-dir, AUTOTUNE_CACHE_DIR)"
        )


def test_a_database_on_read_only_storage_still_answers(tmp_path: Path) -> None:
    """Results on read-only shared storage: best, studies and show read a SQLite database through a
    read-only bind mount (they once failed: "attempt to write a readonly database", WAL's writes)."""
    cache, mounted = tmp_path / "cache", tmp_path / "ro"
    mounted.mkdir()
    args = ["--", "--base-mib", "8", "--step-seconds", "0.01"]
    tuned = autotune(
        "run", "--budget", "1GiB", "--trials", "2", "--plans", "none", "--batch-sizes", "1-4", "--steps", "1",
        "--warmup-steps", "1", "--device", "cpu", "--study", "ro", "--cache-dir", str(cache), str(SYNTHETIC), *args,
    )  # fmt: skip
    assert tuned.returncode == 0, tuned.stderr
    answers = " && ".join(
        [
            f"mount --bind -o ro {cache} {mounted}",
            f"touch {mounted}/probe-write 2>/dev/null && exit 99 || true",  # the mount must be read-only
            f"{AUTOTUNE} best --study ro --json --cache-dir {mounted}",
            f"{AUTOTUNE} best --budget 512MiB --device cpu --json --cache-dir {mounted} {SYNTHETIC} {' '.join(args)}",
            f"{AUTOTUNE} studies --cache-dir {mounted}",
            f"{AUTOTUNE} show ro --cache-dir {mounted}",
        ]
    )
    proc = subprocess.run(["unshare", "-m", "sh", "-c", answers], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0 and "mount" in proc.stderr and "permission denied" in proc.stderr.lower():
        pytest.skip(f"no read-only bind mount here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    assert '"verified": true' in proc.stdout and '"verified": false' in proc.stdout  # stored, and from trials
    assert f"study ro: {SYNTHETIC}, budget 1.00 GiB" in proc.stdout  # show's header, after studies' table


def test_a_damaged_file_names_the_backup_autotune_kept(tmp_path: Path) -> None:
    backup = tmp_path / "autotune.db.backup-0001-20261101-120000"
    backup.write_bytes(b"")
    (tmp_path / "autotune.db").write_bytes(b"this is not a database" * 100)
    for argv in (["studies"], ["run", "--budget", "1GB", str(SYNTHETIC)]):
        proc = autotune(*argv, "--cache-dir", str(tmp_path))
        assert proc.returncode == 5
        assert one_line(proc) == (
            f"Error: cannot open the database {tmp_path / 'autotune.db'}: file is not a database; autotune's "
            f"newest backup of it is {backup} (copy it over the file to restore)"
        )


@pytest.mark.parametrize(
    ("damage", "argv"),
    [
        ("UPDATE trial_user_attributes SET value_json = '{bad' WHERE key = 'peak_bytes'", ["show", "dmg"]),
        ("UPDATE trial_user_attributes SET value_json = '{bad' WHERE key = 'peak_bytes'", ["report", "dmg"]),
    ],
)
def test_damage_inside_a_row_is_one_line_naming_the_database(
    tmp_path: Path, damage: str, argv: list[str]
) -> None:
    """A row whose stored JSON is cut short once made `best` print a traceback (or say "no study"): now one
    line, exit 5, the file named, with the backup to restore where autotune kept one."""
    tuned = autotune(
        "run", "--budget", "1GiB", "--trials", "2", "--plans", "none", "--batch-sizes", "1-4", "--steps", "1",
        "--warmup-steps", "1", "--device", "cpu", "--study", "dmg", "--cache-dir", str(tmp_path), str(SYNTHETIC),
        "--", "--base-mib", "8", "--step-seconds", "0.01",
    )  # fmt: skip
    assert tuned.returncode == 0, tuned.stderr
    path = tmp_path / "autotune.db"
    with sqlite3.connect(path) as conn:
        assert conn.execute(damage).rowcount >= 1
    proc = autotune(*argv, "--cache-dir", str(tmp_path))
    assert proc.returncode == 5, proc.stderr
    assert re.fullmatch(
        rf"Error: the database {re.escape(str(path))} holds a damaged row: a stored value cannot be read "
        r"\(JSONDecodeError: .+\); restore it from a backup, or tune into another --cache-dir or --storage",
        one_line(proc),
    ), proc.stderr


def test_a_study_row_with_damaged_json_is_skipped_with_one_line(tmp_path: Path) -> None:
    """Issue 27: one damaged study row must not stop `studies` from listing the others (before: exit 5 for
    the whole table); what asks for that study finds none, after the line that says why."""
    for study, seed in (("dmg", "1"), ("fine", "2")):
        tuned = autotune(
            "run", "--budget", "1GiB", "--trials", "2", "--plans", "none", "--batch-sizes", "1-4", "--steps", "1",
            "--warmup-steps", "1", "--device", "cpu", "--study", study, "--cache-dir", str(tmp_path),
            str(SYNTHETIC), "--", "--base-mib", "8", "--step-seconds", "0.01", "--seed", seed,
        )  # fmt: skip
        assert tuned.returncode == 0, tuned.stderr
    path = tmp_path / "autotune.db"
    with sqlite3.connect(path) as conn:
        assert (
            conn.execute("UPDATE autotune_studies SET space = '{cut short' WHERE study_name = 'dmg'").rowcount
            == 1
        )
    skipped = (
        f"database sqlite:///{path}: skipping study 'dmg': its space is not JSON (Expecting property name "
        "enclosed in double quotes at character 1)"
    )
    listed = autotune("studies", "--cache-dir", str(tmp_path))
    assert (listed.returncode, listed.stderr) == (0, skipped + "\n")
    assert [line.split()[0] for line in listed.stdout.splitlines()].count("fine") == 1
    asked = autotune("best", "--study", "dmg", "--cache-dir", str(tmp_path))
    assert asked.returncode == 2 and asked.stderr.splitlines()[0] == skipped
