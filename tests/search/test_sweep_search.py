"""`autotune run --sweep` (autotune.search.sweep): once the memory model is calibrated, the plans without a
reading are measured at one batch size in one trial process; each plan's reading is a trial of its own,
the sweep counts as one trial of --trials, and a plan the sweep did not reach is measured on its own."""

from __future__ import annotations

import subprocess
from pathlib import Path

from conftest import AUTOTUNE, SYNTHETIC, stored_trials

MiB = 2**20


def test_a_run_sweeps_the_plans_without_a_reading_in_one_process(tmp_path: Path) -> None:
    """The synthetic script holds 20 MiB + 4 MiB a sample, less half for A:1 and a fifth for C:1; B:1 runs
    out of memory. After none's calibration, A:1, B:1 and C:1 are swept at none's largest fitting batch in
    one process: A:1's reading is its own, B:1 is out of memory there, C:1 (not reached) is released and
    measured later in a process of its own."""
    cache = tmp_path / "cache"
    run = subprocess.run(
        [AUTOTUNE, "run", "--budget", "300MiB", "--device", "cpu", "--sweep", "--plans", "none;A:1;B:1;C:1",
         "--batch-sizes", "1-64", "--trials", "8", "--warmup-steps", "1", "--steps", "2", "--study", "swept",
         "--cache-dir", str(cache), str(SYNTHETIC), "--", "--base-mib", "20", "--per-sample-mib", "4",
         "--plan-effects", "A=0.5:0.2,C=0.2:0.1", "--oom-plan", "B:1", "--step-seconds", "0.05"],
        capture_output=True, text=True, timeout=300, env={"COLUMNS": "300", **__import__("os").environ},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    trials = {t.number: t for t in stored_trials(f"sqlite:///{cache / 'autotune.db'}", "swept")}
    swept = [t for t in trials.values() if t.user_attrs.get("proposed_by") == "sweep"]
    assert [t.params["plan"] for t in swept] == ["A:1", "B:1", "C:1"]
    first = swept[0]
    assert {t.params["batch_size"] for t in swept} == {first.params["batch_size"]}
    assert {t.user_attrs["process"] for t in swept} == {first.number}
    batch = first.params["batch_size"]
    none_at_batch = [
        t for t in trials.values() if t.params.get("plan") == "none" and t.params.get("batch_size") == batch
    ]
    assert none_at_batch, "the sweep's batch is one none fitted at"
    saved = none_at_batch[0].user_attrs["peak_bytes"] - first.user_attrs["peak_bytes"]
    assert abs(saved - batch * 2 * MiB) < 4 * MiB  # A:1 holds half of the 4 MiB a sample
    assert (
        first.user_attrs["outcome"] == "complete"
        and first.user_attrs["log_dir"] == swept[1].user_attrs["log_dir"]
    )
    assert swept[1].user_attrs["outcome"] == "oom"
    assert swept[2].state.name == "FAIL" and "the sweep ended before it" in swept[2].user_attrs["note"]
    (alone,) = [
        t
        for t in trials.values()
        if t.params.get("plan") == "C:1" and t.user_attrs.get("proposed_by") == "released"
    ]
    assert alone.params["batch_size"] == batch and alone.user_attrs["outcome"] == "complete"
    assert alone.user_attrs["log_dir"] != first.user_attrs["log_dir"]
    assert "measures 3 plans at batch" in run.stderr
