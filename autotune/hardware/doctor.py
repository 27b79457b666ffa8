"""``autotune doctor``: what works on this machine, and what to do about what does not.

torch is checked in a child process: the CLI never imports it itself.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import sqlite3
import subprocess
import sys
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from autotune.core.errors import DeviceError
from autotune.hardware.ray_address import NoClusterAnswers, connection, token_auth_environment

_TORCH_PROBE = """
import json
import torch
from torch.utils.checkpoint import create_selective_checkpoint_contexts  # operator-level plans need it
print(json.dumps({"version": torch.__version__, "cuda": torch.version.cuda, "available": torch.cuda.is_available(),
                  "devices": torch.cuda.device_count()}))
"""


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    hint: str | None = None
    required: bool = False  # autotune cannot tune at all without it

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def checks(ray_address: str | None = None, ort: bool = False) -> Iterator[Check]:
    """Every check, in the order a user would fix them, each as soon as it is done (``ray_address``: the Ray
    cluster to look at; None: RAY_ADDRESS, else one running here). ORTModule trains a step only with ``ort``
    (``--backend ort``): on a fresh machine that builds ORT's C++ extension first, and the check took 56-103 s
    of every doctor call for users who never use the deprecated backend (issue 44); without it, whether it
    is installed."""
    yield _torch()
    yield _nvml()
    yield _cpu_memory()
    yield _sqlite()
    yield _postgres()
    yield _ray(ray_address)
    yield _ort(ort)


def _torch() -> Check:
    proc = subprocess.run([sys.executable, "-c", _TORCH_PROBE], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return Check(
            "torch", False, last, "pip install torch (>= 2.4, for selective checkpointing)", required=True
        )
    info = json.loads(proc.stdout)
    if info["cuda"] is None:
        detail = f"{info['version']}, CPU build: trials run on the CPU and measure peak RSS"
        return Check("torch", True, detail, required=True)
    cuda = (
        f"CUDA {info['cuda']}, {info['devices']} device(s) visible"
        if info["available"]
        else "no device visible"
    )
    return Check(
        "torch",
        True,
        f"{info['version']}, {cuda}",
        None if info["available"] else "check the NVIDIA driver and CUDA_VISIBLE_DEVICES",
        required=True,
    )


def _nvml() -> Check:
    from autotune.hardware.nvml import load_nvml

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            nvml = load_nvml()
        except DeviceError as e:
            return Check(
                "NVML (GPU memory)", False, str(e), "without a GPU autotune measures CPU RSS; nothing to do"
            )
    shadow = next((str(w.message) for w in caught if "shadows" in str(w.message)), None)
    names = [
        nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(nvml.nvmlDeviceGetCount())
    ]
    driver = nvml.nvmlSystemGetDriverVersion()
    detail = f"driver {driver}: {', '.join(str(n) for n in names) or 'no GPU'}"
    return Check("NVML (GPU memory)", shadow is None, detail, shadow)


def _cpu_memory() -> Check:
    """How a CPU trial of several processes is measured here: Pss (shared pages once) or, without the
    kernel's smaps_rollup, summed RSS (shared pages once per process: on the safe side of a budget)."""
    if os.path.exists(f"/proc/{os.getpid()}/smaps_rollup"):
        return Check("CPU memory (process trees)", True, "Pss from /proc/PID/smaps_rollup: shared pages once")
    return Check(
        "CPU memory (process trees)",
        True,
        "summed RSS: pages a forked worker shares are counted once per process (no smaps_rollup here)",
        "a Linux kernel of 4.14 or later counts them once (Pss)",
    )


def _sqlite() -> Check:
    return Check("SQLite (default storage)", True, f"SQLite {sqlite3.sqlite_version}")


def _postgres() -> Check:
    missing = _not_installed(
        "PostgreSQL driver", "psycopg", "psycopg", "--storage postgresql://...", "postgres"
    )
    return missing or Check("PostgreSQL driver", True, f"psycopg {importlib.metadata.version('psycopg')}")


_RAY_PROBE = """
import json, logging, sys
import ray
ray.init(address=sys.argv[1], logging_level=logging.ERROR, log_to_driver=False)
nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
print(json.dumps({"version": ray.__version__, "address": ray.get_runtime_context().gcs_address,
                  "gpus": [n.get("GPU", 0) for n in nodes], "cpus": sum(n.get("CPU", 0) for n in nodes)}))
"""


