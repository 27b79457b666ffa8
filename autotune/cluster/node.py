"""One node's share of a trial placed on a cluster, run on that node by autotune's own launcher and meters,
and the driver's merge of the nodes' shares into the trial's one result. Neither imports Ray: the
executor (autotune.cluster.ray_executor) ships a :class:`NodeTask` to each node of a placement group and
gets a :class:`NodeShare` back.

On the node the share is an ordinary trial (autotune.trials.measurement.run_trial): the GPUs the cluster
gave it (``CUDA_VISIBLE_DEVICES``, set by Ray) are resolved through NVML and pinned by UUID, its memory is
metered per rank as on one host (NVML, else RSS), its files go to the node's cache dir. A multi-node
torchrun trial gets its rendezvous from the driver (node 0's address and a port free there) and each node
expects only its own ranks' reports; the driver merges every rank's report as it does one host's
(autotune.trials.ranks.merge_reports), so a step's samples are every rank's and the peak the worst rank's.
"""

from __future__ import annotations

import dataclasses
import os
import random
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.backends import parse_backend_plan
from autotune.core.budget import Budget
from autotune.core.errors import InputError
from autotune.core.paths import cache_dir
from autotune.core.plans import Backend
from autotune.core.protocol import Outcome, RankIdentity, TrialReport, read_rank_identities
from autotune.hardware.devices import Device, cpu_device, resolve_trial_device
from autotune.hardware.host import host_budget_of
from autotune.hardware.meters import make_meter
from autotune.hardware.nvml import nvml_loader
from autotune.trials.command import TrialCommand, file_sha256
from autotune.trials.measurement import run_trial
from autotune.trials.ranks import merge_reports, rank_reports
from autotune.trials.result import Placement, TrialResult, throughput, token_throughput
from autotune.trials.settings import TrialSettings


@dataclass(frozen=True)
class NodeTask:
    """What one node of a trial's placement group runs."""

    command: TrialCommand
    batch_size: int
    plan: str
    backend: Backend
    gpus: int  # GPUs of this node's share (0: a CPU trial)
    settings: TrialSettings
    cache: Path | None  # the node's cache dir (None: its user's default)
    scripts: dict[str, str]  # path -> sha256 as the driver read them: the node must run the same script
    probe: bool = False
    ceiling: int | None = None
    grad_accum: int | None = None
    check_plans: tuple[str, ...] = ()
    sweep: tuple[str, ...] = ()  # more plans measured after ``plan`` in the same process (one node only)
    host_budget: Budget | None = None  # resolved on the node (None: what it has available, less a margin)
    node_rank: int = 0
    nodes: int = 1
    master: tuple[str, int] | None = None  # a multi-node trial's rendezvous: node 0's address and port
    nvml: Any = None  # an NVML module to use instead of nvidia-ml-py's (tests: FAKE, labelled so)


@dataclass(frozen=True)
class NodeShare:
    """What one node measured of a trial."""

    result: TrialResult
    reports: dict[int, TrialReport] = field(default_factory=dict)  # its ranks' reports (torchrun)
    started: dict[int, RankIdentity] = field(default_factory=dict)  # its ranks that started
    port_taken: bool = False  # node 0's torchrun found the rendezvous port taken (run it again on another)


def node_device(gpus: int, environ: Mapping[str, str], nvml: Any = None) -> Device:
    """The device a share runs on here: the CPU, or the ``gpus`` GPUs the cluster gave this task (the first
    ``gpus`` of ``CUDA_VISIBLE_DEVICES``), as a group. Sendable to the driver: no NVML handles."""
    if gpus == 0:
        return cpu_device()
    device = resolve_trial_device("cuda", gpus, environ, nvml_loader(nvml))
    return without_handles(device)


def without_handles(device: Device) -> Device:
    """``device`` with its NVML handles dropped (they are pointers of this process)."""
    members = tuple(dataclasses.replace(d, handle=None, group=()) for d in device.members)
    return dataclasses.replace(device, handle=None, group=members if len(members) > 1 else ())


# A multi-node trial's rendezvous port is picked on node 0 and bound there by torchrun seconds later (it
# imports torch first). A port of the kernel's ephemeral range can meanwhile go to any outgoing connection
# of the node, and a Ray node makes many: CI's run here lost one so (EADDRINUSE). The port is drawn below
# that range, above Ray's worker ports (10002-19999 by default), never torchrun's own defaults; one taken
# all the same is said by the share (NodeShare.port_taken) and the trial runs again on another port.
RENDEZVOUS_FLOOR = 20000
TORCHRUN_PORTS = (29400, 29500)  # torchrun's c10d rendezvous and its master port, by default
PORT_TAKEN = ("EADDRINUSE", "address already in use")  # how torchrun says it could not bind


def free_port() -> tuple[str, int]:
    """This node's address and a TCP port free on it now, outside its ephemeral range where it has room
    (a multi-node trial's rendezvous)."""
    low = _ephemeral_range()[0]
    for _ in range(100 if low > RENDEZVOUS_FLOOR + 1000 else 0):
        port = random.randrange(RENDEZVOUS_FLOOR, low)
        if port not in TORCHRUN_PORTS and _bindable(port):
            return _address(), port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # no room below it: the kernel's choice
        s.bind(("", 0))
        return _address(), s.getsockname()[1]


