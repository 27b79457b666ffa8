"""Warm trial processes (issue 41: autotune.trials.warm, autotune.runtime.warm): one process measures one
configuration after another, each reading what a process of its own reads; a script that leaks, one that
cannot run twice in a process, and an out-of-memory error raised in the process are each handled as the
module says. Real processes, real RSS."""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from pathlib import Path

import pytest

from autotune.core.plans import Backend, parse_plan
from autotune.core.protocol import Outcome, TrialRequest
from autotune.hardware.devices import cpu_device, resolve_device
from autotune.hardware.meters import RssMeter, make_meter
from autotune.search.runner import TrialRunner
from autotune.trials.command import TrialCommand
from autotune.trials.measurement import TrialJob, run_trial
from autotune.trials.result import TrialResult
from autotune.trials.settings import TrialSettings
from autotune.trials.warm import WarmProcess, WarmTrials, capped

from conftest import ROOT, SCRIPTS, SYNTHETIC
from fake_nvml import FakeGpu, FakeNvml

MiB = 2**20
SETTINGS = TrialSettings(1, 3, 120, 300, tight=0)  # a fixed count of steps: peaks are what is compared
ENVIRON = dict(os.environ)  # glibc's allocator as users run it: its mmap threshold rising as blocks are freed
GPT = ["--n-layer", "4", "--n-embd", "128", "--block-size", "64"]


def _job(cache: Path, words: list[str]) -> TrialJob:
    return TrialJob(
        TrialCommand.parse(words), Backend.TORCH, cpu_device(), RssMeter(), SETTINGS, cache, ENVIRON
    )


def _alone(cache: Path, words: list[str], batch: int, plan: str) -> TrialResult:
    """The configuration in a process of its own, as every trial ran before warm processes."""
    result = run_trial(
        TrialCommand.parse(words), batch, parse_plan(plan), cpu_device(), RssMeter(), SETTINGS, cache, ENVIRON
    )
    assert result.outcome is Outcome.COMPLETE, result.error
    return result


def _runner(cache: Path, words: list[str], said: list[str]) -> TrialRunner:
    return TrialRunner(
        TrialCommand.parse(words), Backend.TORCH, cpu_device(), RssMeter(), SETTINGS, cache, ENVIRON,
        warm=True, say=said.append,
    )  # fmt: skip


def _one_runner(
    cache: Path, words: list[str], batches: tuple[int, ...]
) -> tuple[list[TrialResult], list[str]]:
    """Each batch size with no plan through one warm runner, as a search calls it; what the run was told."""
    said: list[str] = []
    runner = _runner(cache, words, said)
    try:
        return [runner(batch, "none") for batch in batches], said
    finally:
        runner.close()


def test_one_process_reads_three_batch_sizes_and_two_plans_as_processes_of_their_own(tmp_path: Path) -> None:
    """The synthetic script (no torch: it holds 20 MiB and 8 MiB a sample, half of that under plan A:1) run
    five times in one process: each configuration's peak is its own process's within 2 MiB (the meter's
    noise between two fresh processes of one configuration is about 1 MiB), each with its own steps."""
    words = [str(SYNTHETIC), "--base-mib", "20", "--per-sample-mib", "8", "--plan-effects", "A=0.5:0",
             "--step-seconds", "0.02"]  # fmt: skip
    pids = tmp_path / "pids"
    configurations = [(4, "none"), (16, "none"), (8, "none"), (16, "A:1"), (8, "A:1")]
    warm = WarmProcess(_job(tmp_path, [*words, "--pid-file", str(pids)]))
    try:
        readings = [warm.measure(batch, parse_plan(plan)) for batch, plan in configurations]
    finally:
        warm.close()
    assert [r.outcome for r in readings] == [Outcome.COMPLETE] * 5, [r.error for r in readings]
    assert [(r.batch_size, r.plan) for r in readings] == configurations
    assert [r.warm_run for r in readings] == [1, 2, 3, 4, 5]
    assert len(set(pids.read_text().split())) == 1  # one process ran the script five times
    assert len(pids.read_text().split()) == 5
    assert all(len(r.step_seconds) == 3 and r.samples_per_sec for r in readings)
    assert not warm.alive
    for reading in readings:
        alone = _alone(tmp_path, words, reading.batch_size, reading.plan)
        assert reading.peak_bytes == pytest.approx(alone.peak_bytes, abs=2 * MiB), reading
    assert readings[1].peak_bytes - readings[0].peak_bytes == pytest.approx(12 * 8 * MiB, abs=2 * MiB)


