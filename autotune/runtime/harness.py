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

from autotune.runtime import hooks, trial, warm


def main(argv: list[str]) -> int:
    if not argv or (argv[0] == "-m" and len(argv) < 2):
        sys.stderr.write("usage: python -m autotune.runtime.harness SCRIPT [ARGS...] | -m MODULE [ARGS...]\n")
        return 2
    hooks.install()
    running = trial.current()
    if running is None:
        run_script(argv, catch=False)
        return 0
    return warm.serve(run_script, argv, running)  # once, or again for each configuration of a warm process


def run_script(argv: list[str], catch: bool = True) -> BaseException | None:
    """Run the script (``argv``: as after the harness) as ``__main__``; what it raised (None: it ended)."""
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))  # as `python SCRIPT` would
            runpy.run_path(argv[0], run_name="__main__")
    except BaseException as error:
        if not catch:
            raise
        return error
    return None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
