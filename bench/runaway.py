"""How far past its budget a runaway trial gets before the meter stops it (issue 41, item 3), quiet and beside
a neighbour burning a core in bursts (bench/robustness.py's Neighbour), interleaved.

The runaway holds 8 MiB more every few milliseconds (about 1 GiB/s: bytearrays filled, so every page is
resident) and steps every 512 MiB, up to 6 GiB; ``autotune measure --budget`` stops it. Prints each run's
outcome and peak over the budget, and the worst per condition. Goal: within 5% of the budget, quiet and loaded.

The guard must cost a trial that is not running away nothing: then examples/gpt.py at batch 32 (~800 of
1024 MiB) is measured with ``--budget 1GiB`` and without, interleaved, on a quiet machine: each pair's
samples/s ratio and the steps' CPU pressure. (The meter once sampled every 2 ms past half the ceiling,
and such a trial read 10-14% slower with its budget.)

    python bench/runaway.py [--budget-mb 800] [--repeat 5] [--out bench/results/runaway-cpu.txt]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from robustness import finish, header, quiet_and_loaded

ROOT = Path(__file__).resolve().parents[1]

RUNAWAY = """import autotune
held = []
for i in range(768):
    held.append(bytearray(b"\\x01") * (8 * 2**20))
    if i % 64 == 0:
        autotune.step()
"""


def once(script: Path, budget_mb: int, cache: str) -> tuple[str, float]:
    proc = subprocess.run(
        [sys.executable, "-m", "autotune", "measure", "-b", "1", "--budget", f"{budget_mb}MB", "--json",
         "--cache-dir", cache, str(script)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    data = json.loads(proc.stdout)
    return data["outcome"], data["peak_bytes"] / (budget_mb * 1e6) - 1


def near(budget: str | None, cache: str) -> tuple[float, float]:
    """examples/gpt.py at batch 32, measured with ``budget`` (None: none): samples/s, the steps' pressure."""
    limit = ["--budget", budget] if budget else []
    proc = subprocess.run(
        [sys.executable, "-m", "autotune", "measure", "-b", "32", "--device", "cpu", *limit, "--json",
         "--cache-dir", cache, str(ROOT / "examples" / "gpt.py")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    data = json.loads(proc.stdout)
    return data["samples_per_sec"], data["load"]["steps_pressure"] or 0.0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--budget-mb", type=int, default=800)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="autotune-runaway-"))
    script = folder / "runaway.py"
    script.write_text(RUNAWAY)
    lines = [
        header("runaway.py"),
        f"# a runaway growing ~1 GiB/s, measured with --budget {args.budget_mb}MB; peak over the budget",
    ]
    worst: dict[str, float] = {}
    for r, condition in quiet_and_loaded(args.repeat, settle=1.5):  # loaded: into the neighbour's first burst
        outcome, over = once(script, args.budget_mb, str(folder / "cache"))
        worst[condition] = max(worst.get(condition, -1.0), over)
        lines.append(f"{condition:7} run {r + 1}: {outcome:12} {over:+.1%}")
        print(lines[-1], flush=True)
    lines += [f"worst {condition}: {over:+.1%}" for condition, over in worst.items()]
    lines.append("# examples/gpt.py at batch 32 (~800 MiB), --budget 1GiB against none, quiet, interleaved")
    ratios = []
    for r in range(args.repeat):
        (capped, capped_p), (free, free_p) = (
            near("1GiB", str(folder / "cache")),
            near(None, str(folder / "cache")),
        )
        ratios.append(capped / free)
        lines.append(
            f"pair {r + 1}: {capped:.1f} vs {free:.1f} samples/s ({capped / free:.3f}x), "
            f"steps' CPU pressure {capped_p:.3f} vs {free_p:.3f}"
        )
        print(lines[-1], flush=True)
    lines.append(
        f"with the budget: {statistics.median(ratios):.3f}x the samples/s without (range "
        f"{min(ratios):.3f}-{max(ratios):.3f})"
    )
    finish(lines, args.out)


if __name__ == "__main__":
    main()
