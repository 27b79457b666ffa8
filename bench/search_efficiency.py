"""How many trials each search needs to find the fastest configuration that fits, on landscapes whose truth
is known: autotune against the baselines, side by side in one run (about 9 minutes on 2 CPU cores).

    .venv/bin/python bench/search_efficiency.py [--seeds 10] [--only knee,noisy-30]

Two landscapes are real torch scripts whose truth is measured first (every configuration twice,
interleaved): examples/gpt.py, and bench/landscapes/cached_mlp.py, whose recompute saves ~5x less than
the probe predicts. The others are the synthetic trial script (tests/scripts/synthetic.py): real allocations and real sleeps,
with peak = fixed + batch x per-sample x (1 - saving) and step = t0 + batch x t1 x (1 + overhead) for each
plan, so the true optimum under a budget is known exactly (fixed includes the interpreter, measured once
at the start). Noisy variants make every step up to 5% or 30% longer at random (``--noise``).

autotune runs for real: ``autotune run`` on the script, every trial a measured subprocess, verification
included. The baselines are search strategies, run against an oracle with the same truth and the same
noise model (each reading the median of the steps' samples/s, each step (1 + noise x |N(0,1)|) longer),
since their trials would only re-measure what the formula says; their trial counts are what they would
run. Baselines: Optuna TPE with its defaults (10 random start-up trials) and the memory constraint; random
search; the exhaustive grid; a Lightning-style batch-size finder (none only: double until it does not fit,
binary search between, keep 5% margin); a DeepSpeed-style estimate (one probe at the smallest batch,
linear extrapolation of its peak to the budget, then the batch sizes within ±5% of the estimate).

Per landscape and method: trials to reach >= 98% of the true optimum (by the best configuration found so
far that fits), the final choice's true throughput over the optimum, over-budget winners, and wall time
(autotune's is real; the oracle's is not meaningful and not shown).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import optuna

ROOT = Path(__file__).parent.parent
SYNTHETIC = ROOT / "tests" / "scripts" / "synthetic.py"
AUTOTUNE = str(Path(sys.executable).with_name("autotune"))
MiB = 2**20
HEADROOM = 0.05
STEPS = 3
BATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
TRIALS = 20  # the ceiling every method gets


@dataclass(frozen=True)
class Landscape:
    name: str
    budget_mib: float
    plans: dict[str, tuple[float, float]]  # plan -> (memory saving, per-sample time overhead)
    base_mib: float = 20
    per_sample_mib: float = 8
    t0: float = 0.05
    t1: float = 0.0005
    noise: float = 0.0
    what: str = ""

    real = False  # a formula, not a measured table
    batches = BATCHES

    @property
    def limit_mib(self) -> float:
        return self.budget_mib * (1 - HEADROOM)

    def peak_mib(self, fixed: float, batch: int, plan: str) -> float:
        return fixed + self.base_mib + batch * self.per_sample_mib * (1 - self.plans[plan][0])

    def speed(self, batch: int, plan: str) -> float:
        return batch / (self.t0 + batch * self.t1 * (1 + self.plans[plan][1]))

    def fits(self, fixed: float, batch: int, plan: str) -> bool:
        return self.peak_mib(fixed, batch, plan) <= self.limit_mib

    def optimum(self, fixed: float) -> tuple[int, str] | None:
        fitting = [(b, p) for b in self.batches for p in self.plans if self.fits(fixed, b, p)]
        return max(fitting, key=lambda c: self.speed(*c), default=None)

    def script_args(self, seed: int) -> list[str]:
        effects = ",".join(
            f"{p}={s}:{o}"  # the synthetic script keys effects by the whole plan
            for p, (s, o) in self.plans.items()
            if p != "none"
        )
        args = f"--base-mib {self.base_mib} --per-sample-mib {self.per_sample_mib}"
        args += f" --step-seconds {self.t0} --per-sample-seconds {self.t1}"
        out = args.split()
        if effects:
            out += ["--plan-effects", effects]
        if self.noise:
            out += ["--noise", str(self.noise), "--seed", str(seed)]
        return out

    def command(self, seed: int) -> list[str]:
        return [str(SYNTHETIC), "--", *self.script_args(seed)]


@dataclass
class Measured:
    """A real script whose truth is measured: every configuration twice, interleaved (the median speed,
    the larger peak). Its baselines replay that table without noise."""

    name: str
    script: list[str]
    budget_mib: float
    plans: dict[str, tuple[float, float]]  # the keys: plans to search
    batches: tuple[int, ...]
    what: str = ""
    noise: float = 0.0
    real: bool = True
    table: dict[tuple[int, str], tuple[float, float]] = field(default_factory=dict)  # (MiB, samples/s)

    @property
    def limit_mib(self) -> float:
        return self.budget_mib * (1 - HEADROOM)

    def measure(self) -> None:
        import autotune as at

        readings: dict[tuple[int, str], list[tuple[float, float]]] = {}
        for _ in range(2):
            for plan in self.plans:
                for batch in self.batches:
                    spec = at.measure_spec(
                        self.script,
                        batch,
                        plan=plan,
                        settings=at.TrialSettings(1, STEPS, 300, 600),
                        device="cpu",
                    )
                    result = at.measure(spec)
                    readings.setdefault((batch, plan), []).append(
                        (result.peak_bytes / MiB, result.samples_per_sec or 0.0)
                    )
        self.table = {
            c: (max(m for m, _ in r), statistics.median(v for _, v in r)) for c, r in readings.items()
        }

    def peak_mib(self, fixed: float, batch: int, plan: str) -> float:
        return self.table[(batch, plan)][0]

    def speed(self, batch: int, plan: str) -> float:
        return self.table[(batch, plan)][1]

    def fits(self, fixed: float, batch: int, plan: str) -> bool:
        return self.peak_mib(fixed, batch, plan) <= self.limit_mib and self.speed(batch, plan) > 0

    def optimum(self, fixed: float) -> tuple[int, str] | None:
        fitting = [(b, p) for b in self.batches for p in self.plans if self.fits(fixed, b, p)]
        return max(fitting, key=lambda c: self.speed(*c), default=None)

    def command(self, seed: int) -> list[str]:
        return [*self.script[:1], "--", *self.script[1:]] if len(self.script) > 1 else self.script


KNEE = {"none": (0.0, 0.0), "A:1": (0.5, 0.25), "B:1": (0.75, 4.0)}
LANDSCAPES = [
    Landscape(
        "saturating",
        290,
        {"none": (0.0, 0.0), "A:1": (0.5, 0.3), "B:1": (0.75, 0.6)},
        t0=0.002,
        t1=0.002,
        what="throughput flat past batch 8: none at its largest batch wins",
    ),
    Landscape("knee", 290, KNEE, what="a larger batch with recompute (A:1@48) beats none@24"),
    Landscape(
        "tight",
        90,
        {"none": (0.0, 0.0), "A:1": (0.5, 0.05), "B:1": (0.75, 0.1)},
        per_sample_mib=40,
        what="40 MiB per sample: none fits batch 1 only, the plan saving 75% reaches 4",
    ),
    Landscape("impossible", 30, KNEE, what="nothing fits: the search should say so at once"),
    Landscape(
        "non-monotonic",
        290,
        {"none": (0.0, 0.0), "A:0.5": (0.6, 0.2), "A:1": (0.3, 0.4)},
        what="A:0.5 saves more than A:1 (a peak not monotonic in the plan's parameter)",
    ),
    Landscape("noisy-5", 290, KNEE, noise=0.05, what="knee, every step up to ~5% slower at random"),
    Landscape("noisy-30", 290, KNEE, noise=0.30, what="knee, every step up to ~30% slower at random"),
    Measured(
        "gpt-example",
        [str(ROOT / "examples" / "gpt.py")],
        1024,
        {"none": (0, 0), "Block:1": (0, 0), "Block:1/save=attention+matmul": (0, 0)},
        (4, 6, 8, 12, 16, 24, 32, 48, 64),
        what="examples/gpt.py on the CPU, 1 GiB, its truth measured (every configuration twice)",
    ),
    Measured(
        "prediction-off",
        [str(ROOT / "bench" / "landscapes" / "cached_mlp.py")],
        560,
        {"none": (0, 0), "CachedLayer:1": (0, 0)},
        (256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096),
        what="checkpointing saves ~5x less than the probe predicts (a cache the recompute doubles), measured",
    ),
]


@dataclass
class Run:
    trials: list[tuple[int, str]] = field(default_factory=list)  # measured, in order
    readings: list[float] = field(default_factory=list)
    choice: tuple[int, str] | None = None
    wall: float | None = None


def oracle(land, fixed: float, rng: random.Random) -> Callable[[int, str], tuple[float, bool]]:
    """A reading (samples/s, fits) with the synthetic script's noise model (a measured table: its own)."""

    def read(batch: int, plan: str) -> tuple[float, bool]:
        if land.real:
            return land.speed(batch, plan), land.fits(fixed, batch, plan)
        speed = land.speed(batch, plan)
        steps = [speed / (1 + land.noise * abs(rng.gauss(0, 1))) for _ in range(STEPS)]
        return statistics.median(steps), land.fits(fixed, batch, plan)

    return read


