"""Which modules are the script's model (autotune.backends.torch_model), and a model of several trees
probed, planned and checked as one (#32 item 2). In-process, tiny torch models; the trial of a real script
of three modules is tests/compat/test_whole_model.py."""

from __future__ import annotations

import copy

import torch
from torch import nn

from autotune.backends.plan_check import capture, check_plans_of
from autotune.backends.torch_model import Whole, find_model, trees_of
from autotune.backends.torch_modules import apply_plan, find_candidates
from autotune.core.plans import parse_plan

from conftest import Block


class Body(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def three() -> tuple[nn.Module, nn.Module, nn.Module]:
    torch.manual_seed(0)
    return nn.Embedding(50, 16), Body(), nn.Linear(16, 50)


def test_the_model_is_every_tree_the_optimizer_trains_and_not_a_teacher_or_an_ema_copy() -> None:
    emb, body, head = three()
    teacher = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16))  # trainable, in no optimizer
    ema = copy.deepcopy(body)
    frozen = Body().requires_grad_(False)
    optimizer = torch.optim.SGD([*emb.parameters(), *body.parameters(), *head.parameters()], lr=0.1)
    model = find_model(emb)
    assert isinstance(model, Whole)
    assert trees_of(model) == [emb, body, head]  # the first called first, then by class
    assert find_model(teacher) is None
    assert {c.cls: c.count for c in find_candidates(model)} == {"Block": 4}
    del optimizer, ema, frozen


def test_one_tree_is_the_model_itself_and_a_wrapper_is_its_tree() -> None:
    emb, body, head = three()
    model = nn.Sequential(emb, body, head)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert find_model(model) is model
    compiled = torch.compile(model, backend="eager")  # called, it is the first module to run a forward
    assert find_model(compiled) is compiled  # the wrapper holds the model: the tree is the wrapper
    del optimizer


class Container(nn.Module):
    """A LightningModule's shape: its training step calls its parts, never its own forward."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.extra = nn.Embedding(50, 16), nn.Sequential(Body(), nn.Linear(16, 50))
        self.loss = nn.CrossEntropyLoss()  # no parameters: no part


def test_a_tree_whose_own_forward_is_not_called_is_the_parts_the_script_calls() -> None:
    """A submodule's forward is the first (the tree's own would have run first and been found): the tree's
    own forward is not running, and the model is its parts, the first called first, then the trainable
    children on the way down to it, in the tree's order (the probe's hooks see their forwards)."""
    only = nn.Sequential(Body())  # one trainable part: the part itself
    optimizer = torch.optim.SGD(only.parameters(), lr=0.1)
    assert find_model(only[0]) is only[0]
    del optimizer, only
    model = Container()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    body, head = model.extra
    found = find_model(body)
    assert isinstance(found, Whole) and trees_of(found) == [body, model.emb, head]
    assert {c.cls: c.count for c in find_candidates(found)} == {"Block": 4}
    assert find_model(model.emb) is not None and trees_of(find_model(model.emb)) == [model.emb, model.extra]
    del optimizer


def test_before_an_optimizer_exists_every_trainable_tree_is_the_model() -> None:
    emb, body, head = three()
    model = find_model(body)
    assert trees_of(model)[0] is body and {id(emb), id(head)} <= {id(t) for t in trees_of(model)}


def test_a_plan_on_several_trees_covers_them_together_and_is_checked_on_each_tree_s_inputs() -> None:
    """Block:0.5 takes every other one of the body's four blocks (0 and 2); the check runs the three trees on their
    own recorded inputs and passes with the numbers of no plan, and a plan that ran nowhere fails."""
    emb, body, head = three()
    optimizer = torch.optim.SGD([*emb.parameters(), *body.parameters(), *head.parameters()], lr=0.1)
    model = find_model(emb)
    assert model is not None
    tokens = torch.randint(0, 50, (4, 8))
    hidden = emb(tokens)
    runs = [
        (emb, capture((tokens,), {})),
        (body, capture((hidden,), {})),
        (head, capture((body(hidden),), {})),
    ]
    checks = check_plans_of(model, runs, ["Block:0.5", "Block:1"])
    assert [(c.plan, c.ok, c.loss_delta, c.grad_delta) for c in checks] == [
        ("Block:0.5", True, 0.0, 0.0),
        ("Block:1", True, 0.0, 0.0),
    ]
    [idle] = check_plans_of(model, runs[:1], ["Block:1"])  # the body did not run: the plan wrapped nothing
    assert idle.error == "the plan ran nowhere in the check step: no forward it wraps was called"
    assert str(apply_plan(model, parse_plan("Block:0.5"))) == "Block:0.5"
    assert [("forward" in b.__dict__) for b in body.blocks] == [True, False, True, False]
    del optimizer