def test_a_configuration_after_the_first_warms_up_one_step_less(tmp_path: Path) -> None:
    """The process's first step paid its one-time costs: after its first configuration, each warms up one
    step less than a fresh process (at least one), and measures as many steps. (``warmup_max`` 1: no slow
    first step may lengthen a warm-up here, so the count is exact.)"""
    words = [str(SYNTHETIC), "--base-mib", "10", "--per-sample-mib", "1", "--step-seconds", "0.01"]
    job = _job(tmp_path, words)
    for warmup, expected in ((2, [2, 1, 1]), (1, [1, 1, 1]), (4, [4, 3, 3])):
        settings = TrialSettings(warmup, 3, 120, 300, tight=0, warmup_max=1)
        warm = WarmProcess(dataclasses.replace(job, settings=settings))
        try:
            readings = [warm.measure(batch, parse_plan("none")) for batch in (1, 2, 4)]
        finally:
            warm.close()
        assert [r.outcome for r in readings] == [Outcome.COMPLETE] * 3, [r.error for r in readings]
        assert [r.warm_run for r in readings] == [1, 2, 3]
        assert [r.warmup_steps for r in readings] == expected
        assert [len(r.step_seconds) for r in readings] == [3, 3, 3]


@pytest.mark.slow
@pytest.mark.compat  # four processes of examples/gpt.py: 61 s of CI's core suite, beside the real-model runs
def test_a_torch_model_reads_each_batch_and_plan_as_its_own_process_does(tmp_path: Path) -> None:
    """examples/gpt.py (4 blocks): batch 4 and 16 with no plan, then Block:1 at 16, in one process (the
    model built again for each, its plan applied as asked): each peak within 5% of a process of its own
    (two fresh processes of one configuration differ by up to ~3% here), recompute saving at 16."""
    words = [str(ROOT / "examples" / "gpt.py"), *GPT]
    warm = WarmProcess(_job(tmp_path, words))
    configurations = [(4, "none"), (16, "none"), (16, "Block:1")]
    try:
        readings = [warm.measure(batch, parse_plan(plan)) for batch, plan in configurations]
    finally:
        warm.close()
    assert [r.outcome for r in readings] == [Outcome.COMPLETE] * 3, [r.error for r in readings]
    assert [(r.batch_size, r.plan) for r in readings] == configurations
    assert {r.log_dir for r in readings} == {readings[0].log_dir}
    first = readings[0].startup_seconds
    assert first is not None and all((r.startup_seconds or first) < first for r in readings[1:])  # no imports
    for reading in readings:
        alone = _alone(tmp_path, words, reading.batch_size, reading.plan)
        assert abs(reading.peak_bytes - alone.peak_bytes) <= 0.05 * alone.peak_bytes, (
            reading.plan,
            reading.batch_size,
        )
    assert readings[2].peak_bytes < readings[1].peak_bytes


def test_an_out_of_memory_error_in_the_process_is_followed_by_a_smaller_batch_in_it(tmp_path: Path) -> None:
    """Batch 32 asks the allocator for more than any machine has (a real MemoryError): outcome oom; the
    process is back at rest and measures batch 8 next, as a process of its own would."""
    words = [str(SYNTHETIC), "--base-mib", "10", "--per-sample-mib", "4", "--oom-above", "16",
             "--step-seconds", "0.02"]  # fmt: skip
    warm = WarmProcess(_job(tmp_path, words))
    try:
        big = warm.measure(32, parse_plan("none"))
        assert warm.alive
        small = warm.measure(8, parse_plan("none"))
    finally:
        warm.close()
    assert big.outcome is Outcome.OOM and "MemoryError" in (big.error or "")
    assert small.outcome is Outcome.COMPLETE and (big.warm_run, small.warm_run) == (1, 2)
    assert small.log_dir == big.log_dir
    assert small.peak_bytes == pytest.approx(_alone(tmp_path, words, 8, "none").peak_bytes, abs=2 * MiB)


