"""The trial protocol: what the tuner asks a trial to do, and what the trial reports back.

The parent writes a :class:`TrialRequest` as JSON and points the child at it with ``AUTOTUNE_TRIAL_REQUEST``.
The child writes a :class:`TrialReport` as JSON to ``request.report_path`` and exits with one of the
``EXIT_*`` codes. The outcome comes from the report and the exit status, never from the trial's logs.
While it runs, the child atomically rewrites ``request.progress_path`` with the steps done so far, and the
phase it is in (``eval``, ``save``: see PHASES) while it runs one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from autotune.core.enums import TextEnum
from autotune.core.plans import Backend

REQUEST_ENV = "AUTOTUNE_TRIAL_REQUEST"
TRIAL_UMASK_ENV = "AUTOTUNE_TRIAL_UMASK"  # the user's umask, restored for the trial (the tuner's is private)
STORAGE_ENV = "AUTOTUNE_STORAGE"  # the database URL, password included: never passed to a trial
JOB_KEY_ENV = "AUTOTUNE_JOB_KEY"  # the key jobs are signed with (autotune.workers.signing): nor this
JOB_KEY_FILE_ENV = "AUTOTUNE_JOB_KEY_FILE"  # where to read it instead: nor this
NOT_FOR_TRIALS = (STORAGE_ENV, JOB_KEY_ENV, JOB_KEY_FILE_ENV)  # what a trial's environment leaves out
BATCH_SIZE_ENV = "AUTOTUNE_BATCH_SIZE"
PLAN_ENV = "AUTOTUNE_PLAN"
GRAD_ACCUM_ENV = "AUTOTUNE_GRAD_ACCUM"  # micro-batches per optimizer step (autotune.grad_accum())
WORST_CASE_ENV = (
    "AUTOTUNE_WORST_CASE"  # "1": the script pads its inputs to their longest (autotune.worst_case())
)
BACKEND_ENV = "AUTOTUNE_BACKEND"  # outside a trial: the backend prepare() applies AUTOTUNE_PLAN with

# What torchrun (and torch.distributed.launch, Lightning, Accelerate) tell each rank of a multi-process job.
RANK_ENV = "RANK"
LOCAL_RANK_ENV = "LOCAL_RANK"
WORLD_SIZE_ENV = "WORLD_SIZE"

# The phases of a job besides its training steps that a trial can be asked to run once after its measured
# steps (--with-eval, --with-save), each measured on its own: the script's evaluation, a checkpoint save.
PHASES = ("eval", "save")

EXIT_COMPLETE = 0  # warm-up + measured steps done, report written
EXIT_OOM = 75  # CUDA out of memory, or the CPU allocator refused
EXIT_FAILED = 76  # the script raised, or ended before its steps were done


class Outcome(TextEnum):
    """How a trial ended."""

    COMPLETE = "complete"
    OOM = "oom"
    OVER_BUDGET = (
        "over-budget"  # stopped by autotune as its peak passed the budget: the peak is a lower bound
    )
    FAILED = "failed"
    TIMEOUT = "timeout"
    # ended by a signal autotune did not send (the kernel's out-of-memory killer, most likely: an offload
    # plan's pinned host memory), or stopped as its host memory passed the host budget; the launcher too
    KILLED = "killed"

    @property
    def out_of_memory(self) -> bool:
        """Ran out of memory, or was stopped or killed before it could: its peak bounds what the configuration
        needs, and no batch size as large is tried with its plan (a killed one's peak too: it is a lower bound
        of the device's, and its host memory was what ran out)."""
        return self in (Outcome.OOM, Outcome.OVER_BUDGET, Outcome.KILLED)


@dataclass(frozen=True)
class TrialRequest:
    """What one trial must do; written by the tuner, read by ``autotune.runtime.trial`` in the child."""

    batch_size: int
    plan: str
    backend: Backend
    device: str
    warmup_steps: int
    measured_steps: int
    report_path: str
    progress_path: str
    probe: bool = False  # instrument the model (autotune.backends.torch_probe) instead of applying a plan
    # Micro-batches per optimizer step the trial asks for ({grad_accum}, autotune.grad_accum()), from a
    # global batch or declared with --grad-accum. None: whatever the script does, counted as its forwards.
    grad_accum: int | None = None
    check_plans: tuple[str, ...] = ()  # a probe: plans to check against no plan beside those it offers
    # Warm-up adapts: a first measured step much slower than the others (a recompilation, cuDNN's
    # autotuning, the allocator still growing) becomes warm-up and one more step is measured, up to this
    # many warm-up steps in all (autotune.runtime.trial).
    warmup_max: int = 0
    # Phases (of PHASES) to run once after the measured steps, before the trial ends: its peak then covers
    # the script's evaluation and a checkpoint save too (autotune.runtime.trial, autotune.runtime.phases).
    phases: tuple[str, ...] = ()
    # A verification runs on past its measured steps while its peak still grows, up to this many steps
    # more: the tuner, which measures the peak, writes at ``settled_path`` the step to end at once the peak
    # has stopped growing (or its time cap is reached); all ranks end at that step (0: off).
    settle_steps: int = 0
    settled_path: str = ""
    # measure on past ``measured_steps`` until the throughput's interval is within ``tight`` of its median
    # (relative half-width; 0: a fixed number of steps), for at most ``measure_share`` of the trial's
    # start-up and ``measure_cap`` seconds of measured steps (autotune.runtime.trial)
    tight: float = 0.0
    measure_share: float = 0.25
    measure_cap: float = 10.0
    # More plans measured after ``plan`` in the same process, in this order, at the same batch size (issue
    # 31: a trial that takes 18 s to start measures several plans for one start-up). Each is a segment:
    # the plan switched between two steps, warm-up and measured steps of its own, its peak filed under the
    # phase SEGMENT_PHASE + plan (autotune.runtime.trial).
    sweep: tuple[str, ...] = ()
    # A warm process (issue 41, autotune.runtime.warm): after this configuration the runtime returns the
    # process to rest and waits in the request's folder for the next one (WarmMessage), instead of ending.
    warm: bool = False
    # bytes torch's CUDA caching allocator may hold (torch.cuda.set_per_process_memory_fraction), set by a
    # warm process before the configuration runs: the budget less what the process holds outside the
    # allocator at rest (the CUDA context, cuBLAS's workspace), so a configuration over the budget raises
    # in the process, at the budget (0: no cap)
    memory_cap: int = 0

    @property
    def total_steps(self) -> int:
        """The steps a settled trial runs (warm-up may add up to ``warmup_max - warmup_steps``)."""
        return self.warmup_steps + self.measured_steps

    def write(self, path: Path) -> None:
        _write_json_atomic(path, asdict(self))

    @classmethod
    def read(cls, path: str | Path) -> TrialRequest:
        data = json.loads(Path(path).read_text())
        return cls(
            **{
                **data,
                "backend": Backend(data["backend"]),
                "check_plans": tuple(data.get("check_plans", ())),
                "phases": tuple(data.get("phases", ())),
                "sweep": tuple(data.get("sweep", ())),
            }
        )


SEGMENT_PHASE = "plan "  # a sweep's segment is filed by the meter under this phase + the plan
WARM_PHASE = "run "  # a warm process's configuration k is filed by the meter under this phase + k
REST_PHASE = "rest "  # ... and its rest after configuration k under this one


def warm_file(folder: str | Path, kind: str, run: int) -> Path:
    """A warm process's file of its ``run``-th configuration in ``folder`` (autotune.runtime.warm): the
    tuner's ``request``, the runtime's ``report`` and ``progress``, the runtime's ``rest`` after it, and the
    tuner's ``next`` message (the next configuration, or the end)."""
    return Path(folder) / f"{kind}-{run}.json"


@dataclass(frozen=True)
class WarmMessage:
    """What the tuner tells a warm process at rest: run ``request`` (its command line after the harness:
    ``argv``), or end (``request`` empty)."""

    request: str = ""
    argv: tuple[str, ...] = ()

    def write(self, path: Path) -> None:
        _write_json_atomic(path, {"request": self.request, "argv": list(self.argv)})

    @classmethod
    def read(cls, path: Path) -> WarmMessage:
        data = json.loads(path.read_text())
        return cls(str(data["request"]), tuple(str(a) for a in data["argv"]))


@dataclass(frozen=True)
class Rest:
    """A warm process back at rest after a configuration, as it measured itself (autotune.runtime.warm)."""

    rss_bytes: int  # resident now (after the collection and malloc_trim)
    cuda_allocated: int | None = None  # torch's CUDA counters now (None: CUDA not in use)
    cuda_reserved: int | None = None
    # the process's CPU seconds so far: its own and its reaped children's (a DataLoader's workers, joined as
    # the script's objects went): what the tuner counts as the trial's, not a neighbour's (hardware.load)
    cpu_seconds: float | None = None

    def write(self, path: Path) -> None:
        _write_json_atomic(path, asdict(self))

    @classmethod
    def read(cls, path: Path) -> Rest:
        return cls(**json.loads(path.read_text()))


@dataclass(frozen=True)
class Segment:
    """One plan's part of a sweep (TrialRequest.sweep), as the trial measured it."""

    plan: str  # as asked
    plan_applied: str | None
    step_seconds: tuple[float, ...]
    step_samples: tuple[int, ...]
    warmup_steps: int
    first_step: int  # the trial's step count when the segment began (its steps are the ones after it)
    last_step: int  # ... and when it ended
    step_tokens: tuple[int, ...] = ()
    rss_peak: int | None = None  # the process's resident high-water mark over the segment (Linux VmHWM)
    step_pressure: tuple[float, ...] = ()  # per measured step, its CPU pressure (autotune.core.pressure)
    torch_peak_allocated: int | None = None  # torch's CUDA peaks over the segment
    torch_peak_reserved: int | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Segment:
        return cls(
            **{
                **data,
                "step_seconds": tuple(data["step_seconds"]),
                "step_samples": tuple(data["step_samples"]),
                "step_tokens": tuple(data.get("step_tokens") or ()),
                "step_pressure": tuple(data.get("step_pressure") or ()),
            }
        )


@dataclass(frozen=True)
class TrialReport:
    """What the child measured about itself. Memory is measured from outside; these are its own counters."""

    outcome: Outcome
    steps_done: int
    step_seconds: tuple[float, ...] = ()  # measured steps only, warm-up excluded
    step_samples: tuple[int, ...] = ()
    torch_peak_allocated: int | None = None  # torch.cuda.max_memory_allocated, on a GPU
    torch_peak_reserved: int | None = None  # torch.cuda.max_memory_reserved, on a GPU
    error: str | None = None
    plan_applied: str | None = None  # the plan as applied, with `all` expanded to classes
    candidates: list[dict[str, Any]] | None = None  # the model's repeated module classes, once prepared
    probe: dict[str, Any] | None = None  # the probe's measurements, in a probe trial
    micro_batches: int | None = None  # forwards counted in the last optimizer step (None: none counted)
    rank: int | None = None  # the rank that wrote it, in a multi-process job ($RANK)
    world_size: int | None = None  # the job's ranks, as that rank was told ($WORLD_SIZE)
    # torch.compile's cache lookups in this process (FX graphs, AOT autograd): hits and misses; None when the
    # script compiled nothing
    compile_cache: dict[str, int] | None = None
    warmup_steps: int | None = None  # the steps it counted as warm-up (more than asked: it did not settle)
    # seconds from the runtime's start (the script's first import of autotune) to the end of warm-up
    warmup_seconds: float | None = None
    step_tokens: tuple[int, ...] = ()  # per measured step, where the model's inputs were (B, T) token ids
    lengths: tuple[int, int] | None = None  # the shortest and longest step's longest T, for token inputs
    batch_seen: int | None = None  # the largest batch dimension the model's inputs showed
    phase_seconds: dict[str, float] | None = None  # each phase the script ran (autotune.phase), its seconds
    # the checkpointing the script does by itself, in words (None: none seen): a plan adds to it
    own_checkpointing: str | None = None
    # a settling verification (TrialRequest.settle_steps): its steps in all and why it ended then
    settled: str | None = None
    # a measurement that stopped lengthening because the load changed as it ran (autotune.runtime.settling)
    shifted: str | None = None
    # a slow start it measured past: its first steps became warm-up (autotune.runtime.settling.unsettled)
    slow_start: str | None = None
    # a sweep (TrialRequest.sweep): every segment that completed, in order, the first (the request's plan)
    # included; the outcome and error, where not complete, are the next segment's. The report's own steps
    # are the first segment's.
    segments: list[Segment] | None = None
    # the process's resident high-water mark as the report was written (Linux VmHWM; in a warm process since
    # its return to rest before this configuration): no sampler can miss it
    rss_peak: int | None = None
    # per measured step, the share of its time some task waited for a CPU (autotune.core.pressure; empty
    # where the kernel does not say): the steps a busy moment slowed are left out of its speed
    step_pressure: tuple[float, ...] = ()

    def write(self, path: str | Path) -> None:
        data = asdict(self)
        data["outcome"] = self.outcome.value
        _write_json_atomic(Path(path), data)

    @classmethod
    def read(cls, path: str | Path) -> TrialReport:
        data = json.loads(Path(path).read_text())
        data["outcome"] = Outcome(data["outcome"])
        data["step_seconds"] = tuple(data["step_seconds"])
        data["step_samples"] = tuple(data["step_samples"])
        data["step_tokens"] = tuple(data.get("step_tokens") or ())
        data["step_pressure"] = tuple(data.get("step_pressure") or ())
        if data.get("lengths") is not None:
            data["lengths"] = tuple(data["lengths"])
        if data.get("segments") is not None:
            data["segments"] = [Segment.from_json(x) for x in data["segments"]]
        return cls(**data)


@dataclass(frozen=True)
class RankIdentity:
    """Which rank of a multi-process job a trial process is, from the launcher's environment."""

    rank: int
    local_rank: int
    world_size: int
    pid: int

    @classmethod
    def from_environ(cls, environ: Any = None) -> RankIdentity | None:
        """The rank this process is (None when ``$RANK`` is unset or not a number: no multi-process job)."""
        env = os.environ if environ is None else environ
        rank = env.get(RANK_ENV, "")
        if not rank.isdigit():
            return None
        local = env.get(LOCAL_RANK_ENV, "")
        world = env.get(WORLD_SIZE_ENV, "")
        return cls(
            rank=int(rank),
            local_rank=int(local) if local.isdigit() else int(rank),
            world_size=int(world) if world.isdigit() else int(rank) + 1,
            pid=os.getpid(),
        )


@dataclass(frozen=True)
class RankResult:
    """One rank of a multi-process trial: its device, its peak, and how it ended (None: stopped by autotune
    because another rank ended the trial, or it left no report)."""

    rank: int
    device: str
    peak_bytes: int
    outcome: Outcome | None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "outcome": self.outcome.value if self.outcome else None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RankResult:
        outcome = data.get("outcome")
        return cls(
            int(data["rank"]),
            str(data["device"]),
            int(data["peak_bytes"]),
            Outcome(outcome) if outcome else None,
        )


def worst_case_enabled(environ: Mapping[str, str]) -> bool:
    """Whether ``$AUTOTUNE_WORST_CASE`` asks for the longest inputs (1, true, yes, on)."""
    return environ.get(WORST_CASE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def rank_path(path: str | Path, rank: int | None) -> Path:
    """Where rank ``rank`` writes what a single-process trial writes to ``path``: ``report.json`` ->
    ``report.rank-1.json`` (``path`` itself for a process that is no rank)."""
    path = Path(path)
    return path if rank is None else path.with_name(f"{path.stem}.rank-{rank}{path.suffix}")


def rank_files(path: str | Path) -> dict[int, Path]:
    """The per-rank files of ``path`` that exist, by rank."""
    path = Path(path)
    found = {}
    for candidate in path.parent.glob(f"{path.stem}.rank-*{path.suffix}"):
        number = candidate.name[len(path.stem) + len(".rank-") : len(candidate.name) - len(path.suffix)]
        if number.isdigit():
            found[int(number)] = candidate
    return dict(sorted(found.items()))


def read_progress(path: str | Path) -> int:
    """Steps the child has finished so far (0 before the first, or if the file is unreadable). In a
    multi-process job, the steps of its slowest rank (each rank writes its own file from its start on)."""
    ranks = rank_files(path)
    if ranks:
        return min(_steps(p) for p in ranks.values())
    return _steps(path)


def read_rank_identities(path: str | Path) -> dict[int, RankIdentity]:
    """The ranks that have started, by rank, from their progress files."""
    found = {}
    for rank, file in rank_files(path).items():
        try:
            data = json.loads(file.read_text())
            found[rank] = RankIdentity(
                rank, int(data["local_rank"]), int(data["world_size"]), int(data["pid"])
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return found


def read_position(path: str | Path) -> tuple[int, str | None]:
    """Where the child is: the steps it has finished (read_progress's: its slowest rank's) and the phase it
    is in (PHASES; None: its training steps; in a multi-process job the lowest rank's that is in one), each
    progress file read once (the meter asks at every sample)."""
    files = list(rank_files(path).values()) or [Path(path)]
    steps: list[int] = []
    phase: str | None = None
    for file in files:
        try:
            data = json.loads(file.read_text())
            steps.append(int(data["steps"]))
        except (OSError, ValueError, KeyError, TypeError):
            steps.append(0)
            continue
        if phase is None and isinstance(data.get("phase"), str):
            phase = data["phase"]
    return min(steps), phase


def _steps(path: str | Path) -> int:
    try:
        return int(json.loads(Path(path).read_text())["steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def write_progress(
    path: str | Path,
    steps: int,
    rank: RankIdentity | None = None,
    phase: str | None = None,
    pinned: int | None = None,
) -> None:
    """``pinned``: the bytes CUDA's pinned host allocator holds now (what an offload plan draws on)."""
    data: dict[str, Any] = {"steps": steps, **(asdict(rank) if rank is not None else {})}
    if phase is not None:
        data["phase"] = phase
    if pinned:
        data["pinned"] = pinned
    _write_json_atomic(Path(path), data)


def read_pinned(path: str | Path) -> int | None:
    """The pinned host bytes the trial last wrote, summed over its ranks (None: none written)."""
    files = list(rank_files(path).values()) or [Path(path)]
    total = None
    for file in files:
        try:
            value = json.loads(file.read_text()).get("pinned")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(value, int):
            total = (total or 0) + value
    return total


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    # Write-then-rename: a reader never sees half a file, even if the writer is killed mid-write.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def write_settled(path: Path, end_at: int, reason: str, rise_bytes: int | None) -> None:
    """The tuner's word to a settling trial (TrialRequest.settled_path): end at step ``end_at``, and why."""
    _write_json_atomic(path, {"end_at": end_at, "reason": reason, "rise_bytes": rise_bytes})


def read_settled(path: str) -> tuple[int, str] | None:
    """The step a settling trial ends at and why, once the tuner has written it (None before)."""
    if not path:
        return None
    try:
        data = json.loads(Path(path).read_text())
        return int(data["end_at"]), str(data["reason"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
