"""Start one trial process through the shim, meter it, enforce its timeouts, and collect how it ended.

The shim (``autotune/trials/_shim.py``) runs the command in its own session, measures the main process with
``wait4``, kills every descendant when the trial ends, and dies with the tuner. This module owns the
tuner's side: the timeouts, Ctrl-C, and the meter's sampling thread.

Start trials from a thread that lives as long as the tuner: the shim's PR_SET_PDEATHSIG fires when the
*thread* that started it exits.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.core.errors import TrialError
from autotune.core.faults import files_fault, unwritable
from autotune.core.protocol import read_pinned, read_position, read_progress
from autotune.hardware.host import HostWatch
from autotune.hardware.meters import MemoryMeter, MemoryReading, PhaseSource, Ranks
from autotune.trials._shim import descendants
from autotune.trials.interrupts import StopRequested, TrialInterrupted
from autotune.trials.settle import Settle

SHIM = Path(__file__).with_name("_shim.py")
POLL_SECONDS = 0.05


@dataclass(frozen=True)
class Launch:
    """How to run one trial process."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    workdir: Path  # stdout.log, stderr.log and shim.json go here
    progress_path: Path
    startup_timeout: float  # seconds until the first step is done
    timeout: float  # seconds for the whole trial
    grace: float = 5.0  # seconds between SIGTERM and SIGKILL when a trial is stopped
    cwd: Path | None = None
    ceiling: int | None = None  # bytes: a trial whose sampled peak passes it is stopped at once
    ranks: Ranks | None = None  # a multi-process trial's ranks (pid -> identity), for the meter
    # True once one of the trial's processes has ended it (a rank's out-of-memory or error): the rest of
    # the tree is stopped at once, so no rank waits in a collective for one that is gone.
    ended: Callable[[], bool] | None = None
    settle: Settle | None = None  # a verification that runs on until its peak stops growing
    host_budget: int | None = None  # bytes of host memory the trial's tree may hold (None: no limit)
    log_limit: int = (
        0  # bytes of stdout.log and of stderr.log kept, the last ones (0: all; the shim caps them)
    )


@dataclass(frozen=True)
class ProcessExit:
    """How the trial's main process ended."""

    exit_code: int | None
    signal: int | None
    main_maxrss_bytes: int
    wall_seconds: float
    # "startup" or "run" (its timeouts), "ceiling" (its peak passed it), "host" (its host memory passed the
    # host budget), or "rank" (one rank ended it)
    timed_out: str | None
    stopped: bool  # autotune stopped it (timeout, ceiling, host budget or Ctrl-C)
    cpu_seconds: float | None = None  # user + system time of the main process and its reaped children
    # the launcher (the shim) itself ended by a signal, leaving no result: its trial died with it
    launcher_killed: bool = False
    host_peak_bytes: int = 0  # the trial's host memory as the host watch sampled it: its largest
    host_last_bytes: int = 0  # ... and its last sample
    pinned_bytes: int | None = None  # CUDA's pinned host memory as the trial last wrote it (None: unknown)
    first_step_seconds: float | None = None  # from the launch to the end of its first step (start-up)
    host_budget: int | None = None  # the host budget it ran under (Launch.host_budget)


def run_process(
    launch: Launch,
    meter: MemoryMeter,
    on_poll: Callable[[int, float], None] | None = None,
    interruptible: Callable[[], AbstractContextManager[None]] | None = None,
    stop: threading.Event | None = None,
) -> tuple[ProcessExit, MemoryReading]:
    """Run ``launch`` to its end, metered. ``on_poll(steps_done, elapsed)`` is called while it runs;
    ``interruptible()`` encloses the wait for the trial, once its launcher is up (see autotune.trials.interrupts);
    ``stop``, once set, stops the trial cleanly from any thread (a worker that is shutting down).

    Raises:
        TrialError: the shim could not be started or left no result.
        TrialInterrupted: Ctrl-C, after the trial has been stopped cleanly (a KeyboardInterrupt).
        StopRequested: ``stop`` was set; the trial has been stopped cleanly.
    """
    process = TrialProcess(launch, meter)
    timed_out: str | None = None
    try:
        timed_out = process.wait(on_poll, interruptible, stop)
    finally:
        exit_info, reading = process.end(timed_out)
    return exit_info, reading


