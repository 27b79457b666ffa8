"""torch.compile paid once per workload: every trial of a workload gets the same inductor and Triton cache
folders under autotune's cache dir (keyed by the workload's fingerprint), so a later trial reuses the graphs
an earlier one compiled, read from torch's own cache counters in the trial's report. Real trials of a script
that calls torch.compile itself (inductor on the CPU: a C++ compiler, as on every machine of this project)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autotune.core.paths import compile_cache_dir, torch_default_inductor_dir
from autotune.hardware.devices import resolve_device
from autotune.trials.command import TrialCommand
from autotune.trials.measurement import measure, measure_spec
from autotune.trials.settings import TrialSettings
from autotune.trials.workload import workload_of

from conftest import SCRIPTS

COMPILED = str(SCRIPTS / "compiled.py")
# torch.compile in every trial (30-40 s of CI's core suite): beside the real-model runs
pytestmark = [pytest.mark.slow, pytest.mark.compat]


def compiled_trial(cache: Path, *args: str, environ: dict[str, str] | None = None):
    settings = TrialSettings(warmup_steps=1, measured_steps=1, tight=0)
    spec = measure_spec([COMPILED, *args], 4, device="cpu", cache_dir=cache, settings=settings)
    return measure(spec, environ=environ)


@pytest.mark.compat  # compiles in real trials: CI's compatibility phase (core suite time)
def test_a_workload_compiles_once_and_its_later_trials_reuse_the_graphs(tmp_path: Path) -> None:
    # importing torch's inductor writes torch's default folder into the environment (a test process or a
    # notebook that compiled something has it): nobody's choice, and the workload's own folder is used
    environ = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": torch_default_inductor_dir()}
    first = compiled_trial(tmp_path, environ=environ)
    assert first.outcome.value == "complete", first.error
    assert first.compile_cache is not None
    assert first.compile_cache["fx_graph_hits"] == 0 and first.compile_cache["fx_graph_misses"] >= 1
    again = compiled_trial(tmp_path, environ=environ)
    assert again.compile_cache is not None
    assert again.compile_cache["fx_graph_hits"] == first.compile_cache["fx_graph_misses"]
    assert again.compile_cache["fx_graph_misses"] == 0
    fingerprint = workload_of(TrialCommand.parse([COMPILED]), resolve_device("cpu", {}), "torch").fingerprint
    folder = compile_cache_dir(tmp_path, fingerprint) / "inductor"
    assert folder.is_dir() and any(folder.rglob("*"))
    assert [p.name for p in (tmp_path / "compile").iterdir()] == [fingerprint[:16]]  # nothing elsewhere


def test_a_cache_folder_the_user_chose_is_kept(tmp_path: Path) -> None:
    own = tmp_path / "my-inductor"
    result = compiled_trial(tmp_path / "cache", environ={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(own)})
    assert result.outcome.value == "complete", result.error
    assert any(own.rglob("*"))
    assert not (tmp_path / "cache" / "compile").exists()
