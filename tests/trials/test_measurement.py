"""Real trials of the synthetic script through the shim, the launcher and the RSS meter."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.core.protocol import Outcome

from conftest import SYNTHETIC, MiB, alive


def within(measured: int, expected: int) -> bool:
    """docs/reliability.md's tolerance: ±3% or ±8 MiB, whichever is larger."""
    return abs(measured - expected) <= max(0.03 * expected, 8 * MiB)


def test_peak_grows_by_exactly_what_the_trial_holds(synthetic) -> None:
    baseline = synthetic(1).peak_bytes
    for mib in (100, 300, 600):
        result = synthetic(1, "--base-mib", str(mib))
        assert result.outcome is Outcome.COMPLETE
        assert result.memory_method == "rss"
        assert within(result.peak_bytes - baseline, mib * MiB), (mib, (result.peak_bytes - baseline) / MiB)


def test_a_large_tuner_does_not_inflate_the_trial(synthetic) -> None:
    baseline = synthetic(1).peak_bytes
    ballast = bytearray(b"\x01") * (1024 * MiB)  # the tuner holds 1 GiB (docs/reliability.md §1)
    try:
        assert within(synthetic(1).peak_bytes, baseline)
        assert within(synthetic(1, "--base-mib", "300").peak_bytes - baseline, 300 * MiB)
    finally:
        del ballast


def test_a_small_trial_after_a_large_one_reads_small(synthetic) -> None:
    baseline = synthetic(1).peak_bytes
    assert within(synthetic(1, "--base-mib", "600").peak_bytes - baseline, 600 * MiB)
    assert within(synthetic(1, "--base-mib", "50").peak_bytes - baseline, 50 * MiB)


def test_peak_scales_with_the_batch_size(synthetic) -> None:
    small, large = synthetic(2, "--per-sample-mib", "40"), synthetic(7, "--per-sample-mib", "40")
    assert within(large.peak_bytes - small.peak_bytes, 5 * 40 * MiB)


def test_a_short_spike_is_part_of_the_peak(synthetic) -> None:
    baseline = synthetic(1).peak_bytes
    result = synthetic(1, "--spike-mib", "200", "--step-seconds", "0.001")
    assert within(result.peak_bytes - baseline, 200 * MiB)


def test_a_process_tree_is_summed_and_labelled(synthetic) -> None:
    baseline = synthetic(1).peak_bytes
    result = synthetic(1, "--base-mib", "100", "--worker-mib", "200", "--step-seconds", "0.1")
    assert result.memory_method == "rss-tree"
    # the trial's own 100 MiB (touched after the fork) and the worker's 200 MiB, resident before the first step
    assert abs(result.peak_bytes - baseline - 300 * MiB) <= 20 * MiB


def test_pages_forked_workers_share_are_counted_once(synthetic) -> None:
    """Two workers forked after the trial filled 300 MiB, reading it and never writing it (a DataLoader's
    workers and the dataset they inherit): summed RSS read 3 x 300; the tree holds 300 once. (Samples
    taken as the workers start read up to ~70 MiB more here: the processes are read one after another.)"""
    baseline = synthetic(1).peak_bytes
    result = synthetic(1, "--base-mib", "300", "--forks", "2", "--step-seconds", "0.1")
    assert result.memory_method == "rss-tree"
    assert 300 * MiB <= result.peak_bytes - baseline + 10 * MiB <= 400 * MiB


def test_throughput_is_the_median_of_the_measured_steps(synthetic) -> None:
    result = synthetic(8, "--step-seconds", "0.05", warmup_steps=2, measured_steps=4)
    assert result.outcome is Outcome.COMPLETE
    assert len(result.step_seconds) == 4
    assert all(0.04 < s < 0.5 for s in result.step_seconds)
    assert 8 / 0.5 < result.samples_per_sec < 8 / 0.04


def test_a_crash_is_failed_with_the_scripts_own_stderr(synthetic) -> None:
    result = synthetic(1, "--crash-at", "2")
    assert result.outcome is Outcome.FAILED
    assert result.error.startswith("ValueError: synthetic crash at step 2")
    assert "Traceback" in result.error
    assert result.samples_per_sec is None


def test_a_memory_error_is_oom(synthetic) -> None:
    result = synthetic(1, "--oom-at", "1")
    assert result.outcome is Outcome.OOM
    assert result.error == "MemoryError: synthetic allocation failure at step 1"