class TrialProcess:
    """One trial process, started through the shim and metered from its construction until ``end()``.
    ``run_process`` waits for its end; a warm process (autotune.trials.warm) waits for one configuration at
    a time, its meter filing samples where ``position()`` says the trial is (default: the launch's progress
    file)."""

    def __init__(self, launch: Launch, meter: MemoryMeter, position: PhaseSource | None = None) -> None:
        self.launch = launch
        self.meter = meter
        self.started = time.monotonic()
        self.shim = _start_shim(launch)
        self.host = HostWatch(functools.partial(descendants, self.shim.pid), launch.host_budget)
        self.first_step: float | None = None  # seconds from the launch to the end of its first step
        try:  # from here on, whatever happens (a Ctrl-C included) stops the shim: no trial outlives its tuner
            meter.start(
                functools.partial(descendants, self.shim.pid),
                launch.ceiling,
                launch.ranks,
                position or functools.partial(read_position, launch.progress_path),
            )
        except BaseException:
            _stop(self.shim, launch.grace)
            raise

    @property
    def alive(self) -> bool:
        return self.shim.poll() is None

    def wait(
        self,
        on_poll: Callable[[int, float], None] | None = None,
        interruptible: Callable[[], AbstractContextManager[None]] | None = None,
        stop: threading.Event | None = None,
        stage: Stage | None = None,
    ) -> str | None:
        """Wait until the process ends, or ``stage.done()``; why autotune stopped it (run_process's
        timeouts, the ceiling, the host budget, a rank), else None. ``stage``: the part of its life being
        waited for (default: all of it, from the launch, as the launch's progress file counts its steps).

        Raises:
            TrialInterrupted, StopRequested: as run_process, the process stopped.
        """
        stage = stage or Stage(self.launch.progress_path, self.started, self.launch.settle)
        try:
            with interruptible() if interruptible is not None else nullcontext():
                return _wait(self.shim, self.launch, stage, on_poll, stop, self.meter, self.host)
        except KeyboardInterrupt as e:
            _stop(self.shim, self.launch.grace)
            raise TrialInterrupted from e
        except BaseException:
            _stop(self.shim, self.launch.grace)
            raise
        finally:
            if self.first_step is None and stage.first_step is not None:
                self.first_step = stage.first_step + stage.since - self.started

    def stop(self) -> None:
        """Ask the trial to stop (SIGTERM, grace, SIGKILL), and wait for its launcher to end."""
        _stop(self.shim, self.launch.grace)

    def end(self, timed_out: str | None) -> tuple[ProcessExit, MemoryReading]:
        """Once the process has ended (or been stopped): how, and the meter's reading (the meter stops)."""
        wall = time.monotonic() - self.started
        result = _read_result(self.launch.workdir / "shim.json", self.shim)
        reading = self.meter.stop(result.get("maxrss_bytes", 0))
        exit_info = ProcessExit(
            exit_code=result["exit_code"],
            signal=result["signal"],
            main_maxrss_bytes=result["maxrss_bytes"],
            wall_seconds=wall,
            timed_out=timed_out,
            # a trial autotune stopped (a timeout, the ceiling, the host budget, a rank's end: the SIGKILL may
            # be _kill's own, before the shim saw its stop) was stopped, not killed
            stopped=result["stopped"] or timed_out is not None,
            cpu_seconds=result.get("cpu_seconds"),
            launcher_killed=result.get("launcher_killed", False),
            host_peak_bytes=self.host.peak,
            host_last_bytes=self.host.last,
            pinned_bytes=read_pinned(self.launch.progress_path),
            first_step_seconds=self.first_step,
            host_budget=self.launch.host_budget,
        )
        return exit_info, reading


@dataclass
class Stage:
    """A part of a trial process's life that the tuner waits for: from ``since`` (time.monotonic()), its
    steps counted in ``progress_path``, over once ``done()`` (None: when the process ends)."""

    progress_path: Path
    since: float
    settle: Settle | None = None
    done: Callable[[], bool] | None = None
    first_step: float | None = None  # seconds from ``since`` to the end of its first step
    # a warm process's later configuration: seconds it has to take its message (its progress file then
    # exists) before the wait ends with "untaken" (None: no such bound)
    take_seconds: float | None = None