def test_a_leaking_script_is_measured_in_processes_of_its_own(tmp_path: Path) -> None:
    """Each run of the script keeps 48 MiB more in a module: after its second configuration the process is
    not back at its first rest; that configuration (its reading holds the first run's leak) is measured
    again in a process of its own, and so is every later one, the run told once."""
    words = [str(SYNTHETIC), "--base-mib", "10", "--per-sample-mib", "2", "--leak-mib", "48",
             "--step-seconds", "0.02"]  # fmt: skip
    (first, second, third), said = _one_runner(tmp_path, words, (2, 4, 8))
    assert [r.outcome for r in (first, second, third)] == [Outcome.COMPLETE] * 3
    assert (first.warm_run, second.warm_run, third.warm_run) == (1, None, None)
    assert len({first.log_dir, second.log_dir, third.log_dir}) == 3
    assert len(said) == 1 and re.fullmatch(
        rf"trials run one process each from now on: {re.escape(str(SYNTHETIC))}: its memory at rest grew "
        r"by 4[789] MiB over 2 configurations \(a leak, or a library holding the script's objects\)",
        said[0],
    ), said
    leak_once = _alone(tmp_path, words, 4, "none").peak_bytes
    assert second.peak_bytes == pytest.approx(leak_once, abs=2 * MiB)  # one leak, as in its own process


def test_a_script_that_cannot_run_twice_in_a_process_is_detected(tmp_path: Path) -> None:
    """The script fails when run again in one process (as one that initialises a process group at import
    does): its second configuration is measured again in a fresh process, where it completes; from then on
    each trial has a process of its own, and the run is told why, once."""
    words = [str(SYNTHETIC), "--base-mib", "10", "--per-sample-mib", "2", "--once-per-process",
             "--step-seconds", "0.02"]  # fmt: skip
    (first, second, third), said = _one_runner(tmp_path, words, (2, 4, 8))
    assert [r.outcome for r in (first, second, third)] == [Outcome.COMPLETE] * 3
    assert (first.warm_run, second.warm_run, third.warm_run) == (1, 1, None)
    assert len({first.log_dir, second.log_dir, third.log_dir}) == 3
    assert said == [
        f"trials run one process each from now on: {SYNTHETIC} failed on its run 2 in one process "
        "(RuntimeError: trying to initialize the default process group twice!) and not in a fresh one"
    ]


def test_a_script_that_fails_in_a_fresh_process_too_keeps_its_warm_process(tmp_path: Path) -> None:
    """A failure of the configuration itself (plan B:1 raises ValueError, in any process) is its outcome:
    the fresh process that confirmed it goes on warm with the next configuration."""
    words = [str(SYNTHETIC), "--base-mib", "10", "--per-sample-mib", "2", "--crash-plan", "B:1",
             "--step-seconds", "0.02"]  # fmt: skip
    said: list[str] = []
    runner = _runner(tmp_path, words, said)
    try:
        first, failed, after = (runner(batch, plan) for batch, plan in ((2, "none"), (8, "B:1"), (8, "none")))
    finally:
        runner.close()
    assert [r.outcome for r in (first, failed, after)] == [Outcome.COMPLETE, Outcome.FAILED, Outcome.COMPLETE]
    assert "ValueError: synthetic crash with plan B:1" in (failed.error or "")
    assert (first.warm_run, failed.warm_run, after.warm_run) == (1, 1, 2)
    assert after.log_dir == failed.log_dir != first.log_dir
    assert said == []


