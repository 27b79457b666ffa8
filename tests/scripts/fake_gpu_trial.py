"""Trial script for the FAKE NVML tests: declares "GPU memory" in $FAKE_GPU_USAGE_FILE as "<pid> <bytes>".

Holds --held-mib for the whole trial and --spike-mib more for --spike-seconds during step 1; writes the
CUDA_VISIBLE_DEVICES it was given to $FAKE_GPU_USAGE_FILE.env.
"""

import argparse
import os
import time

import autotune

MiB = 2**20


def declare(path: str, size: float) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{os.getpid()} {int(size)}")
    os.replace(tmp, path)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--held-mib", type=float, default=0)
    p.add_argument("--spike-mib", type=float, default=0)
    p.add_argument("--spike-seconds", type=float, default=0.2)
    args = p.parse_args()
    usage = os.environ["FAKE_GPU_USAGE_FILE"]
    with open(usage + ".env", "w") as f:
        f.write(os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"))
    declare(usage, args.held_mib * MiB)
    for step in range(10**9):
        if step == 1 and args.spike_mib:
            declare(usage, (args.held_mib + args.spike_mib) * MiB)
            time.sleep(args.spike_seconds)
            declare(usage, args.held_mib * MiB)
        time.sleep(0.01)
        autotune.step()


if __name__ == "__main__":
    main()
