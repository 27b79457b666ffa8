"""A tuning job resolved against this machine and database, before any search: the device and the budget
on it, the workload and its probe (run here if it is new), the search space, and the study that holds it."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import optuna

from autotune.backends.probe import GPU_ONLY, check_plans, fixed_saving, forward_share, saving_per_sample
from autotune.backends.probe_report import ProbeReport, TorchProbeReport
from autotune.core.budget import Limit
from autotune.core.paths import cache_dir
from autotune.core.plans import Backend, offloads
from autotune.hardware.devices import Device, resolve_trial_device
from autotune.hardware.host import host_budget_of
from autotune.hardware.meters import make_meter
from autotune.hardware.nvml import nvml_loader
from autotune.leases.watch import grace_seconds
from autotune.search.cost import Cost
from autotune.search.loop import Search
from autotune.search.naming import default_study_name, study_key
from autotune.search.optuna_trials import records_of
from autotune.search.probing import check_named_plans, discover
from autotune.search.reporting import Reporter
from autotune.search.runner import Executor, Runner, TrialRunner
from autotune.search.space import SearchSpace, build_space
from autotune.search.spec import TuneResult, TuneSpec
from autotune.search.study import check_ours
from autotune.storage import BestRow, Store, StudyRow, open_store
from autotune.trials.interpreter import check_interpreter, interpreter_of
from autotune.trials.interrupts import InterruptShield
from autotune.trials.workload import Workload, workload_of


@dataclass(frozen=True)
class ResolvedJob:
    spec: TuneSpec
    device: Device
    limit: Limit
    store: Store
    workload: Workload
    space: SearchSpace
    study_row: StudyRow
    savings: dict[str, float]  # the probe's predicted saving per sample of each plan
    runner: Runner
    probes_run: int  # trials the probe took in this process (0 or 1)
    forward_shares: dict[str, float]  # the probe's share of the forward pass each plan repeats
    fixed_bytes: int | None  # the probe's weights, gradients and optimizer state
    transfer: dict[str, float]  # an offload plan's least seconds per sample to the host and back
    fixed_savings: dict[str, float]  # the probe's: what a sharding plan frees a rank whatever the batch size

    def left_out(self, named: bool) -> list[str]:
        """The plans the search leaves out, each with why: ``named``, those the user named (said at once,
        a zero-trial answer included: they are the user's request); else the probe's own, said once a
        search starts and only where the model is why, not the device (issue 44: "plan Block:1/offload
        left out: GPU only" on every CPU run, a zero-trial answer included)."""
        asked = set(self.spec.plans or ())
        return [
            f"plan {plan} left out: {why}"
            for plan, why in self.space.excluded.items()
            if (plan in asked) == named and (named or not why.startswith(GPU_ONLY))
        ]

    def search(
        self, study: optuna.Study, reporter: Reporter, worker: str, cost: Cost | None = None
    ) -> Search:
        return Search(
            study,
            self.space,
            self.limit.bytes,
            self.runner,
            self.spec.trials,
            reporter,
            self.store,
            self.savings,
            grace=grace_seconds(),
            worker=worker,
            forward_shares=self.forward_shares,
            fixed_bytes=self.fixed_bytes,
            transfer=self.transfer,
            fixed_savings=self.fixed_savings,
            headroom=self.limit.headroom,
            exhaustive=self.spec.exhaustive,
            sweep=self.spec.backend is Backend.TORCH
            and not self.spec.settings.phases  # a phase runs once, after the last plan: no plan's peak
            and (
                self.spec.sweep
                if self.spec.sweep is not None
                else self.device.kind == "cuda" and not self.spec.warm  # warm trials measure a plan for less
            ),
            cost=cost,
        )

    def result(
        self, best: BestRow, study: optuna.Study, new_trials: int, stopped: str | None, cached: bool = False
    ) -> TuneResult:
        return TuneResult(
            study_name=self.study_row.study_name,
            storage=self.store.display_url,
            device_name=self.device.name,
            budget_bytes=self.limit.budget_bytes,
            limit_bytes=self.limit.bytes,
            best=best,
            records=tuple(records_of(study)),
            cached=cached,
            new_trials=new_trials,
            stopped=stopped,
            global_batch=self.space.global_batch,
            grad_accum=self.space.grad_accum(best.batch_size),
            max_seq_len=self.space.max_seq_len,
        )


def resolve(
    spec: TuneSpec,
    environ: Mapping[str, str],
    reporter: Reporter,
    nvml: Any,
    worker: str,
    stop: threading.Event | None = None,
    store: Store | None = None,
    shield: InterruptShield | None = None,
    executor: Executor | None = None,
) -> ResolvedJob:
    """Device, budget, database, workload, probe (run if new), search space and study name of ``spec``.

    ``store``: the database already open on ``spec.storage`` (a worker's, shared by all its jobs: one
    engine and connection pool per process, not one per job); opened here if None. ``shield``: the
    caller's active Ctrl-C shield (see autotune.trials.interrupts); the probe and every later trial of the
    job's runner run inside it. ``executor``: where trials run when not here (autotune.cluster): the device
    comes from it, and its runner places each trial, the probe included.

    Raises:
        InputError, DeviceError: the device or the budget on it. StorageError: the database.
        ScriptError: the probe's trial failed.
    """
    device = (
        resolve_trial_device(spec.device, spec.gpus_per_trial, environ, nvml_loader(nvml))
        if executor is None
        else executor.device
    )
    limit = spec.budget.limit(device.total_bytes, spec.headroom)
    check_interpreter(spec.command, environ)  # before the probe: the command's python can run the script
    store = store or open_store(spec.storage_url)
    workload = workload_of(spec.command, device, spec.backend, spec.function)
    shown = str(spec.command) if spec.function is None else f"[in process: {spec.function}] {spec.command}"
    store.add_workload(workload.fingerprint, workload.script, shown, device.name, workload.details)
    runner: Runner = (
        TrialRunner(
            spec.command, spec.backend, device, make_meter(device, nvml), spec.settings,
            cache_dir(spec.cache_dir), environ, limit.budget_bytes, host_budget_of(spec.host_budget),
            stop=stop, shield=shield, warm=spec.warm, say=reporter.note,
        )
        if executor is None
        else executor.runner(device, limit.budget_bytes, stop, shield)
    )  # fmt: skip
    if spec.study is not None:
        check_ours(store, spec.study)  # before the probe: a user's own study is refused without a trial
    python = interpreter_of(spec.command, environ)
    probe, probes_run = discover(store, workload, spec, runner, reporter, worker, python)
    check_plans(spec.plans, probe)  # before any measured trial
    named = [p for p in spec.plans or () if p != "none"]
    if probe is None and spec.backend is Backend.TORCH and named:
        # nothing autotune can check or apply them to: the script reads AUTOTUNE_PLAN itself, or not
        reporter.note(
            f"the probe saw the script train no torch module: plans {', '.join(named)} reach it only as "
            "AUTOTUNE_PLAN, which autotune can neither check nor apply (a script that reads it applies them "
            "itself)"
        )
    probe = check_named_plans(store, workload, spec, runner, reporter, probe)
    space = build_space(
        spec.batch_sizes,
        spec.plans,
        probe,
        spec.global_batch,
        spec.grad_accum,
        spec.world_size,
        spec.max_seq_len,
    )
    row = _study_row(spec, workload, limit, space)
    return ResolvedJob(
        spec, device, limit, store, workload, space, row, _savings(probe, space), runner, probes_run,
        _forward_shares(probe, space), _fixed_bytes(probe), _transfer(probe, space),
        _fixed_savings(probe, space),
    )  # fmt: skip


def _study_row(spec: TuneSpec, workload: Workload, limit: Limit, space: SearchSpace) -> StudyRow:
    """The study that holds this job: keyed by the workload and everything the search was asked."""
    steps = (spec.settings.warmup_steps, spec.settings.measured_steps)
    key = study_key(workload, limit.budget_bytes, spec.headroom, space.as_dict(), steps, spec.settings.phases)
    name = spec.study or default_study_name(workload, key)
    return StudyRow(name, workload.fingerprint, key, limit.budget_bytes, spec.headroom, space.as_dict())


def _fixed_savings(probe: ProbeReport | None, space: SearchSpace) -> dict[str, float]:
    """What the probe says each sharding plan of the space frees a rank whatever the batch size (negative:
    holds more); plans it says nothing of are left out."""
    if probe is None:
        return {}
    known = {plan: float(fixed_saving(probe, plan)) for plan in space.uniform_plans}
    return {plan: saving for plan, saving in known.items() if saving}


def _forward_shares(probe: ProbeReport | None, space: SearchSpace) -> dict[str, float]:
    """The share of the forward pass each plan of the space repeats, by the probe (none without one)."""
    if probe is None:
        return {}
    shares = {plan: forward_share(probe, plan) for plan in space.uniform_plans if plan != "none"}
    return {plan: share for plan, share in shares.items() if share is not None}


# The fastest host link a GPU has, per direction: PCIe 5.0 x16 (64 GB/s). An offload plan's copies can go no
# faster, so its time per sample is a bound on how slow it is (NVLink-C2C hosts are faster: a bound still).
HOST_LINK_BYTES_PER_SECOND = 64e9


def _transfer(probe: ProbeReport | None, space: SearchSpace) -> dict[str, float]:
    """Each offload plan's least seconds per sample moving what it saves to the host and back (its
    predicted saving per sample, twice, over HOST_LINK_BYTES_PER_SECOND)."""
    if probe is None:
        return {}
    seconds = {}
    for plan in space.uniform_plans:
        if offloads(plan):
            saving = saving_per_sample(probe, plan)
            if saving:
                seconds[plan] = 2 * saving / HOST_LINK_BYTES_PER_SECOND
    return seconds


def _fixed_bytes(probe: ProbeReport | None) -> int | None:
    """What every configuration holds whatever its batch size or plan: weights, gradients and optimizer
    state, by the probe (None without one, or for an ORT probe, which knows only the weights)."""
    if not isinstance(probe, TorchProbeReport):
        return None
    return probe.weights_bytes + probe.gradients_bytes + (probe.optimizer_state_bytes or 0)


def _savings(probe: ProbeReport | None, space: SearchSpace) -> dict[str, float]:
    """The probe's predicted saving per sample of every plan in the space (none without a probe)."""
    if probe is None:
        return {}
    return {plan: saving_per_sample(probe, plan) for plan in space.uniform_plans if plan != "none"}
