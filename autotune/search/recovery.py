"""What happens to a configuration whose worker will not finish it.

- A worker that died (a dead pid on this host, or beats that stopped for the grace period): the first
  worker to notice fails its lease (``fail_if_silent``: exactly one wins) and its trial, and queues the
  configuration once more as attempt 1, never twice.
- Ctrl-C of ``run``: the same, at once, by the interrupted process itself.
- A worker that is stopping (SIGTERM/SIGINT): its trial is failed and its lease *released*, queued again
  with the same attempt; stopping is not a fault.
- A RUNNING trial with no live lease (an orphan): failed with its lease's note. Two workers may both try;
  whichever writes second finds it finished and leaves it, so every order ends in the same database.
"""

from __future__ import annotations

import contextlib
import datetime
from typing import NamedTuple

import optuna
from optuna.trial import TrialState

from autotune.core.errors import StorageError, StorageFault
from autotune.leases.identity import WorkerState, worker_state
from autotune.leases.watch import LeaseWatch
from autotune.search.optuna_trials import fail_trial
from autotune.storage import Lease, LeaseState, Store


class Recovered(NamedTuple):
    """What one look at a study's leases found: the trials it failed, and the configurations it queued for
    their one retry. They differ where a worker died between claiming a configuration and asking its
    trial (nothing to fail, one to queue), or where the trial was orphaned (failed, its lease's retry
    queued by whoever failed the lease)."""

    trials: int
    retries: int

    def __bool__(self) -> bool:
        return bool(self.trials or self.retries)

    def __str__(self) -> str:
        failed = f"{self.trials} interrupted trial(s) failed"
        if self.retries == self.trials:
            return f"{failed} and queued for one retry"
        return f"{failed}; {self.retries} configuration(s) queued for one retry"


class Recovery:
    """Failing, releasing and retrying the leases of one study, as seen by one worker."""

    def __init__(self, study: optuna.Study, store: Store, worker: str, grace: float) -> None:
        self.study, self.store, self.worker = study, store, worker
        self.watch = LeaseWatch(grace)

    @property
    def name(self) -> str:
        return self.study.study_name

    def recover(self) -> Recovered:
        """Fail the leases (and trials) of dead workers and queue each configuration's one retry; fail the
        orphaned trials. Returns what this worker failed and queued."""
        failed = retries = 0
        for lease in self.store.leases(self.name, states=(LeaseState.RUNNING,)):
            if lease.worker == self.worker:
                continue
            why = self.watch.dead(lease)
            if why is None:
                continue
            note = failure_note(lease, why)
            if self.store.fail_if_silent(lease.id, lease.beats, note):
                trials, retried = self._after_failure(lease, note)
                failed, retries = failed + trials, retries + retried
        return Recovered(failed + self._fail_orphans(), retries)

    def fail(self, lease: Lease, why: str) -> None:
        """Fail a lease whose worker will not finish it (this one, interrupted), with its trials, and
        queue its one retry."""
        note = failure_note(lease, why)
        self.store.end_lease(lease.id, LeaseState.FAILED, note)
        self._after_failure(lease, note)

    def release(self, lease: Lease, number: int, why: str = "its worker was stopped") -> None:
        """A stopping worker gives its configuration back (same attempt: stopping is not a fault, nor is
        storage that could not be written)."""
        fail_trial(self.study, number, f"released: {why}")
        self.store.release(lease.id, f"released: {why}")

    def give_back(self, lease: Lease, number: int, fault: StorageFault) -> None:
        """Release a configuration whose trial storage stopped (as it was: the storage's fault, not its), where
        the database can still be written; where it cannot, the next run fails the trial (a dead pid)."""
        with contextlib.suppress(StorageError):
            self.release(lease, number, str(fault))

    def _after_failure(self, lease: Lease, note: str) -> tuple[int, bool]:
        """Fail a failed lease's RUNNING trials and queue its retry: (trials failed, whether queued)."""
        failed = 0
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if t.user_attrs.get("lease") == lease.id:
                failed += fail_trial(self.study, t.number, note)
        if lease.attempt != 0:
            return failed, False
        origin = f"trial {lease.trial_number}" if lease.trial_number is not None else f"lease {lease.id}"
        return failed, self.store.queue(self.name, lease.kind, lease.batch_size, lease.plan, 1, origin)

    def _fail_orphans(self) -> int:
        """RUNNING trials with no live lease: a worker died between its ask and its lease's update, or
        the trial is from a database written before leases (its worker's pid says whether it is dead)."""
        leases = {x.id: x for x in self.store.leases(self.name)}
        orphans = 0
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            lease = leases.get(int(t.user_attrs.get("lease", -1)))
            worker = str(t.user_attrs.get("worker", ""))
            if lease is not None and lease.state is not LeaseState.RUNNING:
                note = lease.note or "its lease ended"
            elif lease is None and worker_state(worker, self.watch.host) is WorkerState.DEAD:
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


def _age(start: datetime.datetime) -> float:
    return (datetime.datetime.now() - start).total_seconds()
