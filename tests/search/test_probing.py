"""A workload's probe never wedges it: a Ctrl-C'd probe is run by the next run, a probe that failed for a
reason outside the script is retried once, a stored script failure says so and how to re-run, and a wait
for another worker's probe is announced and ends at a stop request.

Each of these once failed: the next run after a Ctrl-C'd probe waited silently forever, a worker waiting
for it ignored SIGTERM, and a stored failure was replayed without a word on --force."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import time
from pathlib import Path

from conftest import AUTOTUNE, SYNTHETIC, signal_as_a_trial_starts, trial_pids, wait_for

OPTIONS = "--budget 300MiB --plans none --batch-sizes 1-8 --steps 2 --warmup-steps 1 --device cpu".split()


def run(cache: Path, *script_args: str, trials: int = 2, extra: tuple[str, ...] = ()) -> list[str]:
    return [
        AUTOTUNE, "run", *OPTIONS, "--trials", str(trials), "--cache-dir", str(cache), *extra,
        str(SYNTHETIC), "--", "--base-mib", "10", *script_args,
    ]  # fmt: skip


def slow(cache: Path) -> tuple[str, ...]:
    """The script's arguments for a probe that stays under way until the test ends it: its first step waits
    while a file exists (a probe of ~12 s once let a loaded machine start the second command after it ended)."""
    held = cache / "probe-held"
    held.touch()
    return ("--hold-while", str(held))


def probing_slowly(cache: Path) -> subprocess.Popen[str]:
    """A run of study "shared" whose probe is under way (until the test kills it)."""
    prober = subprocess.Popen(
        run(cache, *slow(cache), extra=("--study", "shared")), stderr=subprocess.PIPE, text=True
    )
    wait_for(lambda: trial_pids(cache, prober.pid))
    return prober


def trial_folders(cache: Path) -> int:
    return len(list((cache / "trials").glob("*"))) if (cache / "trials").exists() else 0


def test_a_probe_stopped_by_ctrl_c_is_run_by_the_next_run(tmp_path) -> None:
    first = subprocess.Popen(
        run(tmp_path, "--step-seconds", "0.5"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    signal_as_a_trial_starts(first, signal.SIGINT, tmp_path)  # the run's first trial is the probe
    _, err = first.communicate(timeout=60)
    assert first.returncode == 130
    assert "Interrupted: the running trial was stopped." in err
    second = subprocess.run(
        run(tmp_path, "--step-seconds", "0.5"), capture_output=True, text=True, timeout=120
    )
    assert second.returncode == 0, second.stderr
    assert "probe: batch 1: complete" in second.stderr


def test_a_worker_waiting_for_another_s_probe_says_so_and_stops_at_sigterm(tmp_path) -> None:
    prober = probing_slowly(tmp_path)
    submit = run(tmp_path, *slow(tmp_path), extra=("--study", "shared"))
    submit[1] = "submit"
    assert subprocess.run(submit, capture_output=True, timeout=60).returncode == 0
    worker = subprocess.Popen(
        [AUTOTUNE, "worker", "--once", "--devices", "cpu", "--cache-dir", str(tmp_path)],
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    assert worker.stderr is not None
    while not any("to probe this workload" in line for line in lines):
        lines.append(worker.stderr.readline())
        assert lines[-1], "".join(lines)
    stopped = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    _, rest = worker.communicate(timeout=30)
    assert time.monotonic() - stopped < 5, "".join(lines) + rest
    assert worker.returncode == 0
    assert "stopped" in rest
    prober.kill()
    prober.wait()


def test_a_stored_script_failure_is_replayed_with_how_to_rerun_it(tmp_path) -> None:
    failing = ("--crash-at", "0")
    first = subprocess.run(run(tmp_path, *failing), capture_output=True, text=True, timeout=60)
    assert first.returncode == 7
    assert "ValueError: synthetic crash at step 0" in first.stderr
    folders = trial_folders(tmp_path)
    second = subprocess.run(run(tmp_path, *failing), capture_output=True, text=True, timeout=60)
    assert second.returncode == 7
    assert "stored from an earlier run" in second.stderr
    assert "autotune run --force runs it again" in second.stderr
    assert trial_folders(tmp_path) == folders  # replayed, not re-run
    forced = subprocess.run(
        run(tmp_path, *failing, extra=("--force",)), capture_output=True, text=True, timeout=60
    )
    assert forced.returncode == 7 and trial_folders(tmp_path) == folders + 1  # --force runs it again


def test_a_probe_that_timed_out_is_retried_once(tmp_path) -> None:
    hanging = ("--never-step",)
    timeout = ("--startup-timeout", "1")
    first = subprocess.run(run(tmp_path, *hanging, extra=timeout), capture_output=True, text=True, timeout=60)
    assert first.returncode == 7
    assert "first trial timeout" in first.stderr and "the next run retries it once" in first.stderr
    second = subprocess.run(
        run(tmp_path, *hanging, extra=timeout), capture_output=True, text=True, timeout=60
    )
    assert second.returncode == 7 and trial_folders(tmp_path) == 2  # the retry ran
    third = subprocess.run(run(tmp_path, *hanging, extra=timeout), capture_output=True, text=True, timeout=60)
    assert third.returncode == 7 and trial_folders(tmp_path) == 2  # and only once
    assert "the workload's probe failed twice" in third.stderr
    assert "autotune run --force runs it again" in third.stderr


def test_a_run_waiting_for_another_s_probe_says_so_and_ctrl_c_ends_it_at_once(tmp_path) -> None:
    prober = probing_slowly(tmp_path)
    waiting = subprocess.Popen(
        run(tmp_path, *slow(tmp_path), extra=("--study", "shared")), stderr=subprocess.PIPE, text=True
    )
    assert waiting.stderr is not None
    first = waiting.stderr.readline()
    assert "to probe this workload" in first, first
    stopped = time.monotonic()
    waiting.send_signal(signal.SIGINT)
    _, rest = waiting.communicate(timeout=30)
    assert time.monotonic() - stopped < 5
    assert waiting.returncode == 130
    assert rest.strip() == (  # nothing of its own was running
        "Interrupted: no trial was running. The same command resumes the run: the trials that finished are stored."
    )
    prober.kill()
    prober.wait()


def test_a_probe_whose_stored_result_was_lost_is_run_again(tmp_path) -> None:
    """A probe lease that ended done while the workload's result is gone (a row edited or restored by
    hand) must not leave the next run waiting for nothing: it probes again (attempt 1)."""
    first = subprocess.run(run(tmp_path), capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    folders = trial_folders(tmp_path)
    with sqlite3.connect(tmp_path / "autotune.db") as conn:
        conn.execute("UPDATE autotune_workloads SET discovery = NULL")
    again = subprocess.run(
        run(tmp_path, extra=("--study", "other")), capture_output=True, text=True, timeout=60
    )
    assert again.returncode == 0, again.stderr
    assert "probe: batch 1: complete" in again.stderr
    assert trial_folders(tmp_path) > folders
