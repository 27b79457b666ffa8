"""The rows of autotune's tables as typed values, and the states and kinds their text columns hold.

The enums are ``str`` enums whose values are what the database stores; the Store writes ``.value`` and
reads rows back into these types, so nothing above the storage layer compares bare strings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.core.enums import TextEnum
from autotune.core.stats import Interval


class JobState(TextEnum):
    """A tuning job's life: open (submitted) -> running (a worker took it) -> done (winner stored) or failed."""

    OPEN = "open"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class LeaseKind(TextEnum):
    """What a lease gives its worker: the workload's probe, a trial, a verification, or one of a study's
    ``--trials N`` slots."""

    PROBE = "probe"
    TRIAL = "trial"
    VERIFY = "verify"
    SLOT = "slot"


class LeaseState(TextEnum):
    """queued (any worker may take it) -> running (its worker beats) -> done or failed."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True)
class StudyRow:
    study_name: str
    fingerprint: str
    study_key: str
    budget_bytes: int
    headroom: float
    space: dict[str, Any]
    script: str = ""


@dataclass(frozen=True)
class WorkloadRow:
    """A workload (autotune.trials.workload) and, once its probe ran, what the probe found."""

    fingerprint: str
    script: str
    command: str
    device: str
    details: dict[str, Any]  # what went into the fingerprint
    discovery: dict[str, Any] | None  # {"probe": the probe's report (JSON), "outcome", "log_dir"}

    @property
    def backend(self) -> str:
        return str(self.details.get("backend", "torch"))


@dataclass(frozen=True)
class JobRow:
    study_name: str
    script: str
    script_sha256: str | None
    spec: dict[str, Any]  # autotune.search.spec.TuneSpec.to_json()
    state: JobState
    submitted_by: str
    error: str | None = None
    scripts: dict[str, str] | None = None  # the sha256 of every script the command names, by path as written
    signature: str | None = None  # the submitter's HMAC over the job (autotune.workers.signing)


@dataclass(frozen=True)
class Lease:
    id: int
    study_name: str
    kind: LeaseKind
    batch_size: int
    plan: str
    attempt: int
    state: LeaseState
    worker: str | None
    device: str | None
    trial_number: int | None
    beats: int
    note: str | None


@dataclass(frozen=True)
class BestRow:
    study_name: str
    trial_number: int
    batch_size: int
    plan: str
    peak_bytes: int
    samples_per_sec: float
    verified_peak_bytes: int
    verified_samples_per_sec: float  # the median of all its readings (autotune.core.stats.pooled)
    samples_per_sec_low: float | None = None  # their interval; None in a row stored before it was kept
    samples_per_sec_high: float | None = None
    readings: int | None = None  # how many readings the interval pools
    certainty: str | None = None  # how noisy the tuning was (autotune.search.noise.certainty); None: quiet

    @property
    def throughput(self) -> Interval:
        """The verified samples/s with its interval (±NOISE_FLOOR for a row stored without one)."""
        return Interval.stored(
            self.verified_samples_per_sec, self.samples_per_sec_low, self.samples_per_sec_high
        )
