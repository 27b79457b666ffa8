"""The executor's rules without a cluster (part of `make test`, which never needs Ray): how many trials a
cluster's nodes hold at once, what a multi-node torchrun becomes on each node, which options agree, how the
nodes' shares of a trial merge, and `--executor ray` without Ray installed."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.cluster.node import TORCHRUN_PORTS, NodeShare, NodeTask, free_port, merge_shares, run_share
from autotune.cluster.ray_executor import Shape, groups_placeable
from autotune.core.budget import parse_budget
from autotune.core.errors import InputError
from autotune.core.plans import Backend
from autotune.core.protocol import Outcome, RankIdentity, RankResult, TrialReport
from autotune.search.spec import TuneSpec
from autotune.trials.command import TrialCommand
from autotune.trials.ranks import merge_reports
from autotune.trials.result import Placement, TrialResult
from autotune.trials.settings import TrialSettings

from conftest import AUTOTUNE, SYNTHETIC

MiB = 2**20
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


def test_groups_a_cluster_holds_at_once() -> None:
    a, b = {"CPU": 4.0, "GPU": 4.0}, {"CPU": 4.0, "GPU": 3.0}
    assert groups_placeable([a, b], Shape(gpus=2)) == 3  # 2 on a, 1 on b: b's odd GPU joins no group
    assert groups_placeable([a, b], Shape(gpus=2, nodes=2)) == 1  # then b has no whole bundle left
    assert groups_placeable([a, a, b], Shape(gpus=2, nodes=2)) == 2
    assert groups_placeable([a, b], Shape(gpus=8)) == 0  # no node has 8
    assert groups_placeable([{"CPU": 2.0}, {"CPU": 0.0}, {"CPU": 3.0}], Shape(gpus=0)) == 5
    assert groups_placeable([{"CPU": 1.0, "GPU": 8.0}], Shape(gpus=2)) == 1  # a CPU per bundle too
    assert Shape(gpus=2, nodes=2).strategy == "STRICT_SPREAD" and Shape(gpus=2).strategy == "PACK"
    assert Shape(gpus=2, nodes=2).bundle() == {"CPU": 1.0, "GPU": 2.0}
    assert str(Shape(gpus=8, nodes=2)) == "8 GPU(s) on each of 2 nodes"


def test_a_multi_node_torchrun_gets_its_rendezvous_on_each_node(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    command = TrialCommand.parse(
        [TORCHRUN, "--nnodes", "2", "--nproc-per-node", "gpu", str(script), "-b", "{batch_size}"]
    )
    assert command.nodes == 2 and command.world_size(4) == 8
    on_one = command.on_node(1, "10.0.0.5", 29400)
    assert on_one.argv(16) == [
        TORCHRUN, "--node-rank", "1", "--master-addr", "10.0.0.5", "--master-port", "29400",
        "--nnodes", "2", "--nproc-per-node", "gpu", str(script), "-b", "16",
    ]  # fmt: skip
    for option in ("--master-port=29500", "--rdzv-endpoint=h:1", "--node_rank=0"):
        words = [TORCHRUN, "--nnodes", "2", option, str(script)]
        with pytest.raises(
            InputError, match="on a cluster autotune places each trial and sets its rendezvous"
        ):
            TrialCommand.parse(words).check_placeable()


def test_a_rendezvous_port_is_free_and_outside_the_ports_the_kernel_hands_out() -> None:
    """Node 0's rendezvous port is bound by torchrun seconds after it is picked: one of the ephemeral range
    could meanwhile go to any outgoing connection of the node (CI lost one so, EADDRINUSE)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(50):
        _, port = free_port()
        assert 20000 <= port < low and port not in TORCHRUN_PORTS
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", port))  # free


def test_node_zero_says_when_its_rendezvous_port_was_taken(tmp_path: Path) -> None:
    """A real torchrun as node 0 of a two-node trial whose port a listening socket holds: it cannot bind, and
    the share says so (the driver runs the trial again on another port: RayCluster.run)."""
    words = [TORCHRUN, "--nnodes", "2", "--nproc-per-node", "1", str(SYNTHETIC), "--per-sample-mib", "1"]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("", 0))
        held.listen()
        task = NodeTask(
            command=TrialCommand.parse(words),
            batch_size=2,
            plan="none",
            backend=Backend.TORCH,
            gpus=0,
            settings=TrialSettings(1, 1, 60, 90, tight=0),
            cache=tmp_path / "cache",
            scripts={},
            nodes=2,
            master=("127.0.0.1", held.getsockname()[1]),
        )
        share = run_share(task, "node-a")
    assert share.result.outcome is Outcome.FAILED
    assert share.port_taken, share.result.error


