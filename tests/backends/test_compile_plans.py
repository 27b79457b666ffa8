"""Compile plans (``compile:R``, torch.compile's activation memory budget) and offload plans, on real models
with real torch: the partitioner asked per budget, budgets with one partition deduplicated, the numbers of
every plan checked against no plan, the budget applied in real trials of a script that calls torch.compile
itself (inductor on the CPU), and the answer given as torch's own setting."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from scripts.compiled import Block  # the block of the script the trials below run
from torch import nn

from autotune.backends import plan_check, torch_compile
from autotune.backends.probe import default_plans, named_plans, rows
from autotune.backends.torch_modules import apply_plan
from autotune.core.plans import parse_plan
from autotune.trials.measurement import measure, measure_spec
from autotune.trials.settings import TrialSettings

from conftest import SCRIPTS

COMPILED = str(SCRIPTS / "compiled.py")


def blocks(dropout: float = 0.0) -> tuple[nn.Module, plan_check.Inputs]:
    torch.manual_seed(0)
    model = nn.Sequential(*(Block(32, dropout) for _ in range(4)), nn.Linear(32, 1))
    return model, ((torch.randn(8, 16, 32),), {})


def test_the_partitioner_is_asked_per_budget_and_budgets_with_one_partition_are_one_plan() -> None:
    model, inputs = blocks()
    parts = torch_compile.partitions(model, inputs, (0.0, 0.3, 0.6, 0.7, 0.8, 0.9))
    assert [p.ratio for p in parts] == [0.0, 0.3, 0.6, 0.7, 0.8, 0.9, 1.0]
    by_ratio = {p.ratio: p for p in parts}
    assert all(p.graphs == 1 for p in parts)  # one compiled region: no graph break in this model
    # the default partition keeps the most; budget 0 the least
    assert by_ratio[0.0].saved_bytes < by_ratio[0.3].saved_bytes < by_ratio[1.0].saved_bytes
    for part in parts:  # a duplicate names the largest budget with its partition, which names none
        if part.same_as is not None:
            assert (
                by_ratio[part.same_as].partition == part.partition and by_ratio[part.same_as].same_as is None
            )
            assert part.same_as > part.ratio
    distinct = {p.partition for p in parts}
    assert len(distinct) == sum(p.same_as is None for p in parts)
    assert len(distinct) < len(parts)  # this model has budgets that yield one partition (0.6 to 0.9)


def test_compile_and_offload_plans_keep_the_numbers_and_a_recomputed_dropout_is_caught() -> None:
    """Without dropout every budget gives no plan's loss and gradients exactly (the recompute replays the
    same ops). With dropout, torch 2.13's partitioner recomputes dropout in backward under a budget below 1
    and draws a new mask, so the gradients change: the check leaves those plans out, as it must. Module
    checkpointing and offload preserve the random state and keep the numbers."""
    model, inputs = blocks()
    plans = ["compile:0", "compile:0.5", "Block:1,compile:0.3", "Block:1/offload"]
    checks = plan_check.check_plans(model, inputs, plans)
    assert [(c.plan, c.ok, c.loss_delta, c.grad_delta) for c in checks] == [
        (p, True, 0.0, 0.0) for p in plans
    ]

    model, inputs = blocks(dropout=0.1)
    checks = {c.plan: c for c in plan_check.check_plans(model, inputs, plans)}
    assert not checks["compile:0"].ok and not checks["compile:0.5"].ok
    assert checks["compile:0"].loss_delta == 0.0 and (checks["compile:0"].grad_delta or 0) > 1e-2
    assert checks["Block:1,compile:0.3"].ok and checks["Block:1/offload"].ok


def test_an_offload_plan_keeps_the_saved_tensors_in_host_memory_and_the_gradients() -> None:
    model, (args, _) = blocks()
    reference = model(*args).square().mean()
    reference.backward()
    expected = [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]
    model.zero_grad()
    applied = apply_plan(model, parse_plan("Block:0.5/offload"))
    assert str(applied) == "Block:0.5/offload"
    model(*args).square().mean().backward()
    assert [type(block.forward).__name__ for block in list(model)[:4]] == ["_Offloaded", "method"] * 2
    assert all(torch.equal(p.grad, e) for p, e in zip(model.parameters(), expected, strict=True))  # type: ignore[arg-type]


_COMPILED_PLAN = """
import json, sys
import torch, torch._dynamo
from torch._dynamo.utils import counters
sys.path.insert(0, {tests!r})
from backends.test_compile_plans import blocks
from autotune.backends.torch_modules import apply_plan
from autotune.core.plans import parse_plan

model, (args, _) = blocks()
model(*args).square().mean().backward()
expected = [p.grad.clone() for p in model.parameters()]
model.zero_grad()
apply_plan(model, parse_plan({plan!r}))
torch.compile(model, backend="aot_eager")(*args).square().mean().backward()
scale = max(float(e.abs().max()) for e in expected)
worst = max(float((p.grad - e).abs().max()) for p, e in zip(model.parameters(), expected))
print(json.dumps({{"breaks": len(counters["graph_break"]), "graphs": counters["stats"]["unique_graphs"],
                  "delta": worst / scale}}))
