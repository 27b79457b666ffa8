from __future__ import annotations

import pytest

from autotune.core.errors import InputError
from autotune.core.plans import ModuleRule, Plan, Sharding, Zero, parse_plan, recomputes_at_least


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
        ("compile:0.50", "compile:0.5"),
        ("compile:0", "compile:0"),
        ("compile:.3, Block", "Block:1,compile:0.3"),
        ("all,compile:0.2", "all,compile:0.2"),
        ("Block:0.5/offload", "Block:0.5/offload"),
        ("Block:1|compile:0.4", "Block:1|compile:0.4"),
        ("fsdp:keep", "fsdp:keep"),
        ("fsdp:offload+keep, Block:0.5", "Block:0.5,fsdp:keep+offload"),
        ("fsdp:4", "fsdp:4"),
        ("fsdp:reshard+offload", "fsdp:reshard+offload"),
        ("Block:1,fsdp:keep|fsdp:keep", "Block:1,fsdp:keep|fsdp:keep"),
        ("zero:2", "zero:2"),
        ("zero:offload+3, Block:0.5", "Block:0.5,zero:3+offload"),
        ("zero:offload", "zero:offload"),
        ("zero:0", "zero:0"),
    ],
)
def test_plan_strings_round_trip_to_a_canonical_form(text: str, canonical: str) -> None:
    plan = parse_plan(text)
    assert str(plan) == canonical
    assert parse_plan(str(plan)) == plan


