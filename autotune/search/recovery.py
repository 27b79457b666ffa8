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

import optuna
from optuna.trial import TrialState

from autotune.core.errors import StorageError, StorageFault
from autotune.leases.identity import WorkerState, worker_state
from autotune.leases.watch import LeaseWatch
from autotune.search.optuna_trials import fail_trial
from autotune.storage import Lease, LeaseState, Store


class Recovery:
    """Failing, releasing and retrying the leases of one study, as seen by one worker."""

    def __init__(self, study: optuna.Study, store: Store, worker: str, grace: float) -> None:
        self.study, self.store, self.worker = study, store, worker
        self.watch = LeaseWatch(grace)

    @property
    def name(self) -> str:
        return self.study.study_name

    def recover(self) -> int:
        """Fail the leases (and trials) of dead workers and queue each configuration's one retry; fail the
        orphaned trials. Returns how many this worker failed."""
        failed = 0
        for lease in self.store.leases(self.name, states=(LeaseState.RUNNING,)):
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

    def _after_failure(self, lease: Lease, note: str) -> None:
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if t.user_attrs.get("lease") == lease.id:
                fail_trial(self.study, t.number, note)
        if lease.attempt == 0:
            origin = f"trial {lease.trial_number}" if lease.trial_number is not None else f"lease {lease.id}"
            self.store.queue(self.name, lease.kind, lease.batch_size, lease.plan, 1, origin)

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
