"""The daemon: ``autotune submit`` records a tuning job, ``autotune worker`` runs the trials of open jobs.

A worker runs one thread per device, each one trial at a time, and a heartbeat thread. Workers on any
number of hosts cooperate through the database alone (leases, autotune.search.loop): no home-made protocol.

    submit ──► autotune_jobs (open)
                  │  each device thread, in a loop:
                  ▼
    worker ──► JobWork.step(): probe (leased) ─► Search.step() ─► verify_step() ─► job done/failed

SIGTERM or SIGINT stops a worker cleanly: each running trial is stopped, its configuration released to
the queue (same attempt: a stop is not a fault) and its Optuna trial failed; nothing is left RUNNING.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TextIO

from autotune.core.errors import InputError, NoFitError, ScriptError
from autotune.trials.workload import check_study_name
from autotune.leases.heartbeat import Heartbeat
from autotune.trials.interrupts import StopRequested
from autotune.workers.jobs import JobRefused, job_row, spec_digest, spec_of
from autotune.search.records import TrialRecord
from autotune.search.loop import Search, Step, worker_id
from autotune.storage import JobRow, Store, open_store

if TYPE_CHECKING:  # without importing the tuning machinery at CLI start
    from autotune.workers.tune import TuneSpec

POLL_SECONDS = 1.0


def submit(spec: TuneSpec) -> JobRow:
    """Record ``spec`` as an open job (or return the same job submitted before) and return at once."""
    from autotune.core.paths import cache_dir, default_storage_url

    store = open_store(spec.storage or default_storage_url(cache_dir(spec.cache_dir)))
    stem = Path(spec.command.script_path() or spec.command.words[0]).stem[:64] or "job"
    name = spec.study or check_study_name(f"{stem}-{spec_digest(spec)[:12]}")
    row = job_row(spec, name, worker_id(), "open")
    stored = store.submit_job(row)
    if stored.spec != row.spec:
        raise InputError(
            f"a different job named {name!r} exists in {store.display_url}: choose another --study"
        )
    if spec.force and stored.state in ("done", "failed"):
        store.forget_study(name)
        store.set_job_state(name, "open")
        stored = replace(stored, state="open", error=None)
    return stored


def parse_devices(text: str, environ: Mapping[str, str], nvml: Any = None) -> list[str]:
    """``--devices``: ``auto`` (every GPU NVML sees, else the CPU), ``cpu``, or indices ``0,1,…``."""
    if text == "auto":
        count = gpu_count(environ, nvml)
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


def gpu_count(environ: Mapping[str, str], nvml: Any = None) -> int:
    """The GPUs visible here (CUDA_VISIBLE_DEVICES respected); 0 without NVML. ``nvml``: a loaded module
    (tests pass a fake); None loads pynvml."""
    from autotune.hardware.nvml import load_nvml

    try:
        nvml = nvml or load_nvml()
    except Exception:
        return 0
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([v for v in visible.split(",") if v.strip()])
    return int(nvml.nvmlDeviceGetCount())


@dataclass
class WorkerSummary:
    trials: int = 0  # trials measured (probes and verifications included)
    jobs_done: list[str] = field(default_factory=list)
    jobs_failed: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)  # job -> why
    stopped: bool = False  # by SIGTERM/SIGINT


class LineReporter:
    """Plain lines, one per event, prefixed with the device: readable from several threads and in logs."""

    def __init__(self, device: str, out: TextIO, lock: threading.Lock) -> None:
        self.device, self.out, self.lock = device, out, lock

    def _line(self, text: str) -> None:
        with self.lock:
            print(f"[{self.device}] {text}", file=self.out, flush=True)

    def trial_started(self, number: int, batch_size: int, plan: str, why: str) -> None:
        self._line(f"trial {number if number >= 0 else '-'}: batch {batch_size}, plan {plan} ({why})")

    def trial_progress(self, steps: int, elapsed: float) -> None:
        pass

    def trial_finished(self, record: TrialRecord, best: TrialRecord | None) -> None:
        peak = f"{(record.peak_bytes or 0) / 2**20:.0f} MiB"
        speed = f"{record.samples_per_sec:.1f} samples/s" if record.samples_per_sec else "-"
        self._line(f"trial {record.number}: {record.outcome}, peak {peak}, {speed}")

    def skipped(self, record: TrialRecord) -> None:
        pass

    def note(self, text: str) -> None:
        self._line(text)


class JobWork:
    """One job as one device thread of this worker sees it: resolved on first use, then stepped."""

    def __init__(
        self,
        job: JobRow,
        store: Store,
        storage_url: str,
        device: str,
        cache: Path | None,
        environ: dict[str, str],
        reporter: LineReporter,
        worker: str,
        stop: threading.Event,
        nvml: Any = None,
    ) -> None:
        self.job, self.store, self.device, self.environ, self.nvml = job, store, device, environ, nvml
        self.reporter, self.worker, self.stop = reporter, worker, stop
        self.spec = spec_of(job, storage_url, cache, device)
        self.search: Search | None = None
        self.run_long: Any = None
        self.trials = 0

    def step(self) -> Step:
        """One unit of work on this job: a probe, a trial, or a verification.

        Raises:
            JobRefused: this worker cannot run the job here. ScriptError, NoFitError: the job failed.
        """
        from autotune.core.errors import StorageError
        from autotune.workers.tune import open_study, resolve, verify_step

        if self.search is None:
            job = resolve(
                self.spec, self.environ, self.reporter, self.nvml, self.worker, self.stop, self.store
            )
            self.trials += job.probes_run
            try:
                study = open_study(job.store, job.study_row, self.spec.seed, job.workload, job.limit)
            except StorageError as e:
                raise JobRefused(
                    f"job {self.job.study_name}: this worker's device or software differs from the job's "
                    f"({job.device.name}): {e}"
                ) from e
            self.store.set_job_state(self.job.study_name, "running", only_from=("open",))
            self.search = job.search(study, self.spec, self.reporter, self.worker, self.stop)
            self.run_long = partial(job.run, settings=self.spec.verify_settings, stop=self.stop)
            if job.probes_run:
                return Step.RAN
        before = self.search.trials_run
        step = self.search.step()
        self.trials += self.search.trials_run - before
        if step is not Step.FINISHED:
            return step
        step, best = verify_step(self.search, self.run_long)
        if step is Step.RAN:
            self.trials += 1
        return Step.FINISHED if best is not None else step


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
        out: TextIO | None = None,
        nvml: Any = None,
    ) -> None:
        self.storage_url = storage_url
        self.store = open_store(storage_url)
        self.devices = devices
        self.cache = cache
        self.environ = dict(os.environ if environ is None else environ)
        self.once = once
        self.only = jobs
        self.out = out or sys.stderr
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
        print(
            f"worker {self.worker}: devices {', '.join(self.devices)}; database {self.store.display_url}",
            file=self.out,
            flush=True,
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
                print(
                    f"worker {self.worker}: stopping ({signal.Signals(signum).name}): running trials "
                    "are stopped and released",
                    file=self.out,
                    flush=True,
                )
            self.stop.set()
            self.summary.stopped = True

        return {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}

    def _device_loop(self, device: str) -> None:
        reporter = LineReporter(device, self.out, self._lock)
        works: dict[str, JobWork] = {}
        try:
            while not self.stop.is_set():
                jobs = [
                    j
                    for j in self.store.jobs(states=("open", "running"))
                    if (self.only is None or j.study_name in self.only)
                    and j.study_name not in self.summary.refused
                ]
                if not jobs and self.once:
                    return
                open_names = {j.study_name for j in jobs}
                for name in [n for n in works if n not in open_names]:
                    del works[name]  # done or failed elsewhere: its study cache goes with it
                step = self._work_on(jobs, works, device, reporter)
                if step in (Step.RAN, Step.MISSED):
                    continue
                self.stop.wait(POLL_SECONDS)
        except StopRequested:
            return
        except BaseException as e:
            self._errors.append(e)
            self.stop.set()

    def _work_on(
        self, jobs: list[JobRow], works: dict[str, JobWork], device: str, reporter: LineReporter
    ) -> Step | None:
        """A step on the first of ``jobs`` that has work for this device; None if none had any."""
        for job in jobs:
            name = job.study_name
            try:
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
                        self.nvml,
                    )
                work = works[name]
                before = work.trials
                step = work.step()
                with self._lock:
                    self.summary.trials += work.trials - before
            except JobRefused as e:
                works.pop(name, None)
                with self._lock:
                    self.summary.refused[name] = str(e)
                reporter.note(f"refusing job {name}: {e}")
                continue
            except (ScriptError, NoFitError) as e:
                works.pop(name, None)
                error = str(e)
                self.store.set_job_state(name, "failed", error)
                with self._lock:
                    self.summary.jobs_failed.append(name)
                reporter.note(f"job {name} failed: {str(e).splitlines()[0]}")
                continue
            if step is Step.FINISHED:
                del works[name]  # a long-lived worker keeps only its open jobs' state (Optuna's study cache)
                self.store.set_job_state(name, "done")
                with self._lock:
                    if name not in self.summary.jobs_done:
                        self.summary.jobs_done.append(name)
                reporter.note(f"job {name} is done")
                continue
            if step is not Step.BUSY:
                return step
        return None
