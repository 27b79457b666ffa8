"""The search loop: Optuna ask/tell over batch size x plan, steered by the memory model, shared by workers.

Each round does one thing, in this order:

1. a queued lease — a configuration to measure again (the one retry after a dead worker, or a trial a
   stopping worker released);
2. calibration — the first plan at the smallest batch sizes until the model is calibrated;
3. the frontier — for each plan, the largest batch size that fits (measured, or predicted by the model);
4. the sampler (TPE) — everything else. Its proposals that the model predicts cannot fit (beyond
   SKIP_MARGIN) are recorded as ``skipped`` without running; re-proposals of a measured configuration are
   recorded as ``copy`` with the same result. Neither counts as a trial.

Any number of searches, in processes on any hosts, can work on one study. A configuration is *leased* in
the database (``Store.claim``: a unique key) before its trial is asked for, so exactly one worker measures
it, on SQLite as on PostgreSQL. (Optuna's own queue, ``enqueue_trial``, hands one queued trial to several
workers on SQLite: RELIABILITY.md §4.) Workers heartbeat their leases; a lease whose worker died — a dead
pid on this host, or beats that stopped for the grace period — is failed with its trial, and its
configuration is queued once more (attempt 1), never twice.

An OOM or over-budget trial is a COMPLETE trial with a violated ``memory`` constraint: Optuna's samplers
ignore FAILed trials and would propose the same OOM again.
"""

from __future__ import annotations

import datetime
import enum
import os
import socket
import time
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.exceptions import ExperimentalWarning, UpdateFinishedTrialError
from optuna.trial import TrialState

from autotune.core.errors import ScriptError
from autotune.trials.interrupts import InterruptShield, StopRequested
from autotune.trials.measurement import TrialResult
from autotune.search.memory_model import MemoryModel, Observation
from autotune.core.protocol import Outcome
from autotune.search.records import TrialRecord, constraint_mib
from autotune.search.reporting import Reporter
from autotune.search.space import SearchSpace
from autotune.storage import Lease, Store

SKIP_MARGIN = 0.10  # skip only what the model predicts over the limit by more than this
MAX_MISSES = 40  # sampler proposals in a row that were skipped or copies: the space is exhausted
MAX_FAILURES = 3  # script failures in a row (not OOMs) before giving up
DEFAULT_GRACE_SECONDS = 60.0  # a lease whose beats stop this long belongs to a dead worker
HEARTBEAT_SECONDS = 10.0  # how often workers beat (the grace period spans several beats)

# Fixing a trial's parameters for one ask is all autotune uses it for; the class is stable since optuna 2.4.
warnings.filterwarnings("ignore", message="PartialFixedSampler is experimental", category=ExperimentalWarning)

# run_config(batch, plan, on_poll, interruptible): one measured trial
RunConfig = Callable[
    [int, str, Callable[[int, float], None], Callable[[], AbstractContextManager[None]]], TrialResult
]


@dataclass(frozen=True)
class Proposal:
    batch_size: int
    plan: str
    why: str  # "calibration", "frontier"


class Step(enum.Enum):
    """What one round of a search did."""

    RAN = "ran"  # a trial was measured
    MISSED = "missed"  # a proposal was skipped, copied, or taken by another worker first
    BUSY = "busy"  # nothing to do here until other workers' trials end
    FINISHED = "finished"  # the study holds its trials, or nothing new is left to try


def host_name() -> str:
    """This host's name in worker ids: AUTOTUNE_WORKER_HOST, else the hostname. Set it where several
    hosts (containers with their own pid namespaces) share one hostname: a worker judges workers of
    its own host by their pids, and others' by their heartbeats."""
    return os.environ.get("AUTOTUNE_WORKER_HOST") or socket.gethostname()


