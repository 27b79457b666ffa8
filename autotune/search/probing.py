"""A workload's probe: its first trial (plan ``none``, the smallest batch, instrumented), run once per
workload fingerprint, shared by every budget and every worker.

Workers racing on a new workload lease the probe (key ``workload-<fingerprint>``): one runs it, the others
wait for its result, and say what they wait for. The probe's trial is instrumented, so its peak and speed
are stored with the workload, never as a measurement.

How a probe ends decides what the next run does, so that no workload is ever left with a lease nothing
can take:
- Ctrl-C, or a worker that is stopping: the lease is released (queued again, same attempt);
- its worker died, it timed out, or it could not be started (reasons outside the script): it is retried
  once, by whichever run or worker comes next;
- the script failed: the failure is stored with the interpreter the command ran in, and later runs say so
  and that ``--force`` runs it again; a run whose command now runs another interpreter (an environment
  activated since) probes again instead (issue 44).

Plans named with ``--plans`` that the stored probe did not check against no plan are checked by one more
instrumented trial (``check_named_plans``), their checks stored with the workload.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from autotune.backends.probe import checked_part
from autotune.backends.probe_report import (
    OrtProbeReport,
    ProbeReport,
    TorchProbeReport,
    probe_report_from_json,
)
from autotune.core.errors import InputError, ScriptError
from autotune.core.plans import parse_plan
from autotune.core.protocol import Outcome
from autotune.leases.watch import LeaseWatch, grace_seconds
from autotune.search.reporting import Reporter
from autotune.search.runner import Runner
from autotune.search.spec import TuneSpec
from autotune.storage import Lease, LeaseKind, LeaseState, Store
from autotune.trials.command import same_interpreter
from autotune.trials.interrupts import StopRequested
from autotune.trials.result import TrialResult, misconfigured
from autotune.trials.workload import Workload

POLL_SECONDS = 0.5
SAY_EVERY_SECONDS = 30.0  # a wait is announced at once, then again this often
SCRIPT_FAILURE = "script: "  # how a probe lease's note marks the script's own failure
BATCH_IGNORED = "BatchIgnored: "  # the runtime's error for a script that ignores the batch size
RERUN = "autotune run --force runs it again"
RAN_IN = " [python: "  # a stored script failure's interpreter, at the end of its note: `... [python: /usr/bin/python3]`


def _interpreter_note(note: str) -> tuple[str, str | None]:
    """A stored failure's note without its interpreter, and the interpreter (None: not stored)."""
    head, found, tail = note.rpartition(RAN_IN)
    return (head, tail[:-1]) if found and tail.endswith("]") else (note, None)


def discover(
    store: Store,
    workload: Workload,
    spec: TuneSpec,
    runner: Runner,
    reporter: Reporter,
    worker: str,
    python: str | None = None,
) -> tuple[ProbeReport | None, int]:
    """The workload's probe report (None if the script probed nothing) and how many trials it took here:
    measured once per fingerprint (again with ``spec.force``), or waited for while another worker runs it.
    ``python``: the interpreter the command runs in here (autotune.trials.interpreter.interpreter_of): a
    failure stored from another one is not this run's answer.

    Raises:
        ScriptError: the probe's script failed (now, or in a run whose failure is stored), or the probe
            failed twice for other reasons.
        StopRequested: the runner's stop was set while this waited.
    """
    key = f"workload-{workload.fingerprint}"
    if spec.force:
        store.forget_leases(key)
    elif (found := _discovery(store, workload)) is not None:
        return probe_report_from_json(found.get("probe")), 0
    watch = LeaseWatch(grace_seconds())
    waiting = _Waiting(reporter)
    while True:
        found = _discovery(store, workload)
        if found is not None and not (spec.force and not store.leases(key, (LeaseState.DONE,))):
            return probe_report_from_json(found.get("probe")), 0
        lease = store.take_queued(key, worker, str(runner.device)) or store.claim(
            key, LeaseKind.PROBE, spec.batch_sizes[0], "none", 0, worker, str(runner.device)
        )
        if lease is not None:
            return _probe(store, workload, lease, spec.batch_sizes[0], runner, reporter, python), 1
        running = _after_the_prober(store, key, watch, worker, python)
        if running is not None:
            waiting.say(running)
        _pause(runner)


