"""One measured trial: ``run_trial`` on a resolved device and meter (what the search calls), and
``measure(spec)`` (what ``autotune measure`` and ``autotune.measure`` call), the unit every search is built
from: request -> launch -> report -> TrialResult."""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.backends import AnyPlan, parse_backend_plan
from autotune.backends.probe_report import ModuleCandidate, probe_report_from_json
from autotune.core.batches import check_trial_sizes, grad_accum_for
from autotune.core.budget import Budget, parse_budget
from autotune.core.errors import InputError
from autotune.core.faults import files_fault, unwritable, writing_trial_files
from autotune.core.paths import cache_dir, compile_cache_dir, new_trial_dir, torch_default_inductor_dir
from autotune.core.plans import Backend, Plan
from autotune.core.protocol import (
    BATCH_SIZE_ENV,
    GRAD_ACCUM_ENV,
    NOT_FOR_TRIALS,
    PLAN_ENV,
    REQUEST_ENV,
    SEGMENT_PHASE,
    Outcome,
    RankResult,
    Segment,
    TrialReport,
    TrialRequest,
)
from autotune.hardware.devices import Device, gpus_in, resolve_device
from autotune.hardware.host import default_host_budget
from autotune.hardware.load import LoadSnapshot
from autotune.hardware.meters import HOST_METHODS, MemoryMeter, MemoryReading, RankPeak, make_meter
from autotune.hardware.nvml import nvml_loader
from autotune.trials.command import TrialCommand
from autotune.trials.interpreter import check_interpreter
from autotune.trials.interrupts import InterruptShield
from autotune.trials.launcher import Launch, ProcessExit, run_process, tail
from autotune.trials.ranks import RankWatch, merge_reports, rank_failed, rank_reports
from autotune.trials.result import TrialResult, classify, steps_load, throughput, token_throughput
from autotune.trials.settings import TrialSettings
from autotune.trials.settle import Settle, still_rising
from autotune.trials.workload import workload_of

# A torch probe's measured steps: its speed is no reading (its steps are instrumented), and it ends once its
# probe has recorded forward #2, timed #3 and checked the plans (runtime.checks.probe_pending, which holds it
# up to PROBE_PATIENCE steps more). Five measured steps at batch 1 took 2.5 s of issue 41's GPT-2's 12 s probe
# on the CPU, after its checks were done. An ORT probe ends at its measured steps: those stay the run's.
PROBE_MEASURED_STEPS = 1


@dataclass(frozen=True)
class MeasureSpec:
    """One trial to run: ``command`` at ``batch_size`` with ``plan`` on ``device``; with ``budget``, the
    result says whether its peak fits (the budget is resolved on the device before the trial starts), and
    a trial that passes it is stopped at once."""

    command: TrialCommand
    batch_size: int
    plan: AnyPlan = field(default_factory=Plan.none)  # a Plan, or for backend ort an OrtPlan
    device: str = "auto"
    settings: TrialSettings = field(default_factory=TrialSettings)
    cache_dir: Path | None = None
    backend: Backend = Backend.TORCH
    budget: Budget | None = None
    grad_accum: int | None = None  # micro-batches per optimizer step the trial asks for (None: the script's)

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise InputError(f"batch size must be a positive integer, got {self.batch_size}")
        if self.grad_accum is not None and self.grad_accum < 1:
            raise InputError(f"--grad-accum must be a positive integer, got {self.grad_accum}")


def measure_spec(
    command: Sequence[str],
    batch_size: int,
    *,
    plan: str = "none",
    backend: str | Backend = Backend.TORCH,
    budget: str | None = None,
    settings: TrialSettings | None = None,
    device: str = "auto",
    cache_dir: Path | None = None,
    global_batch: int | None = None,
    grad_accum: int | None = None,
) -> MeasureSpec:
    """A MeasureSpec from what a user types: ``measure_spec(["train.py"], 32, plan="all", budget="8GB")``.

    ``global_batch``: the trial accumulates ``global_batch / (batch_size x ranks)`` micro-batches per optimizer
    step (ranks: a torchrun command's ``--nproc-per-node``);
    ``grad_accum``: the script accumulates that many on its own (either way samples/s counts them all).

    Raises:
        InputError: a bad command, plan, backend, budget or global batch, in one line.
    """
    parsed = TrialCommand.parse(command)
    if global_batch is not None:
        if grad_accum is not None:
            raise InputError("give --global-batch or --grad-accum, not both")
        grad_accum = grad_accum_for(global_batch, batch_size, parsed.world_size(gpus_in(device)))
    return MeasureSpec(
        command=parsed,
        batch_size=batch_size,
        plan=parse_backend_plan(plan, backend),
        device=device,
        settings=settings or TrialSettings(),
        cache_dir=cache_dir,
        backend=Backend.parse(backend),
        budget=parse_budget(budget) if budget is not None else None,
        grad_accum=grad_accum,
    )


