"""A verification runs on until its peak has stopped growing (#32 item 6, autotune.trials.settle): real
trials of the synthetic script, whose memory grows 1 MiB a step for its first 60 steps and then holds, as
the Llama-LoRA and T5 runs of the issue grew past their verification (969.05 MiB verified, 985.93 over 60
steps; T5 727.65 / 729.64 / 753.18 MiB after 5 / 15 / 100 steps)."""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner
from optuna.distributions import CategoricalDistribution

from autotune import api
from autotune.cli import cli
from autotune.core.protocol import Outcome, read_settled
from autotune.search.optuna_trials import CONSTRAINTS_ATTR, tell_result
from autotune.search.records import TrialRecord, peak_verdict
from autotune.search.spec import VERIFY_SETTLE_STEPS
from autotune.trials.measurement import measure_spec
from autotune.trials.settings import TrialSettings
from autotune.trials.settle import (
    RATE_MIN_STEPS,
    ROOM,
    SETTLE_WINDOW,
    Settle,
    growth,
    recent_rise,
    still_rising,
    tolerance,
)

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
    # a fixed count of measured steps (tight=0: on a loaded machine the tight rule measured on, and the
    # trial ran 334 steps in all), then settling
    verification = TrialSettings(
        warmup_steps=2, measured_steps=15, settle_steps=VERIFY_SETTLE_STEPS, tight=0, warmup_max=2
    )
    settled, why, steps = peak(tmp_path, verification, "--grow-steps", "60")
    exactly = TrialSettings(
        warmup_steps=2, measured_steps=15, tight=0, warmup_max=2
    )  # 17 steps, loaded or not
    fixed, _, _ = peak(tmp_path, exactly, "--grow-steps", "60")
    long, _, _ = peak(tmp_path, TrialSettings(warmup_steps=2, measured_steps=248), "--grow-steps", "60")
    assert long - fixed > 35 * MiB  # a fixed-length verification stops at 17 of the 60 growing steps
    # the settled one held all 60 growing steps: the 43 the fixed one missed (43.0-43.3 MiB read here)...
    assert settled - fixed >= (60 - 17 - 2) * MiB
    # ... and holds for the long run. A long run's RSS can read a little above the growth the script holds:
    # CI once read 105.1 MiB for 250 steps where the settled run read 102.1 (101.9-102.1 here, quiet or
    # beside three bursting neighbours; 1500 steps read 102.5)
    assert settled >= long - 4 * MiB, (settled / MiB, long / MiB)
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


