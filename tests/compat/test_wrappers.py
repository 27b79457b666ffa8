"""A plan applied and checked through the wrappers users put around their model (#32 item 1): Lightning
Fabric's _FabricModule, DDP (gloo, one process), torch.compile's OptimizedModule, PEFT's PeftModel and
Accelerate's prepared model. Each check proves its plan ran (its wrapped forwards counted in the check step),
twice in a row (a plan left applied by the first would make the second wrap nothing and pass with a
difference of 0, as the Fabric loop did), and the plan's state is the inner model's, never set on a wrapper.
In-process, a tiny real model; the probe of a real Fabric script is tests/compat/test_fabric_probe.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from autotune.backends.plan_check import capture, check_plans
from autotune.backends.torch_modules import applied_plan, apply_plan, inner_module
from autotune.core.plans import parse_plan

from conftest import Blocks as Net

pytestmark = pytest.mark.compat


def fabric(model: nn.Module) -> nn.Module:
    from lightning.fabric import Fabric

    wrapped = Fabric(accelerator="cpu", devices=1).setup_module(model)
    assert type(wrapped).__name__ == "_FabricModule"
    return wrapped


@pytest.fixture
def gloo(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def ddp(model: nn.Module) -> nn.Module:
    return nn.parallel.DistributedDataParallel(model)


def compiled(model: nn.Module) -> nn.Module:
    return torch.compile(model, backend="eager")


def peft(model: nn.Module) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=4, target_modules=["fc", "out"]))


def accelerate(model: nn.Module) -> nn.Module:
    from accelerate import Accelerator

    return Accelerator(cpu=True).prepare(model)


WRAPPERS: dict[str, Callable[[nn.Module], nn.Module]] = {
    "fabric": fabric,
    "ddp": ddp,
    "compiled": compiled,
    "peft": peft,
    "accelerate": accelerate,
}


@pytest.mark.parametrize("name", list(WRAPPERS))
def test_a_plan_is_checked_and_applied_through_a_wrapper_and_kept_on_the_inner_model(
    name: str, request: pytest.FixtureRequest
) -> None:
    if name == "ddp":
        request.getfixturevalue("gloo")
    torch.manual_seed(0)
    inner = Net()
    wrapped = WRAPPERS[name](inner)
    inputs = capture((torch.randn(4, 16),), {})
    plans = ["Block:1", "Block:0.5/save=matmul", "Block:0.5/offload"]
    for _ in range(2):  # a plan left applied by the first round would make the second wrap nothing
        checks = check_plans(wrapped, inputs, plans)
        assert [(c.plan, c.error, c.ok) for c in checks] == [(p, None, True) for p in plans]
        assert applied_plan(wrapped) is None and applied_plan(inner) is None
        assert not any("forward" in b.__dict__ for b in inner.blocks)  # put back as it was
    base = inner_module(wrapped)
    assert base is (inner if name != "peft" else wrapped.get_base_model())
    assert not any(key.startswith("_autotune") for key in vars(wrapped)) and not any(
        key.startswith("_autotune") for key in vars(inner)
    )
    assert str(apply_plan(wrapped, parse_plan("Block:0.5"))) == "Block:0.5"
    assert str(apply_plan(base, parse_plan("Block:1"))) == "Block:0.5"  # once: through the wrapper or not
    assert [("forward" in b.__dict__) for b in inner.blocks] == [
        True,
        False,
        True,
        False,
    ]  # every other block
