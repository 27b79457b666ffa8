"""ZeRO plans (``zero:...``) without DeepSpeed: the config the wrapper passes to ``deepspeed.initialize`` (the
plan's stage and offload over the script's own config, found where DeepSpeed looks for it, the script's own
objects untouched), and the probe's rows for a DeepSpeed job. The plans in a real DeepSpeed job under
torchrun: tests/ranks/test_zero_plans.py."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pytest

from autotune.backends.deepspeed_zero import _config, _with_zero
from autotune.backends.probe import (
    GPU_ONLY,
    checked_part,
    default_plans,
    fixed_saving,
    named_plans,
    plans_to_check,
    rows,
)
from autotune.backends.probe_report import PlanCheck, TorchProbeReport
from autotune.cli.render_trial import fixed_text
from autotune.core.errors import InputError
from autotune.core.plans import Zero

SCRIPT = {
    "train_micro_batch_size_per_gpu": 4,
    "zero_optimization": {"stage": 3, "reduce_bucket_size": 1000, "offload_param": {"device": "nvme"}},
}


def test_the_plan_s_stage_and_offload_go_over_the_script_s_config_and_the_rest_stays() -> None:
    assert _with_zero(SCRIPT, Zero(1), pin_memory=False) == {
        "train_micro_batch_size_per_gpu": 4,
        "zero_optimization": {"stage": 1, "reduce_bucket_size": 1000, "offload_param": {"device": "nvme"}},
    }
    cpu = {"device": "cpu", "pin_memory": False}
    offloaded = _with_zero(SCRIPT, Zero(offload=True), pin_memory=False)  # the script's own stage 3
    assert offloaded["zero_optimization"] == {
        "stage": 3, "reduce_bucket_size": 1000, "offload_param": cpu, "offload_optimizer": cpu,
    }  # fmt: skip
    assert _with_zero({}, Zero(2), pin_memory=True) == {"zero_optimization": {"stage": 2}}
    assert SCRIPT["zero_optimization"]["stage"] == 3  # the script's dict as it was


def probe_data() -> TorchProbeReport:
    """A probe report of a model with no repeated module: only what a sharding plan acts on is added."""
    return TorchProbeReport(
        batch_size=2, weights_bytes=0, gradients_bytes=0, optimizer_state_bytes=None, activation_bytes=0,
        forward_seconds=1.0, op_seconds={}, candidates=(), instances=(),
    )  # fmt: skip


class NoLoader:
    """A deepspeed module without ``load_ds_config`` (older DeepSpeed): a JSON file is read as JSON."""


def test_the_config_is_found_where_deepspeed_looks_and_the_script_s_args_are_left_as_they_were(
    tmp_path: Path,
) -> None:
    config, args = _config({"config": SCRIPT}, NoLoader())
    assert config == SCRIPT and config is not SCRIPT and args is None
    assert _config({"config_params": SCRIPT}, NoLoader()) == (SCRIPT, None)
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(SCRIPT))
    script_args = argparse.Namespace(deepspeed_config=str(path), local_rank=0)
    config, args = _config({"args": script_args}, NoLoader())
    assert config == SCRIPT and args == argparse.Namespace(deepspeed_config=None, local_rank=0)
    assert script_args.deepspeed_config == str(path)  # a copy went to DeepSpeed, not the script's own
    old = argparse.Namespace(deepscale_config=str(path))
    assert _config({"args": old}, NoLoader()) == (SCRIPT, argparse.Namespace(deepscale_config=None))
    with pytest.raises(InputError, match=r"^deepspeed.initialize was called with no config"):
        _config({"args": argparse.Namespace(deepspeed_config=None)}, NoLoader())


def test_the_probe_offers_each_other_stage_with_what_a_rank_holds_and_offload_on_a_gpu_only() -> None:
    """2 ranks at stage 1, parameters 100 MiB (gradients as large), the optimizer state 200 MiB in all: a
    rank holds 300 MiB at stage 1 (parameters, gradients, its half of the state), 400 at stage 0, 250 at 2
    (half the gradients), 200 at 3 (half the parameters)."""
    mib = 2**20
    data = dataclasses.replace(
        probe_data(),
        zero_stage=1,
        zero_ranks=2,
        zero_parameter_bytes=100 * mib,
        zero_optimizer_bytes=200 * mib,
    )
    zero = {r.plan: (r.detail, r.excluded) for r in rows(data) if r.level == "zero"}
    assert zero == {
        "zero:0": ("100.00 MiB more a rank than stage 1", ""),
        "zero:2": ("50.00 MiB less a rank than stage 1", ""),
        "zero:3": ("100.00 MiB less a rank than stage 1, parameters gathered for each use", ""),
        "zero:1+offload": ("optimizer state in host memory, its step on the CPU", GPU_ONLY),
    }
    # the same as numbers, for the search's memory model (offload: measured, 0)
    assert {r.plan: r.fixed_saving for r in rows(data) if r.level == "zero"} == {
        "zero:0": -100 * mib,
        "zero:2": 50 * mib,
        "zero:3": 100 * mib,
        "zero:1+offload": 0,
    }
    assert [fixed_saving(data, p) for p in ("zero:2", "Block:1,zero:3", "none", "Block:1")] == [
        50 * mib,
        100 * mib,
        0,
        0,
    ]
    plans, excluded = default_plans(data)
    assert plans[1:4] == ("zero:0", "zero:2", "zero:3") and excluded["zero:1+offload"] == GPU_ONLY
    on_gpu = dataclasses.replace(data, gpu=True)
    assert "zero:1+offload" in default_plans(on_gpu)[0]
    assert not [r for r in rows(dataclasses.replace(data, zero_ranks=1)) if r.level == "zero"]  # one rank
    assert not [r for r in rows(probe_data()) if r.level == "zero"]  # no DeepSpeed


def test_the_probe_says_its_fixed_memory_is_this_rank_s_where_it_is_sharded() -> None:
    plain = probe_data()
    assert fixed_text(plain) == "weights 0 B, gradients 0 B, optimizer state unknown (no torch.optim)"
    zero = dataclasses.replace(plain, zero_stage=2, zero_ranks=4)
    assert fixed_text(zero).endswith(" (this rank's: sharded over 4 ranks)")
    assert fixed_text(dataclasses.replace(zero, zero_stage=0)) == fixed_text(plain)  # stage 0 shards nothing
    fsdp = dataclasses.replace(plain, sharded_blocks=4, shard_ranks=2)
    assert fixed_text(fsdp).endswith(" (this rank's: sharded over 2 ranks)")


def test_the_probe_says_what_each_fsdp_plan_holds_or_frees_a_rank_as_a_number() -> None:
    """4 blocks of 120 MiB of parameters in all, sharded over 4 ranks (30 MiB a rank): keeping them unsharded
    after forward holds up to the other 90 MiB, of which FSDP2's default holds two blocks' at backward's start
    anyway (the block in backward, the one prefetched): 45 MiB more; resharding to groups of 2 up to 30 MiB
    more, 15 at the peak. A script that keeps them: resharding frees 45 MiB, groups of 2 30 (of up to 60).
    Two blocks: nothing either way at the peak."""
    mib = 2**20
    data = dataclasses.replace(probe_data(), sharded_blocks=4, shard_ranks=4, block_parameter_bytes=120 * mib)
    table = {r.plan: (r.detail, r.fixed_saving) for r in rows(data) if r.level == "fsdp"}
    assert table == {
        "fsdp:keep": ("up to 90.00 MiB more a rank, one all-gather less", -45 * mib),
        "fsdp:2": ("up to 30.00 MiB more a rank, backward's all-gather in groups of 2", -15 * mib),
        "fsdp:offload": ("parameters, gradients and optimizer state in host memory", 0),
    }
    kept = dataclasses.replace(data, blocks_kept=True)
    assert {r.plan: r.fixed_saving for r in rows(kept) if r.level == "fsdp"} == {
        "fsdp:reshard": 45 * mib,
        "fsdp:2": 30 * mib,
        "fsdp:offload": 0,
    }
    assert fixed_saving(kept, "fsdp:reshard") == 45 * mib
    two = dataclasses.replace(data, sharded_blocks=2)
    assert {r.fixed_saving for r in rows(two) if r.level == "fsdp"} == {0}


def test_the_probe_checks_the_fsdp_plans_fsdp2_takes_after_sharding_and_leaves_out_one_that_failed() -> None:
    """keep and reshard are set on a sharded model by FSDP2's set_reshard_after_forward: the probe's check
    tries them (with any recompute rules: the whole plan); a group, offload or a ZeRO stage only their
    recompute part. A failed fsdp:keep is left out with the check's reason, in the default space and named."""
    data = dataclasses.replace(
        probe_data(), sharded_blocks=4, shard_ranks=4, block_parameter_bytes=120 * 2**20
    )
    assert "fsdp:keep" in plans_to_check(data) and "fsdp:2" not in plans_to_check(data)
    assert "fsdp:reshard" in plans_to_check(dataclasses.replace(data, blocks_kept=True))
    assert [
        checked_part(p) for p in ("fsdp:keep", "Block:1,fsdp:reshard", "fsdp:2", "Block:1,fsdp:keep+offload")
    ] == [
        "fsdp:keep",
        "Block:1,fsdp:reshard",
        "none",
        "Block:1",
    ]
    assert [checked_part(p) for p in ("zero:3", "Block:0.5,zero:1+offload", "Block:1")] == [
        "none",
        "Block:0.5",
        "Block:1",
    ]
    failed = PlanCheck("fsdp:keep", 0.0, 0.25, 1e-5)
    refused = dataclasses.replace(data, checks=(*data.checks, failed))
    assert {r.plan: r.excluded for r in rows(refused) if r.level == "fsdp"}["fsdp:keep"] == failed.reason
    plans, excluded = default_plans(refused)
    assert "fsdp:keep" not in plans and excluded["fsdp:keep"] == failed.reason
    assert "fsdp:keep" in default_plans(data)[0]  # unchecked (a probe stored before): offered, as it was
    assert named_plans(("none", "fsdp:keep", "Block:1,fsdp:keep"), refused)[1] == {"fsdp:keep": failed.reason}