def measure(
    spec: MeasureSpec, environ: Mapping[str, str] | None = None, nvml: Any = None, probe: bool = False
) -> TrialResult:
    """Run one trial of ``spec`` and measure it (with the probe's instruments if ``probe``).

    Args:
        spec: what to run.
        environ: the environment the trial inherits (default: this process's).
        nvml: an NVML module to use instead of nvidia-ml-py's (tests without a GPU pass a fake).

    Raises:
        InputError, DeviceError: bad spec, device or budget (before any trial runs).
        TrialError: the trial could not be started.
    """
    env = dict(os.environ if environ is None else environ)
    device = resolve_device(spec.device, env, nvml_loader(nvml))
    budget_bytes = spec.budget.resolve(device.total_bytes) if spec.budget is not None else None
    check_interpreter(spec.command, env)
    with InterruptShield() as shield:  # a Ctrl-C as the trial starts still stops it (TrialInterrupted)
        result = run_trial(
            spec.command,
            spec.batch_size,
            spec.plan,
            device,
            make_meter(device, nvml),
            spec.settings,
            cache_dir(spec.cache_dir),
            env,
            spec.backend,
            probe=probe,
            interruptible=shield.allow,
            ceiling=budget_bytes,  # a trial is stopped as soon as it passes the budget it is measured against
            grad_accum=spec.grad_accum,
        )
    return dataclasses.replace(result, budget_bytes=budget_bytes)


@dataclass(frozen=True)
class TrialJob:
    """What every trial of a job shares: the command, where it runs, how it is measured and stopped (the
    budget as its ceiling, the host budget)."""

    command: TrialCommand
    backend: Backend
    device: Device
    meter: MemoryMeter
    settings: TrialSettings
    root: Path
    environ: Mapping[str, str]
    ceiling: int | None = None
    host_budget: int | None = None


def run_trial(
    command: TrialCommand,
    batch_size: int,
    plan: AnyPlan,
    device: Device,
    meter: MemoryMeter,
    settings: TrialSettings,
    root: Path,
    environ: Mapping[str, str],
    backend: Backend = Backend.TORCH,
    on_poll: Callable[[int, float], None] | None = None,
    probe: bool = False,
    interruptible: Callable[[], AbstractContextManager[None]] | None = None,
    stop: threading.Event | None = None,
    ceiling: int | None = None,
    grad_accum: int | None = None,
    check_plans: tuple[str, ...] = (),
    host_budget: int | None = None,
    node_ranks: range | None = None,
    sweep: tuple[str, ...] = (),
) -> TrialResult:
    """Run one trial on an already resolved device with ``meter``; files go to a new folder under ``root``.

    ``ceiling``: bytes; a trial whose sampled peak passes it is stopped at once and ends ``over-budget``.
    ``grad_accum``: micro-batches per optimizer step the trial asks for (None: the script's own, counted).
    ``check_plans``: a probe also checks these plans against no plan.
    ``host_budget``: bytes of host memory the trial's processes may hold (None: what the host has available
    now, less a margin); a trial passing it is stopped at once and ends ``killed``.
    ``sweep``: more plans measured after ``plan`` in the same process (TrialRequest.sweep); the result is
    ``plan``'s, with the others' in its ``sweep``.
    ``node_ranks``: the ranks this node runs, where the trial spans several nodes (autotune.cluster): only
    they must report here.
    ``interruptible`` and ``stop``: see :func:`autotune.trials.launcher.run_process`.

    Raises:
        InputError: ``batch_size`` or ``grad_accum`` is not a whole number >= 1 (whoever called: it goes into
            the trial's command line and environment), before anything is started.
    """
    check_trial_sizes(batch_size, grad_accum)
    with writing_trial_files(root / "trials"):
        workdir = new_trial_dir(root)
        request = trial_request(
            workdir, batch_size, plan, backend, device, settings, probe, grad_accum, check_plans, sweep
        )
        request.write(workdir / "request.json")
    # torchrun's ranks, or those another launcher starts (DeepSpeed's: each reports its $RANK)
    watch = RankWatch(workdir / "progress.json", declared=command.launcher)
    launch = dataclasses.replace(
        trial_launch(
            command.argv(batch_size, grad_accum),
            request,
            workdir,
            TrialJob(command, backend, device, meter, settings, root, environ, ceiling, host_budget),
        ),
        ranks=watch,
        ended=lambda: rank_failed(request.report_path),
        settle=(
            Settle(
                Path(request.settled_path),
                request.total_steps,
                settings.settle_seconds,
                settings.settle_limit,
                Path(request.progress_path),
                warmup=request.warmup_steps,
            )
            if settings.settle_steps
            else None
        ),
    )  # fmt: skip
    before = LoadSnapshot.now()
    with writing_trial_files(workdir):  # its logs must be opened
        exit_info, reading = run_process(launch, meter, on_poll, interruptible, stop)
    load = before.until(LoadSnapshot.now())
    if exit_info.cpu_seconds is not None and exit_info.wall_seconds > 0:
        load = dataclasses.replace(load, cpu_per_wall=exit_info.cpu_seconds / exit_info.wall_seconds)
    reports = rank_reports(request.report_path)
    reading = ranks_own_high_water(reading, reports)
    started = watch.identities()
    report = (
        merge_reports(reports, started, node_ranks)
        if reports or started
        else read_report(Path(request.report_path))
    )
    host_read = reading.peak_bytes if reading.method in HOST_METHODS else None
    outcome, error = classify(exit_info, report, settings, host_read)
    if outcome is not Outcome.COMPLETE and (refused := unwritable(workdir)) is not None:
        raise files_fault(
            workdir, refused
        )  # the trial could not write its report: the storage, not the script
    if outcome is Outcome.FAILED:
        error = "\n".join(filter(None, [error, tail(workdir / "stderr.log")]))
    ranks = _rank_results(reading, reports, exit_info, ceiling)
    result = dataclasses.replace(
        trial_result(outcome, error, request, device, reading, exit_info, report, workdir, ranks),
        load=steps_load(load, report),
    )
    if request.sweep and report is not None and report.segments:
        return _swept(result, report.segments, request, reading)
    return result