def test_a_verification_whose_peak_still_rose_at_its_cap_fits_only_with_room_for_as_much_again(
    tmp_path: Path,
) -> None:
    """#43 item 2: an answer's peak must hold over the verification's settled run. Memory growing 1 MiB a
    step forever: the time cap ends the run with the peak still rising ~10 MiB over its last 10 steps, and
    at a limit between the peak and the peak plus that rise the verification does not fit, here and as the
    study stores it (its constraint and its record), so the search takes it for over the limit."""
    spec = measure_spec(
        [str(SYNTHETIC), *GROWING], 4, device="cpu", cache_dir=tmp_path,
        settings=TrialSettings(warmup_steps=2, measured_steps=5, settle_steps=10_000, settle_seconds=1.0),
    )  # fmt: skip
    result = api.measure(spec, environ=DETERMINISTIC_CPU_ALLOCATOR)
    assert result.outcome is Outcome.COMPLETE, result.error
    assert result.settled is not None and result.settled.startswith("time cap after ")
    # ~10 MiB: the sampled peaks of the last ten steps. A starved sampler moves either end: CI's load once
    # let it miss the newest pages of the last steps (7.0 MiB), once left it no sample in the steps before
    # the window, so the window's start read an older, lower peak (12.05 MiB); the rules below hold for
    # whatever rise was read
    assert result.rising_bytes is not None and 5 * MiB <= result.rising_bytes <= 16 * MiB
    between = result.peak_bytes + result.rising_bytes // 2
    assert result.fits(result.peak_bytes + result.rising_bytes) and not result.fits(between)

    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'studies.db'}", direction="maximize")
    trial = study.ask(
        {"batch_size": CategoricalDistribution((4,)), "plan": CategoricalDistribution(("none",))}
    )
    tell_result(study, trial, result, limit=between)
    stored = study.trials[0]
    record = TrialRecord.from_frozen(stored)
    assert record.rising_bytes == result.rising_bytes and record.peak_bytes == result.peak_bytes
    assert not record.fits(between) and peak_verdict([record], (4, "none"), between) is False
    assert stored.system_attrs[CONSTRAINTS_ATTR] == [pytest.approx((result.rising_bytes // 2) / MiB)]


def test_a_settled_verification_has_no_rise_to_make_room_for() -> None:
    assert still_rising({s: (100 + s) * MiB for s in range(40)}, 39, "settled after 39 steps") is None
    assert still_rising({s: (100 + s) * MiB for s in range(40)}, 39, "time cap after 39 steps") == 10 * MiB
    flat = {s: 100 * MiB + s * 4096 for s in range(40)}  # a page a step: the meter's noise
    assert still_rising(flat, 39, "step cap after 39 steps") is None
    assert still_rising({1: 100 * MiB}, 5, "the script's end after 5 steps") is None  # too short to say


def test_a_run_whose_answer_was_still_rising_says_so(tmp_path: Path) -> None:
    """Memory growing 0.5 MiB a step forever: the verification ends at its step cap still rising, and the run
    says so where the trial ends and beside the answer's peak."""
    result = CliRunner().invoke(
        cli,
        [
            "run", "--budget", "600MiB", "--trials", "6", "--cache-dir", str(tmp_path), "--plans", "none",
            "--batch-sizes", "1-64", "--steps", "3", "--warmup-steps", "1", "--device", "cpu", str(SYNTHETIC),
            "--", "--base-mib", "20", "--per-sample-mib", "4", "--step-seconds", "0.02", "--grow-mib", "0.5",
        ],
        env={"COLUMNS": "300"},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert re.search(
        r"trial \d+'s peak was still rising, [\d.]+ MiB per 10 steps at the end \(rising with room to spare "
        r"after",
        result.output,
    )
    assert re.search(r"; still rising [\d.]+ MiB per 10 steps at the end of its longest run", result.output)


def test_the_limit_has_room_for_a_rise_that_goes_on_at_its_rate_until_the_cap() -> None:
    """Issue 41: a verification need not wait for its peak to settle where waiting could change no verdict.
    The peak (112 MiB) rose 10 MiB over its last 10 steps, at a step a second since the first poll, and the
    time cap allows 30 s more: the limit must hold 30 more steps at that rate and the window's rise once
    more, 40 MiB over the peak. A byte less and it waits; without a limit (``measure``) it always waits."""

    def room(limit: int | None, peak: int = 112 * MiB, steps: int = 12, now: float = 10.0) -> bool:
        settle = Settle(Path("settled.json"), measured=12, seconds=30.0, limit=limit)
        settle.first, settle.started, settle.cap = (0.0, 2), 10.0, 30.0
        return settle.room(10 * MiB, peak, steps, now)

    assert room(152 * MiB) and not room(152 * MiB - 1) and not room(None)
    # 20 s on (at the same pace, 32 steps), 10 s of the cap are left: room for 20 MiB over the peak
    assert room(132 * MiB, steps=32, now=30.0) and not room(132 * MiB, peak=113 * MiB, steps=32, now=30.0)


def test_a_single_process_ends_at_the_step_it_is_in_and_ranks_one_later(tmp_path: Path) -> None:
    """The tuner saw 12 steps finished and a settled peak: a single process, in its 13th, ends there (a step
    of 2.3 s less on issue 41's GPT-2 than the ranks' margin); ranks, the slowest of which the tuner saw,
    end at 14, a step none of them has finished (read_progress is their slowest's)."""
    progress = tmp_path / "progress.json"
    flat = {step: 100 * MiB for step in range(1, 13)}

    def end() -> tuple[int, str] | None:
        (tmp_path / "settled.json").unlink(missing_ok=True)
        Settle(tmp_path / "settled.json", measured=12, seconds=30.0, progress=progress).watch(12, flat, 5.0)
        return read_settled(str(tmp_path / "settled.json"))

    assert end() == (13, "settled")
    for rank in (0, 1):
        (tmp_path / f"progress.rank-{rank}.json").write_text("{}")
    assert end() == (14, "settled")


def test_a_verification_with_room_for_its_rise_ends_before_its_peak_settles(tmp_path: Path) -> None:
    """A real trial of the synthetic script growing 1 MiB a step for its first 60 steps, as a verification
    runs it: with a limit far above its peak it ends once it has run its measured steps, its rise over the
    last 10 steps recorded for the answer to leave room for; with a limit just above its settled peak it
    runs on until the peak settles (as without a limit: the first test)."""
    settings = TrialSettings(
        warmup_steps=2, measured_steps=15, settle_steps=VERIFY_SETTLE_STEPS, tight=0, warmup_max=2,
        settle_limit=64 * 2**30,
    )  # fmt: skip
    spec = measure_spec(
        [str(SYNTHETIC), *GROWING, "--grow-steps", "60"],
        4,
        device="cpu",
        cache_dir=tmp_path,
        settings=settings,
    )
    result = api.measure(spec, environ=DETERMINISTIC_CPU_ALLOCATOR)
    assert result.outcome is Outcome.COMPLETE, result.error
    assert result.settled is not None and result.settled.startswith(f"{ROOM} after "), result.settled
    assert len(result.step_seconds) < 60 - 2  # ended while the peak still grew
    # ~10 MiB: the sampled peaks of the last ten steps (a starved sampler moves either end: the cap test)
    assert result.rising_bytes is not None and 5 * MiB <= result.rising_bytes <= 16 * MiB
    near = dataclasses.replace(settings, settle_limit=result.peak_bytes + 20 * MiB)
    tight, why, steps = peak(tmp_path, near, "--grow-steps", "60")
    assert why is not None and why.startswith("settled after "), why
    assert steps >= 60 + SETTLE_WINDOW - 17 and tight - result.peak_bytes >= 30 * MiB


def test_a_peak_s_rate_is_read_over_the_steps_since_warm_up_where_they_are_fewer_than_the_window() -> None:
    """Issue 41: a verification that has run its five measured steps past two of warm-up reads its peak's
    rate over those five, per 10 steps: 1 MiB a step reads 10 MiB; the warm-up's own climb (the first
    step allocates everything) is never in it; fewer than three steps say nothing."""
    climbing = {1: 500 * MiB, 2: 600 * MiB, **{s: (600 + s - 2) * MiB for s in range(3, 8)}}
    assert recent_rise(climbing, 7, warmup=2) == (10 * MiB, 605 * MiB)
    assert recent_rise(climbing, 4, warmup=2) is None and RATE_MIN_STEPS == 3
    assert recent_rise(climbing, 5, warmup=2) == (10 * MiB, 603 * MiB)
    # past the window, the window: the old rule's figure
    long = {s: (600 + min(s, 30)) * MiB for s in range(1, 40)}
    assert recent_rise(long, 30, warmup=2) == growth(long, 30) == (10 * MiB, 630 * MiB)
    # a rise over three steps of 1 MiB reads 3 MiB per 10 (integer bytes: 10 // 3)
    assert recent_rise(long, 5, warmup=2) == (3 * MiB * 10 // 3, 605 * MiB)
    # a run that ended with room to spare keeps that rate: the answer leaves room for as much again
    assert still_rising(climbing, 7, f"{ROOM} after 7 steps", warmup=2) == 10 * MiB


def test_a_verification_with_room_ends_once_its_measured_steps_are_done(tmp_path: Path) -> None:
    """Issue 41's GPT-2 on the CPU: a verification of 2 warm-up and 5 measured steps of 2.2 s, its peak 2052
    MiB and climbing 7 MiB a step past warm-up (glibc's heap stepping up), 130 MiB under its limit, ends at
    its 7th step: 8.6 more steps at that rate and ten once more need 130 MiB, which the limit holds. The
    same peak 125 MiB under the limit waits; so did every verification before, whose rise was read over a
    full window of ten steps past warm-up (12 steps, then 13 here: 13 steps of 2.2 s of a 76 s answer)."""
    by_step = {1: 1500 * MiB, 2: 2010 * MiB, **{s: (2010 + 7 * (s - 2)) * MiB for s in range(3, 8)}}
    peak = by_step[7]

    def ends(limit: int) -> tuple[int, str] | None:
        settled = tmp_path / "settled.json"
        settled.unlink(missing_ok=True)
        settle = Settle(settled, measured=7, seconds=120.0, limit=limit, warmup=2)
        settle.first = (time.monotonic() - 6 * 2.2, 1)  # 2.2 s a step since the first poll
        settle.watch(7, by_step, 19.0)  # 19 s since the launch: as long again to settle
        return read_settled(str(settled))

    # the rate: 35 MiB over 5 steps, 70 per 10; the pace: 2.2 s a step since the first poll
    assert recent_rise(by_step, 7, warmup=2) == (70 * MiB, peak)
    assert ends(peak + 131 * MiB) == (8, ROOM)
    assert ends(peak + 125 * MiB) is None  # (a second late to the poll, it would still wait)
