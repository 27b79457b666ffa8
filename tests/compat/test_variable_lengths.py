"""Variable-length inputs (#26 item 5): a language model whose batches are padded to a random length of
32-512 tokens each step. Its job's peak is what 200 steps of it reach standalone; a trial in worst-case
mode (AUTOTUNE_WORST_CASE=1: the script pads to 512) measures that peak within 5% in its few steps, and a
plain trial says its lengths varied. Real processes, real RSS; the standalone run's peak is the kernel's
high-water mark of the script alone (os.wait4 from a small stdlib launcher, RELIABILITY.md §1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune import api
from autotune.core.protocol import WORST_CASE_ENV, Outcome
from autotune.trials.measurement import measure_spec

from conftest import DETERMINISTIC_CPU_ALLOCATOR, MiB

pytestmark = pytest.mark.compat

SCRIPT = [str(Path(__file__).parents[1] / "scripts" / "inputs.py"), "--layout", "tokens", "--vocab", "4000"]
SCRIPT += ["--lengths", "32-512"]
BATCH = 16
LAUNCH = (  # fork, exec the script, and print the child's own peak RSS in bytes
    "import os, sys\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n"
    "_, status, usage = os.wait4(pid, 0)\n"
    "assert os.waitstatus_to_exitcode(status) == 0\n"
    "print(usage.ru_maxrss * 1024)\n"
)


def test_a_worst_case_trial_measures_the_peak_of_200_standalone_steps_within_5_percent(
    tmp_path: Path,
) -> None:
    env = {**os.environ, **DETERMINISTIC_CPU_ALLOCATOR}
    standalone = subprocess.run(
        [sys.executable, "-c", LAUNCH, *SCRIPT, "--batch-size", str(BATCH), "--steps", "200"],
        env=env, capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    job_peak = int(standalone.stdout.split()[-1])
    command = [sys.executable, *SCRIPT, "--batch-size", "{batch_size}"]
    spec = measure_spec(command, BATCH, device="cpu", cache_dir=tmp_path)
    worst = api.measure(spec, environ={**env, WORST_CASE_ENV: "1"})
    plain = api.measure(spec, environ=env)
    print(
        f"standalone 200 steps {job_peak / MiB:.1f} MiB; worst-case trial {worst.peak_bytes / MiB:.1f} MiB "
        f"(lengths {worst.lengths}); plain trial {plain.peak_bytes / MiB:.1f} MiB (lengths {plain.lengths})"
    )
    assert worst.outcome is Outcome.COMPLETE and plain.outcome is Outcome.COMPLETE, (worst.error, plain.error)
    assert worst.lengths == (512, 512)
    assert abs(worst.peak_bytes - job_peak) <= 0.05 * job_peak
    low, high = plain.lengths or (0, 0)
    assert 32 <= low < high <= 512  # a plain trial's lengths varied, and it says so
