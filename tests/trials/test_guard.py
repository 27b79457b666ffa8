"""The meter is also a guard: a trial whose peak passes its budget is stopped at once (the whole process
tree, no grace period) and recorded as over budget, its peak a lower bound; a search goes on past it.
Without it a trial of a hopeless batch size once reached 23 GiB on a 24 GiB machine."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import optuna

import autotune
from autotune.core.protocol import Outcome

from conftest import AUTOTUNE, SYNTHETIC, MiB, trial_pids

BUDGET = 300 * MiB
# The meter samples a CPU trial at 20 Hz and the launcher reacts within 50 ms: a trial growing 10 MiB
# every 10 ms passes the budget by ~1 GiB/s x ~0.1 s at most.
OVERSHOOT = 160 * MiB


def test_a_growing_trial_is_stopped_as_its_peak_passes_the_budget(tmp_path: Path) -> None:
    spec = autotune.measure_spec(
        [
            str(SYNTHETIC),
            "--base-mib",
            "20",
            "--grow-mib",
            "10",
            "--step-seconds",
            "0.01",
            "--steps",
            "100000",
        ],
        1,
        budget="300MiB",
        settings=autotune.TrialSettings(1, 100000, 60, 120),
        device="cpu",
        cache_dir=tmp_path,
    )
    result = autotune.measure(spec)
    assert result.outcome is Outcome.OVER_BUDGET
    assert BUDGET < result.peak_bytes < BUDGET + OVERSHOOT
    assert result.fits_budget is False and result.samples_per_sec is None
    assert result.wall_seconds < 10  # not its 100000 steps, nor the 120 s timeout
    assert trial_pids(tmp_path) == []


def test_measure_budget_says_the_trial_was_stopped(tmp_path: Path) -> None:
    argv = [
        AUTOTUNE,
        "measure",
        "-b",
        "64",
        "--budget",
        "300MiB",
        "--device",
        "cpu",
        "--cache-dir",
        str(tmp_path),
    ]
    argv += [str(SYNTHETIC), "--", "--base-mib", "20", "--per-sample-mib", "8", "--step-seconds", "2"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[0].split() == ["outcome", "over-budget"]
    assert "does not fit: stopped as soon as its peak passed the budget" in proc.stdout


def test_a_search_records_an_over_budget_trial_as_a_bound_and_goes_on(tmp_path: Path) -> None:
    """Calibration jumps from batch 1 to 64 (4x or more); 64 x 8 MiB passes the 300 MiB budget: that trial
    is stopped at once and recorded as over budget; the search goes on and verifies batch 2."""
    argv = [
        AUTOTUNE,
        "run",
        "--budget",
        "300MiB",
        "--trials",
        "5",
        "--plans",
        "none",
        "--batch-sizes",
        "1,2,64",
    ]
    argv += ["--steps", "2", "--warmup-steps", "1", "--device", "cpu", "--study", "guard", "--json"]
    argv += ["--cache-dir", str(tmp_path), str(SYNTHETIC), "--", "--base-mib", "20", "--per-sample-mib", "8"]
    argv += ["--step-seconds", "1"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (json.loads(proc.stdout)["batch_size"], json.loads(proc.stdout)["plan"]) == (2, "none")
    trials = optuna.load_study(study_name="guard", storage=f"sqlite:///{tmp_path / 'autotune.db'}").trials
    (big,) = [t for t in trials if t.params["batch_size"] == 64]
    assert big.user_attrs["outcome"] == "over-budget" and big.user_attrs["peak_bytes"] > BUDGET
    assert big.constraints["0"] > 0  # infeasible: the sampler learns from it
    assert (big.datetime_complete - big.datetime_start).total_seconds() < 3  # not its 3 steps of 1 s


def test_the_meter_samples_faster_only_while_a_trial_grows_toward_its_ceiling() -> None:
    """20 Hz, unless the trial's growth over the last 0.1 s would take it past its ceiling within two
    intervals: then a quarter of the time to the ceiling, down to 2 ms. A trial resting at 80% of its
    ceiling is sampled at 20 Hz: sampled every 2 ms there, examples/gpt.py at batch 32 read 10-14% slower."""
    from autotune.hardware.meters import NEAR_INTERVAL, next_wait

    ceiling = 1000 * MiB

    def growing(rate_mib_per_s: float, at_mib: float) -> list[tuple[float, int]]:
        return [(0.0, int((at_mib - 0.1 * rate_mib_per_s) * MiB)), (0.1, int(at_mib * MiB))]

    assert next_wait(0.05, None, growing(1024, 990)) == 0.05  # no ceiling
    assert next_wait(0.05, ceiling, [(0.0, 800 * MiB)]) == 0.05  # one sample: no growth known
    assert next_wait(0.05, ceiling, [(0.0, 800 * MiB), (0.1, 800 * MiB)]) == 0.05  # at rest near it
    assert next_wait(0.05, ceiling, growing(-1024, 900)) == 0.05  # shrinking
    assert next_wait(0.05, ceiling, growing(1024, 800)) == 0.05  # 1 GiB/s, 200 MiB to go: 0.2 s
    assert next_wait(0.05, ceiling, growing(1000, 940)) == 0.06 / 4  # 60 MiB to go at 1000 MiB/s
    assert next_wait(0.05, ceiling, growing(1024, 999)) == NEAR_INTERVAL == 0.002
    assert next_wait(0.05, ceiling, growing(1024, 1200)) == NEAR_INTERVAL  # past it already
