"""What a trial measured (``TrialResult``), and how its outcome is decided: from its exit status and its
report, never from its logs."""

from __future__ import annotations

import dataclasses
import signal
from dataclasses import asdict, dataclass
from typing import Any

from autotune.backends.probe_report import ModuleCandidate, ProbeReport
from autotune.core.budget import fits, peak_phase, with_rise
from autotune.core.pressure import quiet_rates, set_aside
from autotune.core.protocol import Outcome, RankResult, Segment, TrialReport
from autotune.core.stats import Interval, median_interval
from autotune.hardware.host import kill_cause, mib
from autotune.hardware.load import Load
from autotune.runtime.inputs import batch_ignored_message
from autotune.trials.launcher import ProcessExit
from autotune.trials.settings import TrialSettings


@dataclass(frozen=True)
class Placement:
    """Where a trial placed on a cluster ran (autotune.cluster): one node's share of it."""

    node: str  # the host's name
    node_id: str  # the cluster's id of the node (several nodes may share a host)
    devices: tuple[str, ...]  # the GPUs' UUIDs (none: a CPU trial)
    started: float  # wall-clock seconds (time.time()) of the share's start and end, on that node
    ended: float

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "devices": list(self.devices)}


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
    samples_per_sec: float | None  # the median over the measured steps
    step_seconds: tuple[float, ...]
    wall_seconds: float
    log_dir: str
    error: str | None = None
    torch_peak_allocated: int | None = None
    torch_peak_reserved: int | None = None
    memory_note: str | None = None
    candidates: tuple[ModuleCandidate, ...] | None = None  # the model's repeated module classes
    probe: ProbeReport | None = None  # a probe trial's report
    budget_bytes: int | None = None  # the budget it was measured against (measure --budget), if any
    samples_per_sec_low: float | None = None  # the median's interval (autotune.core.stats)
    samples_per_sec_high: float | None = None
    grad_accum: int | None = None  # micro-batches per optimizer step the trial asked for
    micro_batches: int | None = None  # forwards the trial counted in its last optimizer step
    ranks: tuple[RankResult, ...] = ()  # a multi-process trial's ranks; peak_bytes is the worst rank's
    world_size: int | None = None  # its ranks (None: one process)
    compile_cache: dict[str, int] | None = None  # torch.compile's cache hits and misses (None: no compile)
    warmup_steps: int | None = None  # the steps counted as warm-up (more than asked: they did not settle)
    # the largest memory sample of warm-up and of the measured steps (the budget is checked against
    # peak_bytes, the whole run's: what the user's job sees)
    warmup_peak_bytes: int | None = None
    steady_peak_bytes: int | None = None
    load: Load | None = None  # how busy the machine was while it ran (autotune.hardware.load)
    tokens_per_sec: float | None = None  # the median over the measured steps, for (B, T) token inputs
    lengths: tuple[int, int] | None = None  # the shortest and longest step's sequence length (token inputs)
    batch_seen: int | None = None  # the largest batch dimension the model's inputs showed
    # the largest memory sample of each phase of the job the trial ran (eval, save: --with-eval,
    # --with-save, autotune.phase), by phase, and the seconds each took (a phase too short for a sample has
    # seconds and no peak; the whole run's peak_bytes still covers it)
    phase_peaks: dict[str, int] | None = None
    phase_seconds: dict[str, float] | None = None
    # the checkpointing the script does by itself, in words (None: none seen): the plan adds to it, and
    # plan none keeps it
    own_checkpointing: str | None = None
    settled: str | None = None  # a settling verification: why it ended when it did (autotune.trials.settle)
    # ... and, where it ended with its peak still rising, how much it rose over its last steps: the limit
    # must hold as much again (autotune.trials.settle.still_rising)
    rising_bytes: int | None = None
    shifted: str | None = None  # its measurement stopped lengthening: the load changed as it ran
    slow_start: str | None = None  # a slow start it measured past: its first steps became warm-up
    # where its wall time went: from the launch to the end of its first step (imports, building the model,
    # CUDA, the first step's compilation), and its measured steps together (issue 31: ~18 s vs 0.35 s)
    startup_seconds: float | None = None
    measured_seconds: float | None = None
    placement: tuple[Placement, ...] = ()  # where it ran, on a cluster: each node's share (autotune.cluster)
    # a warm process's (autotune.trials.warm): which of the configurations its process measured this one
    # was, from 1 (None: a process of its own)
    warm_run: int | None = None
    # a sweep (several plans in one process, TrialRequest.sweep): the later plans' results, each a trial of
    # its own; this result is the first plan's
    sweep: tuple[TrialResult, ...] = ()

    @property
    def batch_ignored(self) -> bool:
        """The model saw batches of another size than the trial asked for (the script ignores it)."""
        return self.batch_seen is not None and self.batch_seen != self.batch_size

    @property
    def peak_phase(self) -> str | None:
        """Which phase set the peak (``core.budget.peak_phase``)."""
        return peak_phase(self.warmup_peak_bytes, self.steady_peak_bytes, self.phase_peaks)

    @property
    def throughput(self) -> Interval | None:
        if self.samples_per_sec is None:
            return None
        return Interval.stored(self.samples_per_sec, self.samples_per_sec_low, self.samples_per_sec_high)

    def fits(self, limit_bytes: int) -> bool:
        """Completed, and its measured peak is within ``limit_bytes``, with room for as much again as a
        still rising peak rose over its last steps."""
        return fits(self.outcome, with_rise(self.peak_bytes, self.rising_bytes), limit_bytes)

    @property
    def fits_budget(self) -> bool | None:
        """Whether it fits ``budget_bytes`` (None when measured against no budget)."""
        return None if self.budget_bytes is None else self.fits(self.budget_bytes)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["step_seconds"] = list(self.step_seconds)
        data["probe"] = self.probe.to_json() if self.probe is not None else None
        data["fits"] = self.fits_budget
        data["ranks"] = [r.to_dict() for r in self.ranks]
        return data


