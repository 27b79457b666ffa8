"""Warm trial processes (issue 41): one process measures one configuration after another.

A fresh trial process spends most of its life starting (on an H200, 12-24 s of imports, model building, the
CUDA context and warm-up for 0.4-3.8 s of measured steps); Accelerate's finder answers faster because it never
leaves its process. A warm process starts once: after each configuration the runtime collects the script's
objects and waits at rest (autotune.runtime.warm), and the next configuration runs the script again in it.

The protocol, in the trial's folder: the tuner writes ``request-K.json`` and then ``next-K.json`` (the
request's path and the command line after the harness; for K = 1 the process is started with the request);
the runtime writes ``progress-K.json`` and ``report-K.json`` as any trial does, then returns to rest and
writes ``rest-K.json``. The tuner ends the process with a ``next`` message that names no request.

What each configuration measures is what its own process would have:
- its steps, warm-up and throughput are its own (the trial object starts over); its warm-up is one step
  shorter than a fresh process's (at least one: ``warm_warmup``), since the process's own first step paid
  the one-time costs (lazy initialisation, thread pools, libraries' first touch), and a first measured step
  that is still slow becomes warm-up as in any trial (autotune.runtime.settling.unsettled);
- its peak is the meter's samples from the message to its rest, filed apart from the others'
  (``MemoryMeter.split``): on a GPU the whole device's use above the level before the process started, CUDA
  context included, as a fresh trial's (CUDA's cache is emptied at rest: nothing carries over); on the CPU
  also never below the process's resident high-water mark since its return to rest
  (``/proc/self/clear_refs``), which starts at what the process holds at rest: torch's libraries and what
  they keep, which a fresh process of the same script holds at its peak too. The CPU's allocator keeps a
  history a GPU's emptied cache does not: glibc raises its mmap threshold as large blocks are freed, so a
  configuration reads 2-4% over a fresh process of it after others at its batch size or below, and 8-20%
  over after a larger batch (GPT-2 4 x 256: batch 2 after 8, 1181 vs 984 MiB). So on the CPU a warm process
  never takes a smaller batch than one it ran (``WarmProcess.takes``: the next one starts a new process),
  and its readings are conservative: never under a fresh process's. The verification, in a process of its
  own, reads the answer's true peak; a configuration read warm over the limit by no more than that excess
  (records.WARM_EXCESS), and fast enough to be the answer if it fitted, is read again in a process of its
  own before it bounds its plan's larger batches (search.propose.warm_near_limit).

Warm only while it is honest (``WarmTrials``): a process takes the next configuration only if it came back to
the memory it had at rest after its first one (within REST_SLACK); a script that fails on a later run in one
process is run again in a fresh one, and if that one does not fail, the script cannot run twice in a process
(a process group initialised at import, a module-level side effect): trials run one process each from then on,
and the run says why, once. A leak turns warm trials off the same way. An out-of-memory error raised in the
process is its configuration's outcome ``oom``, and the process goes on; one the meter or the kernel stops
(over the budget, killed) ends it, and the next configuration starts a new one. Not warm: a sweep, a
verification (the winner is verified in a process of its own), phases (--with-eval, --with-save), compile
plans, ORT, plans per rank and any command whose Python the harness does not run (torchrun, a shell
wrapper).

The probe (and a check of named plans, its second instrumented trial) starts the warm process: the search's
trials then run in the process the probe started, one start-up fewer (on an H200 12-24 s; on this project's
2-core CPU ~8 s for bench/time_to_answer.py's GPT-2). Its instruments go with the script's objects at rest
(the trial lets go of the probe, dynamo is reset, CUDA's cache emptied, the heap trimmed). Measured on that
GPT-2 on the CPU, two runs each way: the process at rest after the probe held 396.5 MiB against 389.6 after a
plain first configuration, and the next configurations read none@1 at 788 and 783 MiB against 773 and 773 in
a process of their own, none@4 at 1411 and 1445 against 1403 and 1397: the warm readings' usual excess,
handled as any warm reading's (records.warm_on_host). A warm probe runs under the budget like any
configuration; one the budget stopped (the probe holds more than a plain trial: 1154 MiB at batch 1 there) is
run again in a process of its own without it (autotune.search.runner), as a probe always ran.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from autotune.backends import AnyPlan
from autotune.core.batches import check_trial_sizes
from autotune.core.errors import TrialError
from autotune.core.faults import writing_trial_files
from autotune.core.paths import new_trial_dir
from autotune.core.plans import Backend, parse_plan
from autotune.core.protocol import (
    EXIT_COMPLETE,
    EXIT_FAILED,
    EXIT_OOM,
    Outcome,
    Rest,
    TrialReport,
    TrialRequest,
    WarmMessage,
    read_pinned,
    read_position,
    warm_file,
)
from autotune.hardware.host import mib
from autotune.hardware.load import LoadSnapshot
from autotune.hardware.meters import HOST_METHODS, MemoryReading
from autotune.trials.launcher import Launch, ProcessExit, Stage, TrialProcess, tail
from autotune.trials.measurement import TrialJob, read_report, trial_launch, trial_request, trial_result
from autotune.trials.result import TrialResult, classify, steps_load
from autotune.trials.settings import TrialSettings

HARNESS = "autotune.runtime.harness"
# How far above its first rest a warm process may come back and still take a configuration: what torch and
# the allocator keep between runs (3 MiB a run on examples/mlp.py) is well inside; a leak of the model is not.
REST_SLACK_BYTES = 32 * 2**20
REST_SLACK_SHARE = 0.05
END_SECONDS = 10.0  # a warm process told to end has this long before it is stopped
# a warm process at rest looks for its next message every 10 ms: one that has not taken it in this long
# (its progress file) does not listen, and is ended; its configuration is measured in a fresh process
TAKE_SECONDS = 30.0
_EXIT = {Outcome.COMPLETE: EXIT_COMPLETE, Outcome.OOM: EXIT_OOM}


@dataclass(frozen=True)
class Watch:
    """How the tuner waits for a configuration (see autotune.trials.launcher.run_process): ``on_poll(steps,
    elapsed)`` as it runs, ``interruptible()`` around the wait, ``stop`` set to stop it from another thread."""

    on_poll: Callable[[int, float], None] | None = None
    interruptible: Callable[[], AbstractContextManager[None]] | None = None
    stop: threading.Event | None = None


NO_WATCH = Watch()


def split_harness(argv: list[str]) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """A trial's command line as the interpreter's part (up to the harness) and the script's (after it);
    None where the harness does not run the script (a launcher, a shell wrapper)."""
    for i in range(len(argv) - 1):
        if argv[i] == "-m" and argv[i + 1] == HARNESS:
            return tuple(argv[: i + 2]), tuple(argv[i + 2 :])
    return None


class WarmProcess:
    """One trial process measuring configurations in turn (see the module docstring)."""

    def __init__(self, job: TrialJob) -> None:
        self.job = job
        self.process: TrialProcess | None = None
        self.folder: Path | None = None
        self.prefix: tuple[str, ...] = ()
        self.runs = 0
        self.largest_batch = 0  # the largest batch size it ran
        self.rest_reference: int | None = None  # bytes at rest after its first configuration
        self.grown: str | None = None  # why it may take no more: its memory at rest grew
        # on a GPU: what the process held at its last rest outside torch's allocator (NVML's reading less
        # torch's reserved bytes: the CUDA context, cuBLAS's workspace)
        self.outside: int | None = None
        self._progress = Path()
        self.cpu_at_rest = 0.0  # the process's CPU seconds at its last rest (autotune.hardware.load)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.alive

    def takes(self, argv: list[str], batch: int) -> bool:
        """Whether the process can run a configuration at ``batch`` with command line ``argv`` next. Where the
        meter reads host memory, not a batch smaller than one it ran: glibc raises its mmap threshold as
        large blocks are freed, so a process that ran a larger batch keeps more of a smaller one's blocks on
        its heap, and reads 8-20% over a fresh process of it (GPT-2 4 x 256 on the CPU: batch 2 after 8,
        1181 vs 984 MiB); at the same or a larger batch it reads 2-4% over, never under."""
        parts = split_harness(argv)
        if not self.alive or self.grown is not None or parts is None or parts[0] != self.prefix:
            return False
        if self.job.meter.over.is_set():  # a sample past the ceiling as its last configuration ended
            return False
        return self.job.meter.method not in HOST_METHODS or batch >= self.largest_batch

    def measure(
        self,
        batch: int,
        plan: AnyPlan,
        grad_accum: int | None = None,
        watch: Watch = NO_WATCH,
        check_plans: tuple[str, ...] | None = None,
    ) -> TrialResult:
        """The next configuration, in this process (started now if it is not yet); with ``check_plans``
        (a tuple, maybe empty), a probe that also checks those plans.

        Raises:
            InputError: ``batch`` or ``grad_accum`` is not a whole number >= 1.
            TrialInterrupted, StopRequested: as run_trial; the process is stopped.
            Untaken: the process, at rest, did not take the configuration; it is stopped.
        """
        check_trial_sizes(batch, grad_accum)
        job = self.job
        argv = job.command.argv(batch, grad_accum)
        parts = split_harness(argv)
        if parts is None:
            raise TrialError(f"a warm trial needs the harness in its command line: {argv}")
        run = self.runs + 1
        with writing_trial_files(job.root / "trials"):
            if self.folder is None:
                self.folder = new_trial_dir(job.root)
            request = self._request(run, batch, plan, grad_accum, check_plans)
        before = LoadSnapshot.now()
        since = time.monotonic()
        if self.process is None:
            self.process = TrialProcess(self._launch(argv, request, run), job.meter, self._position)
            self.prefix = parts[0]
        else:
            job.meter.split()  # its samples at rest are no configuration's
            WarmMessage(str(warm_file(self.folder, "request", run)), parts[1]).write(
                warm_file(self.folder, "next", run)
            )
        self.runs = run
        self.largest_batch = max(self.largest_batch, batch)
        folder = self.folder
        stage = Stage(
            self._progress,
            since,
            done=lambda: warm_file(folder, "rest", run).exists(),
            take_seconds=TAKE_SECONDS if run > 1 else None,
        )
        try:
            timed_out = self.process.wait(watch.on_poll, watch.interruptible, watch.stop, stage)
        except BaseException:
            self._end(None)
            raise
        if timed_out == "untaken":
            self._end(None)
            raise Untaken(f"its process did not take configuration {run} within {TAKE_SECONDS:g}s")
        return dataclasses.replace(self._result(request, run, timed_out, stage, since, before), warm_run=run)

    def close(self) -> None:
        """End the process: told to end, stopped if it does not within END_SECONDS."""
        if self.process is None or self.folder is None:
            return
        if self.process.alive:
            with contextlib.suppress(OSError):  # a folder it cannot write: stopped below
                WarmMessage().write(warm_file(self.folder, "next", self.runs + 1))
            deadline = time.monotonic() + END_SECONDS
            while self.process.alive and time.monotonic() < deadline:
                time.sleep(0.02)
            if self.process.alive:
                self.process.stop()
        self._end(None)

    def _end(self, timed_out: str | None) -> tuple[ProcessExit, MemoryReading] | None:
        process, self.process = self.process, None
        if process is None:
            return None
        if process.alive:
            process.stop()
        with contextlib.suppress(TrialError):  # a launcher that left no result: nothing more to learn
            return process.end(timed_out)
        return None

    def _request(
        self, run: int, batch: int, plan: AnyPlan, grad_accum: int | None, check_plans: tuple[str, ...] | None
    ) -> TrialRequest:
        job, folder = self.job, self.folder
        assert folder is not None
        probe = check_plans is not None
        request = dataclasses.replace(
            trial_request(
                folder,
                batch,
                plan,
                job.backend,
                job.device,
                job.settings,
                probe,
                grad_accum,
                check_plans or (),
            ),
            warmup_steps=warm_warmup(job.settings.warmup_steps, run),
            report_path=str(warm_file(folder, "report", run)),
            progress_path=str(warm_file(folder, "progress", run)),
            warm=True,
            memory_cap=self._cap(),
        )
        request.write(warm_file(folder, "request", run))
        self._progress = Path(request.progress_path)
        return request

    def _cap(self) -> int:
        """The allocator's cap for the next configuration: the budget less what the process holds outside
        torch's allocator (0: no cap: on the CPU, without a budget, or before the process's first rest)."""
        if self.job.ceiling is None or self.outside is None:
            return 0
        return max(self.job.ceiling - self.outside, 1)

    def _launch(self, argv: list[str], request: TrialRequest, run: int) -> Launch:
        folder = self.folder
        assert folder is not None
        return trial_launch(argv, request, folder, self.job, warm_file(folder, "request", run))

    def _position(self) -> tuple[int, str | None]:
        """Where the configuration being measured is (the meter files each sample under it)."""
        return read_position(self._progress)

    def _result(
        self,
        request: TrialRequest,
        run: int,
        timed_out: str | None,
        stage: Stage,
        since: float,
        before: LoadSnapshot,
    ) -> TrialResult:
        """The configuration's result: from its report and its own samples while the process lives on;
        as a fresh trial's from how the process ended where it did not (its first configuration: the whole
        reading; a later one: the samples since its message)."""
        assert self.process is not None and self.folder is not None
        job, folder = self.job, self.folder
        report = read_report(Path(request.report_path))
        earlier = self.cpu_at_rest  # the process's CPU seconds before this configuration
        if timed_out is None and self.process.alive and report is not None:
            exit_info, reading = self._at_rest(report, stage, since, run)
            # alive: the tuner's count of its reaped children misses this configuration's CPU
            cpu = missed = self.cpu_at_rest - earlier
        else:
            ended = self._end(timed_out)
            if ended is None:
                raise TrialError(f"the warm trial process left no result ({folder})")
            exit_info, reading = ended
            if run > 1:  # the process's own peak is its earlier configurations' too
                reading = dataclasses.replace(reading, peak_bytes=0)
            # reaped: the tuner's count holds the whole process, its earlier configurations too
            cpu, missed = (exit_info.cpu_seconds or 0.0) - earlier, -earlier
        load = before.until(LoadSnapshot.now(), missed)
        if exit_info.wall_seconds > 0:
            load = dataclasses.replace(load, cpu_per_wall=max(cpu, 0.0) / exit_info.wall_seconds)
        host_read = reading.peak_bytes if reading.method in HOST_METHODS else None
        outcome, error = classify(exit_info, report, job.settings, host_read)
        if outcome is Outcome.OOM and request.memory_cap and job.ceiling is not None:
            outcome, error = capped(error)
            reading = dataclasses.replace(reading, peak_bytes=job.ceiling + 1)  # a lower bound, past it
        if outcome is Outcome.FAILED:
            error = "\n".join(filter(None, [error, tail(folder / "stderr.log")]))
        result = trial_result(outcome, error, request, job.device, reading, exit_info, report, folder)
        return dataclasses.replace(result, load=steps_load(load, report))

    def _at_rest(
        self, report: TrialReport, stage: Stage, since: float, run: int
    ) -> tuple[ProcessExit, MemoryReading]:
        """A configuration the process lived through: how it ended (as its exit status would say) and its
        own samples; the process's rest is checked against its first."""
        assert self.process is not None and self.folder is not None
        meter = self.job.meter
        by_step, by_phase = meter.split()
        method = meter.method
        exact = report.rss_peak or 0 if method in HOST_METHODS else 0
        reading = MemoryReading(exact, method, meter.samples, 1, by_step=by_step, by_phase=by_phase)
        rest = Rest.read(warm_file(self.folder, "rest", run))
        self._check_rest(rest, method)
        self.cpu_at_rest = rest.cpu_seconds if rest.cpu_seconds is not None else self.cpu_at_rest
        exit_info = ProcessExit(
            exit_code=_EXIT.get(report.outcome, EXIT_FAILED),
            signal=None,
            main_maxrss_bytes=exact,
            wall_seconds=time.monotonic() - since,
            timed_out=None,
            stopped=False,
            host_peak_bytes=self.process.host.peak,
            host_last_bytes=self.process.host.last,
            pinned_bytes=read_pinned(self._progress),
            first_step_seconds=stage.first_step,
            host_budget=self.process.launch.host_budget,
        )
        return exit_info, reading

    def _check_rest(self, rest: Rest, method: str) -> None:
        """The memory it holds at rest now against its first rest: grown past REST_SLACK, it takes no more."""
        if method in HOST_METHODS:
            now = rest.rss_bytes
        else:
            time.sleep(0.05)  # a few of the meter's samples at rest
            now = self.job.meter.current()
            self.outside = max(now - (rest.cuda_reserved or 0), 0)
        if self.rest_reference is None:
            self.rest_reference = now
            return
        grown = now - self.rest_reference
        if grown > max(REST_SLACK_BYTES, REST_SLACK_SHARE * self.rest_reference):
            self.grown = (
                f"its memory at rest grew by {mib(grown)} over {self.runs} configurations (a leak, or a "
                "library holding the script's objects)"
            )