def _discovery(store: Store, workload: Workload) -> dict[str, Any] | None:
    """What the workload's probe stored (its report may be None: a script with no torch model); None until
    the probe has run."""
    row = store.workload(workload.fingerprint)
    return row.discovery if row is not None else None


def _after_the_prober(
    store: Store, key: str, watch: LeaseWatch, worker: str, python: str | None
) -> Lease | None:
    """The lease of the probe that another worker is running (None if none is): its death queues the probe
    once more; a probe that ended without a result and is not queued again is retried once, or its stored
    failure raised."""
    leases = store.leases(key)
    for other in leases:
        why = watch.dead(other) if other.state is LeaseState.RUNNING and other.worker != worker else None
        if why is not None and store.fail_if_silent(other.id, other.beats, why):
            _retry_or_raise(store, key, other, why, python)
            return None
    if any(x.state is LeaseState.QUEUED for x in leases):
        return None  # the next round takes it
    running = [x for x in leases if x.state is LeaseState.RUNNING]
    if running:
        return running[0]
    last = max(leases, key=lambda x: x.attempt, default=None)
    if last is not None and last.state is LeaseState.FAILED:
        _retry_or_raise(store, key, last, last.note or "it failed", python)
    elif last is not None and last.state is LeaseState.DONE:  # done, yet no result: the row was lost
        _retry_or_raise(store, key, last, "its stored result is missing", python)
    return None


def _retry_or_raise(store: Store, key: str, lease: Lease, why: str, python: str | None) -> None:
    """Queue the failed probe's one retry; raise if the script itself failed in this interpreter, or the
    retry did too. A script's failure in another interpreter than ``python`` is probed again."""
    why, ran_in = _interpreter_note(why)
    if why.startswith(SCRIPT_FAILURE) and ran_in and python and not same_interpreter(ran_in, python):
        store.queue(
            key, LeaseKind.PROBE, lease.batch_size, lease.plan, lease.attempt + 1,
            f"again: it failed in {ran_in}, the command's python is now {python}",
        )  # fmt: skip
        return
    if why.startswith(SCRIPT_FAILURE + BATCH_IGNORED):  # a script that ignores the batch size: as it was said
        raise InputError(why[len(SCRIPT_FAILURE + BATCH_IGNORED) :])
    if why.startswith(SCRIPT_FAILURE):
        where = f", with {ran_in}" if ran_in else ""
        raise ScriptError(
            f"the script's first trial failed (stored from an earlier run, on worker {lease.worker}{where}): "
            f"{why[len(SCRIPT_FAILURE) :]}; {RERUN}"
        )
    if lease.attempt > 0:
        raise ScriptError(f"the workload's probe failed twice (last: {why}); {RERUN}")
    store.queue(key, LeaseKind.PROBE, lease.batch_size, lease.plan, 1, f"retry after: {why}")


class _Waiting:
    """Says what a wait is for, at once and then every SAY_EVERY_SECONDS: nothing waits silently."""

    def __init__(self, reporter: Reporter) -> None:
        self.reporter = reporter
        self.started = time.monotonic()
        self.said_at: float | None = None

    def say(self, lease: Lease) -> None:
        now = time.monotonic()
        if self.said_at is None or now - self.said_at >= SAY_EVERY_SECONDS:
            self.said_at = now
            self.reporter.note(
                f"waiting for worker {lease.worker} to probe this workload (waited {now - self.started:.0f}s; "
                "its result is shared by every run)"
            )


def _pause(runner: Runner) -> None:
    """Wait one poll; a stopping worker's stop ends the wait at once, a Ctrl-C within the poll."""
    runner.check()
    if runner.stop is None:
        time.sleep(POLL_SECONDS)
    else:
        runner.stop.wait(POLL_SECONDS)
    runner.check()  # raises StopRequested once the stop is set