def test_a_process_that_does_not_take_its_next_configuration_is_ended_and_warm_turned_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script leaves time.sleep blocking (its process at rest never looks for its next message again):
    within TAKE_SECONDS the process is ended, the configuration measured in a process of its own, the run
    told once, and later trials run one process each."""
    monkeypatch.setattr("autotune.trials.warm.TAKE_SECONDS", 3.0)
    words = [str(SYNTHETIC), "--base-mib", "10", "--per-sample-mib", "2", "--deaf-after-run",
             "--step-seconds", "0.02"]  # fmt: skip
    (first, second, third), said = _one_runner(tmp_path, words, (2, 4, 8))
    assert [r.outcome for r in (first, second, third)] == [Outcome.COMPLETE] * 3
    assert (first.warm_run, second.warm_run, third.warm_run) == (1, None, None)
    assert len({first.log_dir, second.log_dir, third.log_dir}) == 3
    assert said == [
        f"trials run one process each from now on: {SYNTHETIC}: its process did not take configuration 2 "
        "within 3s"
    ]


def test_on_the_cpu_a_smaller_batch_than_the_process_ran_starts_a_new_process(tmp_path: Path) -> None:
    """glibc's allocator keeps a history (its mmap threshold rises as large blocks are freed): a process that
    ran batch 16 would read batch 4 high, so batch 4 starts a new process, which then takes 8 and 16."""
    words = [str(SYNTHETIC), "--base-mib", "10", "--per-sample-mib", "2", "--step-seconds", "0.02"]
    readings, said = _one_runner(tmp_path, words, (2, 16, 4, 8, 16))
    assert [r.outcome for r in readings] == [Outcome.COMPLETE] * 5
    assert [r.warm_run for r in readings] == [1, 2, 1, 2, 3]
    assert len({r.log_dir for r in readings}) == 2 and said == []


def test_a_verification_a_probe_and_a_sweep_each_run_in_a_process_of_their_own(tmp_path: Path) -> None:
    """The warm process is ended before a configuration it does not take (here a verification's settling
    run, TrialSettings.settle_steps): that one has a process of its own, and the next trial a new warm one."""
    words = [str(SYNTHETIC), "--base-mib", "10", "--per-sample-mib", "2", "--step-seconds", "0.02"]
    said: list[str] = []
    runner = _runner(tmp_path, words, said)
    settling = TrialSettings(1, 3, 120, 300, tight=0, settle_steps=4)
    try:
        first = runner(2, "none")
        verified = runner(2, "none", settings=settling)
        after = runner(4, "none")
    finally:
        runner.close()
    assert [r.outcome for r in (first, verified, after)] == [Outcome.COMPLETE] * 3
    assert (first.warm_run, verified.warm_run, after.warm_run) == (1, None, 1)
    assert len({first.log_dir, verified.log_dir, after.log_dir}) == 3


def test_on_a_gpu_the_next_configuration_runs_under_the_allocator_cap(tmp_path: Path) -> None:
    """FAKE NVML (no GPU here; the real path: tests/hardware/test_devices_and_nvml.py, marked gpu): a process
    holding 500 MiB at rest outside torch's allocator (its CUDA context) gets its next configurations with
    torch's allocator capped at the budget less that; its first, started fresh, has no cap (the meter guards
    it alone); on the CPU no configuration has one."""
    fake = FakeNvml([FakeGpu("GPU-warm", usage_file=tmp_path / "usage")])
    device = resolve_device("cuda:0", {}, lambda: fake)
    words = [str(SCRIPTS / "fake_gpu_trial.py"), "--context-mib", "500", "--per-sample-mib", "10"]
    job = TrialJob(
        TrialCommand.parse(words), Backend.TORCH, device, make_meter(device, fake), SETTINGS, tmp_path,
        {**os.environ, "FAKE_GPU_USAGE_FILE": str(tmp_path / "usage")}, ceiling=2 * 2**30,
    )  # fmt: skip
    warm = WarmProcess(job)
    try:
        readings = [warm.measure(batch, parse_plan("none")) for batch in (4, 8, 2)]
    finally:
        warm.close()
    assert [r.outcome for r in readings] == [Outcome.COMPLETE] * 3
    assert [r.peak_bytes for r in readings] == [540 * MiB, 580 * MiB, 520 * MiB]  # the context included
    caps = [TrialRequest.read(Path(readings[0].log_dir) / f"request-{k}.json").memory_cap for k in (1, 2, 3)]
    assert caps == [0, 2 * 2**30 - 500 * MiB, 2 * 2**30 - 500 * MiB]
    cpu = WarmProcess(_job(tmp_path, [str(SYNTHETIC), "--base-mib", "10", "--step-seconds", "0.02"]))
    try:
        on_the_cpu = [cpu.measure(batch, parse_plan("none")) for batch in (1, 2)]
    finally:
        cpu.close()
    assert [
        TrialRequest.read(Path(on_the_cpu[0].log_dir) / f"request-{k}.json").memory_cap for k in (1, 2)
    ] == [0, 0]


def test_the_probe_starts_the_warm_process_the_search_s_trials_run_in(tmp_path: Path) -> None:
    """The probe is the warm process's first configuration and the search's trials run in the process it
    started (one start-up fewer: 12-24 s on an H200); a probe the budget stops there runs again in a process
    of its own, without the budget, as a probe always ran. On a FAKE NVML device (no GPU here), where a
    configuration's reading starts from the device's use at rest, and on the CPU (real RSS), where it starts
    from the process's resident memory at rest."""
    fake = FakeNvml([FakeGpu("GPU-warm", usage_file=tmp_path / "usage")])
    device = resolve_device("cuda:0", {}, lambda: fake)
    words = [str(SCRIPTS / "fake_gpu_trial.py"), "--context-mib", "500", "--per-sample-mib", "10"]
    environ = {**os.environ, "FAKE_GPU_USAGE_FILE": str(tmp_path / "usage")}

    def gpu_runner(ceiling: int) -> TrialRunner:
        return TrialRunner(
            TrialCommand.parse(words), Backend.TORCH, device, make_meter(device, fake), SETTINGS, tmp_path,
            environ, ceiling=ceiling, warm=True,
        )  # fmt: skip

    runner = gpu_runner(2 * 2**30)
    try:
        probe = runner(1, "none", probe=True)
        after = [runner(batch, "none") for batch in (1, 4)]
    finally:
        runner.close()
    assert [r.outcome for r in (probe, *after)] == [Outcome.COMPLETE] * 3
    assert [r.warm_run for r in (probe, *after)] == [1, 2, 3]
    assert len({r.log_dir for r in (probe, *after)}) == 1
    requests = [TrialRequest.read(Path(probe.log_dir) / f"request-{k}.json") for k in (1, 2, 3)]
    assert [r.probe for r in requests] == [True, False, False]
    assert [r.peak_bytes for r in after] == [510 * MiB, 540 * MiB]  # read from the probe's rest like any

    folders = set((tmp_path / "trials").iterdir())
    tight = gpu_runner(505 * MiB)  # the probe's 510 MiB passes it: stopped warm, then run alone
    try:
        stopped = tight(1, "none", probe=True)
    finally:
        tight.close()
    assert (stopped.outcome, stopped.warm_run, stopped.peak_bytes) == (Outcome.COMPLETE, None, 510 * MiB)
    tried = sorted(set((tmp_path / "trials").iterdir()) - folders)
    assert len(tried) == 2 and (tried[0] / "request-1.json").exists()  # the warm try, then its own process

    synthetic = [str(SYNTHETIC), "--base-mib", "10", "--per-sample-mib", "8", "--step-seconds", "0.02"]
    cpu = _runner(tmp_path, synthetic, [])
    try:
        probe, first, second = cpu(1, "none", probe=True), cpu(1, "none"), cpu(4, "none")
    finally:
        cpu.close()
    assert [r.outcome for r in (probe, first, second)] == [Outcome.COMPLETE] * 3
    assert [r.warm_run for r in (probe, first, second)] == [1, 2, 3]
    alone = _alone(tmp_path, synthetic, 4, "none")  # its peak: within the warm readings' excess (2 MiB here)
    assert abs((second.peak_bytes or 0) - (alone.peak_bytes or 0)) <= 2 * MiB, (
        second.peak_bytes,
        alone.peak_bytes,
    )


