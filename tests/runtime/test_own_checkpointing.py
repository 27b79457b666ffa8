"""A script that checkpoints by itself (#32 item 4, #26 item 4 in part): a trial says so, autotune's own
checkpoints are not counted as the script's, and the answer keeps the user's setting. Real trials of
tests/scripts/own_checkpoint.py; the Hugging Face case (gradient_checkpointing_enable()) is in tests/compat."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune import api
from autotune.core.protocol import Outcome
from autotune.results import formats
from autotune.results.best import BestAnswer
from autotune.results.formats import render
from autotune.trials.measurement import measure_spec
from autotune.trials.settings import TrialSettings

SCRIPT = str(Path(__file__).parents[1] / "scripts" / "own_checkpoint.py")


def _own(tmp_path: Path, plan: str, *args: str) -> str | None:
    spec = measure_spec(
        [SCRIPT, *args], 8, plan=plan, device="cpu", cache_dir=tmp_path,
        settings=TrialSettings(warmup_steps=1, measured_steps=2, tight=0),
    )  # fmt: skip
    result = api.measure(spec)
    assert result.outcome is Outcome.COMPLETE, result.error
    return result.own_checkpointing


@pytest.mark.parametrize(
    ("plan", "args", "said"),
    [
        (
            "none",
            ("--own-checkpoint",),
            "torch.utils.checkpoint in its own forwards (2 torch.utils.checkpoint calls a step)",
        ),
        ("none", (), None),
        ("Block:1", (), None),  # autotune's own checkpoints are not the script's
        ("own:off", ("--own-checkpoint",), None),  # turned off: the script's calls run their blocks plainly
    ],
)
def test_a_trial_says_what_the_script_checkpoints_by_itself(
    tmp_path: Path, plan: str, args: tuple[str, ...], said: str | None
) -> None:
    assert _own(tmp_path, plan, *args) == said


def _answer(own: str | None, plan: str = "none") -> BestAnswer:
    return BestAnswer(
        "s", "train.py", 48, plan, 900 * 2**20, 30.0, 2**30, True, "verified winner of study s",
        own_checkpointing=own, outermost=("RobertaLayer",),
    )  # fmt: skip


def test_the_hugging_face_answer_keeps_the_script_s_own_gradient_checkpointing(monkeypatch) -> None:
    """RoBERTa with the user's gradient_checkpointing_enable(), answered plan none: that was printed as
    gradient_checkpointing=False, and run so, batch 48 peaked over the limit. (In the words of a transformers
    before 5.24; 5.24's are tests/cli/test_widths.py's.)"""
    monkeypatch.setattr(formats, "hf_vocabulary", lambda: ("gradient_checkpointing", frozenset()))
    text = render(
        _answer("gradient_checkpointing_enable() on the model (24 torch.utils.checkpoint calls a step)"), "hf"
    )
    assert "gradient_checkpointing=True" in text.splitlines()
    assert (
        "# the script checkpoints by itself (gradient_checkpointing_enable() on the model (24 torch.utils.checkpoint "
        "calls a step)): every trial measured it on, and the plan none adds to it; keep it on (the plans that "
        "turn it off, own:off, did not win)"
    ) in text.splitlines()
    assert "gradient_checkpointing=False" in render(_answer(None), "hf").splitlines()
    for fmt in ("lightning", "torchrun"):
        assert "# the script checkpoints by itself (" in render(_answer("x"), fmt)


def test_own_off_gives_the_loss_and_gradients_of_the_script_s_own_checkpointing_without_recomputing() -> None:
    """In this process: the script's model with its own checkpointing, then under own:off (its checkpoint
    calls run their blocks plainly): the same loss and gradients, and no checkpoint call made."""
    import importlib.util

    import torch

    from autotune.backends.torch_modules import own_checkpoint_calls, plan_applied, watch_own_checkpointing
    from autotune.core.plans import parse_plan

    found = importlib.util.spec_from_file_location("own_checkpoint", SCRIPT)
    assert found is not None and found.loader is not None
    script = importlib.util.module_from_spec(found)
    found.loader.exec_module(script)
    watch_own_checkpointing()
    torch.manual_seed(0)
    model, x = script.Model(own=True), torch.randn(8, 32)

    def step() -> tuple[float, list[torch.Tensor]]:
        model.zero_grad()
        loss = model(x)
        loss.backward()
        return float(loss), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    before = own_checkpoint_calls()
    kept = step()
    assert own_checkpoint_calls() == before + 2  # its two blocks, checkpointed by the script
    with plan_applied(model, parse_plan("own:off")) as applied:
        assert str(applied) == "own:off"
        off = step()
    assert own_checkpoint_calls() == before + 2  # none made under own:off
    assert off[0] == kept[0] and all(torch.equal(a, b) for a, b in zip(off[1], kept[1], strict=True))
    step()
    assert own_checkpoint_calls() == before + 4  # after the plan: the script's own again


def test_the_probe_offers_own_off_right_after_none_checked_against_no_plan(tmp_path: Path) -> None:
    from autotune.backends.probe import default_plans

    probed = api.probe([SCRIPT, "--own-checkpoint"], batch_size=8, device="cpu", cache_dir=tmp_path)
    assert probed.outcome is Outcome.COMPLETE, probed.error
    report = probed.probe
    assert report is not None and report.own_checkpointing == "torch.utils.checkpoint in its own forwards"
    plans, _ = default_plans(report)
    assert plans[:2] == ("none", "own:off")
    assert [c.ok for c in report.checks if c.plan == "own:off"] == [True]
    plain = api.probe([SCRIPT], batch_size=8, device="cpu", cache_dir=tmp_path)
    assert plain.probe is not None and "own:off" not in default_plans(plain.probe)[0]
