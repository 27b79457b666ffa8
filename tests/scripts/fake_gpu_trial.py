"""Trial script for the FAKE NVML tests: declares "GPU memory" in $FAKE_GPU_USAGE_FILE as "<pid> <bytes>"
(or, with several fake GPUs, in $FAKE_GPU_USAGE_DIR/<the first UUID in CUDA_VISIBLE_DEVICES>).

Holds --held-mib + batch size x --per-sample-mib for the whole trial and --spike-mib more for
--spike-seconds during step 1; writes the CUDA_VISIBLE_DEVICES it was given to <usage file>.env. With
--context-mib, that much more from the first run on, and only that once a run ends: what a CUDA process holds
at rest (its context), as a warm process's rest would show it (autotune.trials.warm). With --company DIR,
each run marks its start in DIR, and the second run to start waits (up to a minute, before its first step)
until a third has started: runs that a tuner starts side by side then overlap however slowly a loaded machine
starts each, and runs it starts one after another never do (the first run, the probe's, runs alone).
"""

import argparse
import os
import time
import uuid

import autotune

MiB = 2**20


def declare(path: str, size: float) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{os.getpid()} {int(size)}")
    os.replace(tmp, path)


def keep_company(folder: str) -> None:
    """Mark this run's start in ``folder``; the second run to start waits until a third has (60 s at most)."""
    open(os.path.join(folder, uuid.uuid4().hex), "w").close()
    if len(os.listdir(folder)) != 2:
        return
    deadline = time.monotonic() + 60
    while len(os.listdir(folder)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--held-mib", type=float, default=0)
    p.add_argument("--spike-mib", type=float, default=0)
    p.add_argument("--spike-seconds", type=float, default=0.2)
    p.add_argument("--per-sample-mib", type=float, default=0)
    p.add_argument("--step-seconds", type=float, default=0.01)
    p.add_argument("--context-mib", type=float, default=0)
    p.add_argument("--company", help="a folder where runs mark their start (see above)")
    args = p.parse_args()
    if args.company:
        keep_company(args.company)
    usage = os.environ.get("FAKE_GPU_USAGE_FILE") or os.path.join(
        os.environ["FAKE_GPU_USAGE_DIR"], os.environ["CUDA_VISIBLE_DEVICES"].split(",")[0]
    )
    held = args.context_mib + args.held_mib + autotune.batch_size(default=1) * args.per_sample_mib
    with open(usage + ".env", "w") as f:
        f.write(os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"))
    declare(usage, held * MiB)
    try:
        for step in range(10**9):
            if step == 1 and args.spike_mib:
                declare(usage, (held + args.spike_mib) * MiB)
                time.sleep(args.spike_seconds)
                declare(usage, held * MiB)
            time.sleep(args.step_seconds)
            autotune.step()
    finally:
        if args.context_mib:
            declare(usage, args.context_mib * MiB)


if __name__ == "__main__":
    main()
