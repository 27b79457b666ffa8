"""The finders' callbacks on real models (issue 44): Lightning's AutotuneFinder on a LightningModule and
Hugging Face's AutotuneCallback on a Trainer of a GPT-2 built from a config, each searching inside the
training's own process (a subprocess per case: the hooks go into that process's torch), then training at the
answer from the weights it started with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import SCRIPTS, finder_options

pytestmark = pytest.mark.compat


def fitted(script: str, tmp_path: Path, *extra: str, **options: Any) -> dict[str, Any]:
    out = tmp_path / "out.json"
    options = finder_options(tmp_path / "cache", options)
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / script), json.dumps(options), *extra, str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def test_lightnings_finder_searches_at_fit_start_then_fits_at_the_answer(tmp_path: Path) -> None:
    result = fitted("finder_lightning.py", tmp_path, budget="900MB", batch_sizes="16,64", plans=["Block:1"])
    assert (result["batch"], result["plan"], result["cached"]) == (64, "Block:1", False)
    assert result["fit_batch"] == 64 and result["fit_steps"] == 3  # the fit's own steps, from the first
    assert result["applied"] == "Block:1"  # on the module the trainer fits
    assert result["restored"]  # the search's trials trained nothing into the weights the fit starts from
    assert result["first_loss"] == result["plain_first_loss"]  # the plan changes no number
    assert not list(tmp_path.glob(".autotune_*.ckpt"))  # the search's checkpoint is gone


def test_the_hugging_face_callback_searches_as_train_starts_then_trains_at_the_answer(tmp_path: Path) -> None:
    output = tmp_path / "output"
    options = {"budget": "1200MB", "batch_sizes": "4,16", "plans": ["GPT2Block:1"]}
    result = fitted("finder_hf.py", tmp_path, str(output), **options)
    assert (result["batch"], result["plan"], result["cached"]) == (16, "GPT2Block:1", False)
    assert result["train_batches"] == [16, 16, 16] and result["steps"] == 3
    assert result["applied"] == "GPT2Block:1" and result["restored"]
    # the real training saves every step (save_steps 1, as set again after the search); the trials, of
    # ten steps and more each, saved nothing
    assert result["save_steps"] == 1
    assert sorted(p.name for p in output.iterdir()) == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    again = fitted("finder_hf.py", tmp_path, str(output), **options)
    assert again["cached"] and again["train_batches"] == [16, 16, 16]  # zero trials the second time
