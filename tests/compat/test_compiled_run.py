"""`autotune run` on a script that calls torch.compile itself (inductor on the CPU): compile budgets explored
with batch sizes, never two budgets with one partition, the workload's compile cache reused, and an answer a
user can apply. Minutes of real compilation: CI's compatibility phase."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from autotune.backends.probe_report import TorchProbeReport
from autotune.core.plans import parse_plan

from conftest import SCRIPTS

pytestmark = pytest.mark.compat

MODEL = ["--", "--blocks", "4", "--width", "64", "--tokens", "64"]


def autotune(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "autotune", *argv], capture_output=True, text=True, timeout=900
    )


def test_a_compiled_script_is_tuned_over_compile_budgets_and_batch_sizes(tmp_path: Path) -> None:
    """Every named budget's frontier is measured (--exhaustive: deterministic here, where the stopping rule
    would depend on this machine's speed), but a budget whose partition another named one has is left
    out with why; a configuration measured again (the winner's verification) compiles nothing; the answer
    is the setting to apply."""
    script = str(SCRIPTS / "compiled.py")
    common = ["--device", "cpu", "--cache-dir", str(tmp_path), "--study", "compiled"]
    budgets = [f"compile:{r}" for r in ("0", "0.7", "0.9")]  # 0.9's partition is 0.7's on this model
    run = autotune(
        "run", "--budget", "2GiB", "--batch-sizes", "8-32", "--exhaustive", "--trials", "6", "--steps", "3",
        "--warmup-steps", "1", "--tight", "0",
        "--plans", ";".join(["none", *budgets]), *common, script, *MODEL,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr

    probe = _probe(tmp_path)
    assert probe.compiles
    partition = {p: probe.compile_partition(parse_plan(p).compile_budget).partition for p in budgets}  # type: ignore[arg-type,union-attr]
    twins = [p for i, p in enumerate(budgets) if partition[p] in {partition[q] for q in budgets[:i]}]
    assert twins  # this model has budgets with one partition (0.6 to 0.9, asserted in test_compile_plans)
    for twin in twins:
        assert f"plan {twin} left out: same partition as compile:" in run.stderr  # progress: stderr

    storage = f"sqlite:///{tmp_path / 'autotune.db'}"
    trials = optuna.load_study(study_name="compiled", storage=storage).trials
    measured = [t for t in trials if t.user_attrs.get("kind") in ("measured", "verification")]
    compiled = [t for t in measured if parse_plan(t.params["plan"]).compile_budget is not None]
    assert {t.params["plan"] for t in compiled} == set(budgets) - set(
        twins
    )  # every distinct budget, once each
    seen = [(t.params["batch_size"], partition[t.params["plan"]]) for t in measured if t in compiled]
    firsts = [t for t in compiled if t.user_attrs["kind"] == "measured"]
    assert len({(t.params["batch_size"], partition[t.params["plan"]]) for t in firsts}) == len(firsts), seen

    again = [t for t in measured if t.user_attrs["kind"] == "verification"]
    assert again and all(t.user_attrs["compile_cache"]["fx_graph_misses"] == 0 for t in again)
    assert all(t.user_attrs["compile_cache"]["fx_graph_hits"] > 0 for t in again)

    best = autotune("best", "--format", "json", *common)
    assert best.returncode == 0, best.stderr
    answer = json.loads(best.stdout)
    env = autotune("best", "--env", *common).stdout
    assert f"export AUTOTUNE_PLAN={answer['plan']}" in env
    if parse_plan(answer["plan"]).compile_budget is not None:
        assert (
            f"torch._functorch.config.activation_memory_budget = {parse_plan(answer['plan']).compile_budget:g}"
            in env
        )


def _probe(cache: Path) -> TorchProbeReport:
    from autotune.storage.store import open_store

    store = open_store(f"sqlite:///{cache / 'autotune.db'}")
    study = store.study("compiled")
    assert study is not None
    workload = store.workload(study.fingerprint)
    assert workload is not None and workload.discovery is not None
    return TorchProbeReport.from_json(workload.discovery["probe"])