def worker_id() -> str:
    """host:pid:start-time — unique even when the pid is reused."""
    start = Path(f"/proc/{os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()[19]
    return f"{host_name()}:{os.getpid()}:{start}"


def records_of(study: optuna.Study) -> list[TrialRecord]:
    return [TrialRecord.from_frozen(t) for t in study.get_trials(deepcopy=False)]


def model_of(records: list[TrialRecord], savings: dict[str, float] | None = None) -> MemoryModel:
    return MemoryModel.fit(
        [
            Observation(r.batch_size, r.plan, r.peak_bytes, r.outcome == Outcome.COMPLETE.value)
            for r in records
            if r.measured and r.batch_size is not None and r.plan is not None and r.peak_bytes is not None
        ],
        savings,
    )


def propose(
    records: list[TrialRecord],
    model: MemoryModel,
    space: SearchSpace,
    limit: int,
    taken: set[tuple[int, str]] | frozenset[tuple[int, str]] = frozenset(),
) -> Proposal | None:
    """The next configuration the model wants measured, or None to let the sampler choose.

    ``taken``: configurations leased by any worker (running, queued or ended)."""
    # Anything that ended (a failure too: a broken plan is not proposed again) or is under way.
    tried = {
        (r.batch_size, r.plan) for r in records if r.outcome is not None or r.state in ("RUNNING", "WAITING")
    } | set(taken)
    first = space.plans[0]
    if not model.calibrated:
        failing = min(
            (
                r.batch_size
                for r in records
                if r.plan == first and r.measured and not r.fits(limit) and r.batch_size is not None
            ),
            default=None,
        )
        for batch in _calibration_batches(space.batch_sizes):
            if (batch, first) not in tried and (failing is None or batch < failing):
                return Proposal(batch, first, "calibration")
        return None
    for plan in space.plans:
        largest = model.largest_fitting(plan, space.batch_sizes, limit)
        if largest is not None and (largest, plan) not in tried:
            return Proposal(largest, plan, "frontier")
    return None


def _calibration_batches(batch_sizes: tuple[int, ...]) -> list[int]:
    """The smallest batch size, then one about 4x larger, then the ones between."""
    low = batch_sizes[0]
    wide = next((b for b in batch_sizes if b >= 4 * low), batch_sizes[-1])
    return [low, wide, *(b for b in batch_sizes if low < b < wide)]


class LeaseWatch:
    """Which running leases belong to dead workers.

    On this host a worker's pid (with its start time) answers at once. Another host's worker is dead when
    its lease's beat counter has not moved for ``grace`` seconds *as seen by this process*: counters and
    this process's monotonic clock, so hosts' clocks never have to agree."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.host = host_name()
        self._seen: dict[int, tuple[int, float]] = {}  # lease id -> (beats, when they were first seen)

    def dead(self, lease: Lease) -> str | None:
        """Why ``lease``'s worker is dead, or None while it may be alive."""
        state = _worker_state(lease.worker or "", self.host)
        if state == "alive":
            return None
        if state == "dead":
            return f"worker {lease.worker} died"
        now = time.monotonic()
        beats, since = self._seen.get(lease.id, (None, now))
        if beats != lease.beats:
            self._seen[lease.id] = (lease.beats, now)
            return None
        if now - since >= self.grace:
            return f"worker {lease.worker} stopped heartbeating for {self.grace:g}s"
        return None


class Search:
    """Runs trials of one study until it holds ``target`` counted trials or the space is exhausted."""

    def __init__(
        self,
        study: optuna.Study,
        space: SearchSpace,
        limit: int,
        run_config: RunConfig,
        target: int,
        reporter: Reporter,
        store: Store,
        device: str,
        savings: dict[str, float] | None = None,
        grace: float = DEFAULT_GRACE_SECONDS,
        worker: str | None = None,
    ) -> None:
        self.study = study
        self.savings = savings or {}
        self.space = space
        self.limit = limit
        self.run_config = run_config
        self.target = target
        self.reporter = reporter
        self.store = store
        self.device = device
        self.worker = worker or worker_id()
        self.watch = LeaseWatch(grace)
        self.trials_run = 0
        self.misses = 0
        self.failures = 0
        self.shield = InterruptShield()
        self.distributions: dict[str, BaseDistribution] = {
            "batch_size": CategoricalDistribution(space.batch_sizes),
            "plan": CategoricalDistribution(space.plans),
        }

    @property
    def name(self) -> str:
        return self.study.study_name

    def run(self, poll_seconds: float = 0.5) -> bool:
        """Search until the study is finished; True if it stopped because nothing new was left to try."""
        while True:
            step = self.step()
            if step is Step.FINISHED:
                return self.misses >= MAX_MISSES
            if step is Step.BUSY:
                time.sleep(poll_seconds)

    def step(self) -> Step:
        """One round: a queued lease, else the model's proposal, else the sampler's."""
        self.shield.check()  # a Ctrl-C between trials: nothing is asked yet, nothing to clean up
        self.recover()
        lease = self.store.take_queued(self.name, self.worker, self.device, kinds=("trial",))
        if lease is not None:
            self._run_lease(lease, "retry" if lease.attempt else "released")
            return Step.RAN
        records = records_of(self.study)
        leases = self.store.leases(self.name, kinds=("trial",))
        busy = any(lease.state in ("running", "queued") for lease in leases)
        if sum(r.counted for r in records) >= self.target or self.misses >= MAX_MISSES:
            return Step.BUSY if busy else Step.FINISHED
        model = model_of(records, self.savings)
        proposal = propose(records, model, self.space, self.limit, {(x.batch_size, x.plan) for x in leases})
        if proposal is None and not model.calibrated and busy:
            return Step.BUSY  # other workers are measuring the calibration trials: wait for their peaks
        slot = self.store.take_slot(self.name, self.target, self.worker)
        if slot is None:  # other workers are measuring the study's last trials
            return Step.BUSY
        step = self._proposed(proposal) if proposal is not None else self._sample(records, model)
        if step is not Step.RAN:  # nothing was measured: the slot is free again
            self.store.forget_slot(self.name, slot)
        return step

    def _proposed(self, proposal: Proposal) -> Step:
        lease = self.store.claim(
            self.name, "trial", proposal.batch_size, proposal.plan, 0, self.worker, self.device
        )
        if lease is None:  # another worker claimed it between our read and our claim
            return Step.MISSED
        self._run_lease(lease, proposal.why)
        return Step.RAN

    def _sample(self, records: list[TrialRecord], model: MemoryModel) -> Step:
        trial = self.study.ask(self.distributions)
        trial.set_user_attr("worker", self.worker)
        batch, plan = trial.params["batch_size"], trial.params["plan"]
        if self._skip_or_copy(trial, batch, plan, records, model):
            self.misses += 1
            return Step.MISSED
        lease = self.store.claim(self.name, "trial", batch, plan, 0, self.worker, self.device)
        if lease is None:
            trial.set_user_attr("kind", "copy")
            trial.set_user_attr("note", "measured by another worker")
            self.study.tell(trial, state=TrialState.PRUNED)
            self.misses += 1
            return Step.MISSED
        self._measure(trial, lease, model, "sampler")
        return Step.RAN

    def _run_lease(self, lease: Lease, why: str) -> None:
        trial = self.ask_fixed(lease.batch_size, lease.plan)
        trial.set_user_attr("worker", self.worker)
        if lease.attempt > 0:
            first = self.store.lease(self.name, lease.kind, lease.batch_size, lease.plan, 0)
            trial.set_user_attr("retry_of", first.trial_number if first is not None else None)
        self._measure(trial, lease, model_of(records_of(self.study), self.savings), why)

    def ask_fixed(self, batch: int, plan: str) -> optuna.Trial:
        """A new trial with these parameters: Optuna's PartialFixedSampler for this one ask, in this
        process only (unlike ``enqueue_trial``, whose shared queue other workers also pop)."""
        sampler = self.study.sampler
        self.study.sampler = optuna.samplers.PartialFixedSampler({"batch_size": batch, "plan": plan}, sampler)
        try:
            return self.study.ask(self.distributions)
        finally:
            self.study.sampler = sampler

    def _skip_or_copy(
        self, trial: optuna.Trial, batch: int, plan: str, records: list[TrialRecord], model: MemoryModel
    ) -> bool:
        same = next((r for r in records if (r.batch_size, r.plan) == (batch, plan) and r.counted), None)
        predicted = model.predict(batch, plan)
        if same is not None:
            trial.set_user_attr("kind", "copy")
            trial.set_user_attr("note", f"same configuration as trial {same.number}")
            self._tell_like(trial, same)
            return True
        if predicted is not None and predicted > self.limit * (1 + SKIP_MARGIN):
            trial.set_user_attr("kind", "skipped")
            trial.set_user_attr("predicted_peak_bytes", int(predicted))
            trial.set_user_attr("note", "the memory model predicts it cannot fit")
            self.study.tell(trial, state=TrialState.PRUNED)
            self.reporter.skipped(TrialRecord.from_frozen(self.study.trials[trial.number]))
            return True
        return False

    def _tell_like(self, trial: optuna.Trial, same: TrialRecord) -> None:
        for name in ("outcome", "peak_bytes", "samples_per_sec"):
            trial.set_user_attr(name, getattr(same, name))
        if same.measured and same.peak_bytes is not None:
            trial.set_constraint(
                "memory", constraint_mib(same.peak_bytes, self.limit, same.outcome == "complete")
            )
            self.study.tell(trial, same.samples_per_sec or 0.0)
        else:
            self.study.tell(trial, state=TrialState.FAIL)

    def _measure(self, trial: optuna.Trial, lease: Lease, model: MemoryModel, why: str) -> TrialResult:
        self.misses = 0
        batch, plan = lease.batch_size, lease.plan
        predicted = model.predict(batch, plan)
        trial.set_user_attr("kind", "measured")
        trial.set_user_attr("proposed_by", why)
        trial.set_user_attr("lease", lease.id)
        trial.set_user_attr("device", self.device)
        if predicted is not None:
            trial.set_user_attr("predicted_peak_bytes", int(predicted))
        self.store.set_lease_trial(lease.id, trial.number)
        self.reporter.trial_started(trial.number, batch, plan, why)
        try:
            result = self.run_config(batch, plan, self.reporter.trial_progress, self.shield.allow)
        except KeyboardInterrupt:
            self.fail_lease(lease, "interrupted")
            raise
        except StopRequested:
            self.release(lease, trial.number)
            raise
        tell_result(self.study, trial, result, self.limit)
        self.store.end_lease(lease.id, "done")
        self.trials_run += 1
        records = records_of(self.study)
        self.reporter.trial_finished(records[trial.number], best_record(records, self.limit))
        self._count_failure(result, records)
        return result

    def _count_failure(self, result: TrialResult, records: list[TrialRecord]) -> None:
        self.failures = self.failures + 1 if result.outcome in (Outcome.FAILED, Outcome.TIMEOUT) else 0
        if self.failures >= MAX_FAILURES or (self.failures and sum(r.counted for r in records) == 1):
            raise ScriptError(
                f"the script failed in {self.failures} trial(s) in a row (logs: {result.log_dir}):\n"
                f"{result.error}"
            )

    def release(self, lease: Lease, number: int) -> None:
        """A stopping worker gives its configuration back (same attempt: stopping is not a fault)."""
        fail_trial(self.study, number, "released: its worker was stopped")
        self.store.release(lease.id, "released by a stopping worker")

    def fail_lease(self, lease: Lease, why: str) -> None:
        """Fail a lease whose worker will not finish it, with its trials, and queue its one retry."""
        note = failure_note(lease, why)
        self.store.end_lease(lease.id, "failed", note)
        self._after_failure(lease, note)

    def _after_failure(self, lease: Lease, note: str) -> None:
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if t.user_attrs.get("lease") == lease.id:
                fail_trial(self.study, t.number, note)
        if lease.attempt == 0:
            origin = f"trial {lease.trial_number}" if lease.trial_number is not None else f"lease {lease.id}"
            self.store.queue(self.name, lease.kind, lease.batch_size, lease.plan, 1, origin)

    def recover(self) -> int:
        """Fail the leases (and trials) of dead workers and queue each configuration's one retry.

        Exactly one worker wins the failing of each lease (``fail_if_silent``). Returns how many this
        search failed."""
        failed = 0
        for lease in self.store.leases(self.name, states=("running",)):
            if lease.worker == self.worker:
                continue
            why = self.watch.dead(lease)
            if why is None:
                continue
            note = failure_note(lease, why)
            if self.store.fail_if_silent(lease.id, lease.beats, note):
                self._after_failure(lease, note)
                failed += 1
        return failed + self._fail_orphans()

    def _fail_orphans(self) -> int:
        """RUNNING trials with no live lease: a worker died between its ask and its lease's update, or
        the trial is from a database written before leases (its worker's pid says whether it is dead)."""
        leases = {x.id: x for x in self.store.leases(self.name)}
        orphans = 0
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            lease = leases.get(t.user_attrs.get("lease"))
            worker = str(t.user_attrs.get("worker", ""))
            if lease is not None and lease.state != "running":
                note = lease.note or "its lease ended"
            elif lease is None and _worker_state(worker, self.watch.host) == "dead":
                note = f"worker {worker} died"
            elif not worker and t.datetime_start and _age(t.datetime_start) > 2 * self.watch.grace:
                note = "asked by a worker that never used it"
            else:
                continue
            orphans += fail_trial(self.study, t.number, note)
        return orphans


def failure_note(lease: Lease, why: str) -> str:
    """The note of a failed lease and of its trial: one string for both, so the trial reads the same
    whether the worker that failed the lease fails it, or another worker that finds it orphaned first."""
    return why + ("; retried once" if lease.attempt == 0 else "")


def fail_trial(study: optuna.Study, number: int, note: str) -> bool:
    """Fail a RUNNING trial with a note; False if it was found finished.

    Workers race to fail a dead worker's trial (one fails the lease, another sees the trial orphaned by
    it): whichever writes second finds it finished in the database, inside its own write, and leaves
    it to the first. The check before the writes cannot settle it: the other may write in between."""
    frozen = study.trials[number]
    if frozen.state is not TrialState.RUNNING:
        return False
    try:
        optuna.trial.Trial(study, frozen._trial_id).set_user_attr("note", note)
        study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
    except UpdateFinishedTrialError:
        return False
    return True


def tell_result(study: optuna.Study, trial: optuna.Trial, result: TrialResult, limit: int) -> None:
    """Store a measured trial: every attribute first, then the value and constraint (or FAIL).

    The storage retries every write while the database is locked or unreachable (RetryingRDBStorage):
    a finished measurement is never dropped for a transient error. If another worker failed the trial
    meanwhile (it took this worker for dead), the measurement is added as a trial of its own."""
    attrs = {
        "outcome": result.outcome.value,
        "peak_bytes": result.peak_bytes,
        "memory_method": result.memory_method,
        "samples_per_sec": result.samples_per_sec,
        "log_dir": result.log_dir,
        "error": result.error.strip().splitlines()[0][:500] if result.error else None,
    }
    constraints: dict[str, float] = {}
    value, state = None, TrialState.FAIL
    if result.outcome in (Outcome.COMPLETE, Outcome.OOM):
        constraints["memory"] = constraint_mib(result.peak_bytes, limit, result.outcome is Outcome.COMPLETE)
        value, state = result.samples_per_sec or 0.0, TrialState.COMPLETE
    try:
        for name, attr in attrs.items():
            trial.set_user_attr(name, attr)
        for name, constraint in constraints.items():
            trial.set_constraint(name, constraint)
        study.tell(trial, value, state=state, skip_if_finished=True)
    except UpdateFinishedTrialError:  # failed as stale, or a retried tell whose first attempt committed
        pass
    stored = trial.storage.get_trial(trial._trial_id)
    if stored.state is state or state is TrialState.FAIL:
        return
    study.add_trial(
        optuna.trial.create_trial(
            params=stored.params,
            distributions=stored.distributions,
            value=value,
            user_attrs={
                **stored.user_attrs,
                **attrs,
                "note": f"late result of trial {stored.number}, failed as stale",
            },
            # the sampler's own attributes; the constraint is this measurement's, whether or not it was set
            system_attrs={k: v for k, v in stored.system_attrs.items() if not k.startswith("constraints:")},
            constraints=constraints,
        )
    )


def best_record(records: list[TrialRecord], limit: int) -> TrialRecord | None:
    fitting = [r for r in records if r.kind in ("measured", "warm-start") and r.fits(limit)]
    return max(fitting, key=lambda r: r.samples_per_sec or 0.0, default=None)


def _age(start: datetime.datetime) -> float:
    return (datetime.datetime.now() - start).total_seconds()


def _worker_state(worker: str, host: str) -> str:
    """'alive' or 'dead' for a worker id of this host (the pid's start time guards against pid reuse);
    'unknown' for another host's: only its heartbeat can tell."""
    parts = worker.split(":")
    if len(parts) != 3 or parts[0] != host or not parts[1].isdigit():
        return "unknown"
    try:
        start = Path(f"/proc/{parts[1]}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "dead"
    return "alive" if start == parts[2] else "dead"
