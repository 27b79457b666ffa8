from __future__ import annotations

import pytest

from autotune.core.errors import InputError
from autotune.search.memory_model import MemoryModel, Observation
from autotune.search.space import SearchSpace, build_space, ladder, parse_batch_sizes, parse_plan_list

MiB = 2**20


def test_ladder_is_every_batch_size_to_8_then_powers_of_two_and_midpoints() -> None:
    assert ladder(1, 100) == (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64, 96)
    assert ladder(8, 64) == (8, 12, 16, 24, 32, 48, 64)
    assert ladder(3, 7) == (3, 4, 5, 6, 7)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("8-64", (8, 12, 16, 24, 32, 48, 64)), ("16,8,8, 24", (8, 16, 24)), ("5-5", (5,)), ("7-7", (7,))],
)
def test_batch_sizes(text: str, expected: tuple[int, ...]) -> None:
    assert parse_batch_sizes(text) == expected


def test_default_batch_sizes_reach_65536() -> None:
    sizes = parse_batch_sizes(None)
    assert (sizes[0], sizes[-1], len(sizes)) == (1, 65536, 34)


@pytest.mark.parametrize("text", ["0-8", "8-4", "a-b", "8,x", "", "-8", "1.5"])
def test_bad_batch_sizes(text: str) -> None:
    with pytest.raises(InputError, match="batch"):
        parse_batch_sizes(text)


def test_plan_lists_are_canonical_and_deduplicated() -> None:
    assert parse_plan_list(["none;all", "Block:0.50;none", "MLP"]) == ("none", "all", "Block:0.5", "MLP:1")
    with pytest.raises(InputError, match="names no plan"):
        parse_plan_list([";"])


def test_a_global_batch_searches_its_divisors_within_the_range() -> None:
    assert build_space(parse_batch_sizes(None), None, None, global_batch=48).batch_sizes == (
        1, 2, 3, 4, 6, 8, 12, 16, 24, 48,
    )  # fmt: skip
    space = build_space(parse_batch_sizes("4-16"), ("none",), None, global_batch=32)
    assert (space.batch_sizes, [space.grad_accum(b) for b in space.batch_sizes]) == ((4, 8, 16), [8, 4, 2])
    assert space.as_dict() == {"batch_sizes": [4, 8, 16], "plans": ["none"], "global_batch": 32}
    assert SearchSpace.from_dict(space.as_dict()) == space
    with pytest.raises(InputError, match="no divisor of --global-batch 7 lies within --batch-sizes 8-16"):
        build_space(parse_batch_sizes("8-16"), ("none",), None, global_batch=7)
    with pytest.raises(InputError, match="--global-batch must be between 1 and"):
        build_space(parse_batch_sizes(None), ("none",), None, global_batch=0)
    declared = build_space(parse_batch_sizes("8"), ("none",), None, declared_accum=4)
    assert (declared.grad_accum(8), declared.as_dict()["grad_accum"]) == (4, 4)
    assert build_space(parse_batch_sizes("8"), ("none",), None).grad_accum(8) is None


def obs(batch: int, plan: str, mib: float, complete: bool = True) -> Observation:
    return Observation(batch, plan, int(mib * MiB), complete)


def test_model_needs_two_batch_sizes_of_one_plan() -> None:
    assert not MemoryModel.fit([obs(1, "none", 110)]).calibrated
    assert not MemoryModel.fit([obs(1, "none", 110), obs(1, "A", 105)]).calibrated
    assert MemoryModel.fit([obs(1, "none", 110), obs(4, "none", 140)]).calibrated


def test_model_fits_shared_fixed_memory_and_per_plan_slopes() -> None:
    model = MemoryModel.fit([obs(1, "none", 110), obs(4, "none", 140), obs(8, "A", 140)])
    assert model.fixed == pytest.approx(100 * MiB)
    assert model.per_sample["none"] == pytest.approx(10 * MiB)
    assert model.per_sample["A"] == pytest.approx(5 * MiB)
    assert model.predict(10, "A") == pytest.approx(150 * MiB)
    assert model.predict(10, "unmeasured") == pytest.approx(200 * MiB)  # borrows the largest slope