@pytest.mark.parametrize(
    "text",
    [
        *(
            "Block:0",
            "Block:1.5",
            "Block:-1",
            "Block:x",
            "Block:",
            "9Block",
            "a.b",
            "Block,Block",
            "Block:nan",
        ),
        *("compile", "compile:1.5", "compile:x", "compile:0.1,compile:0.2", "compile:0.5/offload"),
        *("Block:1/offload+x", "all,Block"),
        *(
            "fsdp",
            "fsdp:",
            "fsdp:1",
            "fsdp:0",
            "fsdp:keep+reshard",
            "fsdp:keep+2",
            "fsdp:x",
            "fsdp:keep,fsdp:offload",
        ),
        "fsdp:keep|none",  # the ranks of a block gather together: one sharding for all
        *("zero", "zero:", "zero:4", "zero:-1", "zero:1+2", "zero:x", "zero:0+offload", "zero:1,zero:2"),
        *("zero:2,fsdp:keep", "fsdp:keep,zero:2", "zero:1|zero:2"),  # one sharding, the same on every rank
    ],
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


def test_a_plan_per_rank_reads_prints_and_gives_each_rank_its_entry() -> None:
    plan = parse_plan("Block:1 | Block:0.5|none")
    assert str(plan) == "Block:1|Block:0.5|none"
    assert [str(plan.for_rank(r)) for r in range(3)] == ["Block:1", "Block:0.5", "none"]
    assert str(parse_plan("Block:1|Block:1")) == "Block:1"  # alike on every rank: one plan
    assert not plan.is_none and parse_plan("none|none").is_none
    with pytest.raises(InputError, match="rank 3"):
        plan.for_rank(3)
    with pytest.raises(InputError, match="no rank"):
        plan.for_rank(None)
    with pytest.raises(InputError, match="a plan for every rank"):
        parse_plan("Block:1||none")
    assert parse_plan("Block:0.5").for_rank(7) == parse_plan("Block:0.5")


def test_recomputing_at_least_is_judged_rank_by_rank() -> None:
    assert recomputes_at_least(parse_plan("A:1|A:0.5"), parse_plan("A:0.5"))
    assert not recomputes_at_least(parse_plan("A:0.5"), parse_plan("A:1|none"))
    assert recomputes_at_least(parse_plan("A:1|none"), parse_plan("A:0.5|none"))
    assert not recomputes_at_least(parse_plan("A:1|none"), parse_plan("none|A:0.5"))
    assert not recomputes_at_least(parse_plan("A:1|A:1|none"), parse_plan("A:1|none"))  # another world size


def test_compile_and_offload_plans_say_what_they_are_and_claim_no_order_between_budgets() -> None:
    budget, offload = parse_plan("compile:0.3"), parse_plan("Block:1/offload")
    assert (budget.compile_budget, budget.compiles, budget.is_none) == (0.3, True, False)
    assert (offload.compiles, offload.rules[0].offload, offload.compile_budget) == (False, True, None)
    # two budgets are two knapsack solutions: neither is known to recompute what the other does
    assert not recomputes_at_least(parse_plan("compile:0.1"), parse_plan("compile:0.5"))
    assert not recomputes_at_least(parse_plan("compile:0.5"), parse_plan("compile:0.1"))
    assert recomputes_at_least(parse_plan("Block:1,compile:0.5"), parse_plan("compile:0.5"))
    assert not recomputes_at_least(parse_plan("Block:1/offload"), parse_plan("Block:1"))


def test_own_off_turns_the_script_s_own_checkpointing_off_and_recomputes_less_than_none() -> None:
    assert str(parse_plan("own:off")) == "own:off" and not parse_plan("own:off").is_none
    assert str(parse_plan("own:off,Block:0.5")) == "Block:0.5,own:off"
    assert parse_plan("Block:0.5,own:off").own_off and not parse_plan("Block:0.5").own_off
    # none keeps the script's own recompute: it recomputes at least what own:off does, never the reverse
    assert recomputes_at_least(parse_plan("none"), parse_plan("own:off"))
    assert not recomputes_at_least(parse_plan("own:off"), parse_plan("none"))
    assert recomputes_at_least(parse_plan("Block:1"), parse_plan("Block:1,own:off"))
    assert not recomputes_at_least(parse_plan("Block:1,own:off"), parse_plan("Block:0.5"))
    assert recomputes_at_least(parse_plan("Block:1,own:off"), parse_plan("Block:0.5,own:off"))
    for bad in ("own:on", "own", "own:off,own:off"):
        with pytest.raises(InputError, match="expected own:off once"):
            parse_plan(bad)


def test_a_sharding_plan_names_fully_shard_s_arguments_and_claims_no_order_against_recompute() -> None:
    keep, group = parse_plan("fsdp:keep+offload"), parse_plan("Block:1,fsdp:2")
    assert keep.sharding == Sharding(reshard=False, offload=True) and not keep.is_none and not keep.rules
    assert keep.sharding.arguments() == {
        "reshard_after_forward": "False",
        "offload_policy": "CPUOffloadPolicy(pin_memory=True)",
    }
    assert group.sharding == Sharding(reshard=2) and group.sharding.arguments() == {
        "reshard_after_forward": "2"
    }
    assert keep.sharding.may_beat_own and group.sharding.may_beat_own
    assert not Sharding(reshard=True).may_beat_own and not Sharding(offload=True).may_beat_own
    # resharding less is faster than none, offload slower: no plan with another sharding is ranked by recompute
    assert not recomputes_at_least(parse_plan("fsdp:keep"), parse_plan("none"))
    assert not recomputes_at_least(parse_plan("Block:1,fsdp:keep"), parse_plan("Block:0.5"))
    assert recomputes_at_least(parse_plan("Block:1,fsdp:keep"), parse_plan("Block:0.5,fsdp:keep"))


def test_a_zero_plan_names_deepspeed_s_config_and_claims_no_order_against_recompute() -> None:
    """zero:N sets the stage, +offload the offload sections (the parameters' too at stage 3 only); either
    alone leaves the other to the script's config."""
    assert parse_plan("zero:2").sharding == Zero(stage=2) and not parse_plan("zero:2").is_none
    assert Zero(2).config(pin_memory=False) == {"stage": 2}
    cpu = {"device": "cpu", "pin_memory": True}
    assert Zero(1, offload=True).config(pin_memory=True) == {"stage": 1, "offload_optimizer": cpu}
    assert Zero(3, offload=True).config(pin_memory=True) == {
        "stage": 3, "offload_optimizer": cpu, "offload_param": cpu,
    }  # fmt: skip
    assert Zero(offload=True).config(pin_memory=True) == {"offload_optimizer": cpu}
    assert Zero(3).may_beat_own and Zero(0).may_beat_own and not Zero(2, offload=True).may_beat_own
    assert not recomputes_at_least(parse_plan("zero:2"), parse_plan("none"))
    assert recomputes_at_least(parse_plan("Block:1,zero:2"), parse_plan("Block:0.5,zero:2"))
    assert not recomputes_at_least(parse_plan("Block:1,zero:2"), parse_plan("Block:0.5,zero:1"))


def test_a_ratio_checkpoints_its_share_of_the_instances_spread_as_hugging_face_s_every_n_layers() -> None:
    """Issue 29: Hugging Face checkpoints every k-th layer (``layer_index % k == 0``); a ratio 1/k picks the
    same layers, so its every_n_layers expresses the plan exactly."""
    assert ModuleRule("Block", 0.5).chosen(24) == list(range(0, 24, 2))
    assert ModuleRule("Block", 0.25).chosen(24) == list(range(0, 24, 4))
    assert ModuleRule("Block", 0.75).chosen(4) == [0, 1, 2]
    assert ModuleRule("Block", 1.0).chosen(5) == [0, 1, 2, 3, 4]
    assert ModuleRule("Block", 0.1).chosen(4) == [0]  # at least one
    assert ModuleRule("Block", 0.5).chosen(5) == [0, 1, 3]  # round(2.5) = 3 of 5, spread
