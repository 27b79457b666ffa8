"""One job as one device thread of a worker sees it: resolved on first use, then stepped (a probe, a
trial, or a verification at a time) until it is done."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from autotune.core.errors import StorageError
from autotune.hardware.devices import gpus_in
from autotune.search.cost import Cost
from autotune.search.loop import Search, Step
from autotune.search.reporting import Reporter
from autotune.search.resolve import resolve
from autotune.search.study import open_study
from autotune.search.verify import verify_step
from autotune.storage import JobRow, JobState, Store
from autotune.workers.jobs import JobRefused, command_line, spec_of
from autotune.workers.signing import Trust


class JobWork:
    def __init__(
        self,
        job: JobRow,
        store: Store,
        storage_url: str,
        device: str,
        cache: Path | None,
        environ: dict[str, str],
        reporter: Reporter,
        worker: str,
        stop: threading.Event,
        trust: Trust,
        nvml: Any = None,
        cost: Cost | None = None,
    ) -> None:
        """Raises JobRefused: the job is not one this worker may run (jobs.spec_of)."""
        self.job, self.store, self.environ, self.nvml = job, store, environ, nvml
        self.reporter, self.worker, self.stop = reporter, worker, stop
        self.spec, verified = spec_of(job, storage_url, cache, device, trust.key, trust.allow_unsigned)
        reporter.note(f"job {job.study_name}: {verified}; runs {command_line(job)}")
        self.cost = cost  # the purse of the run this thread helps, if it helps one (tune's helper devices)
        self.search: Search | None = None
        self.trials = 0  # trials this thread measured for the job (probe and verifications included)

    def close(self) -> None:
        """End what the job's runner keeps between trials (its warm process): the job is done or dropped, or
        another job's trial runs on this device next."""
        if self.search is not None:
            self.search.runner.close()

    def step(self) -> Step:
        """One unit of work on this job: a probe, a trial, or a verification.

        Raises:
            JobRefused: this worker cannot run the job here. ScriptError, NoFitError: the job failed.
        """
        if self.search is None:
            self.search, probed_here = self._start()
            if probed_here:  # the probe's trial was this step's work
                return Step.RAN
        before = self.search.trials_run
        step = self.search.step()
        self.trials += self.search.trials_run - before
        if step is not Step.FINISHED:
            return step
        step, best = verify_step(self.search, self.spec.verify_settings)
        if step is Step.RAN:
            self.trials += 1
        return Step.FINISHED if best is not None else step

    def _start(self) -> tuple[Search, bool]:
        """The job resolved here (its probe run here if no worker ran it yet) and its study opened; whether
        this call ran the probe."""
        given = gpus_in(self.spec.device)
        if given != self.spec.gpus_per_trial:
            raise JobRefused(
                f"job {self.job.study_name} runs each trial on {self.spec.gpus_per_trial} GPU(s); this worker's "
                f"trials get {given} ({self.spec.device}): start a worker with --gpus-per-trial "
                f"{self.spec.gpus_per_trial}"
            )
        job = resolve(self.spec, self.environ, self.reporter, self.nvml, self.worker, self.stop, self.store)
        self.trials += job.probes_run
        try:
            study = open_study(job.store, job.study_row, self.spec.seed, job.limit.bytes)
        except StorageError as e:
            raise JobRefused(
                f"job {self.job.study_name}: this worker's device or software differs from the job's "
                f"({job.device.name}): {e}"
            ) from e
        for line in [*job.left_out(named=True), *job.left_out(named=False)]:
            self.reporter.note(line)
        self.store.set_job_state(self.job.study_name, JobState.RUNNING, only_from=(JobState.OPEN,))
        return job.search(study, self.reporter, self.worker, self.cost), job.probes_run > 0
