"""Verification: the fastest fitting configurations, in order, are re-run longer (3x the measured steps,
at least 10) until one stays under the limit; that one is stored as the study's best plan.

Verifications are leased like trials (kind ``verify``): one worker verifies each configuration, a dead
verifier's configuration is verified once more, and the others wait (``Step.BUSY``).
"""

from __future__ import annotations

import time

from autotune.core.budget import format_bytes
from autotune.core.errors import NoFitError
from autotune.search.loop import Search, Step
from autotune.search.optuna_trials import fail_trial, records_of, tell_result
from autotune.search.records import TrialKind, TrialRecord, best_record
from autotune.storage import BestRow, JobState, Lease, LeaseKind, LeaseState
from autotune.trials.interrupts import StopRequested
from autotune.trials.result import TrialResult
from autotune.trials.settings import TrialSettings

MAX_VERIFICATIONS = 3
POLL_SECONDS = 0.5


def verify(search: Search, settings: TrialSettings) -> BestRow:
    """Verify until the study has a best plan (this worker or another stores it).

    Raises:
        NoFitError: MAX_VERIFICATIONS configurations failed verification, or none fits.
    """
    while True:
        search.shield.check()  # a Ctrl-C while another worker verifies: at once, not when it is done
        step, best = verify_step(search, settings)
        if best is not None:
            return best
        if step is Step.BUSY:
            time.sleep(POLL_SECONDS)


def verify_step(search: Search, settings: TrialSettings) -> tuple[Step, BestRow | None]:
    """One round of verification, with trials of ``settings``; the best plan once one is stored.

    Raises:
        NoFitError: MAX_VERIFICATIONS configurations failed verification, or none fits.
    """
    store, name = search.store, search.name
    if (stored := store.best(name)) is not None:
        return Step.FINISHED, stored
    search.recovery.recover()  # verify leases of dead workers too: failed, queued once more
    kinds = (LeaseKind.VERIFY,)
    lease = store.take_queued(name, search.worker, search.device, kinds=kinds)
    if lease is None:
        leases = store.leases(name, kinds=kinds)
        if any(x.state in (LeaseState.RUNNING, LeaseState.QUEUED) for x in leases):
            return Step.BUSY, None
        records = records_of(search.study)
        tried = {(x.batch_size, x.plan) for x in leases}
        candidate = best_record([r for r in records if (r.batch_size, r.plan) not in tried], search.limit)
        if len(tried) >= MAX_VERIFICATIONS or candidate is None:
            raise NoFitError(_no_fit_message(records, search.limit))
        batch, plan = candidate.batch_size or 0, candidate.plan or "none"
        lease = store.claim(name, LeaseKind.VERIFY, batch, plan, 0, search.worker, search.device)
        if lease is None:
            return Step.MISSED, None
    return Step.RAN, _verify_lease(search, lease, settings)


def _verify_lease(search: Search, lease: Lease, settings: TrialSettings) -> BestRow | None:
    """Verify the configuration of ``lease``: the best plan if it stays under the limit."""
    config = (lease.batch_size, lease.plan)
    candidate = best_record(
        [r for r in records_of(search.study) if (r.batch_size, r.plan) == config], search.limit
    )
    if candidate is None:  # only possible for a stale queued retry: nothing to verify any more
        search.store.end_lease(lease.id, LeaseState.FAILED, "no fitting trial of this configuration")
        return None
    result = _run_verification(search, lease, candidate, settings)
    if result.fits(search.limit) and result.samples_per_sec:
        best = BestRow(
            search.name,
            candidate.number,
            lease.batch_size,
            lease.plan,
            candidate.peak_bytes or 0,
            candidate.samples_per_sec or 0.0,
            result.peak_bytes,
            result.samples_per_sec,
        )
        search.store.save_best(best)
        search.store.set_job_state(search.name, JobState.DONE)
        search.store.end_lease(lease.id, LeaseState.DONE)
        return best
    search.store.end_lease(lease.id, LeaseState.FAILED, f"verification {result.outcome.value}")
    search.reporter.note(
        f"trial {candidate.number} failed verification ({result.outcome.value}, peak "
        f"{format_bytes(result.peak_bytes)}); trying the next configuration"
    )
    return None


def _run_verification(
    search: Search, lease: Lease, candidate: TrialRecord, settings: TrialSettings
) -> TrialResult:
    """The verification trial of ``candidate``, asked, run and told."""
    trial = search.ask_fixed(lease.batch_size, lease.plan)
    for key, value in {
        "kind": TrialKind.VERIFICATION.value,
        "proposed_by": "verification",
        "note": f"verifies trial {candidate.number}",
        "worker": search.worker,
        "lease": lease.id,
        "device": search.device,
    }.items():
        trial.set_user_attr(key, value)
    search.store.set_lease_trial(lease.id, trial.number)
    search.reporter.trial_started(
        trial.number, lease.batch_size, lease.plan, f"verifying trial {candidate.number}"
    )
    try:
        result = search.runner(
            lease.batch_size,
            lease.plan,
            poll=search.reporter.trial_progress,
            settings=settings,
            interruptible=search.shield.allow,
        )
    except StopRequested:
        search.recovery.release(lease, trial.number)
        raise
    except KeyboardInterrupt:  # a verification is not retried here: the next run verifies again
        fail_trial(search.study, trial.number, "interrupted")
        search.store.forget_lease(lease.id)
        raise
    tell_result(search.study, trial, result, search.limit)
    search.reporter.trial_finished(records_of(search.study)[trial.number], candidate)
    return result


def _no_fit_message(records: list[TrialRecord], limit: int) -> str:
    measured = [r for r in records if r.measured and r.peak_bytes is not None]
    if not measured:
        return f"no configuration fits {format_bytes(limit)} (budget minus headroom): no trial completed"
    smallest = min(measured, key=lambda r: r.peak_bytes or 0)
    return (
        f"no configuration fits {format_bytes(limit)} (budget minus headroom): the smallest peak measured was "
        f"{format_bytes(smallest.peak_bytes or 0)} (batch {smallest.batch_size}, plan {smallest.plan}, trial "
        f"{smallest.number}); every trial is kept"
    )