def best_of(run: Run, fits: Callable[[int, str], bool]) -> tuple[int, str] | None:
    seen = [(r, c) for r, c in zip(run.readings, run.trials, strict=True) if fits(*c)]
    return max(seen)[1] if seen else None


def grid(land, read, seed) -> Run:
    run = Run()
    for plan in land.plans:
        for batch in land.batches:
            speed, _ = read(batch, plan)
            run.trials.append((batch, plan))
            run.readings.append(speed)
    return run


def random_search(land, read, seed) -> Run:
    configs = [(b, p) for p in land.plans for b in land.batches]
    random.Random(seed).shuffle(configs)
    run = Run()
    for config in configs[:TRIALS]:
        run.trials.append(config)
        run.readings.append(read(*config)[0])
    return run


def tpe(land, read, seed) -> Run:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    fits: dict[tuple[int, str], bool] = {}

    def objective(trial: optuna.Trial) -> float:
        config = (
            trial.suggest_categorical("batch", land.batches),
            trial.suggest_categorical("plan", list(land.plans)),
        )
        speed, ok = read(*config)
        fits[config] = ok
        trial.set_constraint("memory", 0.0 if ok else 1.0)  # as autotune's own study stores it
        return speed

    sampler = optuna.samplers.TPESampler(seed=seed)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.optimize(objective, n_trials=TRIALS)
    run = Run()
    for t in study.trials:
        run.trials.append((t.params["batch"], t.params["plan"]))
        run.readings.append(t.value or 0.0)
    return run


