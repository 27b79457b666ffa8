"""torch.compile under autotune: compilation paid once per workload, and compile plans beside eager plans.

    .venv/bin/python bench/compile_plans.py [--batch-sizes 64,256] [--rounds 3]

The model is tests/scripts/compiled.py with 4 residual MLP blocks (width 64, 256 tokens per sample): a
script that calls torch.compile itself (inductor; on the CPU it needs a C++ compiler).

1. *Paid once*: in a fresh cache dir, ``none`` and ``compile:0.5`` three times each, interleaved: the time
   from the trial runtime's start to its first measured step, the graphs compiled and reused (torch's own
   cache counters), and the warm-up and steady peaks. The first trial of each compiles; later ones read
   the workload's cache.
2. *Plans side by side*: every plan at each batch size, ``--rounds`` rounds in a rotating order (compiled
   graphs cached from part 1 or the first round), medians of the whole-run peak, the steady peak and
   samples/s, and each plan's samples/s over ``none``'s of the same round (median, min-max).

Machine-dependent: run it on the machine you report, and name the machine with the figures.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
from pathlib import Path

from autotune.core.budget import format_bytes
from autotune.trials.measurement import measure, measure_spec
from autotune.trials.result import TrialResult
from autotune.trials.settings import TrialSettings

SCRIPT = Path(__file__).parent.parent / "tests" / "scripts" / "compiled.py"
MODEL = ["--blocks", "4", "--width", "64", "--tokens", "256"]
PLANS = ("none", "compile:0.5", "compile:0", "Block:1", "Block:1/save=matmul")
SETTINGS = TrialSettings(warmup_steps=2, measured_steps=8, startup_timeout=300, timeout=600)


def trial(cache: Path, plan: str, batch: int) -> tuple[TrialResult, dict[str, object]]:
    spec = measure_spec(
        [str(SCRIPT), *MODEL], batch, plan=plan, device="cpu", cache_dir=cache, settings=SETTINGS
    )
    result = measure(spec)
    if result.outcome.value != "complete":
        raise SystemExit(f"{plan}: {result.outcome.value}: {result.error}")
    report = json.loads((Path(result.log_dir) / "report.json").read_text())
    return result, report


def paid_once(cache: Path, batch: int) -> None:
    print(f"1. compilation paid once (batch {batch}, fresh cache dir)")
    print(
        f"{'plan':<14}{'trial':>6}{'to 1st measured step':>22}{'graphs compiled/reused':>24}{'warm-up peak':>15}{'steady peak':>14}"
    )
    for round_ in (1, 2, 3):
        for plan in ("none", "compile:0.5"):
            result, report = trial(cache, plan, batch)
            counts = result.compile_cache or {}
            graphs = f"{counts.get('fx_graph_misses', 0)}/{counts.get('fx_graph_hits', 0)}"
            seconds = report.get("warmup_seconds")
            print(
                f"{plan:<14}{round_:>6}{seconds:>21.1f}s{graphs:>24}"
                f"{format_bytes(result.warmup_peak_bytes or 0):>15}{format_bytes(result.steady_peak_bytes or 0):>14}"
            )


def side_by_side(cache: Path, batch: int, rounds: int) -> None:
    print(f"\n2. plans side by side (batch {batch}, {rounds} rounds, rotating order, compiled graphs cached)")
    results: dict[str, list[TrialResult]] = {p: [] for p in PLANS}
    ratios: dict[str, list[float]] = {p: [] for p in PLANS}
    for r in range(rounds):
        order = PLANS[r % len(PLANS) :] + PLANS[: r % len(PLANS)]
        this_round = {plan: trial(cache, plan, batch)[0] for plan in order}
        for plan, result in this_round.items():
            results[plan].append(result)
            ratios[plan].append((result.samples_per_sec or 0) / (this_round["none"].samples_per_sec or 1))
    print(
        f"{'plan':<22}{'peak (whole run)':>18}{'steady peak':>14}{'samples/s':>12}{'vs none, same round':>28}"
    )
    for plan in PLANS:
        peak = statistics.median(r.peak_bytes for r in results[plan])
        steady = statistics.median(r.steady_peak_bytes or 0 for r in results[plan])
        speed = statistics.median(r.samples_per_sec or 0 for r in results[plan])
        spread = ratios[plan]
        ratio = f"{statistics.median(spread):.2f}x ({min(spread):.2f}-{max(spread):.2f})"
        print(
            f"{plan:<22}{format_bytes(int(peak)):>18}{format_bytes(int(steady)):>14}{speed:>12,.1f}{ratio:>28}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch-sizes", default="64,256")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    batches = [int(b) for b in args.batch_sizes.split(",")]
    print(f"machine: {platform.node()} ({platform.machine()}, {platform.processor() or 'cpu'}), CPU trials")
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp)
        paid_once(cache, batches[0])
        for batch in batches:
            side_by_side(cache, batch, args.rounds)


if __name__ == "__main__":
    main()
