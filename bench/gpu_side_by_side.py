"""Issue 31's comparison on one GPU: ``autotune run`` beside Accelerate's ``find_executable_batch_size``
without and with checkpointing, on a GPT-2 medium-class model (bench/gpt2_train.py, a budget where no
recompute fits batch ~2: 12 GiB) and on examples/gpt.py at 3 GiB; on GPT-2 also autotune's finder in the
script's own process (``@autotune.find_batch_size``, issue 44: gpt2_train.py --autotune-find).

For each case: each tuner's tries (autotune: its counted trials, and how many were over the budget) and wall
seconds, then each answer measured again, interleaved and repeated (``autotune measure``: NVML's peak, the
median samples/s of 20 steps), with the ratios of autotune's answer to each peer's, their spread over the
rounds, and to the best configuration measured under the limit in this run (autotune's trials and the
peers' answers). Issue 31's goal on GPT-2: >= 0.95 of that best, >= 1.0x the peer with checkpointing, <= 6
trials, <= 1 over budget, <= 90 s.

    python bench/gpu_side_by_side.py --out bench/results/gpu-side-by-side-<device>.md [--cases gpt2,gpt]

Needs a GPU, transformers and accelerate; ``--quick`` shrinks GPT-2 to 4 layers x 256 and its budget to
4 GiB (a dry run of the harness). ``--deadline S`` skips what would start after S seconds (a lent GPU's
minutes are few): the results say what was skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GiB = 2**30


@dataclass
class Case:
    name: str
    budget: str
    budget_bytes: int
    script: list[str]  # the training command, {batch_size} where the batch size goes
    peer: list[str]  # the peer's finder; --checkpointing turns checkpointing on
    checkpointed: tuple[list[str], str]  # the peer-with-checkpointing's answer as autotune measures it
    trials: int = 8
    lines: list[str] = field(default_factory=list)
    # autotune's finder in the script's own process (@autotune.find_batch_size, issue 44): the command that
    # prints its answer as one JSON line (None: the case has none)
    finder: list[str] | None = None


def cases(quick: bool) -> dict[str, Case]:
    small = ["--layers", "4", "--width", "256", "--seq", "256"] if quick else []
    gpt2_budget = 4 if quick else 12
    gpt2 = [sys.executable, str(ROOT / "bench" / "gpt2_train.py"), *small]
    gpt = [sys.executable, str(ROOT / "examples" / "gpt.py")]
    return {
        "gpt2": Case(
            "gpt2", f"{gpt2_budget}GiB", gpt2_budget * GiB,
            [*gpt2, "--batch-size", "{batch_size}"],
            [*gpt2, "--find", "--start", "64", "--budget-bytes", str(gpt2_budget * GiB)],
            ([*gpt2, "--batch-size", "{batch_size}", "--checkpointing"], "none"),
            finder=[*gpt2, "--autotune-find", "--budget-bytes", str(gpt2_budget * GiB)],
        ),
        "gpt": Case(
            "gpt", "3GiB", 3 * GiB,
            [*gpt, "--batch-size", "{batch_size}"],
            [sys.executable, str(ROOT / "bench" / "gpt_find.py"), "--budget-bytes", str(3 * GiB)],
            ([*gpt, "--batch-size", "{batch_size}"], "Block:1"),
        ),
    }  # fmt: skip


def autotune(*argv: str, timeout: float = 900) -> tuple[subprocess.CompletedProcess[str], float]:
    """``autotune ARGV`` (killed after ``timeout`` seconds: then exit code -9 and what it printed)."""
    started = time.monotonic()
    command = [sys.executable, "-m", "autotune", *argv]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        text = lambda b: b.decode(errors="replace") if isinstance(b, bytes) else (b or "")  # noqa: E731
        proc = subprocess.CompletedProcess(
            command, -9, text(e.stdout), text(e.stderr) + f"\n(killed after {timeout:.0f} s)"
        )
    return proc, time.monotonic() - started


def peer(case: Case, checkpointing: bool) -> dict:
    return peer_like([*case.peer, *(["--checkpointing"] if checkpointing else [])])


def peer_like(argv: list[str], timeout: float = 300) -> dict:
    """A finder run as a command that prints its answer as its last line (JSON), with its wall seconds."""
    started = time.monotonic()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"no answer in {timeout:.0f} s", "wall": time.monotonic() - started}
    wall = time.monotonic() - started
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1:] or [f"exit {proc.returncode}"], "wall": wall}
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    return {**found, "wall": wall}


def measure(command: list[str], batch: int, plan: str, budget: str) -> dict:
    proc, wall = autotune(
        "measure", "--json", "--device", "cuda", "-b", str(batch), "--plan", plan, "--steps", "20",
        "--warmup-steps", "3", "--budget", budget, "--", *command, timeout=600,
    )  # fmt: skip
    if proc.returncode != 0 and not proc.stdout.strip():
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1], "wall": wall}
    data = json.loads(proc.stdout)
    return {"speed": data.get("samples_per_sec"), "peak": data.get("peak_bytes"), "outcome": data.get("outcome"),
            "fits": data.get("fits"), "wall": wall}  # fmt: skip


def run_case(
    case: Case, rounds: int, deadline: float, run_seconds: float, say, known: tuple[int, int] | None = None
) -> None:
    """``known``: the peers' answers (without, with checkpointing) from an earlier run of this bench on this
    device: their finders are not run again (a lent GPU's minutes are few), and the results say so."""
    out = case.lines
    out.append(f"\n## {case.name}: budget {case.budget}\n")
    answers: dict[str, tuple[list[str], int, str]] = {}  # measured again in this order: the least needed last
    found: dict[str, tuple[list[str], int, str]] = {}
    if known is not None:
        plain: dict = {"batch_size": known[0], "from": "an earlier run (--known-peers)"}
        ckpt: dict = {"batch_size": known[1], "from": "an earlier run (--known-peers)"}
    else:
        plain = peer(case, checkpointing=False)
        ckpt = peer(case, checkpointing=True)
    say(f"{case.name}: peer without checkpointing: {plain}")
    out.append(f"- Accelerate find_executable_batch_size, no checkpointing: {json.dumps(plain)}")
    if "batch_size" in plain and known is None:  # known: only the peer with checkpointing is measured again
        found["peer"] = (case.script, plain["batch_size"], "none")
    say(f"{case.name}: peer with checkpointing: {ckpt}")
    out.append(f"- Accelerate find_executable_batch_size, with checkpointing: {json.dumps(ckpt)}")
    if "batch_size" in ckpt:
        found["peer+ckpt"] = (case.checkpointed[0], ckpt["batch_size"], case.checkpointed[1])

    cache = tempfile.mkdtemp(prefix="autotune-bench-")
    proc, wall = autotune(
        "run", "--json", "--device", "cuda", "--budget", case.budget, "--trials", str(case.trials),
        "--cache-dir", cache, "--", *case.script, timeout=min(run_seconds, max(60.0, deadline - time.monotonic())),
    )  # fmt: skip
    (Path(cache) / "run.stderr").write_text(proc.stderr)
    say(proc.stderr[-6000:])
    out.append(f"- autotune run ({wall:.0f} s wall, exit {proc.returncode}); its progress:\n")
    out.append("```\n" + "\n".join(line for line in proc.stderr.splitlines() if line.strip()) + "\n```")
    fitting_seen: list[tuple[float, str]] = []
    if proc.returncode == 0:
        data = json.loads(proc.stdout)
        trials = [
            t
            for t in data["trials"]
            if t["kind"] == "measured" and t["outcome"] is not None and t["proposed_by"] != "re-measure"
        ]
        over = [
            t for t in trials if t["outcome"] != "complete" or (t["peak_bytes"] or 0) > data["limit_bytes"]
        ]
        starting = sum(t.get("startup_seconds") or 0 for t in data["trials"])
        measuring = sum(t.get("measured_seconds") or 0 for t in data["trials"])
        out.append(
            f"- autotune: answer {data['plan']}@{data['batch_size']} ({data['samples_per_sec']:.1f} samples/s "
            f"verified); {len(trials)} trials, {len(over)} over the budget; {wall:.0f} s wall "
            f"({starting:.0f} s of trials starting, {measuring:.1f} s of measured steps)"
        )
        answers["autotune"] = (case.script, data["batch_size"], data["plan"])
        fitting_seen = [
            (t["samples_per_sec"], f"{t['plan']}@{t['batch_size']} (autotune trial {t['number']})")
            for t in data["trials"]
            if t["outcome"] == "complete"
            and t["samples_per_sec"]
            and (t["peak_bytes"] or 0) <= data["limit_bytes"]
        ]
    if case.finder is not None and time.monotonic() < deadline:
        cache = tempfile.mkdtemp(prefix="autotune-bench-find-")
        finder = peer_like(
            [*case.finder, "--cache-dir", cache], timeout=min(240.0, deadline - time.monotonic())
        )
        say(f"{case.name}: autotune finder: {finder}")
        out.append(
            f"- autotune finder (@autotune.find_batch_size in the script's process): {json.dumps(finder)}"
        )
        if "batch_size" in finder:
            answers["autotune finder"] = (case.script, finder["batch_size"], finder["plan"])
    answers.update({name: found[name] for name in ("peer+ckpt", "peer") if name in found})
    readings: dict[str, list[dict]] = {name: [] for name in answers}
    for r in range(rounds):  # interleaved: each answer once per round, in turn
        for name, (command, batch, plan) in answers.items():
            if time.monotonic() > deadline:
                out.append(f"- deadline: round {r + 1} of {name} and what follows were skipped")
                break
            reading = measure(command, batch, plan, case.budget)
            say(f"{case.name} round {r + 1}: {name} {plan}@{batch}: {reading}")
            readings[name].append(reading)
    out.append("\n| answer | configuration | NVML peak (GiB) | samples/s per round | median |")
    out.append("|---|---|---|---|---|")
    medians = {}
    for name, (command, batch, plan) in answers.items():
        speeds = [x["speed"] for x in readings[name] if x.get("speed")]
        peaks = [x["peak"] / GiB for x in readings[name] if x.get("peak")]
        medians[name] = statistics.median(speeds) if speeds else None
        flag = " --checkpointing" if "--checkpointing" in command else ""
        out.append(
            f"| {name} | {plan}@{batch}{flag} | {', '.join(f'{p:.2f}' for p in peaks)} | "
            f"{', '.join(f'{s:.1f}' for s in speeds)} | {medians[name] or float('nan'):.1f} |"
        )
        if name != "autotune":
            for reading in readings[name]:
                if reading.get("speed") and reading.get("fits"):
                    fitting_seen.append((reading["speed"], f"{plan}@{batch}{flag} ({name})"))
    for side in ("autotune", "autotune finder"):
        if not medians.get(side):
            continue
        for name in ("peer", "peer+ckpt"):
            ours = [x["speed"] for x in readings[side] if x.get("speed")]
            theirs = [x["speed"] for x in readings.get(name, []) if x.get("speed")]
            if ours and theirs:
                ratios = [a / b for a, b in zip(ours, theirs, strict=False)]  # rounds cut by the deadline
                out.append(
                    f"- {side} / {name}: {statistics.median(ratios):.3f} (rounds: "
                    f"{', '.join(f'{x:.3f}' for x in ratios)})"
                )
        if fitting_seen:
            best, which = max(fitting_seen)
            out.append(f"- {side} / best measured under the limit ({which}, {best:.1f}): "
                       f"{medians[side] / best:.3f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cases", default="gpt2,gpt")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--deadline", type=float, default=3600.0, help="seconds: start nothing after")
    parser.add_argument("--run-seconds", type=float, default=1800.0, help="autotune run is stopped after")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--known-peers", default=None, help="B,C: the first case's peers answered B and C in an earlier run"
    )
    args = parser.parse_args()
    deadline = time.monotonic() + args.deadline
    import torch

    device = torch.cuda.get_device_name(0)
    head = [
        "# autotune beside Accelerate's find_executable_batch_size (issue 31)",
        f"\n{device}; torch {torch.__version__}; `{shlex.join(['python', *sys.argv])}`; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
    ]
    lines = list(head)

    def say(text: str) -> None:
        print(text, flush=True)
        if args.out is not None:  # what is done so far survives a call cut short
            args.out.write_text("\n".join(lines) + "\n")

    for name in args.cases.split(","):
        if time.monotonic() > deadline:
            lines.append(f"\n## {name}: skipped (deadline)")
            continue
        case = cases(args.quick)[name]
        case.lines = lines
        known = tuple(int(x) for x in args.known_peers.split(",")) if args.known_peers else None
        run_case(case, args.rounds, deadline, args.run_seconds, say, known)  # type: ignore[arg-type]
        args.known_peers = None  # the first case's only
    say("\n".join(lines[-12:]))
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
