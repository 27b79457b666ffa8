"""A workload's probe: its first trial (plan ``none``, the smallest batch, instrumented), run once per
workload fingerprint, shared by every budget and every worker.

Workers racing on a new workload lease the probe (key ``workload-<fingerprint>``): one runs it, the others
wait for its result; a probe whose worker dies is retried once. The probe's trial is instrumented, so its
peak and speed are stored with the workload, never as a measurement.
"""

from __future__ import annotations

import time
from typing import Any

from autotune.backends.probe_report import OrtProbeReport, ProbeReport, probe_report_from_json
from autotune.core.errors import ScriptError
from autotune.core.protocol import Outcome
from autotune.leases.watch import LeaseWatch, grace_seconds
from autotune.search.reporting import Reporter
from autotune.search.runner import TrialRunner
from autotune.search.spec import TuneSpec
from autotune.storage import Lease, LeaseKind, LeaseState, Store
from autotune.trials.interrupts import StopRequested
from autotune.trials.result import TrialResult
from autotune.trials.workload import Workload

POLL_SECONDS = 0.5
SCRIPT_FAILURE = "script: "  # how a probe lease's note marks the script's own failure


def discover(
    store: Store, workload: Workload, spec: TuneSpec, runner: TrialRunner, reporter: Reporter, worker: str
) -> tuple[ProbeReport | None, int]:
    """The workload's probe report (None if the script probed nothing) and how many trials it took here:
    measured once per fingerprint (again with ``spec.force``), or waited for while another worker runs it.

    Raises:
        ScriptError: the probe's trial failed here or on another worker, or its worker died twice.
    """
    key = f"workload-{workload.fingerprint}"
    if spec.force:
        store.forget_leases(key)
    elif (found := _discovery(store, workload)) is not None:
        return probe_report_from_json(found.get("probe")), 0
    watch = LeaseWatch(grace_seconds())
    while True:
        found = _discovery(store, workload)
        if found is not None and not (spec.force and not store.leases(key, (LeaseState.DONE,))):
            return probe_report_from_json(found.get("probe")), 0
        lease = store.take_queued(key, worker, str(runner.device)) or store.claim(
            key, LeaseKind.PROBE, spec.batch_sizes[0], "none", 0, worker, str(runner.device)
        )
        if lease is not None:
            return _probe(store, workload, lease, runner, reporter), 1
        _watch_the_prober(store, key, watch, worker)
        time.sleep(POLL_SECONDS)


def _discovery(store: Store, workload: Workload) -> dict[str, Any] | None:
    """What the workload's probe stored (its report may be None: a script with no torch model); None until
    the probe has run."""
    row = store.workload(workload.fingerprint)
    return row.discovery if row is not None else None


def _watch_the_prober(store: Store, key: str, watch: LeaseWatch, worker: str) -> None:
    """While another worker probes: its script's failure is ours too; its death queues the probe once."""
    for other in store.leases(key):
        if other.state is LeaseState.FAILED and other.note and other.note.startswith(SCRIPT_FAILURE):
            raise ScriptError(
                f"the script's first trial failed on worker {other.worker}: {other.note[len(SCRIPT_FAILURE) :]}"
            )
        why = watch.dead(other) if other.state is LeaseState.RUNNING and other.worker != worker else None
        if why is not None and store.fail_if_silent(other.id, other.beats, why):
            if other.attempt > 0:
                raise ScriptError(f"the probe's worker died twice ({why})")
            store.queue(key, LeaseKind.PROBE, other.batch_size, other.plan, 1, why)


def _probe(
    store: Store, workload: Workload, lease: Lease, runner: TrialRunner, reporter: Reporter
) -> ProbeReport | None:
    reporter.trial_started(-1, lease.batch_size, "none", "probe")
    try:
        result: TrialResult = runner(lease.batch_size, "none", poll=reporter.trial_progress, probe=True)
    except StopRequested:
        store.release(lease.id, "released by a stopping worker")
        raise
    except BaseException:
        store.end_lease(lease.id, LeaseState.FAILED, "interrupted")
        raise
    if result.outcome in (Outcome.FAILED, Outcome.TIMEOUT):
        error = (result.error or "").strip().splitlines()
        store.end_lease(
            lease.id, LeaseState.FAILED, SCRIPT_FAILURE + (error[0] if error else result.outcome.value)
        )
        raise ScriptError(
            f"the script's first trial {result.outcome.value} (logs: {result.log_dir}):\n{result.error}"
        )
    discovery = {
        "probe": result.probe.to_json() if result.probe is not None else None,
        "outcome": result.outcome.value,
        "log_dir": result.log_dir,
    }
    candidates = [c.__dict__ for c in result.candidates or ()]
    store.set_discovery(workload.fingerprint, candidates, discovery)
    store.end_lease(lease.id, LeaseState.DONE)
    if isinstance(result.probe, OrtProbeReport):
        found = f"ORT recompute plans: {len(result.probe.plans)}"
    else:
        found = "repeated modules: " + (", ".join(c.cls for c in result.candidates or ()) or "none found")
    reporter.note(f"probe: batch {lease.batch_size}: {result.outcome.value}; {found}")
    return result.probe
