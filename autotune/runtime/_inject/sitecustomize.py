"""Installs the autotune trial runtime in every Python process of a trial whose command is not ``python …``.

Only a process that counts at least one step (or runs out of memory) writes the trial's report, so helper
Python processes of a wrapper script (a launcher such as torchrun) do not; each rank of a multi-process job
writes its own. An uncaught error is reported once: the exit handler that runs after it leaves the report. The interpreter's own sitecustomize, if any, still runs.
"""

from __future__ import annotations

import atexit
import importlib.machinery
import importlib.util
import os
import sys


def _install() -> None:
    from autotune.runtime import hooks, process, trial

    hooks.install()
    running = trial.current()
    if running is None:
        return
    previous_hook = sys.excepthook

    def on_uncaught(kind, error, tb):  # type: ignore[no-untyped-def]
        if running.steps or running.rank is not None or process.is_out_of_memory(error):
            running.conclude(error)
        previous_hook(kind, error, tb)

    def on_exit() -> None:
        if (running.steps or running.rank is not None) and not running.finished and not running.concluded:
            running.conclude(None)

    sys.excepthook = on_uncaught
    atexit.register(on_exit)


def _chain_next_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.machinery.PathFinder.find_spec(
        "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != here]
    )
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if os.environ.get("AUTOTUNE_TRIAL_REQUEST"):
    _install()
_chain_next_sitecustomize()