def test_torch_cpu_allocator_failure_is_oom(cache) -> None:
    from autotune.core.plans import Plan
    from autotune.hardware.devices import cpu_device
    from autotune.hardware.meters import RssMeter
    from autotune.trials.command import TrialCommand
    from autotune.trials.measurement import run_trial
    from autotune.trials.settings import TrialSettings

    script = cache / "huge.py"
    script.write_text("import torch\ntorch.empty(2**62, dtype=torch.uint8)\n")
    result = run_trial(
        TrialCommand.parse([str(script)]),
        1,
        Plan.none(),
        cpu_device(),
        RssMeter(),
        TrialSettings(1, 1, 30, 60),
        cache,
        dict(os.environ),
    )
    assert result.outcome is Outcome.OOM
    assert "can't allocate memory" in result.error


def test_a_script_that_ends_early_fails_with_the_step_count(synthetic) -> None:
    result = synthetic(1, "--steps", "2", warmup_steps=1, measured_steps=3)
    assert result.outcome is Outcome.FAILED
    assert result.error.startswith("the script ended after 2 of 4 steps")


def test_a_script_that_exits_with_a_message_is_told_by_its_message(synthetic) -> None:
    """Issue 44: ``raise SystemExit("bad config: ...")`` read "exited with code bad config: ... after 0 of 7
    steps"."""
    result = synthetic(1, "--exit-message", "bad config: lr must be > 0", warmup_steps=1, measured_steps=3)
    assert result.outcome is Outcome.FAILED
    assert result.error.startswith(
        "the script exited with the message 'bad config: lr must be > 0' after 0 of 4 steps"
    ), result.error


def test_a_trial_that_never_steps_times_out_at_startup(synthetic) -> None:
    started = time.monotonic()
    result = synthetic(1, "--never-step", startup_timeout=1.0, grace=0.5)
    assert result.outcome is Outcome.TIMEOUT
    assert result.error == "no training step within 1s"
    assert time.monotonic() - started < 5


def test_a_trial_ending_itself_after_its_steps_even_if_it_would_train_forever(synthetic) -> None:
    result = synthetic(1, warmup_steps=2, measured_steps=3)
    assert result.outcome is Outcome.COMPLETE
    assert "finished all steps" not in (Path(result.log_dir) / "stdout.log").read_text()


def test_timeout_kills_a_sigterm_ignoring_trial_and_its_setsid_grandchild(synthetic, cache) -> None:
    pid_file = cache / "pids"
    started = time.monotonic()
    result = synthetic(
        1,
        "--never-step",
        "--ignore-sigterm",
        "--setsid-grandchild",
        "--pid-file",
        str(pid_file),
        startup_timeout=1.0,
        grace=1.0,
    )
    elapsed = time.monotonic() - started
    assert result.outcome is Outcome.TIMEOUT
    assert elapsed < 1.0 + 1.0 + 1.5  # timeout + grace + 1 s of slack
    main_pid, grandchild = map(int, pid_file.read_text().split())
    assert not alive(main_pid)
    assert not alive(grandchild)
    assert _zombies_of(os.getpid()) == []


def test_sigkill_of_the_tuner_leaves_no_trial_alive(tmp_path) -> None:
    pid_file = tmp_path / "pids"
    tuner = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "autotune",
            "measure",
            str(SYNTHETIC),
            "--batch-size",
            "1",
            "--startup-timeout",
            "60",
            "--cache-dir",
            str(tmp_path),
            "--",
            "--never-step",
            "--ignore-sigterm",
            "--setsid-grandchild",
            "--pid-file",
            str(pid_file),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    # The script opens the file before it writes its line: wait for the whole line.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if pid_file.exists() and pid_file.read_text().endswith("\n"):
            break
        time.sleep(0.05)
    trial_pids = [int(pid) for pid in pid_file.read_text().split()]
    assert len(trial_pids) == 2
    assert all(alive(pid) for pid in trial_pids)
    tuner.send_signal(signal.SIGKILL)
    tuner.wait()
    time.sleep(1.0)
    assert [pid for pid in trial_pids if alive(pid)] == []


def _zombies_of(parent: int) -> list[int]:
    zombies = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] == "Z" and int(fields[1]) == parent:
                zombies.append(int(entry))
    return zombies


@pytest.mark.parametrize("bad", ["missing.py"])
def test_a_missing_script_is_an_input_error(bad: str) -> None:
    from autotune.core.errors import InputError
    from autotune.trials.command import TrialCommand

    with pytest.raises(InputError, match=r"script not found: missing\.py"):
        TrialCommand.parse([bad])


def test_a_stop_during_the_launchers_start_is_not_lost(synthetic) -> None:
    # A start-up timeout this short stops the trial while its launcher is still starting: the stop request
    # must wait for the launcher's handlers (it used to kill the launcher before it wrote its result).
    for _ in range(5):
        result = synthetic(1, startup_timeout=1e-6, grace=0.5)
        assert result.outcome is Outcome.TIMEOUT
