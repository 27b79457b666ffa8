"""State across calls, containers, and the probe's check that a plan never changes the numbers, on real
(tiny) torch models; then through a real probe trial, `probe` and `run`."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path

import torch
from torch import nn

from autotune.backends.plan_check import capture, check_plans
from autotune.backends.probe_report import PlanCheck
from autotune.backends.torch_modules import apply_plan, find_candidates, plan_applied
from autotune.core.plans import parse_plan

from conftest import AUTOTUNE


class Normed(nn.Module):
    """A block with BatchNorm: its running statistics change in every training forward."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.norm = nn.BatchNorm1d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.norm(self.fc(x)))


class Counting(nn.Module):
    """A block whose output depends on how often it ran in this step (the model resets the count at each
    forward): its recompute differs from its forward."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return torch.tanh(self.fc(x) * self.calls)


class Counted(nn.Sequential):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for module in self.modules():
            if isinstance(module, Counting):
                module.calls = 0
        return super().forward(x)


def normed_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(Normed(), Normed(), Normed())


def test_a_checkpointed_batchnorm_updates_its_running_statistics_once() -> None:
    plain, checkpointed = normed_model(), normed_model()
    apply_plan(checkpointed, parse_plan("Normed"))
    for model in (plain, checkpointed):
        for _ in range(3):
            model(torch.randn(16, 8, generator=torch.Generator().manual_seed(1))).square().mean().backward()
    for (name, a), b in zip(plain.named_buffers(), checkpointed.buffers(), strict=True):
        assert torch.equal(a, b), name
    assert all(
        torch.equal(a.grad, b.grad)
        for a, b in zip(plain.parameters(), checkpointed.parameters(), strict=True)
    )


def test_a_container_of_blocks_is_not_a_block() -> None:
    stages = nn.Sequential(*(nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(6)))
    found = [(c.cls, c.count, c.outermost) for c in find_candidates(nn.Sequential(stages, nn.Linear(4, 1)))]
    assert found == [("Sequential", 6, True)]  # the six blocks, neither the stage holding them nor the root


def test_a_ddp_model_counts_its_blocks_once(tmp_path: Path) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        blocks = nn.Sequential(
            *(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4)) for _ in range(6))
        )
        found = [(c.cls, c.count, c.outermost) for c in find_candidates(DistributedDataParallel(blocks))]
    finally:
        dist.destroy_process_group()
    assert found == [("Sequential", 6, True)]


def test_plan_applied_leaves_the_model_as_it_was() -> None:
    model = normed_model()
    with plan_applied(model, parse_plan("Normed:1/save=matmul")) as applied:
        assert str(applied) == "Normed:1/save=matmul"
        assert "forward" in vars(model[0])
    assert all("forward" not in vars(m) for m in model.modules())
    assert not hasattr(model, "_autotune_plan")
    assert str(apply_plan(model, parse_plan("Normed:0.5"))) == "Normed:0.5"  # a plan still applies afterwards


def test_the_check_passes_plans_that_keep_the_numbers_and_flags_one_that_changes_them() -> None:
    torch.manual_seed(0)
    model = Counted(Normed(), Normed(), Counting(), Counting())
    inputs = capture((torch.randn(16, 8),), {})
    before = copy.deepcopy(model.state_dict())
    model[0].fc.weight.grad = torch.ones(8, 8)  # the script's own gradient, kept through the check
    checks = check_plans(model, inputs, ["Normed:1", "Normed:1/save=matmul", "Counting:1"])
    assert [(c.plan, c.ok) for c in checks] == [
        ("Normed:1", True),
        ("Normed:1/save=matmul", True),
        ("Counting:1", False),
    ]
    assert (checks[0].loss_delta, checks[0].grad_delta, checks[0].tolerance) == (0.0, 0.0, 1e-5)
    assert checks[2].reason.startswith("changes the numbers: loss off by 0, gradients by ")
    assert torch.equal(model[0].fc.weight.grad, torch.ones(8, 8))
    assert all(torch.equal(value, model.state_dict()[key]) for key, value in before.items())
    assert all("forward" not in vars(m) for m in model.modules())


def test_a_plan_that_raises_is_excluded_with_its_error() -> None:
    class Mutating(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.fc(x)
            return y.relu_() if torch.is_grad_enabled() else y  # an in-place op on a saved output

    model = nn.Sequential(Mutating(), Mutating())
    [check] = check_plans(model, capture((torch.randn(4, 8),), {}), ["Mutating:1/save=matmul"])
    assert (check.ok, check.reason.startswith("fails on this model: RuntimeError")) == (False, True), check
    assert PlanCheck.from_json(check.__dict__) == check


SCRIPT = """\
import torch, autotune
from torch import nn
class Counting(nn.Module):
    def __init__(self):
        super().__init__(); self.fc = nn.Linear(256, 256); self.calls = 0
    def forward(self, x):
        self.calls += 1
        return torch.tanh(self.fc(x) * self.calls)
