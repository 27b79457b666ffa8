"""Trial logs bounded (issue 27, item 8): each trial's stdout.log and stderr.log keep their last --log-limit
bytes (16 MiB by default), with a first line saying how much was dropped, and never hold more than twice the
limit on disk while the trial runs (before: one configuration's trials left 951 MiB of stdout). Real
`autotune measure` processes; the trial prints 200 KiB of numbered 1 KiB lines to each stream a step."""

from __future__ import annotations

import contextlib
import re
import subprocess
import threading
from pathlib import Path

from conftest import AUTOTUNE, SYNTHETIC

STEPS = 12  # warm-up 1, measured 3 at least, and the trial's own 12 if it measures on (--tight)
KIB = 1024


def measure(cache: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    argv = [AUTOTUNE, "measure", "--device", "cpu", "-b", "1", "--warmup-steps", "1", "--steps", "3", "--tight", "0",
            "--cache-dir", str(cache), *flags, str(SYNTHETIC), "--", "--chatter-kib", "200",
            "--steps", str(STEPS)]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def on_disk(cache: Path) -> int:
    total = 0
    for log in cache.glob("trials/*/std*.log*"):
        with contextlib.suppress(FileNotFoundError):  # set aside or joined between the listing and the stat
            total += log.stat().st_size
    return total


def test_a_trial_keeps_the_last_log_limit_bytes_of_each_log_and_says_what_it_dropped(tmp_path: Path) -> None:
    most, done = [0], threading.Event()

    def watch() -> None:
        while not done.is_set():
            most[0] = max(most[0], on_disk(tmp_path))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        measured = measure(tmp_path, "--log-limit", "64KiB")
    finally:
        done.set()
        watcher.join()

    assert measured.returncode == 0, measured.stderr
    (folder,) = (tmp_path / "trials").iterdir()
    assert sorted(p.name for p in folder.glob("std*")) == ["stderr.log", "stdout.log"]
    for name in ("stdout.log", "stderr.log"):
        first, rest = (folder / name).read_bytes().split(b"\n", 1)
        assert re.fullmatch(
            rb"\[autotune: the first (\d+) bytes of this log were dropped \(--log-limit 65536\)\]", first
        )
        written = int(re.search(rb"first (\d+) bytes", first)[1]) + len(rest)
        assert len(rest) <= 64 * KIB and written % KIB == 0  # whole lines kept, the first a line's start
        assert rest.startswith(b"step ") and rest.endswith(b"x\n")
        steps = {int(line.split()[1]) for line in rest.splitlines()}
        assert max(steps) == written // (200 * KIB) - 1  # the last step's lines are the ones kept
    assert most[0] <= 2 * (2 * 64 * KIB + 64 * KIB)  # each log and the one set aside, a pipe's read over


def test_log_limit_0_keeps_everything_and_a_bad_limit_is_one_line(tmp_path: Path) -> None:
    measured = measure(tmp_path / "all", "--log-limit", "0")
    assert measured.returncode == 0, measured.stderr
    (folder,) = (tmp_path / "all" / "trials").iterdir()
    out = (folder / "stdout.log").read_bytes()
    assert not out.startswith(b"[autotune") and len(out) % (200 * KIB) == 0 and len(out) >= 4 * 200 * KIB
    small = measure(tmp_path, "--log-limit", "10KiB")
    assert (small.returncode, small.stderr) == (
        2,
        "Error: --log-limit must be 0 (keep all) or at least 64 KiB, got 10240 bytes\n",
    )
    share = measure(tmp_path, "--log-limit", "5%")
    assert share.returncode == 2
    assert (
        share.stderr
        == "Error: Invalid value for '--log-limit': expected a size such as 16MiB, got '5%' (see autotune measure --help)\n"
    )