def _swept(
    first: TrialResult, segments: list[Segment], request: TrialRequest, reading: MemoryReading
) -> TrialResult:
    """A sweep's result per plan: each segment that completed, with its own steps and its own peak (the
    samples filed under its phase, the first's under its steps; on the CPU never below the process's
    resident high-water mark over the segment), then the segment the trial ended in with the trial's
    outcome (out of memory, over budget, failed); plans after it were not measured. Every plan's peak covers
    the process's start-up (the samples before its first step ended), as its own trial's would: a job with
    that plan starts the same way."""
    plans = [request.plan, *request.sweep]
    results = []
    startup = reading.by_step.get(0, 0)
    for i, segment in enumerate(segments):
        sampled = (
            max(reading.by_step.values(), default=0)
            if i == 0
            else max(reading.by_phase.get(SEGMENT_PHASE + segment.plan, 0), startup)
        )
        exact = segment.rss_peak if reading.method == "rss" and segment.rss_peak is not None else 0
        speed = throughput(segment)
        results.append(
            dataclasses.replace(
                first,
                outcome=Outcome.COMPLETE,
                error=None,
                plan=segment.plan_applied or segment.plan,
                peak_bytes=max(sampled, exact),
                samples_per_sec=speed.mid if speed else None,
                samples_per_sec_low=speed.low if speed else None,
                samples_per_sec_high=speed.high if speed else None,
                step_seconds=segment.step_seconds,
                torch_peak_allocated=segment.torch_peak_allocated,
                torch_peak_reserved=segment.torch_peak_reserved,
                warmup_steps=segment.warmup_steps,
                warmup_peak_bytes=first.warmup_peak_bytes if i == 0 else None,
                steady_peak_bytes=first.steady_peak_bytes if i == 0 else None,
                phase_peaks=None,
                tokens_per_sec=token_throughput(segment),
                load=steps_load(load, segment) if (load := first.load) is not None else None,
                startup_seconds=first.startup_seconds if i == 0 else None,
                measured_seconds=sum(segment.step_seconds) or None,
            )
        )
    if first.outcome is not Outcome.COMPLETE and len(segments) < len(plans):
        plan = plans[len(segments)]
        results.append(
            dataclasses.replace(
                first,
                plan=plan,
                peak_bytes=max(
                    reading.by_phase.get(SEGMENT_PHASE + plan, 0),
                    reading.peak_bytes if first.outcome.out_of_memory else 0,
                ),
                samples_per_sec=None,
                samples_per_sec_low=None,
                samples_per_sec_high=None,
                step_seconds=(),
                phase_peaks=None,
                startup_seconds=None,
                measured_seconds=None,
            )
        )
    head, *rest = results
    return dataclasses.replace(head, sweep=tuple(rest))


