"""Sharding plans (``fsdp:...``) in a real FSDP2 job under torchrun (gloo, CPU): the script's own
``fully_shard`` calls take the plan's arguments with no change to it, on every rank, as FSDP's own state
reads them back (not autotune's records); the numbers stay the script's own sharding's; a script that does not
shard with FSDP2 is told so; the probe offers the plans, a search measures them, and outside a trial
``autotune.prepare`` applies what FSDP2 can take after sharding."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from autotune import api
from autotune.backends.probe import default_plans, named_plans, rows
from autotune.core.protocol import Outcome
from autotune.search.records import TrialKind
from autotune.search.spec import tune_spec
from autotune.trials.measurement import measure, measure_spec
from autotune.trials.settings import TrialSettings

from conftest import SCRIPTS, torchrun

pytestmark = pytest.mark.ranks

SCRIPT = str(SCRIPTS / "distributed.py")
BLOCKS = [f"blocks.{i}" for i in range(4)]


def trial(tmp_path: Path, plan: str, ranks: int = 2, wrap: str = "fsdp") -> tuple[object, dict, list[dict]]:
    """A trial of distributed.py at batch 4 under ``plan``: its result, rank 0's first-step loss and
    gradient shards, and each rank's FSDP state after that step."""
    out = tmp_path / plan.replace(":", "_").replace("+", "_")
    out.mkdir()
    words = torchrun(
        SCRIPT, "--wrap", wrap, "--grads", str(out / "numbers.pt"), "--fsdp-state", str(out), ranks=ranks
    )
    spec = measure_spec(
        words,
        4,
        plan=plan,
        device="cpu",
        cache_dir=tmp_path / "cache",
        settings=TrialSettings(1, 2, 120, 240, tight=0),
    )
    result = measure(spec)
    if result.outcome is not Outcome.COMPLETE:
        return result, {}, []
    states = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(ranks)]
    return result, torch.load(out / "numbers.pt"), states


def test_each_sharding_plan_reaches_every_rank_s_blocks_and_keeps_the_numbers(tmp_path: Path) -> None:
    """FSDP2's defaults reshard each block after forward and the root not (FSDP keeps the root's parameters
    for backward); fsdp:keep keeps the blocks' too, fsdp:keep+offload also puts them in host memory (on this
    CPU, unpinned); the root keeps the script's own either way. Rank 0's loss and gradient shards equal the
    script's own sharding's, bit for bit."""
    expected = {
        "none": {**{b: {"reshard": True, "offload": False} for b in BLOCKS}, "": {"reshard": False, "offload": False}},
        "fsdp:keep": {**{b: {"reshard": False, "offload": False} for b in BLOCKS}, "": {"reshard": False, "offload": False}},
        "fsdp:keep+offload": {**{b: {"reshard": False, "offload": True} for b in BLOCKS}, "": {"reshard": False, "offload": False}},
    }  # fmt: skip
    numbers = {}
    for plan, state in expected.items():
        result, numbers[plan], states = trial(tmp_path, plan)
        assert result.outcome is Outcome.COMPLETE, result.error
        assert result.plan == plan and result.world_size == 2
        assert states == [state, state], plan  # every rank, as FSDP's state holds it
    plain = numbers["none"]
    for plan in ("fsdp:keep", "fsdp:keep+offload"):
        assert torch.equal(numbers[plan]["loss"], plain["loss"]), plan
        assert numbers[plan]["grads"].keys() == plain["grads"].keys() and len(plain["grads"]) == 4 * 6 + 2
        for name, grad in plain["grads"].items():
            assert torch.equal(numbers[plan]["grads"][name], grad), (plan, name)


def test_a_smaller_reshard_group_reaches_the_blocks_of_four_ranks(tmp_path: Path) -> None:
    """fsdp:2 over 4 ranks: each block reshards to groups of 2 after forward (FSDP's own mesh says 2)."""
    result, _, states = trial(tmp_path, "fsdp:2", ranks=4)
    assert result.outcome is Outcome.COMPLETE, result.error
    assert result.plan == "fsdp:2" and result.world_size == 4
    state = {
        **{b: {"reshard": 2, "offload": False} for b in BLOCKS},
        "": {"reshard": False, "offload": False},
    }
    assert states == [state] * 4


