"""One measured trial: ``autotune.measure(spec)``, the unit every search is built from."""

from __future__ import annotations

import os
import signal
import statistics
import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from autotune.trials.command import TrialCommand
from autotune.hardware.devices import Device, resolve_device
from autotune.core.errors import InputError
from autotune.trials.launcher import Launch, ProcessExit, run_process, tail
from autotune.hardware.meters import MemoryMeter, MemoryReading, make_meter
from autotune.hardware.nvml import load_nvml
from autotune.core.paths import cache_dir, new_trial_dir
from autotune.core.plans import Plan
from autotune.core.protocol import BATCH_SIZE_ENV, PLAN_ENV, REQUEST_ENV, Outcome, TrialReport, TrialRequest


@dataclass(frozen=True)
class TrialSettings:
    """How long a trial runs: steps and time limits. Shared by ``measure`` and the search."""

    warmup_steps: int = 2
    measured_steps: int = 5
    startup_timeout: float = 300.0
    timeout: float = 900.0
    grace: float = 5.0

    def __post_init__(self) -> None:
        if self.warmup_steps < 1:
            raise InputError(
                f"warm-up steps must be at least 1 (the first step includes start-up), got {self.warmup_steps}"
            )
        if self.measured_steps < 1:
            raise InputError(f"measured steps must be at least 1, got {self.measured_steps}")
        for name in ("startup_timeout", "timeout", "grace"):
            if not getattr(self, name) > 0:
                raise InputError(f"{name.replace('_', ' ')} must be positive, got {getattr(self, name)}")


@dataclass(frozen=True)
class MeasureSpec:
    """One trial to run: ``command`` at ``batch_size`` with ``plan`` on ``device``."""

    command: TrialCommand
    batch_size: int
    plan: Any = field(default_factory=Plan.none)  # a Plan, or for backend "ort" an ort_plans.OrtPlan
    device: str = "auto"
    settings: TrialSettings = field(default_factory=TrialSettings)
    cache_dir: Path | None = None
    backend: str = "torch"

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise InputError(f"batch size must be a positive integer, got {self.batch_size}")


@dataclass(frozen=True)
class TrialResult:
    """What one trial measured."""

    outcome: Outcome
    batch_size: int
    plan: str
    device: str
    device_name: str
    peak_bytes: int
    memory_method: str
    samples_per_sec: float | None
    step_seconds: tuple[float, ...]
    wall_seconds: float
    log_dir: str
    error: str | None = None
    torch_peak_allocated: int | None = None
    torch_peak_reserved: int | None = None
    memory_note: str | None = None
    candidates: list[dict[str, Any]] | None = None
    probe: dict[str, Any] | None = None

    def fits(self, budget_bytes: int) -> bool:
        """Completed, and its measured peak is within ``budget_bytes``."""
        return self.outcome is Outcome.COMPLETE and self.peak_bytes <= budget_bytes

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["outcome"] = self.outcome.value
        data["step_seconds"] = list(self.step_seconds)
        return data


def measure(
    spec: MeasureSpec, environ: Mapping[str, str] | None = None, nvml: Any = None, probe: bool = False
) -> TrialResult:
    """Run one trial of ``spec`` and measure it (with the probe's instruments if ``probe``).

    Args:
        spec: what to run.
        environ: the environment the trial inherits (default: this process's).
        nvml: an NVML module to use instead of nvidia-ml-py's (tests without a GPU pass a fake).

    Raises:
        InputError, DeviceError: bad spec or device. TrialError: the trial could not be started.
    """
    env = dict(os.environ if environ is None else environ)
    device = resolve_device(spec.device, env, (lambda: nvml) if nvml is not None else load_nvml)
    return run_trial(
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
    )