def ranks_own_high_water(reading: MemoryReading, reports: Mapping[int, TrialReport]) -> MemoryReading:
    """A multi-process CPU trial's reading with each rank's peak never below the rank's own resident
    high-water mark, as its report gives it at its end (``TrialReport.rss_peak``): the meter samples each
    rank's tree and reads its high-water mark at each sample, and a sampler the machine starved can miss a
    rank's whole measured life (a two-node trial's rank that held 160 MiB from its first step to its last
    read 38.7 MiB beside three busy CI phases); its report cannot miss it. The trial's peak is the worst
    rank's again. Other readings are returned as they are."""
    if reading.method != "rss-rank":
        return reading
    peaks = {r.rank: r for r in reading.ranks}
    for rank, report in reports.items():
        own = report.rss_peak or 0
        if own > (peaks[rank].peak_bytes if rank in peaks else 0):
            peaks[rank] = RankPeak(rank, "cpu", own)
    ranks = tuple(peaks[rank] for rank in sorted(peaks))
    return dataclasses.replace(reading, ranks=ranks, peak_bytes=max(r.peak_bytes for r in ranks))


def _rank_results(
    reading: MemoryReading, reports: dict[int, TrialReport], exit_info: ProcessExit, ceiling: int | None
) -> tuple[RankResult, ...]:
    """Each rank's peak with how that rank ended: its own report's outcome; over-budget for a rank whose
    peak passed the ceiling the trial was stopped at; None for a rank stopped because another ended it."""

    def outcome(rank: int, peak: int) -> Outcome | None:
        if exit_info.timed_out == "ceiling" and ceiling is not None and peak > ceiling:
            return Outcome.OVER_BUDGET
        return reports[rank].outcome if rank in reports else None

    return tuple(
        RankResult(r.rank, r.device, r.peak_bytes, outcome(r.rank, r.peak_bytes)) for r in reading.ranks
    )


def trial_request(
    workdir: Path,
    batch_size: int,
    plan: AnyPlan,
    backend: Backend,
    device: Device,
    settings: TrialSettings,
    probe: bool,
    grad_accum: int | None,
    check_plans: tuple[str, ...] = (),
    sweep: tuple[str, ...] = (),
) -> TrialRequest:
    return TrialRequest(
        batch_size=batch_size,
        plan=str(plan),
        backend=backend,
        device=str(device),
        warmup_steps=settings.warmup_steps,
        measured_steps=PROBE_MEASURED_STEPS
        if probe and backend is Backend.TORCH
        else settings.measured_steps,
        warmup_max=max(settings.warmup_max, settings.warmup_steps),
        report_path=str(workdir / "report.json"),
        progress_path=str(workdir / "progress.json"),
        probe=probe,
        grad_accum=grad_accum,
        check_plans=check_plans,
        phases=settings.phases,
        settle_steps=settings.settle_steps,
        settled_path=str(workdir / "settled.json") if settings.settle_steps else "",
        # a probe's speed is no reading (its steps are instrumented: autotune.search.probing): it does not
        # measure on for a tighter one (issue 41's GPT-2 on the CPU: 14 measured steps at batch 1, 9 of them
        # for that, 4.5 s of its 17)
        tight=0.0 if probe else settings.tight,
        sweep=sweep,
    )


def trial_launch(
    argv: list[str], request: TrialRequest, workdir: Path, job: TrialJob, request_file: Path | None = None
) -> Launch:
    """How to start a trial process of ``job`` for ``request`` (``request_file``: where it is written,
    default ``workdir/request.json``): its command line and environment, its timeouts, its ceiling and host
    budget."""
    command, settings = job.command, job.settings
    env = trial_env(request, workdir, job.device, job.environ, command, job.backend, job.root, request_file)
    return Launch(
        argv=tuple(argv),
        env=command.env(env),
        workdir=workdir,
        progress_path=Path(request.progress_path),
        startup_timeout=settings.startup_timeout,
        timeout=settings.timeout,
        grace=settings.grace,
        cwd=Path(command.cwd) if command.cwd else None,
        ceiling=job.ceiling,
        host_budget=job.host_budget if job.host_budget is not None else default_host_budget(),
        log_limit=settings.log_limit,
    )


