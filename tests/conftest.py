"""Shared fixtures: a per-test cache dir, and running trials of the synthetic script through the real launcher."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from autotune.command import TrialCommand
from autotune.devices import cpu_device
from autotune.measurement import TrialResult, TrialSettings, run_trial
from autotune.meters import RssMeter
from autotune.plans import Plan

SCRIPTS = Path(__file__).parent / "scripts"
SYNTHETIC = SCRIPTS / "synthetic.py"
EXAMPLES = Path(__file__).parent.parent / "examples"
MiB = 2**20


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    path = tmp_path / "cache"
    path.mkdir()
    return path


@pytest.fixture
def synthetic(cache: Path) -> Callable[..., TrialResult]:
    """Run one real trial of tests/scripts/synthetic.py on the CPU meter: synthetic(batch, *flags, **settings)."""

    def run(batch_size: int = 1, *flags: str, **settings: float) -> TrialResult:
        settings = {"warmup_steps": 1, "measured_steps": 3, "startup_timeout": 30, "timeout": 60, **settings}
        command = TrialCommand.parse([str(SYNTHETIC), *flags])
        return run_trial(
            command,
            batch_size,
            Plan.none(),
            cpu_device(),
            RssMeter(),
            TrialSettings(**settings),  # type: ignore[arg-type]
            cache,
            dict(os.environ),
        )

    return run


def alive(pid: int) -> bool:
    """True while /proc has a non-zombie process ``pid`` (kill -0 would count zombies as alive)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def python() -> str:
    return sys.executable
