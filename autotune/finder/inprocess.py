"""Trials inside the user's own process (issue 44): the search's runner for ``autotune.find_batch_size`` and
the Lightning and Hugging Face callbacks.

A finder's user (Accelerate's ``find_executable_batch_size``, Lightning's ``BatchSizeFinder``) calls it in
the process that trains: nothing starts, the model and data already in memory are used as they are, and the
answer is applied by the same call. ``InProcessRunner`` gives the search (autotune.search, unchanged) that
shape: each configuration calls the training function here, as a warm trial process runs its script again
for each configuration the tuner sends (autotune.runtime.warm), with the same pieces:

- the runtime's one trial object (autotune.runtime.trial) starts over for each configuration, and the hooks
  that count steps and apply the plan at the model's first forward are those of any trial
  (autotune.runtime.hooks); a plan is taken off the model after its configuration (a callback's model
  trains on after the search), and between configurations the process goes back to rest as a warm one
  does (``return_to_rest``: collected, CUDA's cache emptied, the heap trimmed, the high-water mark reset);
- a configuration's peak is this process's: on the CPU its resident high-water mark since that rest
  (exact: the kernel keeps it), on a GPU what the process holds on the device, CUDA context included:
  NVML's samples above the device's use at rest, plus what NVML lists for this process at rest;
- the budget stops a configuration from inside: on a GPU the allocator is capped at the budget less what the
  process holds outside torch's allocator (``cap_allocator``), so an allocation past it raises torch's
  OutOfMemoryError in the training function, recorded ``over-budget`` as a warm trial's; on the CPU the
  trial's guard (``_Guard``, run before every step and forward) stops it with :class:`TrialStopped` once
  the high-water mark passes the budget (a lower bound, as the meter's stop is); the same guard keeps the
  trial's time limits and the verification's settling (autotune.trials.settle), which a launcher keeps for a
  trial of its own.

What a process of its own gives and this cannot: a configuration that crashes the interpreter (a segfault),
hangs inside one step, or is killed for memory takes the user's process with it, as it would in their
training (Accelerate's finder is no different); a readings' peak includes what the process held before the
call (the tuner, the data the script loaded), which is what the training that follows holds too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
import traceback
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from autotune.backends import parse_backend_plan
from autotune.core.errors import TrialError
from autotune.core.paths import new_trial_dir
from autotune.core.plans import Backend
from autotune.core.protocol import EXIT_COMPLETE, EXIT_FAILED, EXIT_OOM, REQUEST_ENV, Outcome, TrialRequest
from autotune.hardware.devices import Device
from autotune.hardware.load import LoadSnapshot
from autotune.hardware.meters import MemoryMeter, MemoryReading, NvmlMeter, make_meter
from autotune.runtime import hooks
from autotune.runtime import trial as runtime_trial
from autotune.runtime.process import rss_high_water
from autotune.runtime.trial import _Trial
from autotune.runtime.warm import _configure, _reset_counters, cap_allocator, return_to_rest
from autotune.search.runner import check_between
from autotune.trials.interrupts import InterruptShield, StopRequested, TrialInterrupted
from autotune.trials.launcher import ProcessExit
from autotune.trials.measurement import read_report, trial_request, trial_result
from autotune.trials.result import TrialResult, classify, steps_load
from autotune.trials.settings import TrialSettings
from autotune.trials.settle import Settle
from autotune.trials.warm import capped

Train = Callable[[int], Any]  # the training function: one configuration's run at a batch size
_EXIT = {Outcome.COMPLETE: EXIT_COMPLETE, Outcome.OOM: EXIT_OOM}
POLL_SECONDS = 0.2  # the search's progress callback, at most this often
_TRIAL: list[_Trial] = []  # the process's one runtime trial, which its hooks hold (made by the first search)


class TrialStopped(BaseException):
    """Raised inside the training function by the trial's guard: the configuration passed the budget or a
    time limit (its report is written). A BaseException, as torch's own stop is not: no ``except
    Exception`` in the user's loop swallows it."""


