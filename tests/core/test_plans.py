from __future__ import annotations

import pytest

from autotune.core.errors import InputError
from autotune.core.plans import ModuleRule, Plan, parse_plan


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("none", "none"),
        ("", "none"),
        ("ALL", "all"),
        ("Block", "Block:1"),
        ("Block:0.5", "Block:0.5"),
        ("MLP:0.25, Attention", "Attention:1,MLP:0.25"),
        ("Block:1.0", "Block:1"),
        ("Block:.5", "Block:0.5"),
    ],
)
def test_plan_strings_round_trip_to_a_canonical_form(text: str, canonical: str) -> None:
    plan = parse_plan(text)
    assert str(plan) == canonical
    assert parse_plan(str(plan)) == plan


@pytest.mark.parametrize(
    "text",
    ["Block:0", "Block:1.5", "Block:-1", "Block:x", "Block:", "9Block", "a.b", "Block,Block", "Block:nan"],
)
def test_bad_plans_are_rejected_with_one_line(text: str) -> None:
    with pytest.raises(InputError) as info:
        parse_plan(text)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("ratio", "instances", "count"),
    [(1.0, 4, 4), (0.5, 4, 2), (0.5, 3, 2), (0.1, 4, 1), (0.25, 12, 3), (1.0, 0, 0)],
)
def test_rule_counts_instances(ratio: float, instances: int, count: int) -> None:
    assert ModuleRule("Block", ratio).count(instances) == count


def test_none_and_all() -> None:
    assert Plan.none().is_none
    assert not Plan.all().is_none
    assert parse_plan("all") == Plan.all()
