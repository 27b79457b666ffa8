"""A sweep's segments (TrialRequest.sweep, autotune.search.sweep): several plans measured in one trial
process, the prepared model's plan switched between two steps, each plan with its own warm-up, measured steps
and peak."""

from __future__ import annotations

import os
from typing import TypeVar

from autotune.core.plans import Plan, parse_plan
from autotune.core.protocol import PLAN_ENV, SEGMENT_PHASE, Segment, write_progress
from autotune.runtime.process import cuda_peaks, pinned_bytes, release_segment_memory, rss_high_water
from autotune.runtime.state import TrialState

M = TypeVar("M")


def close_segment(trial: TrialState) -> None:
    """The current plan's segment is measured: keep it (a sweep)."""
    allocated, reserved = cuda_peaks()
    trial.segments.append(
        Segment(
            plan=trial.segment_plan,
            plan_applied=trial.plan_applied,
            step_seconds=tuple(trial.step_seconds),
            step_samples=tuple(trial.step_samples),
            warmup_steps=trial.warmup_steps - trial.segment_start,
            first_step=trial.segment_start,
            last_step=trial.steps,
            step_tokens=tuple(trial.step_tokens) if len(trial.step_tokens) == len(trial.step_seconds) else (),
            rss_peak=rss_high_water(),
            torch_peak_allocated=allocated,
            torch_peak_reserved=reserved,
            step_pressure=trial.measured_pressure(),
        )
    )


def next_segment(trial: TrialState) -> None:
    """Between two steps of a sweep: keep the segment just measured, switch the model to the next plan,
    give back what the last plan's step held (CUDA's cached blocks; the peak counters and the
    resident high-water mark reset), and measure the next plan as a trial of its own: its warm-up, its
    measured steps, its samples filed by the meter under its own phase."""
    close_segment(trial)
    plan = trial.sweep.pop(0)
    os.environ[PLAN_ENV] = plan  # a script that applies plans itself reads it
    if trial.switch is not None:
        trial.plan_applied = trial.switch(plan)
    else:
        trial.plan_applied = None
    release_segment_memory()
    trial.segment_plan = plan
    trial.segment_start = trial.steps
    trial.warmup_steps = trial.steps + max(1, trial.request.warmup_steps)
    trial.step_seconds, trial.step_samples, trial.step_tokens, trial.step_pressure = [], [], [], []
    trial.segment_phase = SEGMENT_PHASE + plan
    write_progress(trial.progress_path, trial.steps, trial.rank, trial.segment_phase, pinned_bytes())
    trial.restart_clock()


def prepare_switchable(model: M, plan: Plan, trial: TrialState) -> M:
    """A sweep's model: ``plan`` applied so that the trial can switch it to the next plan between two steps
    (each undone as the probe's checks undo theirs: autotune.backends.torch_modules.plan_applied)."""
    from autotune.backends.torch_modules import plan_applied

    if trial.switch is not None:  # prepared already (a framework's wrapper of the same model)
        return model
    held = [plan_applied(model, plan)]  # type: ignore[arg-type]
    trial.plan_applied = str(held[0].__enter__())

    def switch(new: str) -> str:
        held[0].__exit__(None, None, None)
        held[0] = plan_applied(model, parse_plan(new))  # type: ignore[arg-type]
        return str(held[0].__enter__())

    def undo() -> None:
        held[0].__exit__(None, None, None)

    trial.switch, trial.undo_plan = switch, undo
    return model