class Untaken(TrialError):
    """A warm process at rest did not take the configuration it was sent (WarmProcess.measure)."""


def warm_warmup(steps: int, run: int) -> int:
    """The warm-up of a warm process's ``run``-th configuration where a fresh process's is ``steps``: one
    shorter after the first (at least one: a configuration's first step builds its model's state and
    buffers). Measured (#41): bench/time_to_answer.py's GPT-2 on the CPU, in a warm process, took 2.7 s for
    two warm-up steps at batch 4 whose measured steps took 1.07 s, and 4.2 s at batch 7 against 1.83: the
    second step was already a measured one's."""
    return steps if run == 1 else max(steps - 1, 1)


def capped(error: str | None) -> tuple[Outcome, str]:
    """An out-of-memory error under the allocator's cap (TrialRequest.memory_cap) is the budget's: the
    configuration needs more than the budget, as a meter that stopped it would say (over-budget, its peak a
    lower bound)."""
    return Outcome.OVER_BUDGET, (
        "raised out of memory at the allocator's cap, the budget less the process's memory outside torch's "
        f"allocator (the peak is a lower bound): {(error or '').strip().splitlines()[0] if error else ''}"
    ).rstrip(": ")


class WarmTrials:
    """A runner's warm process, and the rules for using it (see the module docstring): ``say`` tells the run
    once why its trials run one process each from then on."""

    def __init__(self, job: TrialJob, say: Callable[[str], None] | None = None) -> None:
        self.job = job
        self.say = say or (lambda text: None)
        self.process: WarmProcess | None = None
        self.off: str | None = None  # why trials run one process each from now on
        self._said: set[str] = set()  # why whole jobs cannot run warm, as told

    def suits(self, plan: str, settings: TrialSettings) -> bool:
        """Whether a configuration with ``plan`` under ``settings`` may run warm (see the module docstring).
        Where the whole job cannot (its backend, its command, its phases), the run is told why, once."""
        if self.off is not None:
            return False
        job_wide = self._job_wide(settings)
        if job_wide is not None:
            if job_wide not in self._said:
                self._said.add(job_wide)
                self.say(f"trials run one process each: {job_wide}")
            return False
        parsed = parse_plan(plan)
        # a compile plan's budget is set as torch is imported; a verification runs in a process of its own
        return not parsed.compiles and not parsed.ranks and not settings.settle_steps

    def _job_wide(self, settings: TrialSettings) -> str | None:
        """Why no trial of the job can run warm (None: they may)."""
        if self.job.backend is not Backend.TORCH:
            return "--backend ort builds its session for one plan"
        if self.job.command.launcher or split_harness(self.job.command.argv(1)) is None:
            return "the harness does not run the command's Python (torchrun, a shell wrapper)"
        if settings.phases:
            return "--with-eval and --with-save run their phase once, after the measured steps"
        return None

    def run(
        self,
        batch: int,
        plan: AnyPlan,
        grad_accum: int | None = None,
        watch: Watch = NO_WATCH,
        check_plans: tuple[str, ...] | None = None,
    ) -> TrialResult:
        """Measure the configuration in the warm process (a new one where there is none that can take it);
        with ``check_plans``, a probe (see the module docstring): it starts a process of its own."""
        if self.process is not None and (
            check_plans is not None or not self.process.takes(self.job.command.argv(batch, grad_accum), batch)
        ):
            self.close()
        if self.process is None:
            self.process = WarmProcess(self.job)
        try:
            result = self.process.measure(batch, plan, grad_accum, watch, check_plans)
        except Untaken as e:
            self._turn_off(f"{self._script()}: {e}")
            return self._alone(batch, plan, grad_accum, watch)
        if result.outcome is Outcome.FAILED and (result.warm_run or 1) > 1:
            return self._again_fresh(result, batch, plan, grad_accum, watch)
        if self.process.grown is not None:
            # what the process held at rest before it (the last run's leak) is in this reading too
            self._turn_off(f"{self._script()}: {self.process.grown}")
            return self._alone(batch, plan, grad_accum, watch)
        if not self.process.alive:
            self.close()
        return result

    def close(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            process.close()

    def _again_fresh(
        self,
        failed: TrialResult,
        batch: int,
        plan: AnyPlan,
        grad_accum: int | None,
        watch: Watch,
    ) -> TrialResult:
        """A configuration that failed on a later run of the script in one process, measured again in a
        fresh one: if it does not fail there, the script cannot run twice in one process."""
        self.close()
        self.process = WarmProcess(self.job)
        fresh = self.process.measure(batch, plan, grad_accum, watch)
        if fresh.outcome is not Outcome.FAILED:
            line = (failed.error or "").strip().splitlines()
            self._turn_off(
                f"{self._script()} failed on its run {failed.warm_run} in one process "
                f"({line[0] if line else 'no error'}) and not in a fresh one"
            )
        elif not self.process.alive:
            self.close()
        return fresh

    def _alone(
        self,
        batch: int,
        plan: AnyPlan,
        grad_accum: int | None,
        watch: Watch,
    ) -> TrialResult:
        """The configuration measured again in a process of its own, ended after it."""
        alone = WarmProcess(self.job)
        try:
            return dataclasses.replace(alone.measure(batch, plan, grad_accum, watch), warm_run=None)
        finally:
            alone.close()

    def _script(self) -> str:
        return self.job.command.script_path() or str(self.job.command)

    def _turn_off(self, why: str) -> None:
        self.off = why
        self.close()
        self.say(f"trials run one process each from now on: {why}")
