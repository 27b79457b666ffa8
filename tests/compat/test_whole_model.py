"""A script whose model is three modules called in turn (#32 item 2): an embedding, a body of four
TransformerEncoderLayers and a head, with a frozen teacher run first in each step and an EMA copy alive.
The probe sees all three (it saw the teacher alone: 132 KiB of weights, nothing kept for backward, no
candidate) and a plan on the body's layers is applied and lowers the peak. Real trials of
tests/scripts/three_modules.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from torch import nn

from autotune import api
from autotune.core.protocol import Outcome
from autotune.trials.measurement import measure_spec
from autotune.trials.settings import TrialSettings

from conftest import DETERMINISTIC_CPU_ALLOCATOR

pytestmark = pytest.mark.compat  # ~10 s alone, 40 on a loaded core: beside the other real-model runs

SCRIPT = str(Path(__file__).parents[1] / "scripts" / "three_modules.py")
COMMAND = [sys.executable, SCRIPT, "--batch-size", "{batch_size}"]
MiB = 2**20


@pytest.mark.parametrize("container", [False, True], ids=["trees", "container"])
def test_the_probe_and_a_plan_cover_every_module_the_optimizer_trains(
    tmp_path: Path, container: bool
) -> None:
    """``container``: the three are one module's parts, called one by one, never the module itself (a
    LightningModule's training_step calling ``self.net(x)``): the probe saw no forward of the module and
    checked no plan ("the script trained too few steps"); it sees the parts as it sees three trees."""
    command = [*COMMAND, "--container"] if container else COMMAND
    probed = api.probe(command, batch_size=4, device="cpu", cache_dir=tmp_path)
    assert probed.outcome is Outcome.COMPLETE, probed.error
    report = probed.probe
    assert report is not None
    layer = nn.TransformerEncoderLayer(128, 4, 512, batch_first=True)
    weights = 4 * (500 * 128 + 4 * sum(p.numel() for p in layer.parameters()) + 128 * 500 + 500)
    assert report.weights_bytes == weights  # the embedding, the body and the head: not the teacher
    assert {(c.cls, c.count) for c in report.candidates} == {
        ("TransformerEncoderLayer", 4),
        ("MultiheadAttention", 4),
    }
    assert report.activation_bytes > 4 * 64 * 128 * 4 * 4  # the body's layers keep several per token
    checked = {c.plan: c.ok for c in report.checks}
    assert "TransformerEncoderLayer:1" in checked and all(checked.values()), report.checks

    peaks = {}
    for plan in ("none", "TransformerEncoderLayer:1"):
        spec = measure_spec(
            command, 48, plan=plan, device="cpu", cache_dir=tmp_path,
            settings=TrialSettings(warmup_steps=1, measured_steps=2, tight=0),
        )  # fmt: skip
        result = api.measure(spec, environ=DETERMINISTIC_CPU_ALLOCATOR)
        assert result.outcome is Outcome.COMPLETE, result.error
        assert result.plan == plan  # as applied: the layers are part of the model
        peaks[plan] = result.peak_bytes
    # the body keeps ~1.6 MiB a sample without the plan (the probe's figure), its layers' inputs with it
    assert peaks["none"] - peaks["TransformerEncoderLayer:1"] > 30 * MiB
