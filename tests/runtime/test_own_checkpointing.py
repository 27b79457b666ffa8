"""A script that checkpoints by itself (#32 item 4, #26 item 4 in part): a trial says so, autotune's own
checkpoints are not counted as the script's, and the answer keeps the user's setting. Real trials of
tests/scripts/own_checkpoint.py; the Hugging Face case (gradient_checkpointing_enable()) is in tests/compat."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune import api
from autotune.core.protocol import Outcome
from autotune.results.best import BestAnswer
from autotune.results.formats import render
from autotune.trials.measurement import measure_spec
from autotune.trials.settings import TrialSettings

SCRIPT = str(Path(__file__).parents[1] / "scripts" / "own_checkpoint.py")


def _own(tmp_path: Path, plan: str, *args: str) -> str | None:
    spec = measure_spec(
        [SCRIPT, *args], 8, plan=plan, device="cpu", cache_dir=tmp_path,
        settings=TrialSettings(warmup_steps=1, measured_steps=2),
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


def test_the_hugging_face_answer_keeps_the_script_s_own_gradient_checkpointing() -> None:
    """RoBERTa with the user's gradient_checkpointing_enable(), answered plan none: that was printed as
    gradient_checkpointing=False, and run so, batch 48 peaked over the limit."""
    text = render(
        _answer("gradient_checkpointing_enable() on the model (24 torch.utils.checkpoint calls a step)"), "hf"
    )
    assert "gradient_checkpointing=True" in text.splitlines()
    assert (
        "# the script checkpoints by itself (gradient_checkpointing_enable() on the model (24 torch.utils.checkpoint "
        "calls a step)): every trial measured it on, and the plan none adds to it; keep it on (turning it off was "
        "not measured)"
    ) in text.splitlines()
    assert "gradient_checkpointing=False" in render(_answer(None), "hf").splitlines()
    for fmt in ("lightning", "torchrun"):
        assert "# the script checkpoints by itself (" in render(_answer("x"), fmt)