def _ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands out to connections and to ``bind(0)`` (Linux's setting; else IANA's)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 49152, 65535


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def _address() -> str:
    """The address other nodes reach this one at (the one its default route uses)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet is sent by a UDP connect
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def run_share(task: NodeTask, node_id: str, environ: Mapping[str, str] | None = None) -> NodeShare:
    """Run ``task`` here: its device resolved from the GPUs the cluster gave it, metered as on one host.

    Raises:
        InputError: this node sees another script than the driver hashed (a file system not shared, or
            changed): it would measure another workload.
    """
    env = dict(os.environ if environ is None else environ)
    started = time.time()
    _check_scripts(task.scripts, task.command.cwd)
    device = (
        cpu_device()
        if task.gpus == 0
        else resolve_trial_device("cuda", task.gpus, env, nvml_loader(task.nvml))
    )
    command = task.command
    ranks: range | None = None
    if task.nodes > 1 and task.master is not None:
        command = command.on_node(task.node_rank, *task.master)
        per_node = command.world_size(task.gpus or 1) // task.nodes
        ranks = range(task.node_rank * per_node, (task.node_rank + 1) * per_node)
    result = run_trial(
        command,
        task.batch_size,
        parse_backend_plan(task.plan, task.backend),
        device,
        make_meter(device, task.nvml),
        task.settings,
        cache_dir(task.cache),
        env,
        task.backend,
        probe=task.probe,
        ceiling=None if task.probe else task.ceiling,
        grad_accum=task.grad_accum,
        check_plans=task.check_plans,
        host_budget=host_budget_of(task.host_budget),
        node_ranks=ranks,
        sweep=task.sweep,
    )
    here = Placement(
        socket.gethostname(), node_id, tuple(d.uuid or "" for d in device.members if d.kind == "cuda"), started,
        time.time(),
    )  # fmt: skip
    result = dataclasses.replace(
        result,
        placement=(here,),
        sweep=tuple(dataclasses.replace(x, placement=(here,)) for x in result.sweep),
    )
    report_path = Path(result.log_dir) / "report.json"
    return NodeShare(
        result,
        rank_reports(report_path),
        read_rank_identities(Path(result.log_dir) / "progress.json"),
        port_taken=task.master is not None
        and task.node_rank == 0
        and result.outcome is Outcome.FAILED
        and any(words in (result.error or "") for words in PORT_TAKEN),
    )


def _check_scripts(scripts: Mapping[str, str], cwd: str | None) -> None:
    for path, digest in scripts.items():
        where = Path(cwd or ".") / path
        try:
            here = file_sha256(where)
        except OSError as e:
            raise InputError(
                f"{socket.gethostname()} cannot read {path} ({e}): the nodes must share the script"
            ) from e
        if here != digest:
            raise InputError(
                f"{path} on {socket.gethostname()} is not the script the driver read (sha256 {here[:12]} vs "
                f"{digest[:12]}): the nodes must see the same files"
            )


def merge_shares(shares: list[NodeShare], stopped: int = 0) -> TrialResult:
    """The trial's one result from its nodes' shares (node 0 first): a node's out-of-memory, over-budget or
    kill is the trial's, else a node's failure, else it completes with every rank's steps merged (the
    global samples/s) and the worst rank's peak. ``stopped``: nodes stopped because another's share ended
    the trial first (their ranks' outcomes are None, as for a rank another ended on one host)."""
    first = shares[0].result
    if len(shares) == 1 and not stopped:
        return first
    results = [s.result for s in shares]
    ended = [r for r in results if r.outcome is not Outcome.COMPLETE]
    culprit = next((r for r in ended if r.outcome.out_of_memory), ended[0] if ended else None)
    reports = {rank: report for s in shares for rank, report in s.reports.items()}
    started = {rank: identity for s in shares for rank, identity in s.started.items()}
    merged = merge_reports(reports, started) if reports or started else None
    outcome, error = Outcome.COMPLETE, None
    if culprit is not None:
        outcome, error = culprit.outcome, culprit.error
    elif merged is not None and merged.outcome is not Outcome.COMPLETE:
        outcome, error = merged.outcome, merged.error
    elif stopped:
        outcome, error = Outcome.FAILED, f"{stopped} node(s) of the trial ended without a result"
    speed = throughput(merged) if outcome is Outcome.COMPLETE and merged is not None else None
    worst = max(results, key=lambda r: r.peak_bytes)
    return dataclasses.replace(
        first,
        outcome=outcome,
        error=error,
        peak_bytes=worst.peak_bytes,
        memory_method=worst.memory_method,
        samples_per_sec=speed.mid if speed else None,
        samples_per_sec_low=speed.low if speed else None,
        samples_per_sec_high=speed.high if speed else None,
        step_seconds=merged.step_seconds if merged is not None else first.step_seconds,
        wall_seconds=max(r.wall_seconds for r in results),
        plan=merged.plan_applied if merged is not None and merged.plan_applied else first.plan,
        ranks=tuple(sorted((rank for r in results for rank in r.ranks), key=lambda x: x.rank)),
        world_size=merged.world_size if merged is not None else first.world_size,
        tokens_per_sec=token_throughput(merged)
        if outcome is Outcome.COMPLETE and merged is not None
        else None,
        warmup_peak_bytes=_largest(r.warmup_peak_bytes for r in results),
        steady_peak_bytes=_largest(r.steady_peak_bytes for r in results),
        startup_seconds=_largest(r.startup_seconds for r in results),
        placement=tuple(p for r in results for p in r.placement),
        memory_note="; ".join(filter(None, [worst.memory_note, _elsewhere(results)])) or None,
    )


def _elsewhere(results: list[TrialResult]) -> str:
    """Where the other nodes' logs are."""
    return (
        "other nodes' logs: "
        + ", ".join(f"{p.node}:{r.log_dir}" for r in results[1:] for p in r.placement[:1])
        if len(results) > 1
        else ""
    )


def _largest(values: Any) -> Any:
    known = [v for v in values if v is not None]
    return max(known) if known else None
