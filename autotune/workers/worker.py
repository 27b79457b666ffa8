"""The daemon: ``autotune worker`` runs the trials of open jobs (``autotune submit``, autotune.workers.submit,
records them).

A worker runs only jobs signed with the key it holds (autotune.workers.signing), and says what each runs.
It runs one thread per device, each one trial at a time, and a heartbeat thread. Workers on any
number of hosts cooperate through the database alone (leases, autotune.search.loop): no home-made protocol.

    submit ──► autotune_jobs (open)
                  │  each device thread, in a loop:
                  ▼
    worker ──► JobWork.step(): probe (leased) ─► Search.step() ─► verify_step() ─► job done/failed
                  (autotune.workers.jobwork)

SIGTERM or SIGINT stops a worker cleanly: each running trial is stopped, its configuration released to
the queue (same attempt: a stop is not a fault) and its Optuna trial failed; nothing is left RUNNING.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from autotune.core.errors import (
    DamagedData,
    InputError,
    NoFitError,
    ScriptError,
    StorageError,
    StorageFault,
)
from autotune.core.faults import writing_trial_files
from autotune.core.paths import cache_dir
from autotune.hardware.devices import gpu_count
from autotune.hardware.nvml import nvml_loader
from autotune.leases.heartbeat import Heartbeat
from autotune.leases.identity import worker_id
from autotune.search.cost import Cost
from autotune.search.loop import Step
from autotune.storage import JobRow, JobState, LeaseState, open_store
from autotune.trials.interrupts import StopRequested
from autotune.workers.jobs import JobRefused
from autotune.workers.jobwork import JobWork
from autotune.workers.lines import LineReporter
from autotune.workers.signing import Trust, load_key

POLL_SECONDS = 1.0
log = logging.getLogger("autotune.worker")


def _silent(text: str) -> None:
    pass


def parse_devices(text: str, environ: Mapping[str, str], nvml: Any = None) -> list[str]:
    """``--devices``: ``auto`` (every GPU NVML sees, else the CPU), ``cpu``, or indices ``0,1,…``.

    Raises:
        InputError: anything else, or a device named twice.
    """
    if text == "auto":
        count = gpu_count(environ, nvml_loader(nvml))
        return [f"cuda:{i}" for i in range(count)] if count else ["cpu"]
    devices = []
    for part in text.split(","):
        part = part.strip()
        if part == "cpu" or part.startswith("cuda"):
            devices.append(part)
        elif part.isdigit():
            devices.append(f"cuda:{part}")
        else:
            raise InputError(f"--devices: expected auto, cpu or GPU indices like 0,1, got {part!r}")
    if len(set(devices)) != len(devices):
        raise InputError(f"--devices lists a device twice: {text!r}")
    return devices


@dataclass
class WorkerSummary:
    trials: int = 0  # trials measured (probes and verifications included)
    jobs_done: list[str] = field(default_factory=list)
    jobs_failed: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)  # job -> why
    stopped: bool = False  # by SIGTERM/SIGINT


class Worker:
    """``autotune worker``: runs trials of the database's open jobs on ``devices`` until stopped (or, with
    ``once``, until no open job is left that it can run)."""

    def __init__(
        self,
        storage_url: str,
        devices: list[str],
        cache: Path | None = None,
        environ: Mapping[str, str] | None = None,
        once: bool = False,
        jobs: tuple[str, ...] | None = None,
        say: Callable[[str], None] | None = None,
        nvml: Any = None,
        trust: Trust | None = None,
        cost: Cost | None = None,
    ) -> None:
        """``say``: where the worker's lines go (the CLI: stderr; tune()'s helpers: the run's notes).
        ``cost``: the purse of the run this worker helps (tune()'s helpers spend from the run's --trials);
        None: a worker's own jobs have none (their studies' slots bound them).
        ``trust``: the key jobs must be signed with (default: the one ``environ`` gives, autotune.workers.
        signing; no unsigned jobs).

        Raises:
            InputError: no key, and unsigned jobs not allowed; a bad key file.
        """
        self.trust = (
            trust if trust is not None else Trust(load_key(os.environ if environ is None else environ))
        )
        self.storage_url = storage_url
        self.store = open_store(storage_url)
        self.devices = devices
        self.cache = cache
        self.environ = dict(os.environ if environ is None else environ)
        self.once = once
        self.only = jobs
        self.cost = cost
        self.say = say or _silent
        self.nvml = nvml  # a loaded NVML module (tests: a fake); None: pynvml, loaded where needed
        self.worker = worker_id()
        self.stop = threading.Event()
        self.summary = WorkerSummary()
        self._lock = threading.Lock()
        self._errors: list[BaseException] = []

    def run(self) -> WorkerSummary:
        threads = [
            threading.Thread(target=self._device_loop, args=(device,), name=f"autotune-{device}")
            for device in self.devices
        ]
        previous = self._install_signals()
        self.say(
            f"worker {self.worker}: devices {', '.join(self.devices)}; database {self.store.display_url}"
        )
        try:
            with Heartbeat(self.store, self.worker):
                for thread in threads:
                    thread.start()
                while any(thread.is_alive() for thread in threads):
                    for thread in threads:
                        thread.join(0.2)  # short joins: the main thread stays free for signals
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        if self._errors:
            raise self._errors[0]
        return self.summary

    def _install_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}

        def stop(signum: int, frame: FrameType | None) -> None:
            if not self.stop.is_set():
                self.say(
                    f"worker {self.worker}: stopping ({signal.Signals(signum).name}): running trials "
                    "are stopped and released"
                )
            self.stop.set()
            self.summary.stopped = True

        return {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}

    def _device_loop(self, device: str) -> None:
        reporter = LineReporter(device, self.say, self._lock)
        works: dict[str, JobWork] = {}
        try:
            while not self.stop.is_set():
                jobs = [
                    j
                    for j in self.store.jobs(states=(JobState.OPEN, JobState.RUNNING))
                    if (self.only is None or j.study_name in self.only)
                    and j.study_name not in self.summary.refused
                    and not j.spec.get("function")  # searched in its user's process: only it can run it
                ]
                if not jobs and self.once:
                    return
                open_names = {j.study_name for j in jobs}
                for name in [n for n in works if n not in open_names]:
                    _drop(works, name)  # done or failed elsewhere: its study cache goes with it
                step = self._work_on(jobs, works, device, reporter)
                if step in (Step.RAN, Step.MISSED):
                    continue
                self.stop.wait(POLL_SECONDS)
        except StopRequested:
            return
        except BaseException as e:
            self._errors.append(e)
            self.stop.set()
        finally:
            for name in list(works):
                _drop(works, name)

    def _work_on(
        self, jobs: list[JobRow], works: dict[str, JobWork], device: str, reporter: LineReporter
    ) -> Step | None:
        """A step on the first of ``jobs`` that has work for this device; None if none had any."""
        for job in jobs:
            name = job.study_name
            step = self._step(works, job, device, reporter)
            if step is Step.FINISHED:
                _drop(
                    works, name
                )  # a long-lived worker keeps only its open jobs' state (Optuna's study cache)
                self._ran_to_its_end(job)
                self.store.set_job_state(name, JobState.DONE)
                with self._lock:
                    if name not in self.summary.jobs_done:
                        self.summary.jobs_done.append(name)
                reporter.note(f"job {name} is done")
            elif step not in (Step.BUSY, None):
                return step
        return None

    def _step(
        self, works: dict[str, JobWork], job: JobRow, device: str, reporter: LineReporter
    ) -> Step | None:
        """One step of ``job`` on ``device``; None if the job was refused here or failed (it is dropped)."""
        name = job.study_name
        try:
            if name not in works and self._ran_before(job):
                raise JobRefused(
                    f"job {name}: this worker ran it to its end before (the same signature): it runs again when "
                    "its submitter submits it again (autotune submit --force)"
                )
            if name not in works:
                works[name] = JobWork(
                    job,
                    self.store,
                    self.storage_url,
                    device,
                    self.cache,
                    self.environ,
                    reporter,
                    self.worker,
                    self.stop,
                    self.trust,
                    self.nvml,
                    self.cost,
                )
            work = works[name]
            for other, elsewhere in works.items():
                if other != name:
                    elsewhere.close()  # one job's warm process on a device at a time
            before = work.trials
            step = work.step()
        except JobRefused as e:
            _drop(works, name)
            with self._lock:
                self.summary.refused[name] = str(e)
            reporter.note(f"refused: {e}")
            return None
        except (ScriptError, NoFitError, DamagedData, InputError) as e:  # InputError: JobRefused's above
            self._failed(job, works, str(e), reporter)
            return None
        except StorageFault as e:  # the worker stops (exit 5); its trial was given back by the search
            self._interrupted(name, e)
            raise
        except StorageError:
            raise  # the database itself, not this job: every job would fail the same way
        except Exception as e:  # a job's fault (a row no check foresaw) is never the worker's
            log.debug("job %s failed in this worker", name, exc_info=True)
            self._failed(job, works, f"{type(e).__name__}: {e}", reporter)
            return None
        with self._lock:
            self.summary.trials += work.trials - before
        return step

    @property
    def _ledger(self) -> Path:
        """The signatures of the jobs this worker's host ran to their end, in its cache dir: a worker runs a
        signature once (autotune.workers.signing.sign), whatever the database says of the job's state."""
        return cache_dir(self.cache) / "finished-jobs.txt"

    def _ran_before(self, job: JobRow) -> bool:
        if job.signature is None:  # unsigned jobs (--allow-unsigned) carry nothing to remember
            return False
        try:
            return job.signature in self._ledger.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return False

    def _ran_to_its_end(self, job: JobRow) -> None:
        if job.signature is not None:
            with self._lock, writing_trial_files(self._ledger.parent):
                self._ledger.parent.mkdir(parents=True, exist_ok=True)
                with self._ledger.open("a", encoding="utf-8") as f:
                    f.write(job.signature + "\n")

    def _failed(self, job: JobRow, works: dict[str, JobWork], why: str, reporter: LineReporter) -> None:
        """The job failed (its script, no fit, or a row of it damaged): stored as failed with ``why``; the
        worker serves the next job."""
        name = job.study_name
        self._ran_to_its_end(job)
        _drop(works, name)
        self.store.set_job_state(name, JobState.FAILED, why)
        with self._lock:
            self.summary.jobs_failed.append(name)
        reporter.note(f"job {name} failed: {why.splitlines()[0] if why else ''}")

    def _interrupted(self, name: str, fault: StorageFault) -> None:
        """The job open again where no other worker is running a trial of it (storage it cannot write
        stops this one): what `studies` shows, and what the next worker takes."""
        with contextlib.suppress(StorageError):  # the database may be what cannot be written
            if not self.store.leases(name, states=(LeaseState.RUNNING,)):
                self.store.set_job_state(
                    name, JobState.OPEN, f"interrupted: {fault}", only_from=(JobState.RUNNING,)
                )


def _drop(works: dict[str, JobWork], name: str) -> None:
    """Forget a job's state on this device, its warm process ended."""
    work = works.pop(name, None)
    if work is not None:
        work.close()