def classify(
    exit_info: ProcessExit,
    report: TrialReport | None,
    settings: TrialSettings,
    host_read: int | None = None,
) -> tuple[Outcome, str | None]:
    """The outcome of a trial from its exit status and its report (never from its logs). ``host_read``: the
    peak the meter read where what it reads is host memory (the CPU's resident memory, as the host watch
    reads it): a trial that passed the host budget between two of the watch's samples (a quarter of a
    second apart, longer on a busy machine) and ended before the next is no answer either."""
    if exit_info.timed_out == "startup":
        return Outcome.TIMEOUT, f"no training step within {settings.startup_timeout:g}s"
    if exit_info.timed_out == "run":
        return Outcome.TIMEOUT, f"still running after {settings.timeout:g}s"
    if exit_info.timed_out == "ceiling":
        return Outcome.OVER_BUDGET, "stopped as its peak passed the budget (the peak is a lower bound)"
    if exit_info.timed_out == "host":
        pinned = f", {mib(exit_info.pinned_bytes)} of it pinned by CUDA" if exit_info.pinned_bytes else ""
        return Outcome.KILLED, (
            f"stopped as its host memory passed the host budget ({mib(exit_info.host_last_bytes)}{pinned}, "
            f"budget {mib(exit_info.host_budget)}: --host-budget), before the kernel's out-of-memory killer"
        )
    budget = exit_info.host_budget
    if report is not None and report.outcome is Outcome.COMPLETE and budget and (host_read or 0) > budget:
        return Outcome.KILLED, (
            f"its host memory passed the host budget ({mib(host_read)}, budget {mib(budget)}: "
            "--host-budget) between two of the host watch's samples; a longer run would have been stopped"
        )
    if report is not None:
        return report.outcome, report.error
    name = signal.Signals(exit_info.signal).name if exit_info.signal is not None else None
    who = "its launcher and it" if exit_info.launcher_killed else "it"
    if exit_info.signal == signal.SIGKILL and not exit_info.stopped:
        return Outcome.KILLED, (
            f"SIGKILL ended {who} before it reported: "
            f"{kill_cause(exit_info.host_peak_bytes, exit_info.pinned_bytes)}"
        )
    if exit_info.signal is not None:
        return Outcome.FAILED, f"{name} ended {who} before it reported"
    return Outcome.FAILED, f"exited with code {exit_info.exit_code} before any training step was reported"


PHASE_NOT_RUN = "PhaseNotRun: "  # the runtime's error for a script that did not run a phase asked for


def misconfigured(result: TrialResult) -> str | None:
    """The one line a trial ends a search (or ``measure``) with when the script does not do what the trial
    asked, whatever the configuration: its model saw batches of another size, or it never ran a phase
    asked for (--with-eval, --with-save). None for any other trial."""
    if result.batch_ignored:
        assert result.batch_seen is not None
        return f"{batch_ignored_message(result.batch_seen, result.batch_size)} (trial log: {result.log_dir})"
    if result.outcome is Outcome.FAILED and (result.error or "").startswith(PHASE_NOT_RUN):
        return f"{(result.error or '')[len(PHASE_NOT_RUN) :]} (trial log: {result.log_dir})"
    return None


def throughput(report: TrialReport | Segment | None) -> Interval | None:
    """Median samples/s over the measured steps (warm-up excluded) a busy moment did not slow
    (autotune.core.pressure), with its interval."""
    if report is None or not report.step_seconds:
        return None
    return median_interval(quiet_rates(report.step_samples, report.step_seconds, report.step_pressure))


def token_throughput(report: TrialReport | Segment | None) -> float | None:
    """Median tokens/s over the same steps, where the model's inputs were (B, T) token ids."""
    if report is None or not report.step_seconds or len(report.step_tokens) != len(report.step_seconds):
        return None
    speed = median_interval(quiet_rates(report.step_tokens, report.step_seconds, report.step_pressure))
    return speed.mid if speed is not None else None


def steps_load(load: Load, report: TrialReport | Segment | None) -> Load:
    """``load`` with what the trial's own steps said of it: the pressure over the steps its speed was read
    from, and how many it left out as busy (autotune.core.pressure)."""
    if report is None:
        return load
    left_out, pressure = set_aside(report.step_pressure, len(report.step_seconds))
    return dataclasses.replace(load, steps_pressure=pressure, set_aside=left_out)