def run_trial(
    command: TrialCommand,
    batch_size: int,
    plan: Any,  # Plan or OrtPlan: sent as its string form
    device: Device,
    meter: MemoryMeter,
    settings: TrialSettings,
    root: Path,
    environ: Mapping[str, str],
    backend: str = "torch",
    on_poll: Callable[[int, float], None] | None = None,
    probe: bool = False,
    interruptible: Callable[[], AbstractContextManager[None]] | None = None,
    stop: threading.Event | None = None,
) -> TrialResult:
    """Run one trial on an already resolved device with ``meter``; files go to a new folder under ``root``.

    ``interruptible`` and ``stop``: see :func:`autotune.trials.launcher.run_process`."""
    workdir = new_trial_dir(root)
    request = TrialRequest(
        batch_size=batch_size,
        plan=str(plan),
        backend=backend,
        device=str(device),
        warmup_steps=settings.warmup_steps,
        measured_steps=settings.measured_steps,
        report_path=str(workdir / "report.json"),
        progress_path=str(workdir / "progress.json"),
        probe=probe,
    )
    request.write(workdir / "request.json")
    child_env = {
        **environ,
        **device.child_env(),
        REQUEST_ENV: str(workdir / "request.json"),
        BATCH_SIZE_ENV: str(batch_size),
        PLAN_ENV: str(plan),
        "PYTHONUNBUFFERED": "1",
    }
    if backend == "ort":
        from autotune.trials.workload import workload_of
        from autotune.backends.ort_plans import ensure_extension, environment, parse_ort_plan

        ensure_extension(environ)  # built outside any measured trial: a compiler is no trial's memory
        fingerprint = workload_of(command, device, backend).fingerprint
        child_env.update(environment(parse_ort_plan(str(plan)), workdir / "ort_plan.json", root, fingerprint))
    launch = Launch(
        argv=tuple(command.argv(batch_size)),
        env=command.env(child_env),
        workdir=workdir,
        progress_path=Path(request.progress_path),
        startup_timeout=settings.startup_timeout,
        timeout=settings.timeout,
        grace=settings.grace,
        cwd=Path(command.cwd) if command.cwd else None,
    )
    exit_info, reading = run_process(launch, meter, on_poll, interruptible, stop)
    report = _read_report(Path(request.report_path))
    outcome, error = classify(exit_info, report, settings)
    if outcome is Outcome.FAILED:
        error = "\n".join(filter(None, [error, tail(workdir / "stderr.log")]))
    return _result(outcome, error, request, device, reading, exit_info, report, workdir)


def classify(
    exit_info: ProcessExit, report: TrialReport | None, settings: TrialSettings
) -> tuple[Outcome, str | None]:
    """The outcome of a trial from its exit status and its report (never from its logs)."""
    if exit_info.timed_out == "startup":
        return Outcome.TIMEOUT, f"no training step within {settings.startup_timeout:g}s"
    if exit_info.timed_out == "run":
        return Outcome.TIMEOUT, f"still running after {settings.timeout:g}s"
    if report is not None:
        return report.outcome, report.error
    if exit_info.signal == signal.SIGKILL and not exit_info.stopped:
        return (
            Outcome.OOM,
            "killed by SIGKILL without a report (most likely the kernel's out-of-memory killer)",
        )
    if exit_info.signal is not None:
        return Outcome.FAILED, f"killed by {signal.Signals(exit_info.signal).name}"
    return Outcome.FAILED, f"exited with code {exit_info.exit_code} before any training step was reported"


def _read_report(path: Path) -> TrialReport | None:
    try:
        return TrialReport.read(path)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _result(
    outcome: Outcome,
    error: str | None,
    request: TrialRequest,
    device: Device,
    reading: MemoryReading,
    exit_info: ProcessExit,
    report: TrialReport | None,
    workdir: Path,
) -> TrialResult:
    steps = report.step_seconds if report else ()
    samples = report.step_samples if report else ()
    throughput = statistics.median(n / s for n, s in zip(samples, steps, strict=True)) if steps else None
    return TrialResult(
        outcome=outcome,
        batch_size=request.batch_size,
        plan=report.plan_applied if report and report.plan_applied else request.plan,
        device=str(device),
        device_name=device.name,
        peak_bytes=reading.peak_bytes,
        memory_method=reading.method,
        samples_per_sec=throughput if outcome is Outcome.COMPLETE else None,
        step_seconds=steps,
        wall_seconds=exit_info.wall_seconds,
        log_dir=str(workdir),
        error=error,
        torch_peak_allocated=report.torch_peak_allocated if report else None,
        torch_peak_reserved=report.torch_peak_reserved if report else None,
        memory_note=reading.note,
        candidates=report.candidates if report else None,
        probe=report.probe if report else None,
    )
