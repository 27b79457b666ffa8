"""A verification runs on until its peak has stopped growing (#32 item 6, autotune.trials.settle): real
trials of the synthetic script, whose memory grows 1 MiB a step for its first 60 steps and then holds, as
the Llama-LoRA and T5 runs of the issue grew past their verification (969.05 MiB verified, 985.93 over 60
steps; T5 727.65 / 729.64 / 753.18 MiB after 5 / 15 / 100 steps)."""

from __future__ import annotations

from pathlib import Path

from autotune import api
from autotune.core.protocol import Outcome
from autotune.search.spec import VERIFY_SETTLE_STEPS
from autotune.trials.measurement import measure_spec
from autotune.trials.settings import TrialSettings
from autotune.trials.settle import SETTLE_WINDOW, growth, tolerance

from conftest import DETERMINISTIC_CPU_ALLOCATOR, SYNTHETIC

MiB = 2**20
GROWING = ["--base-mib", "20", "--per-sample-mib", "1", "--step-seconds", "0.01", "--grow-mib", "1"]


def peak(tmp_path: Path, settings: TrialSettings, *extra: str) -> tuple[int, str | None, int]:
    spec = measure_spec(
        [str(SYNTHETIC), *GROWING, *extra], 4, device="cpu", cache_dir=tmp_path, settings=settings
    )
    result = api.measure(spec, environ=DETERMINISTIC_CPU_ALLOCATOR)
    assert result.outcome is Outcome.COMPLETE, result.error
    return result.peak_bytes, result.settled, len(result.step_seconds)


def test_a_verification_s_peak_holds_for_a_250_step_run_of_the_same_configuration(tmp_path: Path) -> None:
    verification = TrialSettings(warmup_steps=2, measured_steps=15, settle_steps=VERIFY_SETTLE_STEPS)
    settled, why, steps = peak(tmp_path, verification, "--grow-steps", "60")
    exactly = TrialSettings(
        warmup_steps=2, measured_steps=15, tight=0, warmup_max=2
    )  # 17 steps, loaded or not
    fixed, _, _ = peak(tmp_path, exactly, "--grow-steps", "60")
    long, _, _ = peak(tmp_path, TrialSettings(warmup_steps=2, measured_steps=248), "--grow-steps", "60")
    assert long - fixed > 35 * MiB  # a fixed-length verification stops at 17 of the 60 growing steps
    assert settled >= long - 2 * MiB  # the settled one holds for the long run
    assert why is not None and why.startswith("settled after ")
    assert 60 + SETTLE_WINDOW - 17 <= steps < VERIFY_SETTLE_STEPS  # it stopped once the peak held


def test_a_peak_that_never_stops_growing_ends_at_the_cap(tmp_path: Path) -> None:
    # tight=0: a fixed count of measured steps (a loaded CI worker's wide interval once measured on past the
    # cap, to 88 steps: measuring on is tests/trials/test_tight_readings.py's)
    capped = TrialSettings(warmup_steps=2, measured_steps=5, settle_steps=30, tight=0, warmup_max=2)
    _, why, steps = peak(tmp_path, capped)
    assert why == "step cap after 37 steps" and steps == 35
    timed = TrialSettings(warmup_steps=2, measured_steps=5, settle_steps=10_000, settle_seconds=1.0)
    _, why, _ = peak(tmp_path, timed)
    assert why is not None and why.startswith("time cap after ")


def test_growth_is_the_rise_of_the_running_peak_over_the_window() -> None:
    by_step = {s: (100 + min(s, 30)) * MiB for s in range(60)}
    assert growth(by_step, SETTLE_WINDOW - 1) is None
    assert growth(by_step, 30) == (SETTLE_WINDOW * MiB, 130 * MiB)
    assert growth(by_step, 30 + SETTLE_WINDOW) == (0, 130 * MiB)
    sparse = {s: p for s, p in by_step.items() if s <= 20}  # a starved sampler: no sample past step 20
    assert growth(sparse, 30) is None and growth(sparse, 25) == (5 * MiB, 120 * MiB)
    assert tolerance(130 * MiB) == 2 * MiB and tolerance(4096 * MiB) == int(0.002 * 4096 * MiB)
