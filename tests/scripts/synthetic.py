"""Synthetic trial script for autotune's tests: no torch, real memory, known behaviour.

Holds ``--base-mib`` plus ``batch_size * --per-sample-mib`` of touched memory, then runs steps through
autotune.step(). Flags add the misbehaviours the launcher must survive.
"""

import argparse
import json
import os
import random
import signal
import sys
import threading
import time

import autotune


def touched(mib: float) -> bytearray:
    return bytearray(b"\x01") * int(mib * 2**20)  # filled, so every page is resident


def plan_effect(spec: str, plan: str) -> tuple[float, float]:
    """(memory saving, time overhead) of the trial's plan, e.g. plan 'A:1' with spec 'A=0.5:0.3'; a key
    naming the whole plan ('A:0.5=0.6:0.2') wins over one naming its class."""
    effects = {}
    for item in filter(None, spec.split(",")):
        key, _, values = item.partition("=")
        saving, _, overhead = values.rpartition(":")
        effects[key] = (float(saving), float(overhead))
    return effects.get(plan, effects.get(plan.split(":")[0], (0.0, 0.0)))


def is_verification() -> bool:
    """Whether this trial verifies an answer: its request lets it run on while its peak settles."""
    request = os.environ.get("AUTOTUNE_TRIAL_REQUEST")
    if not request:
        return False
    with open(request) as f:
        return json.load(f).get("settle_steps", 0) > 0


def wait_for_a_cpu(seconds: float) -> None:
    """Stand-in for a neighbour's burst (a busy machine is not something a test can order): sleep
    ``seconds`` and add them to the kernel-format CPU pressure file the test pointed every process at
    ($AUTOTUNE_CPU_PRESSURE_PATH), as the kernel counts the time a runnable task waited for a CPU."""
    time.sleep(seconds)
    path = os.environ["AUTOTUNE_CPU_PRESSURE_PATH"]
    with open(path, "r+") as f:
        total = int(f.readline().split("total=")[1]) + int(seconds * 1e6)
        f.seek(0)
        f.truncate()
        f.write(
            f"some avg10=0.00 avg60=0.00 avg300=0.00 total={total}\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
        )


def count_reading(state_dir: str | None, batch: int, plan: str, kind: str = "") -> int:
    """How many trials of (batch, plan) ran before this one (0 without a state dir); kind "v": how many of
    its verifications."""
    if state_dir is None:
        return 0
    path = os.path.join(state_dir, f"{batch}-{plan.replace('/', '_')}{kind}.count")
    with open(path, "a+") as f:
        f.seek(0)
        before = len(f.read())
        f.write("x")
    return before


