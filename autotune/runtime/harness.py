"""Run a training script as an autotune trial, unchanged.

    python -m autotune.runtime.harness train.py [ARGS...]
    python -m autotune.runtime.harness -m package.train [ARGS...]

Installs the trial runtime (step counting, the recompute plan) before the script runs, then runs it as
``__main__``. Outside a trial (no ``AUTOTUNE_TRIAL_REQUEST``) it just runs the script.
"""

from __future__ import annotations

import os
import runpy
import sys

from autotune.runtime import hooks, trial


def main(argv: list[str]) -> int:
    if not argv or (argv[0] == "-m" and len(argv) < 2):
        sys.stderr.write("usage: python -m autotune.runtime.harness SCRIPT [ARGS...] | -m MODULE [ARGS...]\n")
        return 2
    hooks.install()
    running = trial.current()
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))  # as `python SCRIPT` would
            runpy.run_path(argv[0], run_name="__main__")
    except BaseException as error:
        if running is None:
            raise
        return running.conclude(error)
    return running.conclude(None) if running is not None else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