RAY_PROBE_SECONDS = 60  # a cluster that answers on its port but not to Ray's client within this is reported


def _ray(address: str | None) -> Check:
    """The Ray cluster ``--executor ray`` would place trials on: its nodes and GPUs (in a child process:
    Ray's import and connection stay out of the CLI). An address where nothing answers, or the dead cluster
    Ray's address file names, is said at once: Ray's own connection would wait minutes on it."""
    missing = _not_installed("Ray cluster", "ray", "ray", "--executor ray", "ray")
    if missing is not None:
        return missing
    hint = (
        "only for --executor ray: start one (ray start --head; examples/slurm/ray-cluster.sbatch on Slurm) "
        "or name it (--ray-address, RAY_ADDRESS); without one, a run starts a local one"
    )
    try:
        to = connection(address)
    except NoClusterAnswers as e:
        return Check("Ray cluster", False, e.reason, hint)
    if to.passed_over is not None:  # Ray would wait on the dead cluster its file names: none runs here
        return Check("Ray cluster", False, f"no Ray cluster running here: {to.passed_over}", hint)
    where = to.init_address or to.shown
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _RAY_PROBE, where],
            capture_output=True,
            text=True,
            timeout=RAY_PROBE_SECONDS,
            env={**os.environ, **token_auth_environment(os.environ)},
        )
    except subprocess.TimeoutExpired:
        return Check(
            "Ray cluster", False, f"the Ray cluster at {where} did not answer in {RAY_PROBE_SECONDS} s", hint
        )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return Check("Ray cluster", False, f"no Ray cluster at {where}: {last}", hint)
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    gpus = found["gpus"]
    return Check(
        "Ray cluster",
        True,
        f"ray {found['version']}, cluster at {found['address']}: {len(gpus)} node(s), {sum(gpus):g} GPU(s)"
        f" ({', '.join(f'{g:g}' for g in gpus)} per node), {found['cpus']:g} CPU(s)",
    )


ORT_PROBE_SECONDS = 1800  # a fresh machine builds ORT's C++ extension first (a minute here)
_ORT_PROBE = """
import sys
from autotune.backends.ort import SUPPORTED_VERSION, OrtUnavailable, extension_build_dir, wrap
try:
    import torch
    model = wrap(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1)))
    model(torch.randn(4, 8)).sum().backward()
except OrtUnavailable as e:
    sys.exit(str(e))
print(f"onnxruntime-training {SUPPORTED_VERSION}, ORTModule trains here (extension in {extension_build_dir()})")
"""


def _ort(train: bool) -> Check:
    missing = _not_installed(
        "ONNX Runtime backend",
        "onnxruntime",
        "onnxruntime-training",
        "--backend ort (deprecated upstream)",
        "ort",
    )
    if missing is not None:
        return missing
    if not train:
        try:
            version = f"onnxruntime-training {importlib.metadata.version('onnxruntime-training')}"
        except importlib.metadata.PackageNotFoundError:
            version = "onnxruntime (not onnxruntime-training)"
        return Check(
            "ONNX Runtime backend",
            True,
            f"{version} installed; not trained here: autotune doctor --backend ort trains a step "
            "(a fresh machine first builds its C++ extension, about a minute)",
        )
    env = {
        **os.environ,
        "ORTMODULE_FALLBACK_POLICY": "FALLBACK_DISABLE",
        "ORTMODULE_ENABLE_CUSTOM_AUTOGRAD": "0",
    }
    hint = (
        "supported: onnxruntime-training 1.19.2 with a C++ compiler and the Python headers for its "
        "extension (pip install 'autotune[ort]')"
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _ORT_PROBE],
            capture_output=True,
            text=True,
            timeout=ORT_PROBE_SECONDS,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return Check(
            "ONNX Runtime backend", False, f"ORTModule did not train a step in {ORT_PROBE_SECONDS} s", hint
        )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return Check("ONNX Runtime backend", False, last, hint)
    return Check("ONNX Runtime backend", True, proc.stdout.strip().splitlines()[-1])


def _not_installed(name: str, module: str, distribution: str, purpose: str, extra: str) -> Check | None:
    """A failed check naming the extra that installs ``distribution``, or None if ``module`` is importable."""
    if importlib.util.find_spec(module) is not None:
        return None
    return Check(
        name,
        False,
        f"{distribution} is not installed",
        f"only for {purpose}: pip install 'autotune[{extra}]'",
    )