class InProcessRunner:
    """Measures configurations by calling ``train(batch_size)`` in this process (autotune.search.runner's
    ``Runner``; see the module docstring). ``ceiling``: the budget's bytes, past which a configuration is
    stopped (not the probe's)."""

    def __init__(
        self,
        train: Train,
        backend: Backend,
        device: Device,
        settings: TrialSettings,
        root: Path,
        ceiling: int | None,
        shield: InterruptShield | None = None,
        nvml: Any = None,
    ) -> None:
        self.train = train
        self.backend = backend
        self._device = device
        self.settings = settings
        self.root = root
        self.ceiling = ceiling
        self._shield = shield
        self.host_budget: int | None = None  # the host watch is a launcher's: nothing to watch from inside
        self.meter: MemoryMeter | None = make_meter(device, nvml) if device.kind == "cuda" else None
        # on a GPU: what the process holds outside torch's allocator (its CUDA context), once known
        self._outside: int | None = None
        if self.meter is not None and _cuda_reserved() is not None:
            self._at_rest(_Reading(None, device, nvml=getattr(self.meter, "_nvml", None)))

    @property
    def device(self) -> Device:
        return self._device

    @property
    def stop(self) -> threading.Event | None:
        return None

    @property
    def shield(self) -> InterruptShield | None:
        return self._shield

    def check(self) -> None:
        check_between(self._shield, None)

    def close(self) -> None:
        """The search is over: no trial runs in this process any more (the hooks stay, and apply only the
        answer's plan: autotune.runtime.hooks), and the allocator is uncapped."""
        runtime_trial.enter(None)
        os.environ.pop(REQUEST_ENV, None)  # a process this one starts is in no trial either
        cap_allocator(0)

    def __call__(
        self,
        batch: int,
        plan: str,
        *,
        poll: Callable[[int, float], None] | None = None,
        settings: TrialSettings | None = None,
        probe: bool = False,
        interruptible: Callable[[], AbstractContextManager[None]] | None = None,
        grad_accum: int | None = None,
        check_plans: tuple[str, ...] = (),
        sweep: tuple[str, ...] = (),
        fresh: bool = False,  # every configuration is this process's: nothing fresher to read it in
    ) -> TrialResult:
        """One configuration, measured in this process (see the module docstring)."""
        if sweep:
            raise TrialError("a search in the user's process measures one plan a configuration")
        settings = settings or self.settings
        probing = probe or bool(check_plans)
        folder = new_trial_dir(self.root)
        request = dataclasses.replace(
            trial_request(
                folder, batch, parse_backend_plan(plan, self.backend), self.backend, self._device,
                settings, probing, grad_accum, check_plans,
            ),
            memory_cap=0 if probing else self._cap(),
        )  # fmt: skip
        path = folder / "request.json"
        request.write(path)
        return_to_rest()  # what the caller and the last configuration left: not this one's peak
        trial = self._start(request, str(path))
        reading = _Reading(self.meter, self._device)
        guard = _Guard(trial, None if probing else self._host_ceiling(), settings, poll, reading)
        trial.guard = guard
        before = LoadSnapshot.now()
        cpu = _cpu_seconds()
        error: BaseException | None = None
        with interruptible() if interruptible is not None else contextlib.nullcontext():
            try:
                self.train(batch)
            except BaseException as e:  # the trial's end (TrialComplete), an error, a stop, Ctrl-C
                error = e
        trial.guard = None
        if trial.undo_plan is not None:
            trial.undo_plan()
        interrupted = isinstance(error, KeyboardInterrupt | StopRequested)
        if not interrupted:
            trial.conclude(error)
        if error is not None:
            traceback.clear_frames(error.__traceback__)  # its frames hold the model and its tensors
        trial.let_go()
        memory = reading.stop()
        if interrupted:
            return_to_rest()
            raise TrialInterrupted() if isinstance(error, KeyboardInterrupt) else error  # type: ignore[misc]
        error = None  # its frames cleared, the error itself let go: the collection at rest takes the rest
        return_to_rest()
        self._at_rest(reading)
        return self._result(request, folder, memory, guard, before, cpu)

    def _start(self, request: TrialRequest, path: str) -> _Trial:
        """The runtime's trial, at ``request``: the process's first one installs the hooks, a later one (of
        this search or another in the process) starts over: the hooks hold the object."""
        _configure(request, path)  # a script reads its batch size and plan from the environment too
        if not _TRIAL:
            _TRIAL.append(_Trial(request))
            runtime_trial.enter(_TRIAL[0])
            hooks.install()
        else:
            _TRIAL[0].restart(request)
            runtime_trial.enter(_TRIAL[0])
            hooks.rearm()
        trial = _TRIAL[0]
        trial.in_process = True
        _reset_counters()
        cap_allocator(request.memory_cap)
        return trial

    def _host_ceiling(self) -> int | None:
        """The budget the guard stops a configuration at (the CPU's; a GPU's is the allocator's cap)."""
        return self.ceiling if self._device.kind != "cuda" else None

    def _cap(self) -> int:
        """The allocator's cap (0: none): the budget less what the process held at rest outside torch's
        allocator (on a GPU, once known)."""
        if self.ceiling is None or self._outside is None:
            return 0
        return max(self.ceiling - self._outside, 1)

    def _at_rest(self, reading: _Reading) -> None:
        """On a GPU, at rest: what the process holds outside torch's allocator (the next cap is the budget
        less it); unknown where NVML lists no process of ours or CUDA is not in use yet."""
        reserved = _cuda_reserved()
        if self._device.kind == "cuda" and reserved is not None:
            held = reading.own_device_bytes()
            if held is not None:
                self._outside = max(held - reserved, 0)

    def _result(
        self,
        request: TrialRequest,
        folder: Path,
        memory: MemoryReading,
        guard: _Guard,
        before: LoadSnapshot,
        cpu: float,
    ) -> TrialResult:
        report = read_report(Path(request.report_path))
        outcome = report.outcome if report is not None else Outcome.FAILED
        wall = time.monotonic() - guard.started
        exit_info = ProcessExit(
            exit_code=_EXIT.get(outcome, EXIT_FAILED),
            signal=None,
            main_maxrss_bytes=memory.peak_bytes if memory.method == "rss" else 0,
            wall_seconds=wall,
            timed_out=None,
            stopped=False,
            cpu_seconds=_cpu_seconds() - cpu,
            first_step_seconds=guard.first_step,
        )
        outcome, error = classify(exit_info, report, self.settings)
        if outcome is Outcome.OOM and request.memory_cap and self.ceiling is not None:
            outcome, error = capped(error)
            memory = dataclasses.replace(memory, peak_bytes=self.ceiling + 1)  # a lower bound, past it
        result = trial_result(outcome, error, request, self._device, memory, exit_info, report, folder)
        load = before.until(LoadSnapshot.now())  # the trial's CPU is this process's own: none missed
        if wall > 0:
            load = dataclasses.replace(load, cpu_per_wall=max(exit_info.cpu_seconds or 0.0, 0.0) / wall)
        return dataclasses.replace(result, load=steps_load(load, report))


