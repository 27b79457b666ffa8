"""A training loop of the user's own with an evaluation and a checkpoint save, for the phase tests: no
torch, real memory. Each step holds ``--train-mib`` (plus ``--per-sample-mib`` per sample) for 50 ms, so its
samples/s grows with the batch; its evaluation (every ``--eval-every`` steps, or when
the trial awaits one) holds ``--eval-mib`` more, a save ``--save-mib`` more, each long enough for the meter
to sample. ``--never`` names a phase the loop never runs (a script that does not do what it was asked).
"""

import argparse
import time

import autotune


def touched(mib: float) -> bytearray:
    return bytearray(b"\x01") * int(mib * 2**20)  # filled, so every page is resident


def hold(mib: float, seconds: float = 0.3) -> None:
    block = touched(mib)
    time.sleep(seconds)  # several of the meter's samples (20 Hz)
    del block


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--train-mib", type=float, default=20)
    parser.add_argument("--eval-mib", type=float, default=120)
    parser.add_argument("--save-mib", type=float, default=60)
    parser.add_argument(
        "--per-sample-mib", type=float, default=0, help="a step holds this much more per sample"
    )
    parser.add_argument("--eval-per-sample-mib", type=float, default=0, help="the evaluation's, per sample")
    parser.add_argument("--eval-every", type=int, default=1000)
    parser.add_argument("--never", choices=("eval", "save"))
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    batch = autotune.batch_size(default=4)
    for step in range(1, args.steps + 1):
        hold(args.train_mib + batch * args.per_sample_mib, 0.05)
        autotune.step(batch)
        if args.never != "eval" and (step % args.eval_every == 0 or autotune.due("eval")):
            with autotune.phase("eval"):
                hold(args.eval_mib + batch * args.eval_per_sample_mib)
        if args.never != "save" and autotune.due("save"):
            with autotune.phase("save"):
                hold(args.save_mib)


if __name__ == "__main__":
    main()
