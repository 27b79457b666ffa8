"""``autotune.tune(spec)``: the product's main job, from a script and a budget to a verified, stored plan,
run by the process that asks for it (with its other GPUs helping), recorded as a job that any worker sharing
the database can help with.

1. Resolve the job (autotune.search.resolve): device, budget, workload; the workload's first trial is the
   probe, whose repeated module classes and operator kinds define the default plan space and seed the
   memory model.
2. The study key (workload, budget, headroom, space, trial lengths) names the study. A study with a stored
   winner answers at once with zero trials (``force`` re-tunes from scratch).
3. A new study starts from the trials measured for other budgets of the same workload; a study
   interrupted earlier resumes: its dead trials are failed and retried once.
4. :class:`~autotune.search.loop.Search` runs until the study holds ``trials`` counted trials.
5. The fastest fitting configuration is verified (autotune.search.verify) before it is stored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import optuna

from autotune.core.errors import NoFitError, ScriptError, StorageError, StorageFault
from autotune.hardware.devices import Device, device_groups, gpu_count
from autotune.hardware.nvml import nvml_loader
from autotune.leases.heartbeat import Heartbeat
from autotune.leases.identity import worker_id
from autotune.search.cost import Cost, default_limit
from autotune.search.optuna_trials import records_of
from autotune.search.reporting import Reporter, SilentReporter
from autotune.search.resolve import ResolvedJob, resolve
from autotune.search.runner import Executor
from autotune.search.spec import TuneResult, TuneSpec
from autotune.search.study import open_study
from autotune.search.verify import verify
from autotune.storage import JobState
from autotune.trials.interrupts import InterruptShield, StopRequested
from autotune.workers.jobs import job_row
from autotune.workers.lines import LineReporter
from autotune.workers.signing import JobKey, Trust, load_key, signature_round
from autotune.workers.worker import Worker

if TYPE_CHECKING:
    from autotune.cluster.ray_executor import RayCluster


def tune(
    spec: TuneSpec,
    environ: Mapping[str, str] | None = None,
    reporter: Reporter | None = None,
    nvml: Any = None,
    executor: Executor | None = None,
) -> TuneResult:
    """Find, verify and store the fastest configuration whose measured peak fits ``spec.budget``.
    ``executor``: where trials run when not in processes of their own here (autotune.finder: the caller's
    process); ``--executor ray`` is the spec's.

    Raises:
        InputError, DeviceError: bad spec or device. StorageError: the database.
        ScriptError: the script failed in its trials. NoFitError: nothing fits (every trial is kept).
    """
    reporter = reporter or SilentReporter()
    env = dict(os.environ if environ is None else environ)
    started = time.monotonic()
    with InterruptShield() as shield:  # from the probe on: a Ctrl-C stops a trial cleanly, never a write
        result = _tune(spec, env, reporter, nvml, shield, executor)
    return dataclasses.replace(result, seconds=time.monotonic() - started)


def _tune(
    spec: TuneSpec,
    env: dict[str, str],
    reporter: Reporter,
    nvml: Any,
    shield: InterruptShield,
    executor: Executor | None,
) -> TuneResult:
    worker = worker_id()
    key = load_key(env) or JobKey.of_this_run()  # checked before the probe; signs the job its helpers run
    if executor is not None:
        return _tune_on(spec, env, reporter, nvml, shield, worker, key, None, executor)
    with _executor(spec, env, reporter, nvml) as cluster:
        return _tune_on(spec, env, reporter, nvml, shield, worker, key, cluster)


def _tune_on(
    spec: TuneSpec,
    env: dict[str, str],
    reporter: Reporter,
    nvml: Any,
    shield: InterruptShield,
    worker: str,
    key: JobKey,
    cluster: RayCluster | None,
    executor: Executor | None = None,
) -> TuneResult:
    started = time.monotonic()
    job = resolve(spec, env, reporter, nvml, worker, shield=shield, executor=executor or cluster)
    resolved = time.monotonic()
    for line in job.left_out(named=True):
        reporter.note(line)
    name = job.study_row.study_name
    previous = job.store.job(name) if spec.force else None
    if spec.force:
        job.store.forget_study(name)
    elif (cached := job.store.best(name)) is not None:
        reporter.note(f"zero trials: answered from {job.store.display_url} (study {name}); --force re-tunes")
        study = optuna.load_study(study_name=name, storage=job.store.optuna)
        return job.result(cached, study, new_trials=0, stopped=None, cached=True)
    study = open_study(job.store, job.study_row, spec.seed, job.limit.bytes)
    for line in job.left_out(named=False):
        reporter.note(line)
    # --force: a new round of the job, which workers that ran the last one run too (autotune.workers.signing)
    round = signature_round(previous.signature) + 1 if previous is not None else 0
    row = job_row(spec, name, worker, JobState.RUNNING, key, round)
    if job.store.submit_job(row).signature != row.signature:
        job.store.replace_job(row)  # an earlier run's job, or one submitted with another key: this run's now
    job.store.set_job_state(name, JobState.RUNNING)
    cost = _cost(spec, job.probes_run, started, resolved, study)
    search = job.search(study, reporter, worker, cost)
    if recovered := search.recovery.recover():
        reporter.note(f"resuming study {name}: {recovered}")
    helpers = _helper_devices(spec, job.device, env, nvml) if cluster is None and executor is None else ()
    with (
        Heartbeat(job.store, worker),
        _helping(spec, name, helpers, env, reporter, nvml, key, cost),
        _slots(job, cluster, spec, reporter, worker, cost, shield) as others_done,
    ):
        try:
            searching = time.monotonic()
            stopped = search.run()
            others_done()  # --executor ray: every trial the run's other searches paid for is in the study
            verifying = time.monotonic()
            best = verify(search, spec.verify_settings)
            verified = time.monotonic()
        except (ScriptError, NoFitError) as e:
            job.store.set_job_state(name, JobState.FAILED, str(e))
            raise
        except StorageFault as e:  # open again, for the next run or a worker, once the storage is fixed
            with contextlib.suppress(StorageError):
                job.store.set_job_state(name, JobState.OPEN, f"interrupted: {e}")
            raise
        finally:
            job.runner.close()  # its warm process
    stages = (
        ("probe", resolved - started),
        ("search", verifying - searching),
        ("verification", verified - verifying),
    )
    return dataclasses.replace(job.result(best, study, cost.spent, stopped), stages=stages)


def _cost(spec: TuneSpec, probes: int, started: float, resolved: float, study: optuna.Study) -> Cost:
    """What this run may spend (autotune.search.cost): ``--trials`` trial runs of every kind, its probe's
    included (``probes``), and ``--time-limit`` from the run's start (its default from what the probe
    took)."""
    seconds = spec.time_limit
    if seconds is None:
        seconds = default_limit(resolved - started, records_of(study))
    deadline = started + seconds if seconds else None
    return Cost(deadline, seconds or None, trials=spec.trials, probes=probes)


@contextlib.contextmanager
def _executor(
    spec: TuneSpec, env: Mapping[str, str], reporter: Reporter, nvml: Any
) -> Iterator[RayCluster | None]:
    """The Ray cluster trials run on under ``--executor ray`` (connected, disconnected at the end); None:
    here."""
    if spec.executor != "ray":
        yield None
        return
    from autotune.cluster.ray_executor import RayCluster, describe

    cluster = RayCluster(
        command=spec.command,
        backend=spec.backend,
        settings=spec.settings,
        device=spec.device,
        gpus_per_trial=spec.gpus_per_trial,
        nodes_per_trial=spec.nodes_per_trial,
        address=spec.ray_address,
        cache=spec.cache_dir,
        host_budget=spec.host_budget,
        say=reporter.note,
        nvml=nvml,
    )
    reporter.note(
        f"Ray cluster {cluster.address}: trials of {cluster.shape} ({cluster.device.name}), "
        f"{cluster.slots()} at once; {describe(cluster.alive_nodes())}"
    )
    try:
        yield cluster
    finally:
        cluster.close()


@contextlib.contextmanager
def _slots(
    job: ResolvedJob,
    cluster: RayCluster | None,
    spec: TuneSpec,
    reporter: Reporter,
    worker: str,
    cost: Cost,
    shield: InterruptShield,
) -> Iterator[Callable[[], None]]:
    """Under ``--executor ray``, while the block runs: as many more searches of the study, in threads, as
    the cluster can place trials at once beside the block's own (at most ``--trials``). Each is a Search
    like a worker's: its configurations leased, its trial lines said as a helper's. The block is given a
    function that waits until every one of them has ended its search: the block's own search may find the
    run's --trials spent and nothing it can see running while another has paid for the last run and not yet
    leased it; verifying then found the study empty and ended "no trial completed" while that trial ran
    (CI's Ray recipe test, twice). On leaving, they are stopped and their running trials released."""
    count = min(cluster.slots(), spec.trials) - 1 if cluster is not None else 0
    if cluster is None or count < 1:
        yield lambda: None
        return
    stop = threading.Event()
    lock = threading.Lock()

    def search(slot: int) -> None:
        runner = cluster.runner(job.device, job.limit.budget_bytes, stop, None)
        lines = LineReporter(f"ray:{slot}", reporter.note, lock)
        try:
            study = open_study(job.store, job.study_row, spec.seed, job.limit.bytes)
            dataclasses.replace(job, runner=runner).search(study, lines, worker, cost).run()
        except StopRequested:
            return
        except Exception as e:  # one slot that cannot go on must not stop the run: the others carry it
            lines.note(f"stopped: {str(e).splitlines()[0] if str(e) else type(e).__name__}")

    threads = [
        threading.Thread(target=search, args=(i,), name=f"autotune-ray-{i}") for i in range(1, count + 1)
    ]
    for thread in threads:
        thread.start()

    def done() -> None:
        for thread in threads:
            while thread.is_alive():
                thread.join(timeout=0.5)
                shield.check()  # a Ctrl-C while they finish: at once

    try:
        yield done
    finally:
        stop.set()
        for thread in threads:
            thread.join()


def _helper_devices(spec: TuneSpec, device: Device, env: Mapping[str, str], nvml: Any) -> tuple[str, ...]:
    """``spec.helpers``, or with ``--device auto`` on a GPU every other visible GPU (in groups of
    ``--gpus-per-trial``; GPUs left over that make no whole group stay idle)."""
    if spec.helpers is not None:
        return spec.helpers
    if spec.device.strip().lower() != "auto" or device.kind != "cuda":
        return ()
    count = gpu_count(env, nvml_loader(nvml))
    count -= count % spec.gpus_per_trial
    return tuple(device_groups([f"cuda:{i}" for i in range(count)], spec.gpus_per_trial)[1:])


@contextlib.contextmanager
def _helping(
    spec: TuneSpec,
    study: str,
    devices: tuple[str, ...],
    env: dict[str, str],
    reporter: Reporter,
    nvml: Any,
    key: JobKey,
    cost: Cost,
) -> Iterator[None]:
    """Run this job's trials on ``devices`` too while the block runs: a Worker restricted to the job, in a
    thread of this process, sharing the work through the leases like any other worker, and the run's
    ``cost`` (its trial runs count toward the run's --trials). On leaving (done, error or Ctrl-C) its
    running trials are stopped and released."""
    if not devices:
        yield
        return
    helper = Worker(
        spec.storage_url,
        list(devices),
        spec.cache_dir,
        env,
        once=True,
        jobs=(study,),
        say=reporter.note,
        nvml=nvml,
        trust=Trust(key),
        cost=cost,
    )

    def work() -> None:
        try:
            helper.run()
        except Exception as e:  # a helper device that cannot work must not stop the run
            reporter.note(f"helper devices {', '.join(devices)} stopped: {e}")

    thread = threading.Thread(target=work, name="autotune-helpers")
    thread.start()
    try:
        yield
    finally:
        helper.stop.set()
        thread.join()
