"""The ONNX Runtime backend on the CPU (ORT's CPU execution provider), through autotune's real trials.

onnxruntime-training 1.19.2 is installed by `make test` (the `ort` extra); ORTModule's C++ extension is
built once per machine (~30 s) into the user cache dir and reused by every later trial.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import AUTOTUNE, EXAMPLES, SCRIPTS

# Not imported here: ORT runs in the trials' processes. Imported into pytest's, it makes dynamo run a
# checkpointed model eagerly without a word (torch 2.13), and the compile plans' checks in the same worker then
# compiled nothing (which those checks now catch and say).
if importlib.util.find_spec("onnxruntime") is None:
    pytest.skip("the ort extra is not installed (pip install 'autotune[ort]')", allow_module_level=True)
pytestmark = pytest.mark.slow

EXAMPLE = EXAMPLES / "ort_transformer.py"
LIVE_BYTES = SCRIPTS / "ort_live_bytes.py"
SMALL = ["--seq", "64", "--d-model", "64", "--layers", "2", "--vocab", "128"]
STEP = re.compile(r"^step (\d+) loss ([0-9.]+)$", re.M)


def losses(text: str) -> list[float]:
    return [float(loss) for _, loss in STEP.findall(text)]


def autotune(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([AUTOTUNE, *args], capture_output=True, text=True, timeout=600, env=env)


def plain_pytorch(*args: str, env: dict[str, str] | None = None) -> list[float]:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return losses(proc.stdout)


def measured(
    cache: Path,
    plan: str,
    *args: str,
    batch: int = 4,
    script: Path = EXAMPLE,
    env: dict[str, str] | None = None,
) -> tuple[dict, list[float]]:
    proc = autotune(
        "measure",
        "--backend",
        "ort",
        "-b",
        str(batch),
        "--plan",
        plan,
        "--device",
        "cpu",
        "--json",
        "--steps",
        "3",
        "--warmup-steps",
        "1",
        "--tight",
        "0",  # exactly 3 measured steps: their losses are compared with plain PyTorch's
        "--cache-dir",
        str(cache),
        str(script),
        "--",
        *args,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    log = Path(result["log_dir"])
    assert "ORTModule" in (log / "stdout.log").read_text() + (log / "stderr.log").read_text()
    return result, losses((log / "stdout.log").read_text())


@pytest.mark.compat  # ~1 minute of ORTModule exports: CI's compatibility phase (core suite time)
def test_ortmodule_trains_with_pytorch_s_losses_and_an_export_cache_per_workload(tmp_path) -> None:
    """Recompute changes memory, never the numbers: every plan trains with plain PyTorch's losses. The
    export cache is per workload: nhead=4 and nhead=8 print alike (ORT's own cache key), yet each gets its
    own export, and the plan trials after the first train from the cached one with the same losses."""
    reference = plain_pytorch("--batch-size", "4", "--steps", "12", *SMALL)
    for plan in ("none", "BiasGelu+:1:-1", "level:1"):
        result, got = measured(tmp_path, plan, *SMALL)
        assert result["outcome"] == "complete" and result["plan"] == plan
        assert len(got) == result["warmup_steps"] + 3  # warm-up adapts: a slow first measured step is warm-up
        assert max(abs(a - b) for a, b in zip(got, reference[: len(got)], strict=True)) < 1e-5, (plan, got)
    assert len(list((tmp_path / "ort-export").iterdir())) == 1  # one workload so far, whatever the plan
    eight = [*SMALL, "--nhead", "8"]
    _, other = measured(tmp_path, "none", *eight)
    exports = sorted((tmp_path / "ort-export").iterdir())
    assert len(exports) == 2 and all(any(d.iterdir()) for d in exports)  # one cache per workload, used
    reference = plain_pytorch("--batch-size", "4", "--steps", "12", *eight)
    assert max(abs(a - b) for a, b in zip(other, reference[: len(other)], strict=True)) < 1e-5


@pytest.mark.compat  # ORT's exports: CI's compatibility phase (core suite time)
def test_the_probe_lists_ort_s_plans_with_numeric_savings(tmp_path) -> None:
    proc = autotune(
        "probe",
        "--backend",
        "ort",
        "-b",
        "4",
        "--json",
        "--device",
        "cpu",
        "--cache-dir",
        str(tmp_path),
        str(EXAMPLE),
        "--",
        *SMALL,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    rows = {row["plan"]: row for row in data["candidates"]}
    assert {row["level"] for row in rows.values()} == {"ort"}
    gelu = rows["BiasGelu+:1:-1"]
    # 2 layers x a (batch, seq, 4 x d_model) float32 GELU output: ORT's own figure, evaluated at batch 4
    assert (gelu["frequency"], gelu["saving_bytes"]) == (2, 2 * 4 * 64 * 4 * 64 * 4)
    assert gelu["saving_per_sample"] == gelu["saving_bytes"] / 4
    assert "FusedMatMul+Softmax+:1:-1" in rows
    assert all(row["saving_bytes"] > 0 for row in rows.values())


@pytest.mark.compat  # minutes of real trials: CI's compatibility phase
def test_a_plan_s_measured_saving_is_within_15_percent_of_ort_s_prediction(tmp_path) -> None:
    """ORT predicts the bytes a plan stops keeping; measured on the process's RSS with ORT's CPU arena off
    (tests/scripts/ort_live_bytes.py says why: with it on, arena fragmentation about doubles the saving).
    The probe trial also fills the workload's export cache, so neither measured trial pays the export."""
    args = ["--seq", "256", "--d-model", "256", "--layers", "4"]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}  # freed tensors go back to the kernel
    proc = autotune(
        "probe",
        "--backend",
        "ort",
        "-b",
        "8",
        "--json",
        "--device",
        "cpu",
        "--cache-dir",
        str(tmp_path),
        str(LIVE_BYTES),
        "--",
        *args,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    plan = "FusedMatMul+Softmax+:1:-1"
    predicted = {row["plan"]: row["saving_bytes"] for row in json.loads(proc.stdout)["candidates"]}[plan]
    assert predicted == 4 * 8 * 4 * 256 * 256 * 4  # layers x the (batch, heads, seq, seq) float32 softmax
    none, _ = measured(tmp_path, "none", *args, batch=8, script=LIVE_BYTES, env=env)
    recomputed, _ = measured(tmp_path, plan, *args, batch=8, script=LIVE_BYTES, env=env)
    saving = none["peak_bytes"] - recomputed["peak_bytes"]
    assert abs(saving - predicted) <= 0.15 * predicted, (saving, predicted)


@pytest.mark.compat  # minutes of real trials: CI's compatibility phase
def test_run_backend_ort_picks_a_plan_under_budget_and_best_env_reproduces_it(tmp_path) -> None:
    proc = autotune(
        "run",
        "--backend",
        "ort",
        "--budget",
        "1GiB",
        "--trials",
        "3",
        "--batch-sizes",
        "2,4,8",
        "--plans",
        "BiasGelu+:1:-1;level:1",
        "--steps",
        "2",
        "--warmup-steps",
        "1",
        "--device",
        "cpu",
        "--json",
        "--cache-dir",
        str(tmp_path),
        str(EXAMPLE),
        "--",
        *SMALL,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["plan"] in ("BiasGelu+:1:-1", "level:1")
    assert result["peak_bytes"] <= result["limit_bytes"]
    answer = autotune(
        "best",
        "--backend",
        "ort",
        "--env",
        "--device",
        "cpu",
        "--cache-dir",
        str(tmp_path),
        str(EXAMPLE),
        "--",
        *SMALL,
    )
    assert answer.returncode == 0, answer.stderr
    exports = dict(line.removeprefix("export ").split("=", 1) for line in answer.stdout.splitlines() if line)
    env = {name: shlex.split(value)[0] for name, value in exports.items()}
    assert env["AUTOTUNE_BATCH_SIZE"] == str(result["batch_size"])
    assert env["AUTOTUNE_BACKEND"] == "ort" and env["ORTMODULE_FALLBACK_POLICY"] == "FALLBACK_DISABLE"
    if result["plan"] == "level:1":
        assert env["ORTMODULE_MEMORY_OPT_LEVEL"] == "1"
    else:
        assert json.loads(Path(env["ORTMODULE_MEMORY_OPT_CONFIG"]).read_text()) == ["BiasGelu+:1:-1"]
    # Outside autotune: the same script, its environment from `best --env`, trains under ORTModule with
    # the plan (ORT's own banner says the memory optimizer is on) and the same losses as plain PyTorch.
    outside = subprocess.run(
        [sys.executable, str(EXAMPLE), "--steps", "3", *SMALL],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )
    assert outside.returncode == 0, outside.stderr[-2000:]
    assert re.search(r"Memory Optimizer\s*:\s*ON", outside.stdout + outside.stderr)
    reference = plain_pytorch("--batch-size", str(result["batch_size"]), "--steps", "3", *SMALL)
    assert max(abs(a - b) for a, b in zip(losses(outside.stdout), reference, strict=True)) < 1e-5


def test_a_tuner_skips_the_extension_check_while_the_loaded_library_is_unchanged(
    tmp_path, monkeypatch
) -> None:
    """The decision only: the check's child process is replaced by a recorder (a real check imports torch
    and ORT, ~3 s; the tests above run it for real)."""
    from autotune.backends import ort_plans
    from autotune.backends.ort import extension_build_dir

    environ = {**os.environ, "AUTOTUNE_ORT_BUILD_DIR": str(tmp_path)}
    build = extension_build_dir(environ)
    build.mkdir(parents=True)
    library = build / "aten_op_executor.so"
    library.write_bytes(b"built")
    checks: list[list[str]] = []

    def child(argv, **kwargs):
        checks.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(ort_plans.subprocess, "run", child)

    def ensure() -> None:
        monkeypatch.setattr(ort_plans, "_extension_ready", False)  # a new tuner process
        ort_plans.ensure_extension(environ)

    ensure()
    ensure()
    assert len(checks) == 1  # checked once, then the stamp of the loaded library answers
    os.utime(library, ns=(0, 0))  # rebuilt or replaced: checked again
    ensure()
    ensure()
    assert len(checks) == 2
    library.unlink()  # gone: the check (which builds it) runs every time until a library is there
    ensure()
    assert len(checks) == 3


def test_a_build_killed_mid_way_leaves_no_lock_that_later_trials_wait_on(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """torch's extension builder waits, polling and silent, on a ``lock`` file for as long as it exists, and
    only the builder that made it removes it: a build killed mid-way once made every later ORT trial of CI's
    machine wait out its start-up timeout. autotune's builders hold an flock beside it, which the kernel
    drops when its holder dies: real processes, a real kill -9."""
    import threading
    import time

    from autotune.backends.ort import building

    stale = tmp_path / "lock"
    stale.write_text("")  # a dead build's
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from autotune.backends.ort import "
         "building\nwith building(Path(sys.argv[1])):\n    open(Path(sys.argv[1]) / 'lock', 'w').close()\n"
         "    print('building', flush=True); time.sleep(120)", str(tmp_path)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "building\n"
        assert stale.exists()  # the live build's own lock file now
        entered = threading.Event()

        def build_next() -> None:
            with building(tmp_path):
                entered.set()

        waiter = threading.Thread(target=build_next, daemon=True)
        waiter.start()
        said = ""
        deadline = time.monotonic() + 30
        while "waiting for another" not in said and time.monotonic() < deadline:  # a busy machine's thread
            said += capfd.readouterr().err
            time.sleep(0.05)
        assert f"waiting for another process's build of ORTModule's extension in {tmp_path}" in said
        assert not entered.wait(0.5)  # a live build is waited for, and the wait is said
        holder.kill()  # mid-build: its lock file stays behind (a kill -9 removes nothing) ...
        holder.wait(timeout=30)
        assert entered.wait(30)  # ... but the flock died with its holder: the next build goes on ...
        assert not stale.exists()  # ... having removed the dead build's lock file: torch's won't wait
    finally:
        holder.kill()
        holder.wait(timeout=30)