def test_an_out_of_memory_error_under_the_cap_is_over_the_budget() -> None:
    """The cap is the budget's: torch's error there says the configuration needs more than the budget."""
    assert capped("OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB") == (
        Outcome.OVER_BUDGET,
        "raised out of memory at the allocator's cap, the budget less the process's memory outside torch's "
        "allocator (the peak is a lower bound): OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    )


def test_what_never_runs_warm_and_what_the_run_is_told() -> None:
    """A job whose trials cannot share a process is told why once (its phases, its command, its backend); a
    configuration that cannot (a compile plan, a verification) just runs in a process of its own."""
    said: list[str] = []
    synthetic = TrialCommand.parse([str(SYNTHETIC)])
    trials = WarmTrials(
        TrialJob(synthetic, Backend.TORCH, cpu_device(), RssMeter(), SETTINGS, Path("."), {}), said.append
    )
    assert trials.suits("none", SETTINGS) and trials.suits("Block:0.5", SETTINGS)
    assert not trials.suits("compile:0.5", SETTINGS)
    assert not trials.suits("none", TrialSettings(1, 3, 120, 300, settle_steps=4))
    assert said == []
    with_eval = TrialSettings(1, 3, 120, 300, phases=("eval",))
    assert not trials.suits("none", with_eval) and not trials.suits("A:1", with_eval)
    assert said == [
        "trials run one process each: --with-eval and --with-save run their phase once, after the measured steps"
    ]
    torchrun = TrialCommand.parse(
        [
            str(Path(sys.executable).with_name("torchrun")),
            "--nproc-per-node",
            "2",
            str(SYNTHETIC),
            "--bs",
            "{batch_size}",
        ]
    )
    ranks = WarmTrials(
        TrialJob(torchrun, Backend.TORCH, cpu_device(), RssMeter(), SETTINGS, Path("."), {}), said.append
    )
    assert not ranks.suits("none", SETTINGS)
    ort = WarmTrials(
        TrialJob(synthetic, Backend.ORT, cpu_device(), RssMeter(), SETTINGS, Path("."), {}), said.append
    )
    assert not ort.suits("none", SETTINGS)
    assert said[1:] == [
        "trials run one process each: the harness does not run the command's Python (torchrun, a shell wrapper)",
        "trials run one process each: --backend ort builds its session for one plan",
    ]
