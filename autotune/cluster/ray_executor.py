"""``autotune run --executor ray``: the search, its models, verification and the database stay in this process
(the driver); each trial runs on a Ray cluster, in a placement group reserved whole before it starts.

- A trial asks for ``--nodes-per-trial`` bundles of ``--gpus-per-trial`` GPUs (and one CPU; a CPU trial one
  CPU), packed on one node, or strictly spread over that many nodes. Ray places a group only when all of it
  is free ("gang" placement), so a trial never starts on part of its GPUs and no two trials share one.
- On each node of the group, autotune's own launcher and meters run the node's share of the trial
  (autotune.cluster.node): NVML or RSS per rank, as on one host. The driver merges the shares.
- Concurrency is the groups the cluster can place at once (:func:`groups_placeable`): the run searches in
  that many threads, each a Search of the study like a worker's, so every in-flight configuration holds its
  lease, and ``autotune worker`` processes can serve the same study beside Ray.
- A node lost mid-trial (its raylet gone: Ray's NodeDiedError, a worker that died with it) is
  :class:`~autotune.core.errors.TrialLost`: the search fails the trial as interrupted, never as out of
  memory, and queues its configuration once more (autotune.search.recovery); the group is removed. A
  driver killed and started again resumes from the database: Ray ends a dead driver's tasks (their trials
  die with them: PDEATHSIG) and removes its groups, and the new run's recovery fails the dead driver's
  leases and retries each configuration once.
- A multi-node trial's rendezvous is node 0's address and a port picked there, outside the kernel's
  ephemeral range (autotune.cluster.node.free_port); if torchrun finds it taken all the same, the trial
  runs again on another port, up to RENDEZVOUS_TRIES times, and the run says so.

Ray is imported only here, and only under ``--executor ray``: the rest of autotune never needs it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.cluster.node import NodeShare, NodeTask, free_port, merge_shares, node_device, run_share
from autotune.core.budget import Budget
from autotune.core.errors import AutotuneError, DeviceError, InputError, TrialError, TrialLost, first_line
from autotune.core.plans import Backend
from autotune.core.protocol import Outcome
from autotune.hardware.devices import Device
from autotune.hardware.ray_address import connection, token_auth_environment
from autotune.search.runner import check_between
from autotune.trials.command import TrialCommand, scripts_named
from autotune.trials.interrupts import InterruptShield, StopRequested
from autotune.trials.result import TrialResult
from autotune.trials.settings import TrialSettings

RAY_EXTRA = "pip install 'autotune[ray]'"
WAIT_NOTE_SECONDS = 30.0  # a group not placed after this long is said, then once a minute
# a share asked to stop (Ray's cancel: KeyboardInterrupt in the task) gets this long
STOP_GRACE_SECONDS = 15.0
RENDEZVOUS_TRIES = 3  # a multi-node trial whose rendezvous port was taken runs again on another, this often


def import_ray() -> Any:
    """Ray, or one line naming the extra.

    Raises:
        InputError: Ray is not installed."""
    try:
        import ray
    except ImportError:
        raise InputError(f"--executor ray needs Ray on this machine and the cluster's: {RAY_EXTRA}") from None
    return ray


@dataclass(frozen=True)
class Shape:
    """What one trial asks of the cluster: ``nodes`` bundles of ``gpus`` GPUs (0: a CPU trial) and ``cpus``
    CPUs each."""

    gpus: int
    nodes: int = 1
    cpus: float = 1.0

    def bundle(self) -> dict[str, float]:
        return {"CPU": self.cpus, **({"GPU": float(self.gpus)} if self.gpus else {})}

    @property
    def strategy(self) -> str:
        """One node: PACK (one bundle); several: STRICT_SPREAD (one bundle on each of that many nodes)."""
        return "STRICT_SPREAD" if self.nodes > 1 else "PACK"

    def __str__(self) -> str:
        each = f"{self.gpus} GPU(s)" if self.gpus else f"{self.cpus:g} CPU(s)"
        return each if self.nodes == 1 else f"{each} on each of {self.nodes} nodes"


def groups_placeable(nodes: Sequence[Mapping[str, float]], shape: Shape) -> int:
    """How many groups of ``shape`` the nodes' resources (``ray.nodes()``'s "Resources") hold at once: each
    node holds whole bundles, and a group needs its bundles on distinct nodes."""
    capacity = []
    for resources in nodes:
        fits = int(resources.get("CPU", 0) // shape.cpus) if shape.cpus else 10**9
        if shape.gpus:
            fits = min(fits, int(resources.get("GPU", 0) // shape.gpus))
        capacity.append(fits)
    groups = 0
    while True:
        capacity.sort(reverse=True)
        if len(capacity) < shape.nodes or capacity[shape.nodes - 1] < 1:
            return groups
        for i in range(shape.nodes):
            capacity[i] -= 1
        groups += 1


@dataclass(frozen=True)
class NodeInfo:
    """What the driver learns from one placed node before the first trial."""

    device: Device  # the device one share of a trial gets there (no NVML handles)
    host_budget: int | None  # the host memory a trial may hold there (bytes)
    node: str


class RayCluster:
    """The connection to a Ray cluster, the shape of a trial on it and the device a trial gets there
    (an ``autotune.search.runner.Executor``)."""

    def __init__(
        self,
        *,
        command: TrialCommand,
        backend: Backend,
        settings: TrialSettings,
        device: str,
        gpus_per_trial: int,
        nodes_per_trial: int,
        address: str | None,
        cache: Path | None,
        host_budget: Budget | None,
        say: Callable[[str], None],
        nvml: Any = None,
        rendezvous_port: Callable[[], tuple[str, int]] = free_port,
    ) -> None:
        """Connect (``address``: a cluster's; None: RAY_ADDRESS, a cluster running here, else a new local
        one), check the cluster can place one trial, and resolve the device on a placed node.
        ``rendezvous_port`` picks a multi-node trial's port on its node 0 (tests: one taken on purpose).

        Raises:
            InputError: no Ray, or a device that names GPUs (the cluster places them). DeviceError: the
                cluster cannot place one trial of this shape.
        """
        # the client's token-auth mode, set before Ray is imported (Ray reads it as it loads)
        os.environ.update(token_auth_environment(os.environ))
        self.ray = import_ray()
        text = device.strip().lower()
        if text not in ("auto", "cpu", "cuda"):
            raise InputError(
                f"--device {device}: under --executor ray the cluster places each trial's GPUs; give auto, "
                "cuda or cpu"
            )
        # the nodes run it where this process would (a file system the nodes share, as workers need)
        command = command if command.cwd else dataclasses.replace(command, cwd=os.getcwd())
        self.command, self.backend, self.settings = command, backend, settings
        self.cache, self.host_budget_asked, self.say, self.nvml = cache, host_budget, say, nvml
        self.scripts = scripts_named(command.words, command.cwd or ".")
        if not self.ray.is_initialized():
            to = connection(address)  # before Ray's own connection, which waits minutes on a dead address
            if to.note is not None:
                say(to.note)
            try:
                self.ray.init(
                    address=to.init_address,
                    logging_level=logging.WARNING,
                    log_to_driver=False,
                    namespace="autotune",
                )
            except Exception as e:  # Ray's own: a cluster of another version, a refused connection
                raise DeviceError(
                    f"cannot connect to the Ray cluster at {to.shown}: {first_line(str(e))}"
                ) from e
        self.address = address or self.ray.get_runtime_context().gcs_address
        has_gpus = self.ray.cluster_resources().get("GPU", 0) > 0
        gpus = 0 if text == "cpu" or (text == "auto" and not has_gpus) else gpus_per_trial
        self.shape = Shape(gpus, nodes_per_trial)
        if self.slots() < 1:
            raise DeviceError(
                f"the Ray cluster at {self.address} cannot place one trial of {self.shape}: "
                f"{describe(self.alive_nodes())}"
            )
        self.info = self._node_info()
        self._remote_share = self.ray.remote(max_retries=0, retry_exceptions=False)(_share)
        self._remote_port = self.ray.remote(max_retries=0, num_cpus=0)(rendezvous_port)

    @property
    def device(self) -> Device:
        return self.info.device

    def runner(
        self,
        device: Device,
        ceiling: int | None,
        stop: threading.Event | None,
        shield: InterruptShield | None,
    ) -> RayRunner:
        return RayRunner(self, device, ceiling, stop, shield)

    def alive_nodes(self) -> list[dict[str, float]]:
        return [n["Resources"] for n in self.ray.nodes() if n.get("Alive")]

    def slots(self) -> int:
        """The trials the cluster's live nodes can hold at once."""
        return groups_placeable(self.alive_nodes(), self.shape)

    def close(self) -> None:
        self.ray.shutdown()

    def _node_info(self) -> NodeInfo:
        remote = self.ray.remote(max_retries=0)(_node_info)
        with self._placed(None) as group:
            info: NodeInfo = self._result_of(
                remote.options(**self._task_options(group, 0)).remote(
                    self.shape.gpus, self.host_budget_asked, self.nvml
                )
            )
            return info

    def run(self, task: NodeTask, stop: threading.Event | None) -> TrialResult:
        """``task`` on a group of the trial's shape, placed whole first; its nodes' shares merged.

        Raises:
            TrialLost: a node of the group was lost mid-trial. StopRequested: ``stop`` was set.
            InputError: a node sees another script than this process read.
        """
        with self._placed(stop) as group:
            for attempt in range(1, RENDEZVOUS_TRIES + 1):
                master = None
                if self.shape.nodes > 1:
                    master = self._result_of(
                        self._remote_port.options(**self._task_options(group, 0, cpus=0)).remote()
                    )
                refs = [
                    self._remote_share.options(**self._task_options(group, i)).remote(
                        dataclasses.replace(task, node_rank=i, nodes=self.shape.nodes, master=master)
                    )
                    for i in range(self.shape.nodes)
                ]
                shares, stopped = self._collect(refs, stop)
                if master is None or attempt == RENDEZVOUS_TRIES or not any(s.port_taken for s in shares):
                    break
                self.say(
                    f"the trial's rendezvous port {master[1]} on {master[0]} was taken before torchrun bound "
                    f"it: running the trial again on another (try {attempt + 1} of {RENDEZVOUS_TRIES})"
                )
        return merge_shares(shares, stopped)

    def _task_options(self, group: Any, index: int, cpus: float | None = None) -> dict[str, Any]:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return {
            "num_cpus": self.shape.cpus if cpus is None else cpus,
            "num_gpus": self.shape.gpus if cpus is None else 0,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=index
            ),
        }

    @contextmanager
    def _placed(self, stop: threading.Event | None) -> Iterator[Any]:
        """A placement group of the trial's shape, reserved whole; removed on leaving (its trial ended,
        failed, was stopped, or its node was lost)."""
        from ray.util.placement_group import placement_group, remove_placement_group

        group = placement_group([self.shape.bundle()] * self.shape.nodes, strategy=self.shape.strategy)
        try:
            waited, said = time.monotonic(), WAIT_NOTE_SECONDS
            while not self.ray.wait([group.ready()], timeout=0.5)[0]:
                if stop is not None and stop.is_set():
                    raise StopRequested
                if time.monotonic() - waited > said:
                    self.say(
                        f"waiting {time.monotonic() - waited:.0f} s for the Ray cluster to place a trial of "
                        f"{self.shape} (its other groups are busy, or a node was lost): {describe(self.alive_nodes())}"
                    )
                    said += 60
            yield group
        finally:
            remove_placement_group(group)

    def _collect(self, refs: list[Any], stop: threading.Event | None) -> tuple[list[NodeShare], int]:
        """The shares of a trial's nodes (node 0 first); once one ends other than complete, the others are
        stopped (their ranks would wait in a collective for the gone one): how many were, beside."""
        ray = self.ray
        index = {ref: i for i, ref in enumerate(refs)}
        pending, shares = list(refs), {}
        stopped = 0
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1, timeout=0.5)
                for ref in done:
                    shares[index[ref]] = self._result_of(ref)
                    if shares[index[ref]].result.outcome is not Outcome.COMPLETE and pending:
                        stopped = len(self._stop(pending))
                        pending = []
                if stop is not None and stop.is_set() and pending:
                    self._stop(pending)
                    pending = []
                    raise StopRequested
        except BaseException:  # Ctrl-C, a lost node, a stop: no share of this trial outlives it
            if pending:
                self._stop(pending)
            raise
        return [shares[i] for i in sorted(shares)], stopped

    def _result_of(self, ref: Any) -> Any:
        """A task's result; its autotune error as itself; any other end of it (its node or worker gone) as
        TrialLost."""
        from ray.exceptions import RayError, RayTaskError

        try:
            return self.ray.get(ref)
        except RayTaskError as e:  # autotune's own error on the node: the same error here
            if isinstance(e.cause, AutotuneError):
                raise e.cause from None
            raise TrialError(f"a trial's share failed on its node: {first_line(str(e.cause or e))}") from e
        except RayError as e:  # the node, or the worker running the share, went away
            raise TrialLost(f"its node was lost mid-trial ({type(e).__name__}: {first_line(str(e))})") from e

    def _stop(self, refs: list[Any]) -> list[Any]:
        """Stop shares: KeyboardInterrupt in each (its launcher stops its trial, as on Ctrl-C), then, past a
        grace, their processes killed (the trials die with them: PDEATHSIG)."""
        for ref in refs:
            self.ray.cancel(ref, force=False)
        _, left = self.ray.wait(refs, num_returns=len(refs), timeout=STOP_GRACE_SECONDS)
        for ref in left:
            self.ray.cancel(ref, force=True)
        return refs


