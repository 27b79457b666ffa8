"""The search loop: Optuna ask/tell over batch size x plan, steered by the memory model.

Each round proposes one configuration, in this order:

1. calibration — the first plan at the smallest batch sizes until the model is calibrated;
2. the frontier — for each plan, the largest batch size that fits (measured, or predicted by the model);
3. the sampler (TPE) — everything else. Its proposals that the model predicts cannot fit (beyond
   SKIP_MARGIN) are recorded as ``skipped`` without running; re-proposals of a measured configuration are
   recorded as ``copy`` with the same result. Neither counts as a trial.

An OOM or over-budget trial is a COMPLETE trial with a violated ``memory`` constraint: Optuna's samplers
ignore FAILed trials and would propose the same OOM again.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import TrialState

from autotune.errors import ScriptError, StudyBusyError
from autotune.interrupts import InterruptShield
from autotune.measurement import TrialResult
from autotune.memory_model import MemoryModel, Observation
from autotune.protocol import Outcome
from autotune.records import TrialRecord, constraint_mib
from autotune.reporting import Reporter
from autotune.space import SearchSpace

SKIP_MARGIN = 0.10  # skip only what the model predicts over the limit by more than this
MAX_MISSES = 40  # sampler proposals in a row that were skipped or copies: the space is exhausted
MAX_FAILURES = 3  # script failures in a row (not OOMs) before giving up

# run_config(batch, plan, on_poll, interruptible): one measured trial
RunConfig = Callable[
    [int, str, Callable[[int, float], None], Callable[[], AbstractContextManager[None]]], TrialResult
]


@dataclass(frozen=True)
class Proposal:
    batch_size: int
    plan: str
    why: str  # "calibration", "frontier", "retry"


def worker_id() -> str:
    """host:pid:start-time — unique even when the pid is reused."""
    start = Path(f"/proc/{os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()[19]
    return f"{socket.gethostname()}:{os.getpid()}:{start}"


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
    records: list[TrialRecord], model: MemoryModel, space: SearchSpace, limit: int
) -> Proposal | None:
    """The next configuration the model wants measured, or None to let the sampler choose."""
    # Anything that ended (a failure too: a broken plan is not proposed again) or is under way.
    tried = {
        (r.batch_size, r.plan) for r in records if r.outcome is not None or r.state in ("RUNNING", "WAITING")
    }
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
        savings: dict[str, float] | None = None,
    ) -> None:
        self.study = study
        self.savings = savings or {}
        self.space = space
        self.limit = limit
        self.run_config = run_config
        self.target = target
        self.reporter = reporter
        self.worker = worker_id()
        self.trials_run = 0
        self.shield = InterruptShield()
        self.distributions: dict[str, BaseDistribution] = {
            "batch_size": CategoricalDistribution(space.batch_sizes),
            "plan": CategoricalDistribution(space.plans),
        }

    def run(self) -> bool:
        """Search; True if it stopped because nothing new was left to try.

        Queued trials (retries of interrupted ones) always run, even once the target is reached.
        """
        misses = failures = 0
        while True:
            self.shield.check()  # a Ctrl-C between trials: nothing is asked yet, nothing to clean up
            records = records_of(self.study)
            queued = any(r.state == "WAITING" for r in records)
            if sum(r.counted for r in records) >= self.target and not queued:
                return False
            model = model_of(records, self.savings)
            proposal = None if queued else propose(records, model, self.space, self.limit)
            if proposal is not None:
                self.study.enqueue_trial(
                    {"batch_size": proposal.batch_size, "plan": proposal.plan},
                    user_attrs={"proposed_by": proposal.why},
                )
            trial = self.study.ask(self.distributions)
            batch, plan = trial.params["batch_size"], trial.params["plan"]
            if trial.user_attrs.get("proposed_by") is None and self._skip_or_copy(
                trial, batch, plan, records, model
            ):
                misses += 1
                if misses >= MAX_MISSES:
                    return True
                continue
            misses = 0
            result = self.measure(trial, batch, plan, model)
            failures = failures + 1 if result.outcome in (Outcome.FAILED, Outcome.TIMEOUT) else 0
            if failures >= MAX_FAILURES or (failures and sum(r.counted for r in records) == 0):
                raise ScriptError(
                    f"the script failed in {failures} trial(s) in a row (logs: {result.log_dir}):\n"
                    f"{result.error}"
                )

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

    def measure(self, trial: optuna.Trial, batch: int, plan: str, model: MemoryModel) -> TrialResult:
        predicted = model.predict(batch, plan)
        trial.set_user_attr("kind", "measured")
        trial.set_user_attr("worker", self.worker)
        if predicted is not None:
            trial.set_user_attr("predicted_peak_bytes", int(predicted))
        self.reporter.trial_started(
            trial.number, batch, plan, trial.user_attrs.get("proposed_by") or "sampler"
        )
        try:
            result = self.run_config(batch, plan, self.reporter.trial_progress, self.shield.allow)
        except KeyboardInterrupt:
            self.interrupted(
                trial.number, {"batch_size": batch, "plan": plan}, trial.user_attrs.get("retry_of")
            )
            raise
        tell_result(self.study, trial, result, self.limit)
        self.trials_run += 1
        records = records_of(self.study)
        self.reporter.trial_finished(records[trial.number], best_record(records, self.limit))
        return result

    def interrupted(self, number: int, params: dict[str, object], retry_of: object) -> None:
        """Fail a trial that did not finish, and retry its configuration once (unless it was the retry)."""
        optuna.trial.Trial(self.study, self.study.trials[number]._trial_id).set_user_attr(
            "note", "interrupted" + ("" if retry_of is not None else "; retried once")
        )
        self.study.tell(number, state=TrialState.FAIL)
        if retry_of is None:
            self.study.enqueue_trial(params, user_attrs={"proposed_by": "retry", "retry_of": number})

    def recover_interrupted(self) -> int:
        """Fail the RUNNING trials of tuners on this host that died, and retry each once.

        Raises:
            StudyBusyError: a live tuner on this host is running a trial of this study.
        """
        host = socket.gethostname()
        running = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        alive = [t for t in running if _worker_state(str(t.user_attrs.get("worker", "")), host) == "alive"]
        if alive:
            pid = str(alive[0].user_attrs["worker"]).split(":")[1]
            raise StudyBusyError(
                f"study {self.study.study_name!r} is being tuned right now by process {pid} on this host "
                f"(trial {alive[0].number}): wait for it, or tune under another --study"
            )
        stale = [t for t in running if _worker_state(str(t.user_attrs.get("worker", "")), host) == "dead"]
        for t in stale:
            self.interrupted(t.number, dict(t.params), t.user_attrs.get("retry_of"))
        return len(stale)


def tell_result(study: optuna.Study, trial: optuna.Trial, result: TrialResult, limit: int) -> None:
    """Store a measured trial: every attribute first, then the value and constraint (or FAIL)."""
    attrs = {
        "outcome": result.outcome.value,
        "peak_bytes": result.peak_bytes,
        "memory_method": result.memory_method,
        "samples_per_sec": result.samples_per_sec,
        "log_dir": result.log_dir,
        "error": result.error.strip().splitlines()[0][:500] if result.error else None,
    }
    for name, value in attrs.items():
        trial.set_user_attr(name, value)
    if result.outcome in (Outcome.COMPLETE, Outcome.OOM):
        trial.set_constraint(
            "memory", constraint_mib(result.peak_bytes, limit, result.outcome is Outcome.COMPLETE)
        )
        study.tell(trial, result.samples_per_sec or 0.0)
    else:
        study.tell(trial, state=TrialState.FAIL)


def best_record(records: list[TrialRecord], limit: int) -> TrialRecord | None:
    fitting = [r for r in records if r.kind in ("measured", "warm-start") and r.fits(limit)]
    return max(fitting, key=lambda r: r.samples_per_sec or 0.0, default=None)


def _worker_state(worker: str, host: str) -> str:
    """'alive' or 'dead' for a worker id of this host (the pid's start time guards against pid reuse);
    'unknown' for another host's: only a heartbeat could tell."""
    parts = worker.split(":")
    if len(parts) != 3 or parts[0] != host or not parts[1].isdigit():
        return "unknown"
    try:
        start = Path(f"/proc/{parts[1]}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "dead"
    return "alive" if start == parts[2] else "dead"
