"""Several plans measured in one trial process (issue 31, item 5: autotune.search.sweep, TrialRequest.sweep):
each plan's reading in a sweep is the reading its own trial gives, and a sweep that ends on a plan (out of
memory) keeps the plans before it and measures none after it. Real processes, real RSS."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autotune.core.plans import parse_plan
from autotune.core.protocol import Outcome
from autotune.hardware.devices import cpu_device
from autotune.hardware.meters import RssMeter
from autotune.trials.command import TrialCommand
from autotune.trials.measurement import run_trial
from autotune.trials.result import TrialResult
from autotune.trials.settings import TrialSettings

from conftest import ROOT, SYNTHETIC

MiB = 2**20
GPT = ["--n-layer", "4", "--n-embd", "128", "--block-size", "64"]


def _trial(cache: Path, words: list[str], batch: int, plan: str, sweep: tuple[str, ...] = ()) -> TrialResult:
    environ = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}  # freed tensors leave the resident set
    return run_trial(
        TrialCommand.parse(words),
        batch,
        parse_plan(plan),
        cpu_device(),
        RssMeter(),
        TrialSettings(2, 3, 120, 300, tight=0),  # a fixed count of steps: peaks are what is compared
        cache,
        environ,
        sweep=sweep,
    )


@pytest.mark.slow
@pytest.mark.compat  # four processes of examples/gpt.py: 77 s of CI's core suite, beside the real-model runs
def test_a_sweep_reads_each_plan_as_its_own_trial_does(tmp_path: Path) -> None:
    """examples/gpt.py (4 blocks) at batch 16: Block:1, Block:0.5 and none swept in one process, the
    model's plan switched between steps; each plan's peak is a trial of that plan alone's, never under it
    (1% for the meter) and at most 5% over it (what an earlier plan leaves resident: 3.7% for none on CI's
    machine, 0.8% here), each applied as asked."""
    words = [str(ROOT / "examples" / "gpt.py"), *GPT]
    swept = _trial(tmp_path, words, 16, "Block:1", ("Block:0.5", "none"))
    readings = [swept, *swept.sweep]
    assert [r.outcome for r in readings] == [Outcome.COMPLETE] * 3, [r.error for r in readings]
    assert [r.plan for r in readings] == ["Block:1", "Block:0.5", "none"]
    assert all(r.samples_per_sec and len(r.step_seconds) >= 3 for r in readings)
    assert swept.sweep[0].log_dir == swept.log_dir  # one process
    for reading in readings:
        alone = _trial(tmp_path, words, 16, reading.plan)
        assert alone.outcome is Outcome.COMPLETE
        over = (reading.peak_bytes - alone.peak_bytes) / alone.peak_bytes
        assert -0.01 <= over <= 0.05, (reading.plan, over)  # never under; over by what earlier plans left
    assert readings[0].peak_bytes < readings[1].peak_bytes < readings[2].peak_bytes  # recompute saves


def test_a_sweep_that_runs_out_of_memory_on_a_plan_keeps_the_plans_before_it(tmp_path: Path) -> None:
    """The synthetic script (no torch: it applies the plan $AUTOTUNE_PLAN names, which a sweep rewrites)
    holds 10 MiB a sample less half for A:1; plan B:1 raises MemoryError. Swept A:1, B:1, none: A:1's reading
    is its own, B:1 is out of memory, none was not measured."""
    words = [str(SYNTHETIC), "--base-mib", "20", "--per-sample-mib", "10", "--plan-effects", "A=0.5:0",
             "--oom-plan", "B:1", "--step-seconds", "0.05"]  # fmt: skip
    swept = _trial(tmp_path, words, 8, "A:1", ("B:1", "none"))
    assert swept.outcome is Outcome.COMPLETE and swept.plan == "A:1"
    assert [r.plan for r in swept.sweep] == ["B:1"] and swept.sweep[0].outcome is Outcome.OOM
    alone = _trial(tmp_path, words, 8, "A:1")
    assert swept.peak_bytes == pytest.approx(alone.peak_bytes, abs=3 * MiB)
    assert swept.sweep[0].peak_bytes >= swept.peak_bytes  # a lower bound: what it held when it failed