def named_value(
    spec: str, batch: int, plan: str, reading: int, default: float, verification: int | None = None
) -> float:
    """VALUE of ``BATCH:PLAN#N=VALUE`` in ``spec`` for this trial (``default`` if it is not named);
    ``BATCH:PLAN#vN=VALUE`` names the configuration's N-th verification (``verification``), whatever
    the search read of it before (a loaded machine's search reads a configuration more often)."""
    for item in filter(None, spec.split(",")):
        config, _, value = item.partition("=")
        if config == f"{batch}:{plan}#{reading}" or (
            verification is not None and config == f"{batch}:{plan}#v{verification}"
        ):
            return float(value)
    return default


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--base-mib", type=float, default=0)
    p.add_argument("--per-sample-mib", type=float, default=0)
    p.add_argument("--step-seconds", type=float, default=0.01)
    p.add_argument("--steps", type=int, default=10**9)
    p.add_argument("--crash-at", type=int, default=-1, help="raise ValueError at this step")
    p.add_argument("--crash-message", default=None, help="... with this message")
    p.add_argument("--crash-above", type=int, default=0, help="... only at a batch size above this one")
    p.add_argument("--oom-at", type=int, default=-1, help="raise MemoryError at this step")
    p.add_argument("--never-step", action="store_true", help="sleep forever without a step")
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument("--setsid-grandchild", action="store_true", help="fork a child that escapes the group")
    p.add_argument("--worker-mib", type=float, default=0, help="fork a worker that holds this much")
    p.add_argument("--forks", type=int, default=0, help="fork this many workers that share what it holds")
    p.add_argument(
        "--burn-workers",
        type=int,
        default=0,
        help="fork this many workers that spin on a CPU while it trains (a DataLoader's, busy), each writing "
        "its CPU seconds to --burn-file.<pid> as it goes; reaped as the run ends",
    )
    p.add_argument("--burn-file", default=None)
    p.add_argument("--pid-file", default=None, help="append the pids of this trial here")
    p.add_argument("--env-file", default=None, help="write the names in this trial's environment here")
    p.add_argument("--spike-mib", type=float, default=0, help="hold this much more during step 1 only")
    p.add_argument("--per-sample-seconds", type=float, default=0.0, help="step time added per sample")
    p.add_argument("--grow-mib", type=float, default=0, help="hold this much more at every step, forever")
    p.add_argument("--grow-steps", type=int, default=None, help="... for this many steps only")
    p.add_argument(
        "--plan-effects",
        default="",
        help="CLS=SAVING:OVERHEAD,...: the plan naming CLS keeps (1-SAVING) of the per-sample memory "
        "and makes the per-sample time (1+OVERHEAD) longer",
    )
    p.add_argument(
        "--noise",
        type=float,
        default=0.0,
        help="each step takes up to about this much longer at random, (1 + NOISE x |N(0,1)|) times: load "
        "only ever slows a step",
    )
    p.add_argument(
        "--slow",
        default="",
        help="BATCH:PLAN#N=FACTOR,...: the N-th trial (from 0) of that configuration, counted in "
        "--state-dir, runs FACTOR times slower, as on a machine busy for that one trial (#vN: its N-th "
        "verification; the first item that names a trial counts)",
    )
    p.add_argument(
        "--extra-mib",
        default="",
        help="BATCH:PLAN#N=MIB,...: the N-th trial (from 0) of that configuration (#vN: its N-th verification), "
        "counted in --state-dir, "
        "holds MIB more, as RSS that differs between two trials of one configuration (glibc, threads)",
    )
    p.add_argument("--state-dir", default=None, help="where trials of each configuration are counted")
    p.add_argument("--seed", type=int, default=None, help="seed of --noise, per configuration and trial")
    p.add_argument("--chatter-kib", type=int, default=0, help="print this much to stdout and stderr a step")
    p.add_argument(
        "--rank-scale",
        default="",
        help="S0,S1,...: under torchrun, rank r holds S_r times the per-sample memory (a pipeline's first "
        "stage keeps the activations of more micro-batches in flight than its last)",
    )
    p.add_argument(
        "--pipeline",
        action="store_true",
        help="under torchrun, every rank's step takes the per-sample time times the mean over the ranks of "
        "(1 + the overhead of that rank's plan): each stage's recompute lies on the pipeline's critical path",
    )
    p.add_argument(
        "--fail-rank", type=int, default=None, help="--oom-at and --crash-at apply to this rank only"
    )
    p.add_argument("--hang-rank", type=int, default=None, help="this rank stops stepping at --hang-at")
    p.add_argument("--hang-at", type=int, default=2)
    p.add_argument("--startup-seconds", type=float, default=0.0, help="sleep this long before the first step")
    p.add_argument(
        "--hold-while", default=None, help="before the first step, wait for as long as this file exists"
    )
    p.add_argument(
        "--slow-start",
        default=None,
        help="N=FACTOR: the first N steps (from 0) are slower: FACTOR times at step 0, (FACTOR + 1) / 2 times at "
        "step N - 1, a slow start that settles",
    )
    p.add_argument(
        "--slow-from",
        default=None,
        help="STEP=FACTOR: from this step (from 0) on, each step takes FACTOR times longer: a load that arrives "
        "while the trial runs",
    )
    p.add_argument(
        "--busy-steps",
        default=None,
        help="FIRST-LAST=FACTOR: steps FIRST to LAST (from 0) take FACTOR times longer, and the CPU pressure "
        "file ($AUTOTUNE_CPU_PRESSURE_PATH) counts the extra time as waited for a CPU: a neighbour's burst",
    )
    p.add_argument("--exit-message", default=None, help="raise SystemExit(this) before the first step")
    p.add_argument("--oom-plan", default=None, help="raise MemoryError at the first step with this plan")
    p.add_argument("--crash-plan", default=None, help="raise ValueError at step 1 with this plan")
    p.add_argument(
        "--oom-above",
        type=int,
        default=None,
        help="above this batch size, ask the allocator for more than any machine has at step 1: a real "
        "MemoryError, the process left as it was",
    )
    p.add_argument(
        "--leak-mib",
        type=float,
        default=0,
        help="keep this much more in a module every run of the script in one process (a library's cache that "
        "holds what the script made)",
    )
    p.add_argument(
        "--deaf-after-run",
        action="store_true",
        help="after its run, leave time.sleep blocking forever (a module-level side effect): a warm process at "
        "rest, which sleeps between looks for its next message, never takes one",
    )
    p.add_argument(
        "--once-per-process",
        action="store_true",
        help="fail when run a second time in one process (a process group initialised at import)",
    )
    p.add_argument(
        "--kill-launcher-above",
        type=int,
        default=None,
        help="above this batch size, at step 1: SIGKILL to the parent (the trial's launcher), then to itself "
        "(a kernel's out-of-memory kill of the whole group, as an offload trial's pinned memory drew on a GPU)",
    )
    args = p.parse_args()
    rank = int(os.environ["RANK"]) if os.environ.get("RANK", "").isdigit() else None
    whole_plan = autotune.parse_plan(os.environ.get("AUTOTUNE_PLAN", "none"))
    saving, overhead = plan_effect(
        args.plan_effects, str(whole_plan.for_rank(rank) if rank is not None else whole_plan)
    )
    if args.pipeline and whole_plan.ranks:
        overheads = [plan_effect(args.plan_effects, str(entry))[1] for entry in whole_plan.ranks]
        overhead = sum(overheads) / len(overheads)
    scale = float(args.rank_scale.split(",")[rank]) if args.rank_scale and rank is not None else 1.0
    if args.fail_rank is not None and rank != args.fail_rank:
        args.oom_at = args.crash_at = -1

    if args.exit_message is not None:
        raise SystemExit(args.exit_message)  # a script's check of its own config: sys.exit("bad config: ...")
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pids = [os.getpid()]
    if args.setsid_grandchild:
        grandchild = os.fork()
        if grandchild == 0:
            os.setsid()
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            while True:
                time.sleep(1)
        pids.append(grandchild)
    if args.worker_mib:
        ready, told = os.pipe()
        child = os.fork()
        if child == 0:
            held = touched(args.worker_mib)
            os.write(told, b"1")
            while True:
                time.sleep(1)
        os.read(ready, 1)  # training starts with the worker resident: a busy machine can run it late
        pids.append(child)
    if args.pid_file:
        time.sleep(0.05)
        with open(args.pid_file, "a") as f:
            f.write(" ".join(map(str, pids)) + "\n")

    if args.env_file:
        with open(args.env_file, "w") as f:
            f.write("\n".join(sorted(os.environ)) + "\n")
    if args.leak_mib:
        json.__dict__.setdefault("_synthetic_leak", []).append(touched(args.leak_mib))
    if args.once_per_process:
        if json.__dict__.get("_synthetic_ran"):
            raise RuntimeError("trying to initialize the default process group twice!")
        json.__dict__["_synthetic_ran"] = True
    batch = autotune.batch_size(default=1)
    plan = os.environ.get("AUTOTUNE_PLAN", "none")
    reading = count_reading(args.state_dir, batch, plan)
    verification = count_reading(args.state_dir, batch, plan, "v") if is_verification() else None
    extra = named_value(args.extra_mib, batch, plan, reading, 0.0, verification)
    held = touched(args.base_mib + extra + batch * args.per_sample_mib * scale * (1 - saving))
    for _ in range(args.forks):  # workers that inherit what it holds and never write it (a DataLoader's)
        if os.fork() == 0:
            while True:
                time.sleep(1)
    for _ in range(args.burn_workers):
        _BURNERS.append(burner(args.burn_file))
    step_seconds = args.step_seconds + batch * args.per_sample_seconds * (1 + overhead)
    step_seconds *= named_value(args.slow, batch, plan, reading, 1.0, verification)
    seed = None if args.seed is None else f"{args.seed}:{batch}:{plan}:{reading}"
    jitter = random.Random(seed)
    if args.never_step:
        while True:
            time.sleep(1)
    time.sleep(args.startup_seconds)  # imports, building a model, CUDA: a GPU trial's ~18 s (issue 31)
    # a trial under way for as long as a test needs
    while args.hold_while and os.path.exists(args.hold_while):
        time.sleep(0.05)
    grown = []
    for step in range(args.steps):
        if os.environ.get("AUTOTUNE_PLAN", "none") != plan:  # a sweep switched the plan between steps
            plan = os.environ["AUTOTUNE_PLAN"]
            saving, overhead = plan_effect(args.plan_effects, plan)
            del held
            held = touched(args.base_mib + extra + batch * args.per_sample_mib * scale * (1 - saving))
            step_seconds = args.step_seconds + batch * args.per_sample_seconds * (1 + overhead)
        if plan == args.oom_plan:
            raise MemoryError(f"synthetic allocation failure with plan {plan}")
        if args.grow_mib and (args.grow_steps is None or step < args.grow_steps):
            grown.append(touched(args.grow_mib))
        if step == 1 and plan == args.crash_plan:
            raise ValueError(f"synthetic crash with plan {plan}")
        if step == args.crash_at and batch > args.crash_above:
            raise ValueError(args.crash_message or f"synthetic crash at step {step}")
        if step == 1 and args.oom_above is not None and batch > args.oom_above:
            bytearray(2**62)  # MemoryError: no allocator gives 4 EiB
        if step == args.oom_at:
            raise MemoryError(f"synthetic allocation failure at step {step}")
        if args.hang_rank is not None and rank == args.hang_rank and step == args.hang_at:
            while True:
                time.sleep(1)
        if step == 1 and args.kill_launcher_above is not None and batch > args.kill_launcher_above:
            os.kill(os.getppid(), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)
        if args.chatter_kib:
            line = f"step {step} ".ljust(1023, "x") + "\n"  # 1 KiB lines, numbered
            sys.stdout.write(line * args.chatter_kib)
            sys.stderr.write(line * args.chatter_kib)
        spike = touched(args.spike_mib) if step == 1 else None
        arrived = args.slow_from is not None and step >= int(args.slow_from.split("=")[0])
        load = float(args.slow_from.split("=")[1]) if arrived else 1.0
        if args.slow_start is not None:  # FACTOR times at step 0, falling to (FACTOR + 1) / 2 at step N - 1
            count, _, factor = args.slow_start.partition("=")
            if step < int(count):
                load *= float(factor) - (float(factor) - 1) / 2 * step / max(int(count) - 1, 1)
        seconds = load * step_seconds * (1 + args.noise * abs(jitter.gauss(0, 1)))
        if args.busy_steps is not None:
            steps, _, factor = args.busy_steps.partition("=")
            first, _, last = steps.partition("-")
            if int(first) <= step <= int(last):
                wait_for_a_cpu(seconds * (float(factor) - 1))
        time.sleep(seconds)
        del spike
        autotune.step()
    sys.stdout.write("finished all steps\n")


_BURNERS: list[int] = []


def burner(report: str | None) -> int:
    """A child that spins on a CPU until killed, writing its CPU seconds to ``report``.<pid> every 50 ms."""
    pid = os.fork()
    if pid:
        return pid
    next_write = 0.0
    while True:
        now = time.monotonic()
        if report and now >= next_write:
            t = os.times()
            with open(f"{report}.{os.getpid()}", "w") as f:
                f.write(str(t.user + t.system))
            next_write = now + 0.05


def reap_burners() -> None:
    """Stop the spinning workers and reap them (their CPU time joins this process's children's)."""
    while _BURNERS:
        pid = _BURNERS.pop()
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def _never(seconds: float) -> None:
    threading.Event().wait()


if __name__ == "__main__":
    try:
        main()
    finally:
        reap_burners()
        if "--deaf-after-run" in sys.argv:
            time.sleep = _never