def test_a_sharding_plan_for_a_script_that_does_not_shard_with_fsdp2_is_one_line(tmp_path: Path) -> None:
    result, _, _ = trial(tmp_path, "fsdp:keep", wrap="ddp")
    assert result.outcome is Outcome.FAILED
    assert (
        "plan fsdp:keep: the script made no fully_shard call before its model's first forward; fsdp plans are "
        "for scripts that shard their blocks with FSDP2's fully_shard (torch.distributed.fsdp)"
    ) in (result.error or "")


def test_the_probe_of_an_fsdp2_job_offers_its_sharding_plans_and_a_search_measures_them(
    tmp_path: Path,
) -> None:
    """The probe sees the script's four sharded blocks over 2 ranks and offers fsdp:keep (what it holds:
    the other rank's half of every block's parameters), and offload left out on this CPU; a search measures
    fsdp:keep beside none, and the answer is one of them (fsdp:keep, by 1.2x here, quiet)."""
    words = torchrun(SCRIPT, "--wrap", "fsdp", "--width", "128")
    probed = api.probe(words, batch_size=4, device="cpu", cache_dir=tmp_path)
    assert probed.outcome is Outcome.COMPLETE, probed.error
    report = probed.probe
    assert (report.sharded_blocks, report.shard_ranks) == (4, 2)
    assert report.block_parameter_bytes == 4 * 4 * (
        2 * 128 + 2 * 128 * 512 + 512 + 128
    )  # LayerNorm, up, down
    table = {row.plan: row for row in rows(report)}
    half = report.block_parameter_bytes / 2 / 2**20
    assert table["fsdp:keep"].detail == f"up to {half:.2f} MiB more a rank, one all-gather less"
    assert table["fsdp:keep"].excluded == "" and table["fsdp:offload"].excluded.startswith("GPU only")
    plans, excluded = default_plans(report)
    assert plans[:2] == ("none", "fsdp:keep") and "fsdp:offload" in excluded
    # tried on the script's model by the probe's check as recompute plans are: the same all-gathers, the
    # same numbers to the bit on each rank
    check = next(c for c in report.checks if c.plan == "fsdp:keep")
    assert check.ok and (check.loss_delta, check.grad_delta) == (0.0, 0.0)
    # the search over them and none (named: the default space calibrates its memory model on the recompute
    # plans first, five trials on this model)
    spec = tune_spec(
        words, "2GiB", batch_sizes="4", plans=["none;fsdp:keep"], device="cpu", cache_dir=tmp_path, trials=5,
        settings=TrialSettings(1, 2, 120, 240, tight=0),
    )  # fmt: skip
    result = api.tune(spec, environ=dict(os.environ))
    measured = {
        r.plan for r in result.records if r.kind is TrialKind.MEASURED and r.outcome is Outcome.COMPLETE
    }
    assert {"none", "fsdp:keep"} <= measured
    assert result.best.plan in measured


