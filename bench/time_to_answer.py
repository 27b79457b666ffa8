"""Issue 41's time to answer on the CPU: ``autotune run`` beside Accelerate's ``find_executable_batch_size``
without and with ``gradient_checkpointing_enable()``, on a small Hugging Face GPT-2 built from a config
(bench/gpt2_train.py --device cpu: 4 layers x 256, sequence 256; nothing downloaded).

Each round, in turn: the peer without checkpointing and with it, each under an address-space cap (what
``ulimit -v`` sets: torch's CPU allocator then raises the error Accelerate halves on); ``autotune run`` given
the memory the peer-with-checkpointing's answer used (its peak as ``autotune measure`` reads it, in this
round), warm (the default) and, with ``--cold``, ``--no-warm``; autotune's finder in the script's own
process at the same budget (``@autotune.find_batch_size``, issue 44); then every distinct answer measured
again by ``autotune measure``, ``--repeats`` times, interleaved (A B C A B C; sides that answered the same
configuration share its readings): each answer's samples/s and resident peak are the medians of its readings
(median samples/s of 10 steps each). One reading each once read the same none@7 at 1.74 for one side and
3.23 for another in one round. It prints each side's wall seconds (autotune's split into its trials'
start-up, their measured steps and the rest: warm-up steps, the tuner, verification's settling), each
answer's samples/s and peak, and autotune's ratios to the peer with checkpointing, with their spread over
the rounds. Goal (issue 41): autotune's wall <= the peer-with-checkpointing's, its answer >= 1.0x
that peer's samples/s at no more measured memory.

    python bench/time_to_answer.py [--rounds 2] [--repeats 3] [--cap-gib 3] [--cold] [--out bench/results/time-to-answer-cpu.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MiB = 2**20
MODEL = ["--device", "cpu", "--layers", "4", "--width", "256", "--seq", "256"]
SCRIPT = [sys.executable, str(ROOT / "bench" / "gpt2_train.py"), *MODEL]


def timed(argv: list[str], timeout: float = 1800) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    return proc, time.monotonic() - started


def peer(cap: int, checkpointing: bool) -> dict:
    """Accelerate's finder from batch 64 down, 3 steps a try, under the address-space cap."""
    flag = ["--checkpointing"] if checkpointing else []
    proc, wall = timed([*SCRIPT, *flag, "--find", "--start", "64", "--budget-bytes", str(cap)])
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1], "wall": wall}
    return {**json.loads(lines[-1]), "wall": wall}


def measure(batch: int, plan: str, checkpointing: bool) -> dict:
    """``autotune measure``: the configuration's resident peak and median samples/s over 10 steps."""
    flag = ["--checkpointing"] if checkpointing else []
    proc, _ = timed([sys.executable, "-m", "autotune", "measure", "--json", "-b", str(batch), "--plan", plan,
                     "--steps", "10", "--warmup-steps", "2", "--", *SCRIPT, *flag, "--batch-size", "{batch_size}"])  # fmt: skip
    if not proc.stdout.strip():
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
    data = json.loads(proc.stdout)
    return {
        "speed": data.get("samples_per_sec"),
        "peak": data.get("peak_bytes"),
        "outcome": data.get("outcome"),
    }


def tune(budget: int, warm: bool) -> dict:
    """``autotune run`` at ``budget`` bytes in a fresh cache dir: its answer, wall and where the time went."""
    cache = tempfile.mkdtemp(prefix="autotune-tta-")
    argv = [sys.executable, "-m", "autotune", "run", "--json", "--budget", f"{budget // MiB}MiB",
            "--cache-dir", cache, *([] if warm else ["--no-warm"]), "--", *SCRIPT, "--batch-size", "{batch_size}"]  # fmt: skip
    proc, wall = timed(argv)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1], "wall": wall}
    data = json.loads(proc.stdout)
    trials = [t for t in data["trials"] if t.get("outcome")]
    return {
        "batch_size": data["batch_size"],
        "plan": data["plan"],
        "wall": wall,
        "processes": len({t.get("log_dir") for t in trials}),
        "trials": len(trials),
        "starting": sum(t.get("startup_seconds") or 0 for t in trials),
        "measuring": sum(t.get("measured_seconds") or 0 for t in trials),
    }


def finder(budget: int) -> dict:
    """``@autotune.find_batch_size`` at ``budget`` bytes in the script's own process (issue 44), in a fresh
    cache dir: its answer and wall (the process's whole life: imports, the search, the answer)."""
    cache = tempfile.mkdtemp(prefix="autotune-tta-find-")
    proc, wall = timed([*SCRIPT, "--autotune-find", "--budget-bytes", str(budget), "--cache-dir", cache])
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1], "wall": wall}
    return {**json.loads(lines[-1]), "wall": wall}