def _start_shim(launch: Launch) -> subprocess.Popen[bytes]:
    """The shim, running the trial's command in its own session, its output in the trial's logs.

    Raises:
        TrialError: it could not be started.
    """
    result_path = launch.workdir / "shim.json"
    shim_argv = [
        sys.executable,
        "-I",
        "-S",
        str(SHIM),
        str(result_path),
        str(os.getpid()),
        str(launch.grace),
        str(launch.log_limit),
        "--",
    ]
    with (
        open(launch.workdir / "stdout.log", "ab") as out,
        open(launch.workdir / "stderr.log", "ab") as err,
        _stop_signals_blocked(),
    ):
        try:
            return subprocess.Popen(
                [*shim_argv, *launch.argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=dict(launch.env),
                cwd=launch.cwd,
                start_new_session=True,  # Ctrl-C in the terminal reaches the tuner, which stops the trial
            )
        except OSError as e:
            raise TrialError(f"cannot start the trial launcher: {e}") from e


@contextmanager
def _stop_signals_blocked() -> Iterator[None]:
    """Start the shim with SIGUSR1 and SIGTERM blocked (the signal mask survives exec): a stop that arrives
    before the shim has installed its handlers stays pending instead of killing it, result unwritten. The
    shim unblocks them once its handlers are in place."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _wait(
    shim: subprocess.Popen[bytes],
    launch: Launch,
    stage: Stage,
    on_poll: Callable[[int, float], None] | None,
    stop: threading.Event | None,
    meter: MemoryMeter,
    host: HostWatch,
) -> str | None:
    """Wait for the trial (``stage`` of it) to end, stopping it where it must; ``stage.first_step`` gets
    the seconds from the stage's start to the end of its first step."""
    while shim.poll() is None:
        if stop is not None and stop.is_set():
            raise StopRequested
        if meter.over.wait(POLL_SECONDS):  # the meter's thread set it: passed the ceiling
            _kill(shim)
            return "ceiling"
        if host.poll():  # before the kernel's out-of-memory killer ends it, and its launcher with it
            _kill(shim)
            return "host"
        if launch.ended is not None and launch.ended():
            _kill(shim)
            return "rank"
        elapsed = time.monotonic() - stage.since
        steps = read_progress(stage.progress_path)
        if steps and stage.first_step is None:
            stage.first_step = elapsed
        meter.at_step(steps)
        if stage.settle is not None:
            stage.settle.watch(steps, meter.peaks_by_step(), elapsed)
        if on_poll is not None:
            on_poll(steps, elapsed)
        if stage.done is not None and stage.done():
            return None
        if (
            stage.take_seconds is not None
            and elapsed > stage.take_seconds
            and not stage.progress_path.exists()
        ):
            return "untaken"  # the process lives, but does not listen: its caller ends it
        reason = "startup" if steps == 0 and elapsed > launch.startup_timeout else None
        reason = "run" if elapsed > launch.timeout else reason
        if reason:
            _stop(shim, launch.grace)
            return reason
    return None


def _kill(shim: subprocess.Popen[bytes]) -> None:
    """Stop the trial at once: no grace period for a trial still growing past its ceiling. Its processes get
    SIGKILL from here first (a runaway grows ~1 GiB/s: the shim's reaction, up to its 20 ms poll, was 2-3%
    of an 800 MB budget), then SIGTERM to the shim, which kills whatever is left and records the end."""
    for pid in descendants(shim.pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    shim.send_signal(signal.SIGTERM)
    try:
        shim.wait(10)
    except subprocess.TimeoutExpired:
        shim.kill()
        shim.wait()


def _stop(shim: subprocess.Popen[bytes], grace: float) -> None:
    """Ask the shim to stop its trial (SIGUSR1: SIGTERM, grace, SIGKILL); kill the shim if it does not finish."""
    if shim.poll() is not None:
        return
    shim.send_signal(signal.SIGUSR1)
    try:
        shim.wait(grace + 10)
    except subprocess.TimeoutExpired:
        shim.kill()  # its trial dies with it (PR_SET_PDEATHSIG)
        shim.wait()


def _read_result(path: Path, shim: subprocess.Popen[bytes]) -> dict[str, Any]:
    """The shim's account of its trial. A shim ended by a signal (the kernel's out-of-memory killer ends a
    whole cgroup, the launcher with its trial) leaves none: its trial died with it (PR_SET_PDEATHSIG), and
    the signal is the trial's outcome, never the tuner's end (issue 31: a study wedged on every resume).

    Raises:
        StorageFault: it could not write its result: the trial's folder cannot be written (a full disk, a
            read-only file system).
        TrialError: the shim exited on its own and left no result (a bug in autotune, not a trial's end)."""
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError) as e:
        if (refused := unwritable(path.parent)) is not None:
            raise files_fault(path.parent, refused) from e
        if shim.returncode is not None and shim.returncode < 0:
            return {
                "exit_code": None,
                "signal": -shim.returncode,
                "maxrss_bytes": 0,
                "stopped": False,
                "launcher_killed": True,
            }
        raise TrialError(
            f"the trial launcher exited with code {shim.returncode} and left no result ({path})"
        ) from e


def tail(path: Path, lines: int = 12) -> str:
    """The last ``lines`` lines of a log file ('' if it is missing)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 64 * 1024))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])