class _Reading:
    """A configuration's memory as it runs: the high-water mark by step (the CPU), NVML's samples (a GPU)."""

    def __init__(self, meter: MemoryMeter | None, device: Device, nvml: Any = None) -> None:
        self.meter = meter
        self.device = device
        self.nvml = nvml if nvml is not None else getattr(meter, "_nvml", None)
        self.by_step: dict[int, int] = {}
        self.resting = 0  # on a GPU: what NVML listed for this process at rest, before the configuration
        if meter is not None:
            self.resting = self.own_device_bytes() or (_cuda_reserved() or 0)
            meter.start(lambda: (os.getpid(),))

    def at_step(self, steps: int) -> int:
        """Now, with ``steps`` finished: the configuration's peak so far (filed under that step)."""
        if self.meter is not None:
            self.meter.at_step(steps)
            peak = self.resting + self.meter.current()
        else:
            peak = rss_high_water() or 0
        self.by_step[steps] = max(self.by_step.get(steps, 0), peak)
        return peak

    def stop(self) -> MemoryReading:
        if self.meter is None:
            peak = rss_high_water() or 0
            report = max(self.by_step.values(), default=0)
            return MemoryReading(max(peak, report), "rss", len(self.by_step), 1, by_step=dict(self.by_step))
        # the sampling alone: the meter's stop waits for the device to come back to its level before the
        # trial, which a process that still holds the configuration's cache (emptied at rest, next) is not
        meter = self.meter
        assert isinstance(meter, NvmlMeter)
        meter.stop_sampling()
        by_step, by_phase = meter.split()
        return MemoryReading(
            self.resting + meter.sampled_peak(),
            meter.method,
            meter.samples,
            1,
            by_step={step: self.resting + above for step, above in by_step.items()},
            by_phase={phase: self.resting + above for phase, above in by_phase.items()},
        )

    def own_device_bytes(self) -> int | None:
        """What NVML lists for this process on the device (None: it lists none, another PID namespace)."""
        nvml = self.nvml
        if nvml is None:
            return None
        pid = os.getpid()
        for member in self.device.members:
            for proc in nvml.nvmlDeviceGetComputeRunningProcesses(member.handle):
                if proc.pid == pid and proc.usedGpuMemory is not None:
                    return int(proc.usedGpuMemory)
        return None


