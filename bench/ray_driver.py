"""What the Ray executor's driver costs per trial, against a local Ray cluster (Ray's own
``ray.cluster_utils.Cluster``: a head and two raylets on this host, with the CPUs they declare).

1. Placement alone: a placement group of one bundle created, waited for, a no-op task run in it, and
   removed; one at a time, then from 8 threads at once (groups per second).
2. A tune: ``autotune run --executor ray`` of the synthetic trial script (no torch; one warm-up and two
   measured steps of 10 ms), 32 trials, 16 at once. Its trials per second, and per trial the driver's share:
   the trial's time in the database (asked to told) less its node's share (the share's start to end, on
   the node), which covers placement, the task's start, the result's return and the database writes.

The trials' own start-up (a Python process, autotune imported) on 2 cores is most of the rest: a real
trial's start-up is seconds to tens of seconds (issue 31: ~18 s on an H100), which is what a cluster run's
throughput is bound by. Run: python bench/ray_driver.py [--trials 32] [--out bench/results/ray-driver-cpu.txt]
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import optuna
import ray
from ray.cluster_utils import Cluster
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

ROOT = Path(__file__).resolve().parent.parent
SYNTHETIC = ROOT / "tests" / "scripts" / "synthetic.py"


@ray.remote(num_cpus=1)
def _noop() -> int:
    return os.getpid()


def place_once() -> float:
    started = time.perf_counter()
    group = placement_group([{"CPU": 1}])
    ray.get(group.ready())
    ray.get(_noop.options(scheduling_strategy=PlacementGroupSchedulingStrategy(group, 0)).remote())
    remove_placement_group(group)
    return time.perf_counter() - started


def placement_rates(count: int) -> tuple[list[float], float]:
    """Seconds of each of ``count`` placements one at a time, and groups per second from 8 threads."""
    place_once()  # the workers' first start is not what is measured
    alone = [place_once() for _ in range(count)]
    started = time.perf_counter()
    threads = [threading.Thread(target=lambda: [place_once() for _ in range(count // 8)]) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return alone, 8 * (count // 8) / (time.perf_counter() - started)


def tune(address: str, cache: Path, trials: int) -> tuple[float, list[float], list[float]]:
    """Wall seconds of the run, and per measured trial the driver's share and the node's, in seconds."""
    started = time.perf_counter()
    subprocess.run(
        [str(Path(sys.executable).with_name("autotune")), "run", "--budget", "4GiB", "--device", "cpu",
         "--executor", "ray", "--ray-address", address, "--trials", str(trials), "--exhaustive",
         "--batch-sizes", ",".join(str(b) for b in range(1, trials + 1)), "--plans", "none", "--warmup-steps", "1", "--steps", "2", "--study", "bench",
         "--cache-dir", str(cache), "--", "python", str(SYNTHETIC), "--step-seconds", "0.01"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    wall = time.perf_counter() - started
    study = optuna.load_study(study_name="bench", storage=f"sqlite:///{cache / 'autotune.db'}")
    driver, node = [], []
    for t in study.trials:
        if t.user_attrs.get("kind") != "measured" or "placement" not in t.user_attrs:
            continue
        (share,) = t.user_attrs["placement"]
        told = (t.datetime_complete - t.datetime_start).total_seconds()
        node.append(share["ended"] - share["started"])
        driver.append(told - node[-1])
    return wall, driver, node


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=32)
    parser.add_argument("--placements", type=int, default=48)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for _ in range(2):
        cluster.add_node(num_cpus=8)  # declared: 16 trials at once, on this host's cores
    cluster.wait_for_nodes()
    lines = [
        f"machine: {platform.node()}, {os.cpu_count()} cores, {platform.processor() or platform.machine()}; "
        f"Python {platform.python_version()}, ray {ray.__version__}; a local cluster: head + 2 raylets x 8 CPUs",
    ]
    try:
        ray.init(address=cluster.address, logging_level=logging.WARNING, log_to_driver=False)
        alone, rate = placement_rates(args.placements)
        ray.shutdown()
        lines.append(
            f"placement group + no-op task + removal, one at a time: median {statistics.median(alone) * 1000:.1f} ms "
            f"(p90 {sorted(alone)[int(0.9 * len(alone))] * 1000:.1f} ms, {len(alone)} runs); from 8 threads: "
            f"{rate:.1f} groups/s"
        )
        with tempfile.TemporaryDirectory() as folder:
            wall, driver, node = tune(cluster.address, Path(folder), args.trials)
        measured = len(driver)
        lines.append(
            f"autotune run --executor ray, {measured} measured trials (plus probe and verification), 16 at once: "
            f"{wall:.1f} s wall, {measured / wall:.2f} measured trials/s"
        )
        lines.append(
            f"per trial: the driver's share (asked to told, less the node's share) median "
            f"{statistics.median(driver) * 1000:.0f} ms (p90 {sorted(driver)[int(0.9 * len(driver))] * 1000:.0f} ms); "
            f"the node's share (a trial process: start-up, 3 steps of 10 ms, exit) median {statistics.median(node):.2f} s"
        )
    finally:
        ray.shutdown()
        cluster.shutdown()
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