def _spec(words: list[str], **options: object) -> TuneSpec:
    return TuneSpec(command=TrialCommand.parse(words), budget=parse_budget("1GiB"), **options)  # type: ignore[arg-type]


def test_executor_options_agree_with_the_command_before_any_trial(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    two_nodes = [TORCHRUN, "--nnodes", "2", "--nproc-per-node", "1", str(script)]
    assert _spec(two_nodes, executor="ray", nodes_per_trial=2).nodes_per_trial == 2
    with pytest.raises(
        InputError, match="--nodes-per-trial places a trial on several nodes: it needs --executor ray"
    ):
        _spec(two_nodes, nodes_per_trial=2)
    with pytest.raises(InputError, match="--nodes-per-trial 1 and the command's torchrun --nnodes 2 differ"):
        _spec(two_nodes, executor="ray")
    with pytest.raises(InputError, match="a trial on several nodes runs a torchrun template"):
        _spec([str(script)], executor="ray", nodes_per_trial=2)
    with pytest.raises(InputError, match="--executor slurm: expected one of local, ray"):
        _spec([str(script)], executor="slurm")


def _report(
    samples: int, seconds: float, rank: int, world: int, outcome: Outcome = Outcome.COMPLETE
) -> TrialReport:
    return TrialReport(
        outcome, 5, (seconds,) * 5, (samples,) * 5, rank=rank, world_size=world, plan_applied="none"
    )


def _result(outcome: Outcome, peak: int, rank: int, node: str) -> TrialResult:
    return TrialResult(
        outcome=outcome, batch_size=8, plan="none", device="cpu", device_name="cpu", peak_bytes=peak,
        memory_method="rss-rank", samples_per_sec=None, step_seconds=(), wall_seconds=3.0, log_dir=f"/logs/{node}",
        ranks=(RankResult(rank, "cpu", peak, outcome),), placement=(Placement(node, f"id-{node}", (), 1.0, 4.0),),
    )  # fmt: skip


def test_the_nodes_shares_merge_into_one_trial() -> None:
    shares = [
        NodeShare(_result(Outcome.COMPLETE, 300 * MiB, 0, "a"), {0: _report(8, 0.5, 0, 2)}, {0: RankIdentity(0, 0, 2, 11)}),
        NodeShare(_result(Outcome.COMPLETE, 500 * MiB, 1, "b"), {1: _report(8, 0.8, 1, 2)}, {1: RankIdentity(1, 0, 2, 12)}),
    ]  # fmt: skip
    merged = merge_shares(shares)
    assert merged.outcome is Outcome.COMPLETE and merged.world_size == 2
    assert merged.peak_bytes == 500 * MiB  # the worst rank's
    assert merged.samples_per_sec == pytest.approx(16 / 0.8)  # every rank's samples, the slowest rank's time
    assert [r.rank for r in merged.ranks] == [0, 1] and [p.node for p in merged.placement] == ["a", "b"]
    assert merged.memory_note == "other nodes' logs: b:/logs/b"
    oom = [
        shares[0],
        NodeShare(_result(Outcome.OOM, 900 * MiB, 1, "b"), {1: _report(8, 0.8, 1, 2, Outcome.OOM)}),
    ]
    assert merge_shares(oom).outcome is Outcome.OOM  # one node's out-of-memory is the trial's
    alone = merge_shares([shares[0]], stopped=1)  # node b stopped as another's share ended the trial
    assert alone.outcome is Outcome.FAILED and alone.samples_per_sec is None


def test_a_node_expects_only_its_own_ranks_reports() -> None:
    reports = {1: _report(8, 0.5, 1, 2)}
    started = {1: RankIdentity(1, 0, 2, 12)}
    assert merge_reports(reports, started).outcome is Outcome.FAILED  # rank 0 of the world is missing
    assert merge_reports(reports, started, expected=range(1, 2)).outcome is Outcome.COMPLETE


def test_executor_ray_without_ray_is_one_line_before_any_trial(tmp_path: Path) -> None:
    """Ray hidden from the interpreter (a stand-in `ray` package that fails to import, as a missing one
    does): `run --executor ray` exits 2 with one line naming the extra, and no trial ran."""
    hidden = tmp_path / "hidden" / "ray"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('No module named ray (hidden by the test)')\n")
    env = {**os.environ, "PYTHONPATH": str(hidden.parent)}
    run = subprocess.run(
        [AUTOTUNE, "run", "--budget", "1GiB", "--executor", "ray", "--cache-dir", str(tmp_path / "cache"), str(SYNTHETIC)],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 2
    assert run.stderr.strip() == (
        "Error: --executor ray needs Ray on this machine and the cluster's: pip install 'autotune[ray]'"
    )
    assert not (tmp_path / "cache" / "trials").exists()
