"""The probe of a real Lightning Fabric loop checks its plans through the _FabricModule (#32 item 1): it
answered ``ConvBlock:1: fails on this model: AttributeError: '_FabricModule' object has no attribute
'_autotune_plan'`` and then passed ``ConvBlock:1/save=conv`` with a difference of 0, a plan left applied
so that the check wrapped nothing. tests/scripts/fabric_cnn.py, written without autotune in mind."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from autotune import api
from autotune.core.protocol import Outcome

pytestmark = pytest.mark.compat

SCRIPT = str(Path(__file__).parents[1] / "scripts" / "fabric_cnn.py")


def test_a_fabric_loop_s_plans_are_checked_through_its_wrapper_and_each_ran(tmp_path: Path) -> None:
    probed = api.probe(
        [sys.executable, SCRIPT, "--batch-size", "{batch_size}"],
        batch_size=4,
        device="cpu",
        cache_dir=tmp_path,
    )
    assert probed.outcome is Outcome.COMPLETE, probed.error
    report = probed.probe
    assert report is not None
    checks = {c.plan: (c.error, c.ok) for c in report.checks}
    assert checks == {"ConvBlock:1": (None, True), "ConvBlock:1/save=conv": (None, True)}
