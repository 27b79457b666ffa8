"""What a run costs is the user's to bound (issue 42, autotune.search.cost): ``--time-limit`` ends a run
within it, with an answer and the reason. Real trials of the synthetic script; its runs counted from the
pids the script itself writes."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from conftest import AUTOTUNE, SYNTHETIC


def run(cache: Path, options: str, *script: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """``autotune run`` of the synthetic script; its result and the pid of every trial's run, in order."""
    pids = cache / "pids"
    state = cache / "state"
    state.mkdir(parents=True, exist_ok=True)
    argv = [AUTOTUNE, "run", "--json", "--device", "cpu", "--cache-dir", str(cache), *options.split()]
    script_args = [*script, "--pid-file", str(pids), "--state-dir", str(state)]
    proc = subprocess.run(
        [*argv, "--", "python", str(SYNTHETIC), *script_args], capture_output=True, text=True, timeout=300
    )
    runs = pids.read_text().split() if pids.exists() else []
    return proc, runs


def test_a_time_limit_ends_the_run_within_it_with_an_answer_and_the_reason(tmp_path) -> None:
    """Steps of 0.15 s, every configuration of eight batch sizes and two plans (--exhaustive: no stopping
    rule): unbounded, the search measures for well over 12 s. With --time-limit 12 the run answers within
    12 s of its start and says the limit stopped it."""
    script = "--base-mib 20 --per-sample-mib 2 --step-seconds 0.15 --plan-effects A=0.5:1.3".split()
    options = "--budget 400MiB --trials 40 --plans none;A --batch-sizes 1-128 --steps 5 --time-limit 12 --exhaustive"
    started = time.monotonic()
    proc, runs = run(tmp_path, options, *script)
    wall = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["seconds"] <= 12, (data["seconds"], proc.stderr)
    assert wall < 12 + 10, wall  # the interpreter's start and exit around the run
    assert "the time limit (12 s, --time-limit) leaves" in (data["stopped"] or ""), proc.stderr
    assert data["batch_size"] >= 1 and runs
