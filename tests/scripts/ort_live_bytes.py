"""examples/ort_transformer.py with ORT's CPU memory arena off: the process's RSS then follows the bytes
ORT holds (with MALLOC_MMAP_THRESHOLD_ low enough that freed tensors go back to the kernel), which is what
ORT's memory optimizer predicts savings of.

Why a test needs this: with the arena on (ORT's default, and what autotune measures for users), ORT's BFC
arena grows in power-of-two regions, ORTModule turns memory reuse off, and the peak RSS counts every arena
page any tensor has touched: where ORT places tensors (fragmentation) enters a plan's measured saving, which
on the example comes out at about twice ORT's prediction (docs/architecture.md, "ONNX Runtime backend"). The
arena setting is a session option with no ORTMODULE_* variable, hence this wrapper rather than a flag.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path
from typing import Any

from onnxruntime.training.ortmodule import _graph_execution_manager

EXAMPLE = Path(__file__).resolve().parent.parent.parent / "examples" / "ort_transformer.py"
_session_config = _graph_execution_manager.GraphExecutionManager._get_session_config


def _without_cpu_arena(self: Any) -> tuple[Any, Any, Any]:
    session_options, providers, provider_options = _session_config(self)
    session_options.enable_cpu_mem_arena = False
    return session_options, providers, provider_options


_graph_execution_manager.GraphExecutionManager._get_session_config = _without_cpu_arena
sys.argv = [str(EXAMPLE), *sys.argv[1:]]
runpy.run_path(str(EXAMPLE), run_name="__main__")