class _Guard:
    """Run before every step and forward of a configuration (TrialState.guard): the budget (the CPU's), the
    time limits, the verification's settling, the search's progress."""

    def __init__(
        self,
        trial: _Trial,
        ceiling: int | None,
        settings: TrialSettings,
        poll: Callable[[int, float], None] | None,
        reading: _Reading,
    ) -> None:
        self.trial = trial
        self.ceiling = ceiling
        self.settings = settings
        self.poll = poll
        self.reading = reading
        self.started = time.monotonic()
        self.first_step: float | None = None
        self._polled = 0.0
        request = trial.request
        self.settle = (
            Settle(
                Path(request.settled_path),
                request.total_steps,
                settings.settle_seconds,
                settings.settle_limit,
                warmup=request.warmup_steps,
            )
            if request.settle_steps
            else None
        )

    def __call__(self) -> None:
        trial, now = self.trial, time.monotonic()
        elapsed = now - self.started
        steps = trial.steps
        if steps and self.first_step is None:
            self.first_step = elapsed
        peak = self.reading.at_step(steps)
        if self.ceiling is not None and peak > self.ceiling:
            self._stop(
                Outcome.OVER_BUDGET, "stopped as its peak passed the budget (the peak is a lower bound)"
            )
        if not steps and elapsed > self.settings.startup_timeout:
            self._stop(Outcome.TIMEOUT, f"no training step within {self.settings.startup_timeout:g}s")
        if elapsed > self.settings.timeout:
            self._stop(Outcome.TIMEOUT, f"still running after {self.settings.timeout:g}s")
        if self.settle is not None:
            self.settle.watch(steps, self.reading.by_step, elapsed)
        if self.poll is not None and now - self._polled >= POLL_SECONDS:
            self._polled = now
            self.poll(steps, elapsed)

    def _stop(self, outcome: Outcome, why: str) -> None:
        trial = self.trial
        trial.guard = None  # the report's own work must not come back here
        trial.report(outcome, why)
        trial.concluded, trial.exit_code = True, EXIT_FAILED
        raise TrialStopped(why)


def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def _cuda_reserved() -> int | None:
    """torch's reserved CUDA bytes now (None: CUDA not in use in this process)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    return int(torch.cuda.memory_reserved())
