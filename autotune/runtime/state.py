"""What the trial runtime knows of the trial its process runs (autotune.runtime.trial's ``_Trial`` is this
and what it does): the request, the steps so far, what the script's model showed, the phases, a sweep's
segments. The runtime's helpers (checks, settling, segments) read and update it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from autotune.core.pressure import pressure_total
from autotune.core.protocol import EXIT_FAILED, RankIdentity, Segment, TrialRequest, rank_path, write_progress
from autotune.runtime.inputs import Seen


class TrialState:
    """State of the one trial this process is running."""

    def __init__(self, request: TrialRequest, rank: RankIdentity | None = None) -> None:
        self.request = request
        self.rank = rank  # in a multi-process job (torchrun): this process's rank; it reports on its own
        self.report_path = rank_path(request.report_path, rank.rank if rank else None)
        self.progress_path = rank_path(request.progress_path, rank.rank if rank else None)
        self.concluded = False  # its final report is written (a later exit handler leaves it)
        self.exit_code = EXIT_FAILED
        if rank is not None:  # from its start on, the tuner knows this rank's process (its memory, its steps)
            write_progress(self.progress_path, 0, rank)
        self.steps = 0
        self.warmup_steps = request.warmup_steps  # grows while the first measured step is an outlier
        self.started = self.last_step_end = time.perf_counter()
        self.step_ends: list[float] = []  # seconds from the runtime's start to the end of each step
        self.step_seconds: list[float] = []
        self.step_samples: list[int] = []
        # per measured step, the share of its time some task waited for a CPU (autotune.core.pressure), and
        # the kernel's counter at the last step's end (None: the kernel does not say)
        self.step_pressure: list[float] = []
        self.last_pressure: int | None = pressure_total()
        self.plan_applied: str | None = None
        self.candidates: list[dict[str, Any]] | None = None
        self.probe: Any = None  # autotune.backends.torch_probe.Probe, in a probe trial
        self.settled: str | None = None  # why a settling verification ended: settled, time cap, step cap
        self.shifted: str | None = None  # the load changed while it measured: lengthening stopped
        self.slow_start: str | None = None  # a slow start it measured past (runtime.settling.unsettled)
        self.slowest_warmup = 0.0  # seconds: the slowest measured step that became warm-up
        self.optimizer: Any = None
        self.explicit_steps = False
        self.counted_optimizer: int | None = None
        self.finished = False
        self.forwards = 0  # forwards of the model with gradients on, since the last optimizer step
        self.seen = Seen()  # what those forwards' inputs showed (batch dimensions, tokens, lengths)
        self.step_tokens: list[int] = []  # per measured step, where its inputs were (B, T) tokens
        self.step_lengths: list[int] = []  # the longest T of each step (warm-up included), where known
        self.batch_seen: int | None = None  # the largest batch dimension a forward of the model showed
        self.counting = True  # off while the probe checks plans on the model
        self.micro_batches: int | None = None  # forwards in the last step that counted any
        self.compiled = False  # the script called torch.compile (autotune.runtime.hooks)
        self.phases = () if request.probe else request.phases  # to run once after the measured steps
        self.measured = False  # the measured steps are done: the phases asked may run now
        self.phase_now: str | None = None  # the phase the script is in (autotune.phase)
        self.phase_depth = 0  # phases inside it of the same name (a Trainer's evaluate inside the user's)
        self.phase_seconds: dict[str, float] = {}
        self.phases_done: set[str] = set()  # asked, and run after the measured steps
        self.extra_steps = 0  # training steps past the measured ones, while phases are due
        self.last_phase: str | None = None  # after the measured steps: the phase the meter files under
        self.own_hf_checkpointing = False  # the script turned a Hugging Face model's own checkpointing on
        # a sweep (TrialRequest.sweep): the plans still to measure in this process, the segments measured,
        # and what switches the prepared model's plan (set by prepare(); None: the script applies plans
        # itself from $AUTOTUNE_PLAN, which a switch rewrites)
        self.sweep = list(request.sweep) if not request.probe and rank is None else []
        self.segments: list[Segment] = []
        self.segment_plan = request.plan
        self.segment_start = 0  # the steps done when the current segment began
        self.segment_phase: str | None = None  # what the meter files this segment's samples under
        self.switch: Callable[[str], str] | None = None
        # a warm process's later configurations (autotune.runtime.warm): the seconds its first one took to
        # start, which a fresh trial of this configuration would have taken too (how long it may measure on)
        self.process_startup = 0.0
        # a search inside the user's own process (autotune.finder): the trial must never end the process,
        # ``guard`` (its budget and time limits) runs before every step and forward, and ``undo_plan``
        # takes the plan off the model afterwards (a callback's model is trained on after the search)
        self.in_process = False
        self.guard: Callable[[], None] | None = None
        self.undo_plan: Callable[[], None] | None = None

    def measured_pressure(self) -> tuple[float, ...]:
        """The measured steps' CPU pressure, one per step (empty where any step's is unknown)."""
        return tuple(self.step_pressure) if len(self.step_pressure) == len(self.step_seconds) else ()

    def restart_clock(self) -> None:
        """The next step starts now: what ran since the last one (the probe's checks, a switch of plans)
        is no step's time or CPU pressure."""
        self.last_step_end = time.perf_counter()
        self.last_pressure = pressure_total()

    def startup_seconds(self) -> float:
        """Seconds from the runtime's start to the end of warm-up (0 before then)."""
        warm = self.segments[0].warmup_steps if self.segments else self.warmup_steps
        return self.step_ends[warm - 1] if len(self.step_ends) >= warm > 0 else 0.0

    def due_phases(self) -> list[str]:
        """The phases asked that the script has yet to run (none before the measured steps are done)."""
        return [p for p in self.phases if p not in self.phases_done] if self.measured else []