@dataclass(frozen=True)
class RayRunner:
    """A search's runner whose trials run on a Ray cluster (autotune.search.runner.Runner)."""

    cluster: RayCluster
    device: Device
    ceiling: int | None = None
    stop: threading.Event | None = None
    shield: InterruptShield | None = None

    @property
    def host_budget(self) -> int | None:
        return self.cluster.info.host_budget

    def __call__(
        self,
        batch: int,
        plan: str,
        *,
        poll: Callable[[int, float], None] | None = None,
        settings: TrialSettings | None = None,
        probe: bool = False,
        interruptible: Callable[[], AbstractContextManager[None]] | None = None,
        grad_accum: int | None = None,
        check_plans: tuple[str, ...] = (),
        sweep: tuple[str, ...] = (),
        fresh: bool = False,
    ) -> TrialResult:
        cluster = self.cluster
        task = NodeTask(
            command=cluster.command,
            batch_size=batch,
            plan=plan,
            backend=cluster.backend,
            gpus=cluster.shape.gpus,
            settings=settings or cluster.settings,
            cache=cluster.cache,
            scripts=cluster.scripts,
            probe=probe,
            ceiling=self.ceiling,
            grad_accum=grad_accum,
            check_plans=check_plans,
            sweep=sweep if cluster.shape.nodes == 1 else (),
            host_budget=cluster.host_budget_asked,
            nvml=cluster.nvml,
        )
        allow = interruptible or (self.shield.allow if self.shield is not None else nullcontext)
        with allow():
            return cluster.run(task, self.stop)

    def check(self) -> None:
        check_between(self.shield, self.stop)

    def close(self) -> None:
        pass  # each trial is a task of its own: nothing is kept between them


def describe(nodes: Sequence[Mapping[str, float]]) -> str:
    """The live nodes' GPUs and CPUs, in one line."""
    if not nodes:
        return "no live node"
    each = ", ".join(f"{n.get('GPU', 0):g} GPU/{n.get('CPU', 0):g} CPU" for n in nodes)
    return f"{len(nodes)} node(s): {each}"


def _share(task: NodeTask) -> NodeShare:
    """A trial's share, as a Ray task runs it on its node."""
    import ray

    return run_share(task, ray.get_runtime_context().get_node_id())


def _node_info(gpus: int, host_budget: Budget | None, nvml: Any) -> NodeInfo:
    import os
    import socket

    from autotune.hardware.host import host_budget_of

    return NodeInfo(node_device(gpus, os.environ, nvml), host_budget_of(host_budget), socket.gethostname())