def _probe(
    store: Store,
    workload: Workload,
    lease: Lease,
    batch: int,
    runner: Runner,
    reporter: Reporter,
    python: str | None,
) -> ProbeReport | None:
    """Run the probe ``lease`` stands for, at ``batch``: the smallest of this job's own (signed) batch sizes,
    never the lease's, which any writer of the database can set (and another job's spec may have queued)."""
    reporter.trial_started(-1, batch, "none", "probe")
    try:
        result: TrialResult = runner(batch, "none", poll=reporter.trial_progress, probe=True)
    except (StopRequested, KeyboardInterrupt):  # a stop is not a fault: the next run or worker probes
        store.release(lease.id, "released: its run or worker was stopped")
        raise
    except BaseException as e:
        store.end_lease(
            lease.id, LeaseState.FAILED, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        )
        raise
    if result.outcome in (Outcome.FAILED, Outcome.TIMEOUT):
        _store_failure(store, lease, result, python)
    discovery = {
        "probe": result.probe.to_json() if result.probe is not None else None,
        "outcome": result.outcome.value,
        "log_dir": result.log_dir,
    }
    store.set_discovery(workload.fingerprint, [c.__dict__ for c in result.candidates or ()], discovery)
    store.end_lease(lease.id, LeaseState.DONE)
    if isinstance(result.probe, OrtProbeReport):
        found = f"ORT recompute plans: {len(result.probe.plans)}"
    else:
        found = "repeated modules: " + (", ".join(c.cls for c in result.candidates or ()) or "none found")
    reporter.note(f"probe: batch {batch}: {result.outcome.value}; {found}")
    return result.probe


def _store_failure(store: Store, lease: Lease, result: TrialResult, python: str | None) -> None:
    """End the lease of a probe that failed (the script: stored, with the interpreter it ran in; a timeout:
    retried once) and raise: InputError for a script that ignores the batch size, else ScriptError."""
    error = (result.error or "").strip().splitlines()
    first = error[0] if error else result.outcome.value
    script = result.outcome is Outcome.FAILED
    ran_in = f"{RAN_IN}{python}]" if script and python else ""
    store.end_lease(lease.id, LeaseState.FAILED, (SCRIPT_FAILURE if script else "timeout: ") + first + ran_in)
    if (why := misconfigured(result)) is not None:
        raise InputError(why)
    retry = "" if script or lease.attempt > 0 else "; the next run retries it once"
    raise ScriptError(
        f"the script's first trial {result.outcome.value} (logs: {result.log_dir}){retry}:\n{result.error}"
    )


def check_named_plans(
    store: Store,
    workload: Workload,
    spec: TuneSpec,
    runner: Runner,
    reporter: Reporter,
    probe: ProbeReport | None,
) -> ProbeReport | None:
    """The probe report with every plan named in ``spec.plans`` checked against no plan: those the stored
    probe did not check are checked by one more instrumented trial, and stored with the workload.

    Raises:
        ScriptError: that trial failed.
    """
    if not spec.plans or not isinstance(probe, TorchProbeReport):
        return probe
    checked = {c.plan for c in probe.checks}
    # a per-rank plan's entries, each without its sharding (what the check can try in the script's process)
    entries = dict.fromkeys(checked_part(str(e)) for p in spec.plans for e in parse_plan(p).entries)
    missing = tuple(p for p in entries if p != "none" and p not in checked)
    if not missing:
        return probe
    reporter.note(f"checking {', '.join(missing)} against no plan (one instrumented trial)")
    result = runner(
        spec.batch_sizes[0], "none", poll=reporter.trial_progress, probe=True, check_plans=missing
    )
    if result.outcome is not Outcome.COMPLETE or not isinstance(result.probe, TorchProbeReport):
        raise ScriptError(
            f"the trial that checks the named plans {result.outcome.value} (logs: {result.log_dir}):\n"
            f"{result.error or ''}"
        )
    found = {c.plan: c for c in result.probe.checks if c.plan in missing}
    merged = dataclasses.replace(probe, checks=(*probe.checks, *(found[p] for p in missing if p in found)))
    row = store.workload(workload.fingerprint)
    if row is not None and row.discovery is not None:
        candidates = [c.__dict__ for c in merged.candidates]
        store.set_discovery(workload.fingerprint, candidates, {**row.discovery, "probe": merged.to_json()})
    return merged