def lightning(land, read, seed) -> Run:
    """Double the batch (none only) until it does not fit, binary search between, keep a 5% margin."""
    run = Run()

    def trial(index: int) -> bool:
        speed, ok = read(land.batches[index], "none")
        run.trials.append((land.batches[index], "none"))
        run.readings.append(speed)
        return ok

    good, bad = -1, len(land.batches)
    index = 0
    while index < len(land.batches):
        if not trial(index):
            bad = index
            break
        good = index
        index = (
            land.batches.index(min(b for b in land.batches if b >= 2 * land.batches[index]))
            if land.batches[index] * 2 <= land.batches[-1]
            else len(land.batches)
        )
    while bad - good > 1:
        middle = (good + bad) // 2
        if trial(middle):
            good = middle
        else:
            bad = middle
    if good >= 0:
        margin = max((b for b in land.batches if b <= 0.95 * land.batches[good]), default=land.batches[0])
        run.choice = (margin, "none")
    return run


def deepspeed(land, read, seed) -> Run:
    """One probe at the smallest batch, its peak extrapolated linearly to the limit, then ±5% around it."""
    run = Run()
    speed, _ = read(land.batches[0], "none")
    run.trials.append((land.batches[0], "none"))
    run.readings.append(speed)
    per_sample = land.peak_mib(FIXED, land.batches[0], "none") / land.batches[0]  # what one probe can tell
    estimate = land.limit_mib / per_sample
    for batch in sorted(
        {b for b in land.batches if 0.95 * estimate <= b <= 1.05 * estimate}
        or {min(land.batches, key=lambda b: abs(b - estimate))}
    ):
        speed, _ = read(batch, "none")
        run.trials.append((batch, "none"))
        run.readings.append(speed)
    return run


