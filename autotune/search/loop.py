"""The search loop: Optuna ask/tell over batch size x plan, steered by the memory model, shared by workers.

Each round does one thing, in this order:

1. a queued lease — a configuration to measure again (the one retry after a dead worker, or a trial a
   stopping worker released);
2. calibration — the first plan at the smallest batch sizes until the model is calibrated;
3. the frontier — for each plan, the largest batch size that fits (measured, or predicted by the model);
4. the sampler (TPE) — everything else. Its proposals that the model predicts cannot fit (beyond
   SKIP_MARGIN) are recorded as ``skipped`` without running; re-proposals of a measured configuration are
   recorded as ``copy`` with the same result. Neither counts as a trial. After DIRECT_AFTER such misses
   in a row the untried configurations are taken directly (autotune.search.propose.untried), so
   ``--exhaustive`` reaches ``--trials`` or says truthfully that nothing is left.

Re-measurements (autotune.search.noise: readings that disagree, or a busy machine's readings that decide
the stop) are trials like any other, leased with attempts from REMEASURE_ATTEMPT up, but second opinions
on a trial counted already: they take no slot of ``--trials`` (at most MAX_READINGS readings of one
configuration bound them).

Any number of searches, in processes on any hosts, can work on one study. A configuration is *leased* in
the database (``Store.claim``: a unique key) before its trial is asked for, so exactly one worker measures
it, on SQLite as on PostgreSQL. (Optuna's own queue, ``enqueue_trial``, hands one queued trial to several
workers on SQLite: docs/reliability.md §4.) Workers heartbeat their leases; a lease whose worker died — a dead
pid on this host, or beats that stopped for the grace period — is failed with its trial, and its
configuration is queued once more (attempt 1), never twice.

An OOM or over-budget trial is a COMPLETE trial with a violated ``memory`` constraint: Optuna's samplers
ignore FAILed trials and would propose the same OOM again.
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable

import optuna
from optuna.trial import TrialState

from autotune.core.budget import format_bytes
from autotune.core.errors import DamagedData, InputError, NoFitError, ScriptError, StorageFault, TrialLost
from autotune.core.protocol import Outcome
from autotune.leases.identity import worker_id
from autotune.leases.watch import DEFAULT_GRACE_SECONDS
from autotune.search.calibration import hopeless
from autotune.search.cost import Cost
from autotune.search.memory_model import MemoryModel
from autotune.search.noise import REMEASURE_ATTEMPT
from autotune.search.optuna_trials import (
    ask_fixed,
    distributions,
    records_of,
    set_memory_constraint,
    tell_result,
)
from autotune.search.propose import (
    Finished,
    Proposal,
    model_of,
    predict_peak,
    propose,
    speed_of,
    untried,
)
from autotune.search.records import (
    SECOND_OPINIONS,
    WARM_EXCESS,
    Configuration,
    ProposedBy,
    TrialKind,
    TrialRecord,
    best_record,
    constraint_mib,
)
from autotune.search.recovery import Recovery
from autotune.search.reporting import Reporter
from autotune.search.runner import Runner
from autotune.search.space import SearchSpace
from autotune.search.sweep import sweep_of
from autotune.storage import Lease, LeaseKind, LeaseState, Store
from autotune.trials.interrupts import InterruptShield, StopRequested
from autotune.trials.result import TrialResult, misconfigured

SKIP_MARGIN = 0.10  # skip only what the model predicts over the limit by more than this
MAX_MISSES = 40  # sampler proposals in a row that were skipped or copies: the space is exhausted
DIRECT_AFTER = 3  # sampler misses in a row after which the untried configurations are taken directly
MAX_FAILURES = 3  # script failures in a row (not OOMs) before giving up


class Step(enum.Enum):
    """What one round of a search did."""

    RAN = "ran"  # a trial was measured
    MISSED = "missed"  # a proposal was skipped, copied, or taken by another worker first
    BUSY = "busy"  # nothing to do here until other workers' trials end
    FINISHED = "finished"  # the study holds its trials, or nothing new is left to try


class Search:
    """Runs trials of one study until it holds ``target`` counted trials or the space is exhausted."""

    def __init__(
        self,
        study: optuna.Study,
        space: SearchSpace,
        limit: int,
        runner: Runner,
        target: int,
        reporter: Reporter,
        store: Store,
        savings: dict[str, float] | None = None,
        grace: float = DEFAULT_GRACE_SECONDS,
        worker: str | None = None,
        forward_shares: dict[str, float] | None = None,
        fixed_bytes: int | None = None,
        transfer: dict[str, float] | None = None,
        headroom: float = 0.0,
        exhaustive: bool = False,
        sweep: bool = False,
        cost: Cost | None = None,
        fixed_savings: dict[str, float] | None = None,
    ) -> None:
        self.study = study
        self.space = space
        self.limit = limit  # bytes a measured peak must stay under
        self.runner = runner
        self.target = target
        self.reporter = reporter
        self.store = store
        self.savings = savings or {}  # the probe's predicted saving per sample of each plan
        # the probe's: what a sharding plan frees a rank whatever the batch size (MemoryModel)
        self.fixed_savings = fixed_savings or {}
        self.forward_shares = forward_shares or {}  # the probe's share of the forward pass each plan repeats
        self.transfer = transfer or {}  # an offload plan's least seconds per sample to the host and back
        self.fixed_bytes = fixed_bytes  # the probe's weights, gradients and optimizer state
        self.headroom = headroom
        self.exhaustive = exhaustive
        self.sweep = sweep  # measure the plans without a reading in one process (autotune.search.sweep)
        self.cost = cost or Cost()  # what the run may spend: trial runs, time (autotune.search.cost)
        self.stopped: str | None = None  # why the search stopped before ``target`` trials
        self.worker = worker or worker_id()
        self.device = str(runner.device)
        self.recovery = Recovery(study, store, self.worker, grace)
        self.shield = runner.shield or InterruptShield()  # entered by the tuner (autotune.workers.tune)
        self.distributions = distributions(space)
        self.trials_run = 0
        self.misses = 0
        self.failures = 0
        self.host_capped: set[str] = set()  # offload plans the host budget caps, said once each

    @property
    def name(self) -> str:
        return self.study.study_name

    def run(self, poll_seconds: float = 0.5) -> str | None:
        """Search until the study is finished; why it stopped before ``target`` trials (None if it did not).

        Raises:
            NoFitError: the budget is hopeless (see autotune.search.calibration.hopeless).
            ScriptError: the script failed (see ``_count_failure``).
        """
        while True:
            step = self.step()
            if step is Step.FINISHED:
                return self.stopped
            if step is Step.BUSY:
                time.sleep(poll_seconds)

    def step(self) -> Step:
        """One round: a queued lease, else the model's proposal, else the sampler's. Each trial run is paid
        for from the run's cost before it starts (``_paid``), and refunded where nothing ran."""
        self.shield.check()  # a Ctrl-C between trials: nothing is asked yet, nothing to clean up
        self.recovery.recover()
        if self._queued_lease():
            return Step.RAN
        records = records_of(self.study)
        leases = self.store.leases(self.name, kinds=(LeaseKind.TRIAL,))
        busy = any(lease.state in (LeaseState.RUNNING, LeaseState.QUEUED) for lease in leases)
        counted = sum(r.counted for r in records)
        if counted >= self.target or self.misses >= MAX_MISSES:
            if self.misses >= MAX_MISSES:
                self._stop(
                    f"stopped after {counted} trials: every configuration left is predicted not to fit "
                    "or was measured already",
                    counted,
                )
            return Step.BUSY if busy else Step.FINISHED
        model = model_of(records, self.savings, self.runner.host_budget, self.limit, self.fixed_savings)
        self._note_host_caps(model)
        self._check_hopeless(records, model)
        taken = {Configuration(x.batch_size, x.plan) for x in leases}
        if self.sweep and (swept := sweep_of(records, model, self.space, self.limit, taken)) is not None:
            return self._paid(records, lambda: self._sweep_slot(swept, records, model, counted))
        speed = speed_of(records, self.forward_shares, self.transfer, self.limit)
        proposal = propose(records, model, speed, self.space, self.limit, taken, self.exhaustive)
        if proposal is None and self.misses >= DIRECT_AFTER:  # the sampler repeats itself
            left = untried(records, model, self.space, self.limit, taken, SKIP_MARGIN)
            proposal = (
                Proposal(*left[0], ProposedBy.UNTRIED)
                if left
                else Finished("every configuration that could fit was measured (or is under way)")
            )
        if isinstance(proposal, Finished):
            if busy:  # other workers' trials may still raise the incumbent or prove a candidate
                return Step.BUSY
            self._stop(f"stopped after {counted} trials: {proposal.reason}", counted)
            return Step.FINISHED
        if proposal is None and not (model.calibrated and model.resolved) and busy:
            return Step.BUSY  # other workers are measuring the calibration trials: wait for their peaks
        return self._paid(records, lambda: self._propose_slot(proposal, records, model, counted))

    def _queued_lease(self) -> bool:
        """Run a queued lease (a dead worker's trial, or one a stopping worker released), if one is queued
        and the run can pay for it; whether one ran. One it cannot pay for is left to a later run or a
        worker."""
        if not self.cost.take_run():
            return False
        try:  # paid for while it looks: another search that finds the purse spent meanwhile waits (in_flight)
            lease = self.store.take_queued(self.name, self.worker, self.device, kinds=(LeaseKind.TRIAL,))
            if lease is None:
                self.cost.ended(ran=False)
                return False
            self._progress(sum(r.counted for r in records_of(self.study)), None)
            self._run_lease(
                self.taken_lease(lease), ProposedBy.RETRY if lease.attempt else ProposedBy.RELEASED
            )
        except BaseException:
            self.cost.ended(ran=True)  # an exception ends the run: what it paid no longer matters
            raise
        self.cost.ended(ran=True)
        return True

    def _sweep_slot(
        self, swept: tuple[int, list[str]], records: list[TrialRecord], model: MemoryModel, counted: int
    ) -> Step:
        slot = self.store.take_slot(self.name, self.target, self.worker)
        if slot is None:  # other workers are measuring the study's last trials
            return Step.BUSY
        self._progress(counted, None)
        step = self._sweep(*swept, records, model)
        if step is not Step.RAN:
            self.store.forget_slot(self.name, slot)
        return step

    def _propose_slot(
        self, proposal: Proposal | None, records: list[TrialRecord], model: MemoryModel, counted: int
    ) -> Step:
        if proposal is not None and proposal.why in SECOND_OPINIONS:  # no slot of the study
            self._progress(counted, proposal.contenders)
            if proposal.why is ProposedBy.FRESH:
                self.reporter.note(
                    f"{proposal.plan}@{proposal.batch_size} is read again in a process of its own: a warm "
                    f"process read it over the limit by less than the {WARM_EXCESS:.0%} its heap can add"
                )
            return self._proposed(proposal)
        slot = self.store.take_slot(self.name, self.target, self.worker)
        if slot is None:  # other workers are measuring the study's last trials
            return Step.BUSY
        self._progress(counted, proposal.contenders if proposal is not None else None)
        step = self._proposed(proposal) if proposal is not None else self._sample(records, model)
        if step is not Step.RAN:  # nothing was measured: the slot is free again
            self.store.forget_slot(self.name, slot)
        return step

    def _paid(self, records: list[TrialRecord], start: Callable[[], Step]) -> Step:
        """``start`` a trial run paid for from the run's cost (autotune.search.cost), refunded where it ran
        nothing; where what is left of --trials or --time-limit is the verification's, the search's end,
        said once. Other workers' running trials are then waited for (they may raise the incumbent), and
        this run's other searches' paid runs (``--executor ray``: one paid for its last run and had not
        claimed its lease yet when the other found nothing running, verified, and found no trial fitting);
        queued ones are left to them or to a later run."""
        spent = self.cost.take(records)
        if spent is not None:
            counted = sum(r.counted for r in records)
            self._stop(f"stopped after {counted} trials: {spent}", counted)
            leases = self.store.leases(self.name, kinds=(LeaseKind.TRIAL,))
            running = any(x.state is LeaseState.RUNNING for x in leases)
            return Step.BUSY if running or self.cost.in_flight > 0 else Step.FINISHED
        try:
            step = start()
        except BaseException:
            self.cost.ended(ran=True)  # an exception ends the run: what it paid no longer matters
            raise
        self.cost.ended(ran=step is Step.RAN)
        return step

    def _progress(self, counted: int, contenders: int | None) -> None:
        """The status line's count: this run's trial runs against --trials where the run has that ceiling
        (each said as it is spent), else the study's counted trials against its target (a worker's)."""
        if self.cost.trials is not None:
            self.reporter.searching(self.cost.spent, self.cost.trials, contenders)
        else:
            self.reporter.searching(counted, self.target, contenders)

    def _stop(self, reason: str, counted: int) -> None:
        if self.stopped is None:
            self.stopped = reason
            self.reporter.note(reason)
            self._progress(counted, 0)

    def _note_host_caps(self, model: MemoryModel) -> None:
        """Say once per plan where the host budget caps an offload plan's batch sizes (issue 31: an offload
        trial proposed at batch 24 pinned ~69 GB and the kernel killed it)."""
        for plan in self.space.uniform_plans:
            cap = model.host_cap(plan)
            if cap is None or cap >= self.space.batch_sizes[-1] or plan in self.host_capped:
                continue
            self.host_capped.add(plan)
            per_sample = model.saving(plan) or 0.0
            self.reporter.note(
                f"plan {plan} kept to batch {cap} at most: its pinned host memory, {format_bytes(int(per_sample))} "
                f"per sample, would pass the host budget of {format_bytes(model.host_limit or 0)} above it "
                "(--host-budget)"
            )

    def _check_hopeless(self, records: list[TrialRecord], model: MemoryModel) -> None:
        """End a hopeless search before another trial: the probe's fixed memory alone passes the limit, or
        every plan was measured not to fit at the smallest batch (no plan's failure proves another's).

        Raises:
            NoFitError: one line with the smallest peak and the budget it would need.
        """
        if self.fixed_bytes is not None and self.fixed_bytes > self.limit:
            raise NoFitError(
                f"no configuration fits {format_bytes(self.limit)} (budget minus headroom): the model's "
                f"weights, gradients and optimizer state alone take {format_bytes(self.fixed_bytes)} (the "
                f"probe's count); it needs a budget of more than {self.budget_for(self.fixed_bytes)}"
            )
        why = hopeless(records, model, self.space, self.limit)
        if why is not None:
            lowest = min((r.peak_bytes or 0 for r in records if r.measured), default=0)
            raise NoFitError(f"{why}; it needs a budget of at least {self.budget_for(lowest)}")

    def budget_for(self, peak: int) -> str:
        """The least budget whose limit (less the headroom) a peak of ``peak`` bytes fits."""
        return format_bytes(math.ceil(peak / (1 - self.headroom)))

    def ask_fixed(self, batch: int, plan: str) -> optuna.Trial:
        """A new trial of (``batch``, ``plan``), which every trial the search measures passes through.

        Raises:
            DamagedData: the configuration is not in the job's search space (it came from a lease or a
                trial that a writer of the database edited).
        """
        self.check_in_space(batch, plan, "a configuration")
        return ask_fixed(self.study, self.distributions, batch, plan)

    def taken_lease(self, lease: Lease) -> Lease:
        """A queued ``lease`` this worker took, checked: one outside the job's search space is failed here.

        Raises:
            DamagedData: it was.
        """
        try:
            self.check_in_space(lease.batch_size, lease.plan, f"lease {lease.id}")
        except DamagedData:
            self.store.end_lease(lease.id, LeaseState.FAILED, "damaged: not in the job's search space")
            raise
        return lease

    def check_in_space(self, batch: int, plan: str, what: str) -> None:
        """Raises DamagedData unless (``batch``, ``plan``) is in the job's (signed) search space."""
        if batch not in self.space.batch_sizes or plan not in self.space.plans:
            raise DamagedData(
                f"study {self.name!r}: {what} from the database names batch {batch!r} and plan {plan!r}, "
                "which are not in the job's search space (the database was edited)"
            )

    def _proposed(self, proposal: Proposal) -> Step:
        attempt = proposal.attempt
        if attempt >= REMEASURE_ATTEMPT:  # past every lease of it, a dead worker's claim included
            config = (proposal.batch_size, proposal.plan)
            leases = self.store.leases(self.name, kinds=(LeaseKind.TRIAL,))
            attempt = max([attempt, *(x.attempt + 1 for x in leases if (x.batch_size, x.plan) == config)])
        lease = self.store.claim(
            self.name,
            LeaseKind.TRIAL,
            proposal.batch_size,
            proposal.plan,
            attempt,
            self.worker,
            self.device,
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
        lease = self.store.claim(self.name, LeaseKind.TRIAL, batch, plan, 0, self.worker, self.device)
        if lease is None:
            trial.set_user_attr("kind", TrialKind.COPY.value)
            trial.set_user_attr("note", "measured by another worker")
            self.study.tell(trial, state=TrialState.PRUNED)
            self.misses += 1
            return Step.MISSED
        self._measure(trial, lease, predict_peak(records, model, self.space, batch, plan), ProposedBy.SAMPLER)
        return Step.RAN

    def _run_lease(self, lease: Lease, why: ProposedBy) -> None:
        trial = self.ask_fixed(lease.batch_size, lease.plan)
        trial.set_user_attr("worker", self.worker)
        if 0 < lease.attempt < REMEASURE_ATTEMPT:  # a retry (a re-measurement is no retry)
            first = self.store.lease(self.name, lease.kind, lease.batch_size, lease.plan, 0)
            trial.set_user_attr("retry_of", first.trial_number if first is not None else None)
        records = records_of(self.study)
        self._measure(
            trial,
            lease,
            predict_peak(
                records,
                model_of(records, self.savings, self.runner.host_budget, self.limit, self.fixed_savings),
                self.space,
                lease.batch_size,
                lease.plan,
            ),
            why,
        )

    def _skip_or_copy(
        self, trial: optuna.Trial, batch: int, plan: str, records: list[TrialRecord], model: MemoryModel
    ) -> bool:
        """Record a sampler proposal that need not run: a configuration measured already (``copy``), or one
        the model predicts over the limit by more than SKIP_MARGIN (``skipped``)."""
        # Only a finished trial is copied: another worker's trial may be half told (its outcome stored, its
        # peak not yet), and a copy of that was once stored as FAIL with outcome "complete".
        same = next(
            (r for r in records if (r.batch_size, r.plan) == (batch, plan) and r.counted and r.finished), None
        )
        predicted = predict_peak(records, model, self.space, batch, plan)
        if same is not None:
            trial.set_user_attr("kind", TrialKind.COPY.value)
            trial.set_user_attr("note", f"same configuration as trial {same.number}")
            self._tell_like(trial, same)
            return True
        if predicted is not None and predicted > self.limit * (1 + SKIP_MARGIN):
            trial.set_user_attr("kind", TrialKind.SKIPPED.value)
            trial.set_user_attr("predicted_peak_bytes", int(predicted))
            trial.set_user_attr("note", "the memory model predicts it cannot fit")
            self.study.tell(trial, state=TrialState.PRUNED)
            self.reporter.skipped(TrialRecord.from_frozen(self.study.trials[trial.number]))
            return True
        return False

    def _tell_like(self, trial: optuna.Trial, same: TrialRecord) -> None:
        for name in (
            "outcome",
            "peak_bytes",
            "samples_per_sec",
            "samples_per_sec_low",
            "samples_per_sec_high",
        ):
            value = getattr(same, name)
            trial.set_user_attr(name, value.value if isinstance(value, Outcome) else value)
        if same.measured and same.peak_bytes is not None:
            complete = same.outcome is Outcome.COMPLETE
            set_memory_constraint(trial, constraint_mib(same.peak_bytes, self.limit, complete))
            self.study.tell(trial, same.samples_per_sec or 0.0)
        else:
            self.study.tell(trial, state=TrialState.FAIL)

    def _measure(
        self, trial: optuna.Trial, lease: Lease, predicted: float | None, why: ProposedBy
    ) -> TrialResult | None:
        return self._measure_all([(trial, lease, predicted)], why)

    def _measure_all(
        self, runs: list[tuple[optuna.Trial, Lease, float | None]], why: ProposedBy
    ) -> TrialResult | None:
        """Run the trial of ``runs``' first configuration, the others' plans swept in the same process after
        it (autotune.search.sweep), and tell each its reading; a plan the sweep did not reach is released
        (measured later on its own). None: the trial was lost with its machine (each failed as interrupted,
        retried once)."""
        self.misses = 0
        first, lease, _ = runs[0]
        batch, plan = lease.batch_size, lease.plan
        for trial, each, predicted in runs:
            for key, value in {
                "kind": TrialKind.MEASURED.value,
                "proposed_by": why.value,
                "lease": each.id,
                "device": self.device,
                "predicted_peak_bytes": int(predicted) if predicted is not None else None,
                "process": first.number if len(runs) > 1 else None,
            }.items():
                if value is not None:
                    trial.set_user_attr(key, value)
            self.store.set_lease_trial(each.id, trial.number)
        self.reporter.trial_started(first.number, batch, plan, why)
        if len(runs) > 1:
            self.reporter.note(
                f"trial {first.number} measures {len(runs)} plans at batch {batch} in one process: "
                + ", ".join(each.plan for _, each, _ in runs)
            )
        try:
            result = self.runner(
                batch,
                plan,
                poll=self.reporter.trial_progress,
                interruptible=self.shield.allow,
                grad_accum=self.space.grad_accum(batch),
                sweep=tuple(each.plan for _, each, _ in runs[1:]),
                fresh=why is ProposedBy.FRESH,
            )
        except KeyboardInterrupt:
            for _, each, _ in runs:
                self.recovery.fail(each, "interrupted")
            raise
        except StopRequested:
            for trial, each, _ in runs:
                self.recovery.release(each, trial.number)
            raise
        except StorageFault as e:
            for trial, each, _ in runs:
                self.recovery.give_back(each, trial.number, e)
            raise
        except TrialLost as e:  # its cluster node went away: interrupted, not out of memory; retried once
            for _, each, _ in runs:
                self.recovery.fail(each, f"interrupted: {e}")
            self.reporter.note(
                f"trial {first.number} ({plan}@{batch}) interrupted: {e}"
                + ("; retried once" if lease.attempt == 0 else "")
            )
            return None
        results = [result, *result.sweep]
        for (trial, each, _), measured in zip(runs, results, strict=False):
            tell_result(self.study, trial, measured, self.limit)
            self.store.end_lease(each.id, LeaseState.DONE)
            self.trials_run += 1
        for trial, each, _ in runs[len(results) :]:
            last = results[-1]
            self.recovery.release(
                each, trial.number, f"the sweep ended before it, at plan {last.plan} ({last.outcome.value})"
            )
        records = records_of(self.study)
        best = best_record(records, self.limit)
        for trial, _, _ in runs[: len(results)]:
            self.reporter.trial_finished(records[trial.number], best)
        self._count_failure(result, records)
        return result

    def _sweep(self, batch: int, plans: list[str], records: list[TrialRecord], model: MemoryModel) -> Step:
        """The plans without a reading, measured at ``batch`` in one process (autotune.search.sweep): each
        leased (one another worker took first is left to it) and asked as a trial of its own."""
        runs = []
        for plan in plans:
            lease = self.store.claim(self.name, LeaseKind.TRIAL, batch, plan, 0, self.worker, self.device)
            if lease is not None:
                trial = self.ask_fixed(batch, plan)
                trial.set_user_attr("worker", self.worker)
                runs.append((trial, lease, predict_peak(records, model, self.space, batch, plan)))
        if not runs:
            return Step.MISSED
        self._measure_all(runs, ProposedBy.SWEEP)
        return Step.RAN

    def _count_failure(self, result: TrialResult, records: list[TrialRecord]) -> None:
        """Three script failures in a row (or the first trial's) end the search with the script's error; a
        script that ignores the batch size, or does not run a phase asked for, ends it at its first such
        trial (an InputError: exit 2).

        Raises:
            InputError: the model saw batches of another size than the trial asked for, the script did
                not run a phase asked for (--with-eval, --with-save), or --max-seq-len was given for a
                model whose inputs show no sequence length.
            ScriptError: the script failed.
        """
        if (why := misconfigured(result)) is not None:
            raise InputError(why)
        if (
            self.space.max_seq_len is not None
            and result.outcome is Outcome.COMPLETE
            and result.lengths is None
        ):
            raise InputError(
                f"--max-seq-len needs (batch, length) token inputs, and the model's first input was not "
                f"one (batch {result.batch_size}): pad the script's batches to the longest length where "
                f"autotune.worst_case() is true instead (trial log: {result.log_dir})"
            )
        self.failures = self.failures + 1 if result.outcome in (Outcome.FAILED, Outcome.TIMEOUT) else 0
        if self.failures >= MAX_FAILURES or (self.failures and sum(r.counted for r in records) == 1):
            raise ScriptError(
                f"the script failed in {self.failures} trial(s) in a row (logs: {result.log_dir}):\n"
                f"{result.error}"
            )