def test_a_sharding_plan_keeps_its_recompute_part_s_slope_and_frees_or_holds_a_fixed_amount() -> None:
    """none: 100 MiB fixed, 10 MiB a sample. The probe says zero:2 frees a rank 60 MiB and fsdp:keep holds
    up to 30 MiB more. Unmeasured, each is none's slope shifted by what the probe says (what fsdp:keep may
    hold is an upper bound: optimistically, nothing); measured once, by what it read, at every batch size;
    a plan with recompute takes that recompute's slope (A: 5 MiB a sample, measured)."""
    batches = (1, 2, 4, 8, 16, 32)
    fixed_savings = {"zero:2": 60 * MiB, "fsdp:keep": -30 * MiB, "A:1,zero:2": 60 * MiB}
    calibration = [obs(1, "none", 110), obs(4, "none", 140), obs(8, "A:1", 140)]
    model = MemoryModel.fit(calibration, fixed_savings=fixed_savings)
    assert model.predict(8, "zero:2") == pytest.approx((100 - 60 + 80) * MiB)
    assert model.predict(8, "fsdp:keep") == pytest.approx((100 + 30 + 80) * MiB)
    assert model.predict(8, "A:1,zero:2") == pytest.approx((100 - 60 + 40) * MiB)
    assert model.largest_fitting("zero:2", batches, 155 * MiB) == 8  # none: 4
    assert model.largest_fitting("fsdp:keep", batches, 155 * MiB) == 2
    assert model.largest_possible("fsdp:keep", batches, 155 * MiB) == 4  # as none: may hold nothing more
    # measured once each: zero:2 freed 45 MiB, fsdp:keep held 10 MiB more, at none's slope
    model = MemoryModel.fit(
        [*calibration, obs(2, "zero:2", 75), obs(4, "fsdp:keep", 150)], fixed_savings=fixed_savings
    )
    assert model.offsets == pytest.approx({"zero:2": -45 * MiB, "fsdp:keep": 10 * MiB})
    assert model.slope("zero:2") == model.slope("fsdp:keep") == pytest.approx(10 * MiB)
    assert model.predict(16, "zero:2") == pytest.approx((100 - 45 + 160) * MiB)
    assert model.predict(16, "fsdp:keep") == pytest.approx((100 + 10 + 160) * MiB)
    # stopped over the budget at 8: a censored peak bounds the slope above what its offset leaves
    model = MemoryModel.fit(
        [*calibration, obs(2, "zero:2", 75), obs(8, "zero:2", 160, complete=False)],
        fixed_savings=fixed_savings,
    )
    assert model.slope("zero:2") == pytest.approx((160 - 100 + 45) / 8 * MiB)
    # no reading of its recompute part: a slope of its own, which carries what it frees (as any plan's)
    model = MemoryModel.fit([obs(1, "none", 110), obs(4, "none", 140), obs(4, "B:1,zero:2", 130)])
    assert (model.offsets, model.offset("B:1,zero:2")) == ({}, 0.0)
    assert model.predict(4, "B:1,zero:2") == pytest.approx(130 * MiB)


def test_largest_fitting_batch_and_measurement_overrules_the_model() -> None:
    batches = (1, 2, 4, 8, 16, 32)
    model = MemoryModel.fit([obs(1, "none", 110), obs(4, "none", 140)])
    assert model.largest_fitting("none", batches, 190 * MiB) == 8
    # Measured over the limit at 8: nothing from 8 up, whatever the model says.
    model = MemoryModel.fit([obs(1, "none", 110), obs(4, "none", 140), obs(8, "none", 195)])
    assert model.largest_fitting("none", batches, 190 * MiB) == 4
    # An OOM is a ceiling too, and its peak is not used for the fit.
    model = MemoryModel.fit([obs(1, "none", 110), obs(4, "none", 140), obs(8, "none", 60, complete=False)])
    assert model.per_sample["none"] == pytest.approx(10 * MiB)
    assert model.largest_fitting("none", batches, 10_000 * MiB) == 4
    # Measured to fit where the model predicted it would not: the measurement wins.
    model = MemoryModel.fit([obs(1, "none", 110), obs(4, "none", 140), obs(16, "none", 180)])
    assert model.largest_fitting("none", batches, 185 * MiB) == 16


def test_an_offload_plan_is_kept_to_the_batch_sizes_whose_pinned_memory_fits_the_host_budget() -> None:
    """An offload plan keeps what it saves in pinned host memory: its saving per sample (the probe's, until
    measured) x the batch size. Issue 31 saw offload proposed at batch 24 on a GPT-2 medium (~2.8 GiB saved per
    sample): ~69 GB pinned, and the kernel killed the trial. The device (here 10 GiB) would fit batch 32."""
    batches = (1, 2, 4, 8, 16, 24, 32)
    observed = [obs(1, "none", 1100), obs(4, "none", 1400)]  # 100 MiB per sample
    savings = {"B:1/offload": 90 * MiB, "B:1": 90 * MiB}
    model = MemoryModel.fit(observed, savings, host_limit=1000 * MiB)
    assert model.host_cap("B:1/offload") == 11  # 1000 MiB / 90 MiB per sample
    assert model.largest_fitting("B:1/offload", batches, 10_000 * MiB) == 8
    assert model.largest_possible("B:1/offload", batches, 10_000 * MiB) == 8
    assert model.host_cap("B:1") is None and model.largest_fitting("B:1", batches, 10_000 * MiB) == 32
    # measured: its own saving decides (20 MiB per sample: 50 fit the host budget)
    measured = MemoryModel.fit([*observed, obs(8, "B:1/offload", 1640)], savings, host_limit=1000 * MiB)
    assert measured.host_cap("B:1/offload") == 50
    assert MemoryModel.fit(observed, savings).host_cap("B:1/offload") is None  # no host budget, no cap