"""


@pytest.mark.compat  # two inductor compilations, 16 s of CPU: CI's compatibility phase
@pytest.mark.parametrize("plan", ["Block:1", "Block:0.5/save=matmul"])
def test_a_module_plan_in_a_compiled_model_is_compiled_with_it_not_run_eagerly(plan: str) -> None:
    """Checkpointing from outside once swapped buffers in a closure that dynamo cannot trace inside a
    checkpoint: every checkpointed block broke the graph and ran eagerly, so a plan silently undid the
    script's torch.compile. Compiled, the blocks are one graph, with no plan's numbers. (In a fresh
    interpreter: onnxruntime-training, once loaded in a process, replaces torch.utils.checkpoint.checkpoint
    with its own function, which dynamo then no longer recognises.)"""
    code = _COMPILED_PLAN.format(tests=str(Path(__file__).parent.parent), plan=plan)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (found["breaks"], found["graphs"]) == (0, 1)
    assert found["delta"] <= 1e-6


@pytest.mark.slow
@pytest.mark.compat  # a probe that compiles each budget, 16 s of CPU: CI's compatibility phase
def test_the_probe_of_a_script_that_compiles_offers_each_distinct_budget_once(tmp_path: Path) -> None:
    from autotune import api

    report = api.probe(
        [COMPILED, "--blocks", "4", "--width", "64"], batch_size=8, device="cpu", cache_dir=tmp_path
    )
    data = report.probe
    assert data.compiles and data.compile_error is None
    assert len(data.compile_partitions) == len(torch_compile.CANDIDATE_RATIOS) + 1
    plans, excluded = default_plans(data)
    offered = [p for p in plans if p.startswith("compile:")]
    partitions = [data.compile_partition(parse_plan(p).compile_budget or 0).partition for p in offered]
    assert offered and len(set(partitions)) == len(partitions)  # never two plans with one partition
    duplicates = [p for p in data.compile_partitions if p.same_as is not None]
    for part in duplicates:
        assert excluded[f"compile:{part.ratio:g}"].startswith("same partition as")
    assert excluded["Block:1/offload"].startswith("GPU only")
    table = {r.plan: r for r in rows(data)}
    default = data.compile_partition(1.0)
    for plan in offered:  # predicted: what the partitioner keeps at 1 minus at this budget
        part = data.compile_partition(parse_plan(plan).compile_budget or 0)
        assert table[plan].saving_bytes == default.saved_bytes - part.saved_bytes > 0
    assert all(c.ok for c in data.checks), data.checks
    # named budgets with one partition are measured once
    if duplicates:
        twin = duplicates[0]
        named = (f"compile:{twin.same_as:g}", f"compile:{twin.ratio:g}")
        kept, left = named_plans(named, data)
        assert kept == named[:1] and left[named[1]] == f"same partition as {named[0]} (measured once)"


@pytest.mark.slow
@pytest.mark.compat  # minutes of real trials: CI's compatibility phase
def test_compile_plans_train_with_the_loss_and_gradients_of_no_plan_in_real_trials(tmp_path: Path) -> None:
    """Real trials of a script that calls torch.compile itself (inductor): the budget is set as torch is
    imported, and a budget's trial gives no plan's loss and gradients within 1e-5 (generated kernels may
    round differently from one partition to another; no dropout, see the check above, which holds budgets
    0 and 0.5 to the numbers exactly in this process). One budget: each trial compiles for a minute and a
    half on CI's loaded machine, and CI has 40 minutes."""
    settings = TrialSettings(warmup_steps=1, measured_steps=1, tight=0)  # numbers, not speed
    results = {}
    for plan in ("none", "compile:0.4"):
        out = tmp_path / f"{plan.replace(':', '-')}.pt"
        spec = measure_spec(
            [COMPILED, "--blocks", "2", "--width", "16", "--grads", str(out)],
            4,
            plan=plan,
            device="cpu",
            cache_dir=tmp_path,
            settings=settings,
        )
        result = measure(spec)
        assert result.outcome.value == "complete", result.error
        assert result.plan == plan
        results[plan] = torch.load(out)
        expected = parse_plan(plan).compile_budget
        assert results[plan]["budget"] == (1.0 if expected is None else expected)  # set before compiling
    reference = results.pop("none")
    scale = max(float(g.abs().max()) for g in reference["grads"])
    for plan, got in results.items():
        assert float((got["loss"] - reference["loss"]).abs()) <= 1e-5 * float(reference["loss"].abs()), plan
        worst = max(float((a - b).abs().max()) for a, b in zip(reference["grads"], got["grads"], strict=True))
        assert worst <= 1e-5 * scale, (plan, worst / scale)