class Block(nn.Module):
    def __init__(self):
        super().__init__(); self.fc = nn.Linear(256, 1024); self.out = nn.Linear(1024, 256)
    def forward(self, x):
        return x + self.out(torch.relu(self.fc(x)))
class Model(nn.Sequential):
    def forward(self, x):
        for module in self.modules():
            if isinstance(module, Counting):
                module.calls = 0
        return super().forward(x)
model = Model(*(nn.Sequential(Block(), Counting()) for _ in range(4)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(1000):
    model(torch.randn(autotune.batch_size(8), 256)).square().mean().backward(); opt.step(); opt.zero_grad()
"""


# the probe, a search trial, a verification; exactly these steps (--tight 0): a probe trial of three steps
# beside a busy neighbour (which stops measuring on) ended before its probe checked the plans, since the probe
# attaches at the model's first forward, and the run offered every plan unchecked, Counting:1 included
FEW = ["--steps", "2", "--warmup-steps", "1", "--tight", "0", "--trials", "3"]


def test_a_probe_that_could_not_check_its_plans_offers_none_of_them() -> None:
    """A probe whose trial ended before the check against no plan ran (a script that trains fewer steps than
    the probe needs) reports every plan the check would have tried as not checked: none is offered."""
    from autotune.backends.probe import default_plans, rows
    from autotune.backends.torch_probe import Probe

    torch.manual_seed(0)
    model = nn.Sequential(
        *(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64)) for _ in range(4))
    )
    probe = Probe(model, 8, ())
    for _ in range(4):  # no step between them: the trial never called after_step
        model(torch.randn(8, 64)).square().mean().backward()
    assert probe.done and probe.pending
    report = probe.result()
    why = "not checked against no plan: the probe's trial ended before the check ran (the script trained too few steps)"
    assert [(c.plan, c.reason) for c in report.checks] == [("Sequential:1", why)]
    assert {r.plan: r.excluded for r in rows(report)}["Sequential:1"] == why
    plans, excluded = default_plans(report)
    assert plans == ("none",) and excluded["Sequential:1"] == why


def test_probe_and_run_leave_out_a_plan_that_changes_the_numbers_and_say_why(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    common = ["--device", "cpu", "--cache-dir", str(tmp_path)]
    probe = subprocess.run(
        [AUTOTUNE, "probe", *common, str(script)], capture_output=True, text=True, timeout=300
    )
    assert probe.returncode == 0, probe.stderr
    excluded = [line for line in probe.stdout.splitlines() if line.startswith("not offered: Counting:1:")]
    assert len(excluded) == 1 and excluded[0].startswith(
        "not offered: Counting:1: changes the numbers: loss off by 0, gradients by "
    ), probe.stdout
    assert (
        "checked against no plan (one step on the probe's batch): 1 of 3 plan(s)" in probe.stdout
    )  # Block:1 only
    run = subprocess.run(
        [AUTOTUNE, "run", "--budget", "4GiB", "--batch-sizes", "4-8", *FEW, *common, str(script)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr
    assert "plan Counting:1 left out: changes the numbers" in run.stderr
    assert "Counting:1" not in "".join(line for line in run.stderr.splitlines() if line.startswith("trial"))
    # issue 44: a plan left out for the device (offload on the CPU) the user never named is not said, and an
    # answer from the database (zero trials) says nothing of plans at all
    assert "left out: GPU only" not in run.stderr
    again = subprocess.run(run.args, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "zero trials" in again.stderr, again.stderr
    assert "left out" not in again.stderr
    named = subprocess.run(
        [AUTOTUNE, "run", "--budget", "4GiB", "--batch-sizes", "4-8", *FEW, "--plans",
         "none;Counting:0.5;Block:1", *common, str(script)],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert named.returncode == 0, named.stderr
    assert "checking Counting:0.5 against no plan (one instrumented trial)" in named.stderr
    assert "plan Counting:0.5 left out: changes the numbers" in named.stderr
    alone = subprocess.run(
        [AUTOTUNE, "run", "--budget", "4GiB", "--plans", "Counting:0.5", *common, str(script)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert alone.returncode == 2
    assert "checking" not in alone.stderr  # its check is stored with the workload
    assert (
        alone.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "Error: no plan named with --plans keeps the numbers of no plan: Counting:0.5: changes the numbers"
        )
    )