def median_reading(readings: list[dict]) -> dict:
    """The median samples/s and peak of an answer's readings (of those that read one), and its samples/s readings."""
    speeds = [x["speed"] for x in readings if x.get("speed")]
    peaks = [x["peak"] for x in readings if x.get("peak")]
    return {
        "speed": statistics.median(speeds) if speeds else None,
        "peak": statistics.median(peaks) if peaks else None,
        "readings": speeds,
    }


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cap-gib", type=float, default=3.0, help="the peers' address-space cap (ulimit -v)")
    parser.add_argument("--cold", action="store_true", help="also autotune run --no-warm")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved readings of each answer")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    cap = int(args.cap_gib * 2**30)
    lines = [
        "# Time to answer on the CPU (issue 41): autotune run beside Accelerate's find_executable_batch_size",
        f"\n{platform.node()}: {os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}; "
        f"`{shlex.join(['python', *sys.argv])}`; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"\nModel: {' '.join(MODEL)}; peers under an address-space cap of {args.cap_gib} GiB.\n",
        "| round | side | answer | wall s | tries / processes | samples/s (median, range) | peak MiB |",
        "|---|---|---|---|---|---|---|",
    ]
    ratios: dict[str, list[float]] = {}
    walls: dict[str, list[float]] = {}
    for r in range(1, args.rounds + 1):
        plain = peer(cap, checkpointing=False)
        ckpt = peer(cap, checkpointing=True)
        print(f"round {r}: peer {plain} | peer+ckpt {ckpt}", flush=True)
        if "batch_size" not in ckpt:
            lines.append(f"| {r} | peer+ckpt | failed: {ckpt.get('error')} | | | | |")
            continue
        budget = measure(ckpt["batch_size"], "none", True).get("peak")
        if not budget:
            lines.append(f"| {r} | peer+ckpt | its answer could not be measured | | | | |")
            continue
        budget = -(-budget // MiB) * MiB  # the peer's memory, up to the MiB
        sides = {"autotune": tune(budget, warm=True), "autotune finder": finder(budget)}
        if args.cold:
            sides["autotune --no-warm"] = tune(budget, warm=False)
        print(f"round {r}: budget {budget // MiB} MiB: {sides}", flush=True)
        answers = {
            "peer": (plain.get("batch_size"), "none", False, plain),
            "peer+ckpt": (ckpt["batch_size"], "none", True, ckpt),
            **{
                name: (side.get("batch_size"), side.get("plan", "none"), False, side)
                for name, side in sides.items()
            },
        }
        distinct = list(dict.fromkeys((b, p, f) for b, p, f, _ in answers.values() if b))
        taken: dict[tuple, list[dict]] = {config: [] for config in distinct}
        for _ in range(args.repeats):  # interleaved: A B C A B C, so a load that comes and goes falls on all
            for config in distinct:
                taken[config].append(measure(*config))
        readings = {name: median_reading(taken.get((b, p, f), [])) for name, (b, p, f, _) in answers.items()}
        for name, (batch, plan, flag, side) in answers.items():
            reading = readings[name]
            tries = side.get("tries") or (
                f"{side.get('trials')} trials / {side.get('processes')} processes" if "trials" in side else ""
            )
            answer = (
                f"{plan}@{batch}{' --checkpointing' if flag else ''}"
                if batch
                else f"failed: {side.get('error')}"
            )
            speed, peak, each = reading.get("speed"), reading.get("peak"), reading.get("readings") or []
            shown = f"{speed or 0:.2f}" + (f" ({min(each):.2f}-{max(each):.2f})" if len(each) > 1 else "")
            lines.append(f"| {r} | {name} | {answer} | {side.get('wall', 0):.0f} | {tries} | "
                         f"{shown} | {(peak or 0) / MiB:.0f} |")  # fmt: skip
            walls.setdefault(name, []).append(side.get("wall", 0))
            base = readings["peer+ckpt"].get("speed")
            if speed and base and name != "peer+ckpt":
                ratios.setdefault(name, []).append(speed / base)
        if "autotune" in sides and "starting" in sides["autotune"]:
            a = sides["autotune"]
            rest = a["wall"] - a["starting"] - a["measuring"]
            lines.append(f"| {r} | (autotune's trials) | {a['starting']:.1f} s starting, {a['measuring']:.1f} s measuring, "
                         f"{rest:.1f} s the rest | | | | budget {budget // MiB} MiB |")  # fmt: skip
        if args.out is not None:
            args.out.write_text("\n".join(lines) + "\n")
    lines.append("\nsamples/s over the peer with checkpointing's (median, range over the rounds):")
    lines += [f"- {name}: {spread(values)}" for name, values in ratios.items()]
    lines.append("\nwall seconds (median, range):")
    lines += [f"- {name}: {spread(values)}" for name, values in walls.items()]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
