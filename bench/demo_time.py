"""`make demo`'s run (``autotune run --budget 1GiB examples/gpt.py``, a fresh cache each time) quiet and beside a
neighbour burning a core in bursts (bench/robustness.py's Neighbour), interleaved and repeated: each run's
wall seconds, stages, processes and answer. Issue 41's goal: <= 30 s quiet, <= 2x the quiet time loaded.

    python bench/demo_time.py [--repeat 3] [--neighbours 1] [--warm | --no-warm] [--out bench/results/demo-time-cpu.txt]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from robustness import finish, header, quiet_and_loaded

ROOT = Path(__file__).resolve().parents[1]


def once(warm: bool) -> dict:
    cache = tempfile.mkdtemp(prefix="autotune-demo-")
    argv = [sys.executable, "-m", "autotune", "run", "--json", "--budget", "1GiB", "--cache-dir", cache,
            *([] if warm else ["--no-warm"]), str(ROOT / "examples" / "gpt.py")]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        return {"wall": wall, "error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
    data = json.loads(proc.stdout)
    trials = [t for t in data["trials"] if t.get("outcome")]
    return {
        "wall": wall,
        "answer": f"{data['plan']}@{data['batch_size']}",
        "stages": {k: round(v) for k, v in (data.get("stages") or {}).items()},
        "trials": len(trials),
        "processes": len({t.get("log_dir") for t in trials}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--neighbours", type=int, default=1, help="bursting neighbours in the loaded runs")
    parser.add_argument("--warm", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    lines = [header("demo_time.py")]
    walls: dict[str, list[float]] = {"quiet": [], "loaded": []}
    for r, condition in quiet_and_loaded(args.repeat, count=args.neighbours):
        result = once(args.warm)
        walls[condition].append(result["wall"])
        lines.append(f"{condition:7} run {r + 1}: {json.dumps(result)}")
        print(lines[-1], flush=True)
    quiet, loaded = statistics.median(walls["quiet"]), statistics.median(walls["loaded"])
    lines.append(
        f"median wall: quiet {quiet:.0f} s, loaded {loaded:.0f} s ({loaded / quiet:.2f}x the quiet time)"
    )
    finish(lines, args.out)


if __name__ == "__main__":
    main()