def autotune(land, seed: int) -> Run:
    with tempfile.TemporaryDirectory() as cache:
        argv = [AUTOTUNE, "run", "--budget", f"{land.budget_mib}MiB", "--trials", str(TRIALS), "--json"]
        argv += ["--plans", ";".join(land.plans), "--batch-sizes", f"{land.batches[0]}-{land.batches[-1]}"]
        argv += ["--steps", str(STEPS), "--warmup-steps", "1", "--device", "cpu", "--seed", str(seed)]
        argv += ["--cache-dir", cache, *land.command(seed)]
        started = time.monotonic()
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=1200)
        run = Run(wall=time.monotonic() - started)
        if proc.returncode not in (0, 6):
            raise SystemExit(f"autotune failed on {land.name}: {proc.stderr[-2000:]}")
        if proc.returncode == 6:  # nothing fits: its trials are in the study
            import sqlite3

            with sqlite3.connect(Path(cache) / "autotune.db") as conn:
                run.trials = [(0, "")] * conn.execute("SELECT count(*) FROM trials").fetchone()[0]
                run.readings = [0.0] * len(run.trials)
            return run
        data = json.loads(proc.stdout)
        for t in data["trials"]:
            if t["kind"] == "measured" and t["outcome"]:
                run.trials.append((t["batch_size"], t["plan"]))
                run.readings.append(t["samples_per_sec"] or 0.0)
        run.choice = (data["batch_size"], data["plan"])
        return run


FIXED = 0.0  # MiB the interpreter adds to every trial: measured in main()

METHODS: dict[str, Callable] = {
    "tpe-default": tpe,
    "random": random_search,
    "grid": grid,
    "lightning-finder": lightning,
    "deepspeed-estimate": deepspeed,
}


def score(land: Landscape, run: Run) -> dict[str, object]:
    optimum = land.optimum(FIXED)
    fits = lambda b, p: bool(p) and land.fits(FIXED, b, p)  # noqa: E731
    if run.choice is None:
        run.choice = best_of(run, fits)
    if optimum is None:
        return {"trials": len(run.trials), "to98": None, "ratio": None, "over": run.choice is not None}
    best_speed = land.speed(*optimum)
    to98 = None
    for n in range(1, len(run.trials) + 1):
        found = best_of(Run(run.trials[:n], run.readings[:n]), fits)
        if found is not None and land.speed(*found) >= 0.98 * best_speed:
            to98 = n
            break
    chosen = run.choice
    ratio = land.speed(*chosen) / best_speed if chosen and land.fits(FIXED, *chosen) else 0.0
    over = chosen is not None and not land.fits(FIXED, *chosen)
    return {"trials": len(run.trials), "to98": to98, "ratio": ratio, "over": over}


def interpreter_mib() -> float:
    """The synthetic script's peak with nothing allocated: what every trial adds to base + batch x per-sample."""
    with tempfile.TemporaryDirectory() as cache:
        argv = [AUTOTUNE, "measure", "--batch-size", "1", "--steps", "2", "--warmup-steps", "1", "--json"]
        argv += ["--device", "cpu", "--cache-dir", cache, str(SYNTHETIC), "--", "--base-mib", "0"]
        data = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    return data["peak_bytes"] / MiB


