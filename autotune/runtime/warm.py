"""A warm trial process (issue 41): the user's script run again, in the same process, for each configuration
the tuner sends.

A fresh trial process spends most of its life starting: on an H200, 12-24 s importing torch and transformers,
building the model, creating the CUDA context and warming up, for 0.4-3.8 s of measured steps. A warm process
pays that once. After a configuration's trial has ended (its report written: complete, out of memory or
failed), the runtime brings the process back to rest:

- the script's objects are collected: the module namespace ``runpy`` ran it in is gone, the error's
  traceback (which holds the script's frames) is cleared, and the collector runs;
- dynamo's caches are reset (the next run's model is a new object: its graphs compile again, from
  inductor's cache on disk), CUDA's cached blocks go back to the driver and torch's peak counters are reset;
- freed heap pages go back to the kernel (glibc's ``malloc_trim``) and the resident high-water mark is reset
  to the resident size now (``/proc/self/clear_refs``), so the next configuration's VmHWM is its own.

Then it writes what it holds at rest (``rest-K.json``: core.protocol.Rest) and waits for the tuner's message
(``next-K+1.json``): the next configuration's request and command line, or the end. The tuner decides whether
the process is fit to take another one (back at its resting memory: autotune.trials.warm); this side only
obeys. Imports, the CUDA context, cuBLAS/cuDNN handles and the compile caches on disk stay.

The same trial object (``autotune.runtime.trial._Trial``) starts over for each configuration, since the
hooks and the frameworks' wrappers hold it; the hook that finds the model at its first forward is armed
again (``autotune.runtime.hooks.rearm``).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from autotune.core.protocol import (
    BATCH_SIZE_ENV,
    GRAD_ACCUM_ENV,
    PLAN_ENV,
    REQUEST_ENV,
    Rest,
    TrialRequest,
    WarmMessage,
    warm_file,
    write_progress,
)
from autotune.runtime.trial import _Trial

WAIT_SECONDS = 0.01  # how often a process at rest looks for the tuner's next message


def serve(run: Callable[[list[str]], BaseException | None], argv: list[str], trial: _Trial) -> int:
    """Run the script (``run(argv)`` returns what it raised), and while the trial is warm, each next
    configuration the tuner sends; the exit code of the last one's end."""
    code = _conclude(trial, run(argv))
    served = 1
    while trial.request.warm:
        folder = Path(trial.request.report_path).parent
        trial.let_go()
        return_to_rest()
        resident = _resident_bytes()
        allocated, reserved = _cuda_now()
        Rest(resident, allocated, reserved, _cpu_seconds()).write(warm_file(folder, "rest", served))
        message = _await(warm_file(folder, "next", served + 1))
        if not message.request:
            return code
        served += 1
        request = TrialRequest.read(message.request)
        _configure(request, message.request)
        trial.restart(request)
        write_progress(trial.progress_path, 0)  # taken: the tuner waits a bounded time for this file
        cap_allocator(request.memory_cap)
        from autotune.runtime import hooks

        hooks.rearm()
        _reset_counters()
        reset_high_water()
        code = _conclude(trial, run(list(message.argv)))
    return code


def _conclude(trial: _Trial, error: BaseException | None) -> int:
    """Report how the script ended, then let go of its frames: an error's traceback holds every frame the
    script left through it, with the model and its tensors in their locals."""
    code = trial.conclude(error)
    if error is not None and trial.request.warm:
        traceback.clear_frames(error.__traceback__)
        error.__traceback__ = None
    return code


def return_to_rest() -> None:
    """Give back what the last configuration held (see the module docstring)."""
    gc.collect()
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    gc.collect()
    _malloc_trim()
    reset_high_water()


def cap_allocator(cap: int) -> None:
    """Let torch's CUDA caching allocator hold at most ``cap`` bytes (0: the whole device): past it, an
    allocation raises torch.OutOfMemoryError in the script, as on a device of that size. A no-op without
    CUDA in use (the CPU's budget stays the meter's)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    torch.cuda.set_per_process_memory_fraction(min(cap / total, 1.0) if cap > 0 else 1.0)


def reset_high_water() -> None:
    """Reset this process's resident high-water mark to its resident size now (Linux; elsewhere nothing)."""
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _malloc_trim() -> None:
    """glibc keeps freed heap pages; ``malloc_trim(0)`` hands every whole free page back to the kernel (a
    no-op where the C library has none: musl, macOS). Looked up in the symbols the process has loaded
    (``CDLL(None)``, as the shim does), not by ``ctypes.util.find_library``, which runs ``ldconfig -p``: a
    child the meter sampled as part of the configuration's tree, which turned its reading into ``rss-tree``
    (a loaded CI worker caught it; tests/search/test_robustness.py asserts a one-process ``rss``)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)


def _await(path: Path) -> WarmMessage:
    """The tuner's message at ``path``, once it is there (the tuner ends the process if it never comes)."""
    while True:
        try:
            return WarmMessage.read(path)
        except FileNotFoundError:
            time.sleep(WAIT_SECONDS)


def _configure(request: TrialRequest, path: str) -> None:
    """The environment a fresh trial of ``request`` (at ``path``) would have: a script reads its batch size
    and plan there."""
    os.environ[REQUEST_ENV] = path
    os.environ[BATCH_SIZE_ENV] = str(request.batch_size)
    os.environ[PLAN_ENV] = request.plan
    os.environ[GRAD_ACCUM_ENV] = str(request.grad_accum or 1)


def _reset_counters() -> None:
    """The recompute wrappers' counters and the fully_shard and deepspeed.initialize calls seen, which a
    fresh process would start at zero."""
    modules = sys.modules.get("autotune.backends.torch_modules")
    if modules is not None:
        modules.reset_counters()
    for name in ("autotune.backends.torch_sharding", "autotune.backends.deepspeed_zero"):
        sharding = sys.modules.get(name)
        if sharding is not None:
            sharding.reset_calls()


def _resident_bytes() -> int:
    """Resident now (0 where /proc has no statm: the tuner's meter then judges the rest alone)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0


def _cpu_seconds() -> float:
    """This process's CPU seconds and its reaped children's."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _cuda_now() -> tuple[int | None, int | None]:
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None, None
    return int(torch.cuda.memory_allocated()), int(torch.cuda.memory_reserved())
