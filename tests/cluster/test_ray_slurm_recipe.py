"""examples/slurm/ray-cluster.sbatch as far as one host allows: no Slurm here, so `scontrol` and `srun` are
stand-ins (labelled: they run the step on this host, the one node of the allocation) and the recipe's own
commands are real: `ray start --head --block` through srun, the wait until every node joined, `autotune
run --executor ray` as the driver, and the Ray processes stopped when the job ends. Joining workers on
other nodes needs other hosts: not tested here (tests/cluster/test_ray_cluster.py has multi-node clusters
through Ray's own utility)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.hardware.ray_address import address_file

from conftest import ROOT, SYNTHETIC

pytest.importorskip("ray", reason="Ray is the cluster extra: make test-ray")
pytestmark = pytest.mark.ray

RECIPE = ROOT / "examples" / "slurm" / "ray-cluster.sbatch"

# STAND-INS for Slurm's commands on a one-node allocation: this host.
SCONTROL = """#!/usr/bin/env bash
[ "$1 $2" = "show hostnames" ] && echo "$(hostname)"
"""
SRUN = """#!/usr/bin/env bash
while [ $# -gt 0 ]; do case "$1" in -w) shift 2;; -*) shift;; *) break;; esac; done
exec "$@"
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _ray_processes(port: int) -> list[str]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if f":{port}" in cmdline or f"--port={port}" in cmdline or f"gcs_server_port={port}" in cmdline:
                found.append(cmdline)
    return found


def test_the_recipe_starts_ray_runs_the_driver_on_it_and_stops_ray(tmp_path: Path) -> None:
    shims = tmp_path / "bin"
    shims.mkdir()
    for name, text in (("scontrol", SCONTROL), ("srun", SRUN)):
        (shims / name).write_text(text)
        (shims / name).chmod(0o755)
    port = _free_port()
    env = {
        **os.environ,
        "PATH": f"{shims}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "node1",
        "SLURM_CPUS_PER_TASK": "2",
        "SLURM_GPUS_PER_TASK": "0",
        "RAY_PORT": str(port),
        "RAY_USAGE_STATS_ENABLED": "0",
        "COLUMNS": "400",
        "AUTOTUNE_RUN_FLAGS": f"--device cpu --cache-dir {tmp_path / 'cache'}",
    }
    env.pop("RAY_ADDRESS", None)
    job = subprocess.run(
        ["bash", str(RECIPE), "--budget", "1GiB", "--trials", "2", "--batch-sizes", "1,2,4", "--plans", "none",
         "--warmup-steps", "1", "--steps", "2", "--study", "slurm", "--",
         "python", str(SYNTHETIC), "--per-sample-mib", "10", "--step-seconds", "0.05"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert job.returncode == 0, job.stdout + job.stderr
    assert (
        f"autotune-ray: Ray cluster at {socket.gethostbyname(socket.gethostname())}:{port}" in job.stderr
        or (f":{port}: 1 node(s), 0 GPU(s) and 2 CPU(s) each" in job.stderr)
    ), job.stderr
    assert "trials of 1 CPU(s) (cpu)" in job.stderr  # the driver ran on the recipe's cluster
    assert "batch size" in job.stdout and "study       slurm" in job.stdout, job.stdout
    deadline = time.monotonic() + 30
    while _ray_processes(port) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _ray_processes(port) == []  # the job's end stopped its Ray cluster
    # ... and took back Ray's record of it: a later ray.init() on the node would wait minutes on it
    recorded = address_file().read_text().strip() if address_file().exists() else ""
    assert not recorded.endswith(f":{port}"), recorded