def test_a_sharding_plan_that_changes_the_gradients_is_refused_by_the_probe_s_check(tmp_path: Path) -> None:
    """A script whose blocks write to their weights after using them: FSDP2's own resharding discards the
    write before backward, fsdp:keep does not, so its gradients differ. The probe's check (each rank, its
    own gradient shards) refuses fsdp:keep with the numbers, the default space and a search naming it
    leave it out with that reason, and the script's blocks reshard again after the check (FSDP's state
    after the probe trial's last step, both ranks)."""
    words = torchrun(
        SCRIPT, "--wrap", "fsdp", "--width", "128", "--write-after-forward", "--fsdp-state", str(tmp_path)
    )
    probed = api.probe(words, batch_size=4, device="cpu", cache_dir=tmp_path)
    assert probed.outcome is Outcome.COMPLETE, probed.error
    report = probed.probe
    check = next(c for c in report.checks if c.plan == "fsdp:keep")
    assert not check.ok and check.grad_delta > check.tolerance
    assert check.reason.startswith("changes the numbers: loss off by ")
    assert {row.plan: row for row in rows(report)}["fsdp:keep"].excluded == check.reason
    plans, excluded = default_plans(report)
    assert "fsdp:keep" not in plans and excluded["fsdp:keep"] == check.reason
    assert named_plans(("none", "fsdp:keep"), report) == (("none",), {"fsdp:keep": check.reason})
    resharding = {
        **{b: {"reshard": True, "offload": False} for b in BLOCKS},
        "": {"reshard": False, "offload": False},
    }
    assert [json.loads((tmp_path / f"rank-{r}-last.json").read_text()) for r in range(2)] == [resharding] * 2


def test_for_a_script_whose_blocks_keep_their_parameters_the_probe_offers_resharding_them(
    tmp_path: Path,
) -> None:
    """The script's own reshard_after_forward=False, read from FSDP's state: the probe offers fsdp:reshard
    (what it frees a rank) in fsdp:keep's place, and the plan reshards every block on both ranks."""
    words = torchrun(SCRIPT, "--wrap", "fsdp-keep", "--width", "128")
    probed = api.probe(words, batch_size=4, device="cpu", cache_dir=tmp_path)
    assert probed.outcome is Outcome.COMPLETE, probed.error
    report = probed.probe
    assert report.blocks_kept and (report.sharded_blocks, report.shard_ranks) == (4, 2)
    table = {row.plan: row for row in rows(report)}
    half = report.block_parameter_bytes / 2 / 2**20
    assert table["fsdp:reshard"].detail == f"up to {half:.2f} MiB less a rank, one all-gather more"
    assert "fsdp:keep" not in table and default_plans(report)[0][:2] == ("none", "fsdp:reshard")
    check = next(c for c in report.checks if c.plan == "fsdp:reshard")
    assert check.ok and (check.loss_delta, check.grad_delta) == (0.0, 0.0)
    result, _, states = trial(tmp_path, "fsdp:reshard", wrap="fsdp-keep")
    assert result.outcome is Outcome.COMPLETE, result.error
    resharded = {
        **{b: {"reshard": True, "offload": False} for b in BLOCKS},
        "": {"reshard": False, "offload": False},
    }
    assert states == [resharded, resharded]


def test_outside_a_trial_prepare_sets_keep_on_the_sharded_blocks_and_names_what_it_cannot(
    tmp_path: Path,
) -> None:
    """The answer applied with AUTOTUNE_PLAN and autotune.prepare (after fully_shard, as a script does):
    keep is set through FSDP2's own set_reshard_after_forward; offload, which FSDP2 takes only as it shards,
    is one line naming fully_shard's arguments."""
    out = tmp_path / "kept"
    out.mkdir()
    words = torchrun(SCRIPT, "--wrap", "fsdp", "--steps", "1")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOTUNE_")}
    done = subprocess.run(
        [*words, "--fsdp-state", str(out)], env={**env, "AUTOTUNE_PLAN": "fsdp:keep"}, capture_output=True,
        text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    kept = {
        **{b: {"reshard": False, "offload": False} for b in BLOCKS},
        "": {"reshard": False, "offload": False},
    }
    assert [json.loads((out / f"rank-{r}.json").read_text()) for r in range(2)] == [kept, kept]
    refused = subprocess.run(
        words, env={**env, "AUTOTUNE_PLAN": "fsdp:keep+offload"}, capture_output=True, text=True, timeout=240
    )
    assert refused.returncode != 0
    assert (
        "plan fsdp:keep+offload: FSDP2 takes it only as it shards; pass reshard_after_forward=False, "
        "offload_policy=CPUOffloadPolicy(pin_memory=True) to the script's fully_shard calls on its blocks"
    ) in refused.stderr
