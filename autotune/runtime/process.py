"""What the trial runtime reads of, and does to, its own process: whether an error is out of memory,
CUDA's synchronisation and counters, the resident high-water mark, CUDA's pinned host bytes, torch.compile's
cache counters. None of it imports torch: each looks for it in ``sys.modules``."""

from __future__ import annotations

import contextlib
import sys


def is_out_of_memory(error: BaseException) -> bool:
    """CUDA OOM (``torch.OutOfMemoryError``), a Python MemoryError, or torch's CPU allocator refusing."""
    if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and (
        "out of memory" in text.lower() or "can't allocate memory" in text
    )


def synchronize_cuda() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def release_segment_memory() -> None:
    """Between a sweep's segments: CUDA's cached blocks back to the driver (NVML's reading falls to what the
    process holds) and torch's peak counters reset; on Linux, the resident high-water mark reset to the
    current resident size (/proc/self/clear_refs, 5), so each segment's peak is its own."""
    import gc

    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def rss_high_water() -> int | None:
    """This process's resident high-water mark (VmHWM; None where /proc has none)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def cuda_peaks() -> tuple[int | None, int | None]:
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None, None
    return int(torch.cuda.max_memory_allocated()), int(torch.cuda.max_memory_reserved())


def pinned_bytes() -> int | None:
    """The bytes CUDA's pinned host allocator holds now (activation offload's saved tensors): the tuner's
    account of a trial the kernel kills for host memory (None without CUDA, or a torch without the stat)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    try:
        return int(torch.cuda.host_memory_stats().get("allocated_bytes.current", 0)) or None
    except (AttributeError, RuntimeError):
        return None


def compile_cache() -> dict[str, int] | None:
    """torch.compile's cache lookups so far in this process (torch's own counters; never imports torch)."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return None
    counters = utils.counters
    found = {
        "fx_graph_hits": counters["inductor"].get("fxgraph_cache_hit", 0),
        "fx_graph_misses": counters["inductor"].get("fxgraph_cache_miss", 0),
        "aot_autograd_hits": counters["aot_autograd"].get("autograd_cache_hit", 0),
        "aot_autograd_misses": counters["aot_autograd"].get("autograd_cache_miss", 0),
    }
    return {k: int(v) for k, v in found.items()} if any(found.values()) else None


def one_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def flush_stdio() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
