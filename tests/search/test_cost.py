"""What a run costs is the user's to bound (issue 42, autotune.search.cost): ``--trials N`` counts every
trial run (the probe's, the search's, re-measurements, verifications), so a run never starts more than N
trial processes; ``--time-limit`` ends a run within it, with an answer and the reason. Real trials of the
synthetic script; its runs and processes counted from the pids the script itself writes, a line per run."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from conftest import AUTOTUNE, SYNTHETIC


def run(cache: Path, options: str, *script: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """``autotune run`` of the synthetic script; its result and the pid of every run of the script (the
    probe's, and each configuration's in a warm process), in order."""
    pids = cache / "pids"
    state = cache / "state"
    state.mkdir(parents=True, exist_ok=True)
    argv = [AUTOTUNE, "run", "--json", "--device", "cpu", "--cache-dir", str(cache), *options.split()]
    script_args = [*script, "--pid-file", str(pids), "--state-dir", str(state)]
    proc = subprocess.run(
        [*argv, "--", "python", str(SYNTHETIC), *script_args], capture_output=True, text=True, timeout=300
    )
    runs = [line.split()[0] for line in pids.read_text().splitlines()] if pids.exists() else []
    return proc, runs


def test_trials_bounds_every_trial_run_re_measurements_and_verifications_included(tmp_path) -> None:
    """A:1@48's one search reading 1.5x slow: the same study unbounded (--trials 40) starts more than 6 trial
    runs, the probe's, the search's and the verification's. With --trials 6 the run starts 6 at most, in at
    most 6 processes, answers, and says that the ceiling ended the search."""
    script = "--base-mib 20 --per-sample-mib 8 --step-seconds 0.05 --per-sample-seconds 0.0005".split()
    script += ["--plan-effects", "A=0.5:1.8", "--slow", "48:A:1#0=1.5"]
    options = "--budget 290MiB --plans none;A --batch-sizes 1-128 --steps 3 --warmup-steps 1"
    proc, unbounded = run(tmp_path / "unbounded", f"{options} --trials 40", *script)
    assert proc.returncode == 0, proc.stderr
    assert len(unbounded) > 6, proc.stderr
    proc, runs = run(tmp_path / "bounded", f"{options} --trials 6", *script)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["new_trials"] == len(runs) <= 6, (runs, proc.stderr)
    assert len(set(runs)) <= 6
    said = " ".join(proc.stderr.split())
    assert "--trials 6 counts every trial run, the probe's and the verification's: the 1 left is kept" in said
    assert data["batch_size"] > 0


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


def test_a_run_paid_for_while_a_search_looks_for_a_queued_lease_is_in_flight_until_it_ends() -> None:
    """CI's Ray recipe flake (--executor ray --trials 2: one search run for two searches): one search paid
    for the last run to look for a queued lease, the other found the purse spent and nothing running,
    verified an empty study and ended "no trial completed"; then the first gave the run back and ran it.
    A paid run is in flight until it ends, and a search that finds the purse spent waits for it
    (Search._paid); given back, the run is there to take."""
    from autotune.search.cost import Cost

    cost = Cost(trials=2, probes=1)
    assert cost.take_run() and cost.in_flight == 1
    assert (
        cost.take([]) == "--trials 2 counts every trial run, the probe's and the verification's: none is left"
    )
    cost.ended(ran=False)  # no queued lease: given back
    assert (cost.spent, cost.in_flight) == (1, 0)
    assert cost.take([]) is None and (cost.spent, cost.in_flight) == (2, 1)
    cost.ended(ran=True)
    assert (cost.spent, cost.in_flight) == (2, 0)