def main() -> None:
    global FIXED
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=10, help="seeds of the noisy landscapes")
    parser.add_argument("--only", default="", help="comma-separated landscape names")
    args = parser.parse_args()
    FIXED = interpreter_mib()
    print(
        f"# {platform.node()}: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}; the interpreter adds {FIXED:.1f} MiB to every trial"
    )
    lands = [x for x in LANDSCAPES if not args.only or x.name in args.only.split(",")]
    summary: dict[str, list[dict[str, object]]] = {m: [] for m in ["autotune", *METHODS]}
    header = f"{'landscape':14} {'method':19} {'trials':>7} {'to 98%':>7} {'choice/opt':>11} {'over':>5} {'wall s':>7}"
    print(header)
    for land in lands:
        if land.real:
            land.measure()
        optimum = land.optimum(FIXED)
        print(
            f"## {land.name}: {land.what}; optimum {optimum and f'{optimum[1]}@{optimum[0]}'} "
            f"({land.speed(*optimum):.1f}/s)"
            if optimum
            else f"## {land.name}: {land.what}"
        )
        for method in ["autotune", *METHODS]:
            results = []
            # noise, or a method that draws at random, is run once per seed
            for seed in range(args.seeds if land.noise or method in ("tpe-default", "random") else 1):
                if method == "autotune":
                    run = autotune(land, seed)
                else:
                    run = METHODS[method](land, oracle(land, FIXED, random.Random(seed)), seed)
                results.append({**score(land, run), "wall": run.wall})
            summary[method] += [dict(r, landscape=land.name) for r in results]
            print(line(land.name, method, results))
    print()
    print(summary_line(summary))


def med(values: list) -> str:
    """The median, a run that never got there counted as more than TRIALS."""
    if not values:
        return "-"
    middle = statistics.median([math.inf if v is None else v for v in values])
    return f">{TRIALS}" if middle == math.inf else f"{middle:.0f}"


def line(name: str, method: str, results: list[dict]) -> str:
    ratios = [r["ratio"] for r in results if r["ratio"] is not None]
    ratio = (
        f"{min(ratios):.3f}"
        + (f"..{max(ratios):.3f}" if len(ratios) > 1 and max(ratios) != min(ratios) else "")
        if ratios
        else "-"
    )
    never = sum(r["to98"] is None for r in results if r["ratio"] is not None)
    to98 = med([r["to98"] for r in results]) + (f" ({never} never)" if never else "") if ratios else "-"
    walls = [r["wall"] for r in results if r["wall"] is not None]
    wall = f"{statistics.median(walls):.0f}" if walls else ""
    over = sum(bool(r["over"]) for r in results)
    return f"{name:14} {method:19} {med([r['trials'] for r in results]):>7} {to98:>7} {ratio:>11} {over:>5} {wall:>7}"


def summary_line(summary: dict[str, list[dict]]) -> str:
    def deterministic(method: str, key: str) -> list:
        return [
            r[key]
            for r in summary[method]
            if not r["landscape"].startswith("noisy") and r["ratio"] is not None
        ]

    ours = deterministic("autotune", "to98")
    tpe_ = deterministic("tpe-default", "to98")
    grid_ = deterministic("grid", "to98")
    noisy = [r for r in summary["autotune"] if r["landscape"] == "noisy-30"]
    good = sum((r["ratio"] or 0) >= 0.95 for r in noisy)
    worst = min((r for r in deterministic("autotune", "ratio")), default=None)
    return (
        f"summary: autotune reaches 98% of the optimum in a median of {med(ours)} trials on the deterministic "
        f"landscapes (TPE with its defaults {med(tpe_)}, the grid {med(grid_)}); its worst final choice there "
        f"is {worst:.3f} of the optimum; "
        f"over-budget winners: {sum(bool(r['over']) for r in summary['autotune'])}; noisy-30: {good} of "
        f"{len(noisy)} seeds >= 95%"
    )


if __name__ == "__main__":
    main()