def trial_env(
    request: TrialRequest,
    workdir: Path,
    device: Device,
    environ: Mapping[str, str],
    command: TrialCommand,
    backend: Backend,
    root: Path,
    request_file: Path | None = None,
) -> dict[str, str]:
    """The trial's environment: the request, the batch size and plan, the device pinned, the workload's
    compilation caches; for ORT, the plan's own variables (the extension built first, outside any measured
    trial)."""
    env = {
        **{
            k: v for k, v in environ.items() if k not in NOT_FOR_TRIALS
        },  # a trial needs no database, nor its password, nor the job key
        **device.child_env(),
        REQUEST_ENV: str(request_file or workdir / "request.json"),
        BATCH_SIZE_ENV: str(request.batch_size),
        PLAN_ENV: request.plan,
        GRAD_ACCUM_ENV: str(request.grad_accum or 1),
        "PYTHONUNBUFFERED": "1",
    }
    fingerprint = workload_of(command, device, backend).fingerprint
    # torch.compile's caches: the workload's own folder, so compilation is paid by its first trial only
    # (a folder the user chose wins; torch's default, which importing torch writes into the environment, not)
    compiled = compile_cache_dir(root, fingerprint)
    if env.get("TORCHINDUCTOR_CACHE_DIR") in (None, "", torch_default_inductor_dir()):
        env["TORCHINDUCTOR_CACHE_DIR"] = str(compiled / "inductor")
    env.setdefault("TRITON_CACHE_DIR", str(compiled / "triton"))
    if backend is Backend.ORT:
        from autotune.backends.ort_plans import ensure_extension, environment, parse_ort_plan

        ensure_extension(environ)  # built outside any measured trial: a compiler is no trial's memory
        env.update(environment(parse_ort_plan(request.plan), workdir / "ort_plan.json", root, fingerprint))
    return env


def read_report(path: Path) -> TrialReport | None:
    try:
        return TrialReport.read(path)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def trial_result(
    outcome: Outcome,
    error: str | None,
    request: TrialRequest,
    device: Device,
    reading: MemoryReading,
    exit_info: ProcessExit,
    report: TrialReport | None,
    workdir: Path,
    ranks: tuple[RankResult, ...] = (),
) -> TrialResult:
    speed = throughput(report) if outcome is Outcome.COMPLETE else None
    warmup_peak, steady_peak = reading.phase_peaks(report.warmup_steps if report else None)
    return TrialResult(
        outcome=outcome,
        batch_size=request.batch_size,
        plan=report.plan_applied if report and report.plan_applied else request.plan,
        device=str(device),
        device_name=device.name,
        peak_bytes=reading.peak_bytes,
        memory_method=reading.method,
        samples_per_sec=speed.mid if speed else None,
        samples_per_sec_low=speed.low if speed else None,
        samples_per_sec_high=speed.high if speed else None,
        step_seconds=report.step_seconds if report else (),
        wall_seconds=exit_info.wall_seconds,
        log_dir=str(workdir),
        error=error,
        torch_peak_allocated=report.torch_peak_allocated if report else None,
        torch_peak_reserved=report.torch_peak_reserved if report else None,
        memory_note=reading.note,
        candidates=(
            tuple(ModuleCandidate.from_json(c) for c in report.candidates)
            if report and report.candidates is not None
            else None
        ),
        probe=probe_report_from_json(report.probe) if report else None,
        grad_accum=request.grad_accum,
        micro_batches=report.micro_batches if report else None,
        compile_cache=report.compile_cache if report else None,
        ranks=ranks,
        world_size=report.world_size if report else None,
        warmup_steps=report.warmup_steps if report else None,
        warmup_peak_bytes=warmup_peak,
        steady_peak_bytes=steady_peak,
        tokens_per_sec=token_throughput(report) if outcome is Outcome.COMPLETE else None,
        lengths=report.lengths if report else None,
        batch_seen=report.batch_seen if report else None,
        phase_peaks=dict(reading.by_phase) or None,
        phase_seconds=report.phase_seconds if report else None,
        own_checkpointing=report.own_checkpointing if report else None,
        settled=report.settled if report else None,
        rising_bytes=(
            still_rising(reading.by_step, report.steps_done, report.settled, report.warmup_steps or 0)
            if report
            else None
        ),
        shifted=report.shifted if report else None,
        slow_start=report.slow_start if report else None,
        startup_seconds=exit_info.first_step_seconds,
        measured_seconds=sum(report.step_seconds) if report and report.step_seconds else None,
    )
