"""How far past its budget a runaway trial gets before the meter stops it (issue 41, item 3), quiet and beside
a neighbour burning a core in bursts (bench/robustness.py's Neighbour), interleaved.

The runaway holds 8 MiB more every few milliseconds (about 1 GiB/s: bytearrays filled, so every page is
resident) and steps every 512 MiB, up to 6 GiB; ``autotune measure --budget`` stops it. Prints each run's
outcome and peak over the budget, and the worst per condition. Goal: within 5% of the budget, quiet and loaded.

    python bench/runaway.py [--budget-mb 800] [--repeat 5] [--out bench/results/runaway-cpu.txt]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from robustness import finish, header, quiet_and_loaded

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
    finish(lines, args.out)


if __name__ == "__main__":
    main()
