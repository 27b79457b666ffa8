"""Several plans in one trial process (``run --sweep``, autotune.search.sweep) against one process per plan:
the wall time of measuring the same plans at one batch size both ways, interleaved and repeated, and each
plan's peak both ways.

The cases are real models on the CPU: examples/gpt.py (its own small transformer: torch's import and a
model built in well under a second) and a Hugging Face GPT-2 from a small config (transformers' import adds
seconds of start-up, as a real script's does). Per case it prints the ratio of the sweep's wall time to the
separate trials' (median over the rounds, with its range), the start-up the separate trials paid, and the
largest difference between a plan's peak in the sweep and alone.

On a GPU (``--device cuda``) the same, metered through NVML: whether CUDA's emptied cache gives each plan its
own peak there (tests/trials/test_sweep_trial.py checks it on the CPU).

Run: python bench/sweep.py [--rounds 3] [--device cpu|cuda] [--out bench/results/sweep-cpu.txt]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.core.plans import parse_plan  # noqa: E402
from autotune.hardware.devices import Device, resolve_device  # noqa: E402
from autotune.hardware.meters import make_meter  # noqa: E402
from autotune.trials.command import TrialCommand  # noqa: E402
from autotune.trials.measurement import run_trial  # noqa: E402
from autotune.trials.result import TrialResult  # noqa: E402
from autotune.trials.settings import TrialSettings  # noqa: E402

HF_GPT2 = """
import argparse, torch, autotune
from transformers import GPT2Config, GPT2LMHeadModel
config = GPT2Config(n_layer=4, n_embd=128, n_head=4, n_positions=128, vocab_size=2000)
model = GPT2LMHeadModel(config)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
batch = autotune.batch_size(default=8)
for _ in range(10**6):
    ids = torch.randint(0, 2000, (batch, 128))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step(); opt.zero_grad()
"""

CASES = {
    "examples/gpt.py (4 blocks x 128, batch 16)": (
        [str(ROOT / "examples" / "gpt.py"), "--n-layer", "4", "--n-embd", "128", "--block-size", "64"],
        16,
        ("Block:1", "Block:0.5", "none"),
    ),
    "Hugging Face GPT-2 (4 layers x 128, batch 8)": (None, 8, ("GPT2Block:1", "GPT2Block:0.5", "none")),
}


def trial(
    device: Device, cache: Path, words: list[str], batch: int, plan: str, sweep: tuple[str, ...] = ()
) -> TrialResult:
    environ = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    result = run_trial(
        TrialCommand.parse(words), batch, parse_plan(plan), device, make_meter(device),
        TrialSettings(2, 5, 300, 600), cache, environ, sweep=sweep,
    )  # fmt: skip
    for r in (result, *result.sweep):
        if r.outcome.value != "complete":
            raise SystemExit(f"{r.plan}: {r.outcome.value}: {r.error}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (NVML)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    device = resolve_device(args.device, os.environ)
    lines = [
        f"machine: {platform.node()}, {os.cpu_count()} cores; Python {platform.python_version()}; "
        f"trials on {device.name} ({device})"
    ]
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        script = root / "hf_gpt2.py"
        script.write_text(HF_GPT2)
        for name, (words, batch, plans) in CASES.items():
            words = words or [str(script)]
            ratios, startups, differences = [], [], []
            for _ in range(args.rounds):  # interleaved: a sweep, then the same plans one process each
                started = time.perf_counter()
                swept = trial(device, root, words, batch, plans[0], plans[1:])
                swept_wall = time.perf_counter() - started
                started = time.perf_counter()
                alone = [trial(device, root, words, batch, plan) for plan in plans]
                alone_wall = time.perf_counter() - started
                ratios.append(swept_wall / alone_wall)
                startups.append(sum(a.startup_seconds or 0.0 for a in alone) / alone_wall)
                for s, a in zip((swept, *swept.sweep), alone, strict=True):
                    differences.append(abs(s.peak_bytes - a.peak_bytes) / a.peak_bytes)
            lines.append(
                f"{name}, plans {', '.join(plans)}: the sweep's wall time / one process each = "
                f"{statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f}, {args.rounds} rounds); "
                f"start-up was {statistics.median(startups):.0%} of the separate trials' wall; "
                f"peaks in the sweep vs alone: largest difference {max(differences):.1%}"
            )
            print(lines[-1], flush=True)
    text = "\n".join(lines)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
