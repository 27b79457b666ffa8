"""Trials placed on a real Ray cluster (``--executor ray``): a local multi-node cluster started by the test
(Ray's own ``ray.cluster_utils.Cluster``: a head and several raylets on this host, each a node with the
CPUs and GPUs it declares), real subprocess trials, real SQLite files.

Where a GPU is needed its NVML is FAKE (tests/fake_nvml.py's NodeFakeNvml, labelled so): each node's GPUs
are the UUIDs its ``FAKE_NVML_GPUS`` names, and the trial script declares its "GPU memory" in a file per
GPU; Ray's own GPU accounting, placement groups and ``CUDA_VISIBLE_DEVICES`` are real.

`make test-ray` runs these (CI's phase of its own): Ray is an optional extra, which `make test` never needs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from itertools import combinations
from pathlib import Path
from typing import Any

import pytest

from conftest import stored_trials, trial_pids, trial_summary

ray_cluster_utils = pytest.importorskip("ray.cluster_utils", reason="Ray is the cluster extra: make test-ray")

from autotune.cluster.ray_executor import RayCluster  # noqa: E402
from autotune.core.budget import parse_budget  # noqa: E402
from autotune.core.plans import Backend  # noqa: E402
from autotune.search.spec import TuneSpec  # noqa: E402
from autotune.trials.command import TrialCommand  # noqa: E402
from autotune.trials.settings import TrialSettings  # noqa: E402
from autotune.workers.tune import tune  # noqa: E402

pytestmark = pytest.mark.ray

TESTS = Path(__file__).resolve().parent.parent
SCRIPTS = TESTS / "scripts"
SYNTHETIC = SCRIPTS / "synthetic.py"
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
AUTOTUNE = str(Path(sys.executable).with_name("autotune"))
MiB = 2**20


class LocalCluster:
    """A Ray cluster on this host: a head that runs nothing and the nodes a test adds."""

    def __init__(self, usage_dir: Path) -> None:
        self.usage_dir = usage_dir
        self.cluster = ray_cluster_utils.Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": 0, "num_gpus": 0, "include_dashboard": False},
        )
        self.nodes: dict[str, Any] = {}

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def add(self, name: str, cpus: int, gpus: int = 0) -> Any:
        """Node ``name`` with ``cpus`` CPUs and ``gpus`` FAKE GPUs (GPU-<name>0, ...)."""
        env = {
            "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])),
            "FAKE_GPU_USAGE_DIR": str(self.usage_dir),
            "FAKE_NVML_GPUS": ",".join(f"GPU-{name}{i}" for i in range(gpus)),
        }
        node = self.cluster.add_node(num_cpus=cpus, num_gpus=gpus, env_vars=env)
        self.cluster.wait_for_nodes()
        self.nodes[name] = node
        return node

    def node_id(self, name: str) -> str:
        return str(self.nodes[name].node_id)

    def remove(self, name: str) -> None:
        self.cluster.remove_node(self.nodes.pop(name), allow_graceful=False)

    def shutdown(self) -> None:
        self.cluster.shutdown()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    usage = tmp_path / "gpu-usage"
    usage.mkdir()
    local = LocalCluster(usage)
    try:
        yield local
    finally:
        import ray

        ray.shutdown()
        local.shutdown()


def _spec(tmp_path: Path, words: list[str], **options: Any) -> TuneSpec:
    return TuneSpec(
        command=TrialCommand.parse(words),
        budget=parse_budget(options.pop("budget", "1GiB")),
        trials=options.pop("trials", 6),
        batch_sizes=options.pop("batch_sizes", (1, 2, 4, 8, 16)),
        plans=("none",),
        settings=options.pop("settings", TrialSettings(1, 3, 60, 120)),
        cache_dir=tmp_path / "cache",
        study=options.pop("study", "ray"),
        executor="ray",
        **options,
    )


def _ran(trials: list[Any]) -> list[Any]:
    """Trials that ran (measured or verifications) and were told."""
    return [
        t
        for t in trials
        if t.user_attrs.get("kind") in ("measured", "verification") and "outcome" in t.user_attrs
    ]


def test_two_gpu_trials_are_placed_whole_and_never_share_a_gpu(tmp_path: Path, cluster: LocalCluster) -> None:
    """Nodes of 4 and 3 FAKE GPUs: 2-GPU trials, 3 at a time. Every trial ran on 2 GPUs of one node (never
    one here and one there, never the odd GPU with another node's), no two trials that ran at the same time
    shared a GPU, trials did run at the same time, and each peak is the batch's declared GPU memory, read
    on the node through (FAKE) NVML."""
    from fake_nvml import NodeFakeNvml

    cluster.add("a", cpus=4, gpus=4)
    cluster.add("b", cpus=4, gpus=3)
    doctor = subprocess.run(
        [AUTOTUNE, "doctor", "--json", "--ray-address", cluster.address],
        capture_output=True,
        text=True,
        timeout=300,
    )
    (seen,) = [c for c in json.loads(doctor.stdout) if c["name"] == "Ray cluster"]
    assert seen["ok"], seen
    assert f"cluster at {cluster.address}: 3 node(s), 7 GPU(s) (" in seen["detail"]  # head, a, b
    assert seen["detail"].endswith("per node), 8 CPU(s)"), seen
    # Trials started side by side overlap however slowly the machine starts each: the second waits for a third
    # (loaded, CI's 8 trials of 0.15 s steps had started and ended one after another, 3 at once or not).
    company = tmp_path / "started"
    company.mkdir()
    words = ["--per-sample-mib", "100", "--step-seconds", "0.15", "--company", str(company)]
    spec = _spec(
        tmp_path,
        [str(SCRIPTS / "fake_gpu_trial.py"), *words],
        gpus_per_trial=2,
        ray_address=cluster.address,
        trials=10,  # the probe's run, 8 search trials, the verification's 1
        batch_sizes=tuple(range(1, 17)),
        exhaustive=True,  # every configuration the model allows, until 8: trials enough to overlap
    )
    notes: list[str] = []

    class Notes:  # the run's lines, kept
        def __getattr__(self, name: str) -> Any:
            return lambda *args, **kwargs: notes.append(" ".join(map(str, args))) if name == "note" else None

    result = tune(spec, nvml=NodeFakeNvml(), reporter=Notes())  # type: ignore[arg-type]
    assert any("3 at once" in n for n in notes), notes
    ran = _ran(stored_trials(f"sqlite:///{tmp_path / 'cache' / 'autotune.db'}", "ray"))
    assert len(ran) >= 8
    owner = {cluster.node_id("a"): "GPU-a", cluster.node_id("b"): "GPU-b"}
    shares = []
    for t in ran:
        (placed,) = t.user_attrs["placement"]  # one node's share: never split
        assert len(placed["devices"]) == 2 and all(
            d.startswith(owner[placed["node_id"]]) for d in placed["devices"]
        )
        assert t.user_attrs["peak_bytes"] == t.params["batch_size"] * 100 * MiB
        shares.append(placed)
    overlapping = [
        (x, y) for x, y in combinations(shares, 2) if x["started"] < y["ended"] and y["started"] < x["ended"]
    ]
    assert overlapping  # trials ran at the same time
    for x, y in overlapping:
        assert not {(x["node_id"], d) for d in x["devices"]} & {(y["node_id"], d) for d in y["devices"]}
    assert (result.best.batch_size, result.best.plan) == (9, "none")  # 10 x 100 MiB > 1 GiB x 0.95


def test_a_two_node_trial_is_measured_on_both_nodes(tmp_path: Path, cluster: LocalCluster) -> None:
    """torchrun --nnodes 2 under --nodes-per-trial 2: one rank on each node, its rendezvous set per trial;
    each rank measured on its own node (rank 1 holds twice rank 0's memory per sample), the trial's peak the
    worst rank's, its samples/s every rank's samples. The first port node 0 is handed is one a listening
    socket holds (as when another process took it between its pick and torchrun's bind: CI's run lost a
    trial so): the trial runs again on another port, and the run says it."""
    cluster.add("a", cpus=1)
    cluster.add("b", cpus=1)
    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    held.bind(("", 0))
    held.listen()
    taken, handed = held.getsockname()[1], tmp_path / "handed-the-taken-port"

    def taken_first() -> tuple[str, int]:  # runs on node a (a Ray task): the held port once, then free ones
        from autotune.cluster.node import free_port

        if handed.exists():
            return free_port()
        handed.touch()
        return "127.0.0.1", taken

    said: list[str] = []
    words = [TORCHRUN, "--nnodes", "2", "--nproc-per-node", "1", str(SYNTHETIC), "--per-sample-mib", "20"]
    spec = _spec(
        tmp_path, [*words, "--rank-scale", "1,2", "--steps", "1000"], nodes_per_trial=2, device="cpu"
    )
    executor = RayCluster(
        command=spec.command,
        backend=Backend.TORCH,
        settings=spec.settings,
        device="cpu",
        gpus_per_trial=1,
        nodes_per_trial=2,
        address=cluster.address,
        cache=spec.cache_dir,
        host_budget=None,
        say=said.append,
        rendezvous_port=taken_first,
    )
    try:
        result = executor.runner(executor.device, None, None, None)(8, "none")
    finally:
        executor.close()
        held.close()
    assert result.outcome.value == "complete", result.error
    assert [line for line in said if "rendezvous" in line] == [
        f"the trial's rendezvous port {taken} on 127.0.0.1 was taken before torchrun bound it: running the "
        "trial again on another (try 2 of 3)"
    ]
    assert result.world_size == 2
    assert {p.node_id for p in result.placement} == {cluster.node_id("a"), cluster.node_id("b")}
    peaks = {r.rank: r.peak_bytes for r in result.ranks}
    assert set(peaks) == {0, 1}
    assert 150 * MiB < peaks[1] - peaks[0] < 170 * MiB  # rank 1 holds 8 x 20 MiB more than rank 0
    assert result.peak_bytes == peaks[1]
    assert result.samples_per_sec is not None and result.step_seconds
    assert result.samples_per_sec == pytest.approx(
        16 / sorted(result.step_seconds)[len(result.step_seconds) // 2], rel=0.3
    )


def _driver(tmp_path: Path, address: str, *flags: str, startup: float = 3) -> subprocess.Popen[str]:
    """`autotune run --executor ray` in a process of its own, CPU trials of the synthetic script, each
    sleeping `startup` seconds before its first step."""
    return subprocess.Popen(
        [
            AUTOTUNE, "run", "--budget", "1GiB", "--device", "cpu", "--executor", "ray", "--ray-address", address,
            "--trials", "6", "--batch-sizes", "1,2,4,8", "--plans", "none", "--warmup-steps", "1", "--steps", "3",
            "--study", "ray", "--cache-dir", str(tmp_path / "cache"), *flags, "--",
            "python", str(SYNTHETIC), "--per-sample-mib", "10", "--step-seconds", "0.3", "--startup-seconds", str(startup),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "400"},  # one line each
    )  # fmt: skip


def _measured_trial_running(cache: Path, timeout: float = 90) -> Path:
    """The folder of a trial (not the probe) that has started, once there is one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for request in sorted((cache / "trials").glob("*/request.json")):
            if not json.loads(request.read_text())["probe"] and not (request.parent / "report.json").exists():
                return request.parent
        time.sleep(0.2)
    raise AssertionError("no measured trial started")


def _no_trial_process_for(cache: Path, seconds: float, timeout: float) -> bool:
    """Whether, within ``timeout``, no trial process under ``cache`` was seen for ``seconds`` in a row. One
    empty look is not enough: a Ray worker that was starting a trial when its driver died forks a shim whose
    environment names the trial only once it has exec'd (CI once saw none, then one at the next look); the shim
    then finds its parent gone and exits, or dies with the worker Ray ends."""
    deadline = time.monotonic() + timeout
    empty_since = None
    while time.monotonic() < deadline:
        if trial_pids(cache):
            empty_since = None
        elif empty_since is None:
            empty_since = time.monotonic()
        elif time.monotonic() - empty_since >= seconds:
            return True
        time.sleep(0.25)
    return False


def test_a_node_lost_mid_trial_is_retried_once_and_the_study_completes(
    tmp_path: Path, cluster: LocalCluster
) -> None:
    """The node running a trial is killed mid-trial (its raylet and workers gone): the trial fails as
    interrupted (never out of memory), its configuration runs once more on the node that is left, and the
    study completes with no duplicate and nothing left RUNNING."""
    cluster.add("a", cpus=1)
    # Starting node b takes seconds, more on a busy machine (CI's, beside another phase, once outlasted a
    # trial of 3 s start-up and 4 steps: node a was removed with no trial on it): a start-up long enough to
    # be mid-trial still when it goes.
    driver = _driver(tmp_path, cluster.address, startup=20)
    try:
        running = _measured_trial_running(tmp_path / "cache")
        cluster.add("b", cpus=1)
        assert not (running / "report.json").exists(), "the trial ended before node b had started"
        lost_at = time.time()
        cluster.remove("a")
        out, _ = driver.communicate(timeout=300)
    finally:
        driver.kill()
    assert driver.returncode == 0, out
    trials = stored_trials(f"sqlite:///{tmp_path / 'cache' / 'autotune.db'}", "ray")
    assert {t.state.name for t in trials} <= {"COMPLETE", "FAIL", "PRUNED"}  # nothing left RUNNING
    (lost,) = [t for t in trials if t.state.name == "FAIL"]
    assert lost.user_attrs["note"].startswith("interrupted: its node was lost mid-trial")
    assert lost.user_attrs["note"].endswith("; retried once")
    assert "outcome" not in lost.user_attrs  # not out of memory: no outcome was measured
    (retry,) = [t for t in trials if t.user_attrs.get("retry_of") == lost.number]
    assert retry.params == lost.params and retry.state.name == "COMPLETE"
    assert retry.user_attrs["placement"][0]["node_id"] == cluster.node_id("b")
    measured = [
        t
        for t in _ran(trials)
        if t.user_attrs["kind"] == "measured" and t.user_attrs.get("proposed_by") != "re-measure"
    ]
    configs = [(t.params["batch_size"], t.params["plan"]) for t in measured]
    assert len(configs) == len(set(configs)) == 3  # no duplicate
    retried_after = retry.datetime_start.timestamp() - lost_at
    print(f"node-loss retry: the retry started {retried_after:.1f} s after the node was removed")
    assert f"trial {lost.number} (none@{lost.params['batch_size']}) interrupted: its node was lost" in out


def test_a_driver_killed_and_rerun_resumes(tmp_path: Path, cluster: LocalCluster) -> None:
    """SIGKILL of `autotune run --executor ray` mid-trial: Ray ends the dead driver's tasks and their trials
    die with them; the same command again fails the dead driver's trial, retries its configuration once,
    and completes the study with no duplicate and nothing left RUNNING."""
    cluster.add("a", cpus=2)
    first = _driver(tmp_path, cluster.address)
    _measured_trial_running(tmp_path / "cache")
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    assert _no_trial_process_for(tmp_path / "cache", seconds=3, timeout=60)  # the dead driver's trials died
    second = _driver(tmp_path, cluster.address, "--trials", "4")  # no probe: the retry and 2 more, then 1
    out, _ = second.communicate(timeout=180)
    assert second.returncode == 0, out
    resumed = re.search(
        r"resuming study ray: (\d) interrupted trial\(s\) failed"
        r"(?: and|; \d configuration\(s\)) queued for one retry",
        out,
    )  # a configuration claimed by the dead driver and not yet asked is queued with no trial to fail
    assert resumed is not None, out
    trials = stored_trials(f"sqlite:///{tmp_path / 'cache' / 'autotune.db'}", "ray")
    assert {t.state.name for t in trials} <= {"COMPLETE", "FAIL", "PRUNED"}
    dead = [t for t in trials if t.state.name == "FAIL"]
    assert len(dead) == int(resumed[1]) >= 1  # the trials it was running (2 slots: one or two)
    for t in dead:
        assert t.user_attrs["note"].endswith("; retried once")
        (retry,) = [r for r in trials if r.user_attrs.get("retry_of") == t.number]
        assert retry.params == t.params and retry.state.name == "COMPLETE"
    measured = [
        t
        for t in _ran(trials)
        if t.user_attrs["kind"] == "measured" and t.user_attrs.get("proposed_by") != "re-measure"
    ]
    configs = [(t.params["batch_size"], t.params["plan"]) for t in measured]
    assert len(configs) == len(set(configs)) == 3


def test_a_worker_and_ray_serve_one_study_together(tmp_path: Path, cluster: LocalCluster) -> None:
    """`autotune run --executor ray` on a cluster that places one trial at a time, and an `autotune worker`
    on the same database: each in-flight configuration holds its lease, so both measure trials of the one
    study (Ray's with a placement, the worker's without), none twice, and nothing is left RUNNING."""
    cluster.add("a", cpus=1)
    driver = _driver(
        tmp_path, cluster.address, "--exhaustive", "--trials", "5", "--batch-sizes", "1,2,3,4,5,6,8"
    )
    worker = None
    try:
        _measured_trial_running(tmp_path / "cache")
        worker = subprocess.Popen(
            [AUTOTUNE, "worker", "--once", "--devices", "cpu", "--study", "ray", "--cache-dir", str(tmp_path / "cache")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        out, _ = driver.communicate(timeout=240)
        helped, _ = worker.communicate(timeout=120)
    finally:
        driver.kill()
        if worker is not None:
            worker.kill()
    assert driver.returncode == 0, out
    assert worker.returncode == 0, helped
    trials = stored_trials(f"sqlite:///{tmp_path / 'cache' / 'autotune.db'}", "ray")
    assert {t.state.name for t in trials} <= {"COMPLETE", "PRUNED"}  # nothing RUNNING, nothing lost
    measured = [t for t in _ran(trials) if t.user_attrs["kind"] == "measured"]
    on_ray = [t for t in measured if "placement" in t.user_attrs]
    by_worker = [t for t in measured if "placement" not in t.user_attrs]
    assert on_ray and by_worker, (len(on_ray), len(by_worker))
    assert {t.user_attrs["worker"] for t in on_ray}.isdisjoint({t.user_attrs["worker"] for t in by_worker})
    counted = [
        (t.params["batch_size"], t.params["plan"])
        for t in measured
        if t.user_attrs.get("proposed_by") != "re-measure"
    ]
    assert len(counted) == len(set(counted))  # no configuration measured twice


def test_an_address_where_no_cluster_answers_is_one_line(tmp_path: Path) -> None:
    """Ray's own connection retries a wrong address for minutes: autotune checks it answers first."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once the socket is closed
    started = time.monotonic()
    run = subprocess.run(
        [AUTOTUNE, "run", "--budget", "1GiB", "--executor", "ray", "--ray-address", f"127.0.0.1:{port}",
         "--cache-dir", str(tmp_path / "cache"), str(SYNTHETIC)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 4, run.stderr
    assert run.stderr.startswith(f"Error: no Ray cluster answers at 127.0.0.1:{port} (")
    assert run.stderr.strip().endswith(
        "start one (ray start --head) or give its address (--ray-address, RAY_ADDRESS)"
    )
    assert len(run.stderr.strip().splitlines()) == 1 and time.monotonic() - started < 30
    assert not (tmp_path / "cache" / "trials").exists()


@pytest.fixture
def dead_record() -> Iterator[tuple[dict[str, str], str]]:
    """An environment whose Ray temporary folder records a cluster where nothing answers, as a killed
    `ray start --block` leaves it (a short folder under /tmp: a local cluster's socket paths must fit)."""
    import shutil
    import socket
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    (folder / "ray").mkdir()
    (folder / "ray" / "ray_current_cluster").write_text(dead)
    env = {**os.environ, "RAY_TMPDIR": str(folder), "COLUMNS": "400", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    try:
        yield env, dead
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_doctor_says_at_once_that_the_cluster_ray_recorded_is_gone(
    tmp_path: Path, dead_record: tuple[dict[str, str], str]
) -> None:
    """CI's failure: after the Slurm recipe's test, Ray's address file named its ended head, and the doctor's
    probe (ray.init("auto")) waited on it until its 120 s timeout, which took the doctor down."""
    env, dead = dead_record
    # onnxruntime shadowed: the ORT check fails in one line instead of training a step (on a fresh machine,
    # building ORT's extension first: a minute), so the time below is the Ray check's and torch's
    (tmp_path / "onnxruntime.py").write_text("raise ImportError('hidden by this test')\n")
    env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))}
    started = time.monotonic()
    doctor = subprocess.run(
        [AUTOTUNE, "doctor", "--json"], capture_output=True, text=True, timeout=300, env=env
    )
    found = {c["name"]: c for c in json.loads(doctor.stdout)}["Ray cluster"]
    assert not found["ok"], found
    assert found["detail"].startswith(
        f"no Ray cluster running here: Ray's address file {env['RAY_TMPDIR']}/ray/ray_current_cluster names "
        f"{dead}, where nothing answers ("
    ), found
    assert found["hint"].endswith("without one, a run starts a local one")
    assert time.monotonic() - started < 60  # Ray's wait alone was minutes


def test_a_run_without_an_address_passes_over_a_dead_recorded_cluster_for_a_local_one(
    tmp_path: Path, dead_record: tuple[dict[str, str], str]
) -> None:
    env, dead = dead_record
    run = subprocess.run(
        [AUTOTUNE, "run", "--budget", "1GiB", "--device", "cpu", "--executor", "ray", "--trials", "4",
         "--batch-sizes", "1,2", "--plans", "none", "--warmup-steps", "1", "--steps", "2", "--study", "local",
         "--cache-dir", str(tmp_path / "cache"), "--",
         "python", str(SYNTHETIC), "--per-sample-mib", "10", "--step-seconds", "0.05"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    said = [line for line in run.stderr.splitlines() if "Ray's address file" in line]
    assert len(said) == 1 and said[0].endswith(
        "where nothing answers ([Errno 111] Connection refused; a cluster that ended without `ray stop`): "
        "starting a local Ray cluster"
    ), run.stderr
    assert f"names {dead}," in said[0]
    trials = stored_trials(f"sqlite:///{tmp_path / 'cache' / 'autotune.db'}", "local")
    assert {t.state.name for t in trials} == {"COMPLETE"} and len(trials) >= 2, trial_summary(trials)


def test_a_run_joins_a_cluster_that_ray_start_put_under_token_authentication(tmp_path: Path) -> None:
    """Ray (2.60) turns token authentication on for `ray start` where ~/.ray/auth_token exists (a local
    ray.init() writes one) and leaves a client without it: `autotune run --ray-address` never joined (Ray:
    "Authentication token is missing or incorrect"). The run takes `ray start`'s rule for its client."""
    import shutil
    import socket
    import tempfile

    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("0123456789abcdef" * 4)
    folder = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # Ray's sockets under a short path
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "HOME": str(home), "RAY_TMPDIR": str(folder), "RAY_USAGE_STATS_ENABLED": "0"}
    for name in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        env.pop(name, None)
    ray = str(Path(sys.executable).with_name("ray"))
    head = subprocess.Popen(
        [ray, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2",
         "--include-dashboard=false", "--block"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        run = subprocess.run(
            [AUTOTUNE, "run", "--budget", "1GiB", "--device", "cpu", "--executor", "ray", "--ray-address",
             f"127.0.0.1:{port}", "--trials", "4", "--batch-sizes", "1,2", "--plans", "none", "--warmup-steps", "1",
             "--steps", "2", "--study", "token", "--cache-dir", str(tmp_path / "cache"), "--",
             "python", str(SYNTHETIC), "--per-sample-mib", "10", "--step-seconds", "0.05"],
            capture_output=True, text=True, timeout=300, env=env,
        )  # fmt: skip
    finally:
        head.send_signal(signal.SIGTERM)
        said, _ = head.communicate(timeout=90)
        shutil.rmtree(folder, ignore_errors=True)
    assert "Token authentication is enabled for this Ray cluster" in said, said  # Ray's own line
    assert run.returncode == 0, run.stderr
    trials = stored_trials(f"sqlite:///{tmp_path / 'cache' / 'autotune.db'}", "token")
    assert {t.state.name for t in trials} == {"COMPLETE"} and len(trials) >= 2, trial_summary(trials)
