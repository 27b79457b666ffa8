"""Test environment only: lets PyPI's torchvision import beside the CPU build of torch.

PyPI's torchvision wheel is built against the CUDA build of torch: beside the CPU wheel (constraints/cpu.txt)
its C++ extension cannot load (libtorch_cuda.so is missing), and ``import torchvision`` then fails registering
fake kernels for operators that do not exist ("operator torchvision::nms does not exist"). transformers
imports torchvision whenever it is installed, so the failure would break every Hugging Face model too.

This module, loaded by ``autotune_test_torchvision.pth`` (``make venv`` copies both into the test venv's
site-packages), waits for torchvision's import without importing anything itself, and while torchvision's
``__init__`` runs makes ``torch.library.register_fake`` skip torchvision operators that were never
registered. Only the detection ops (nms, roi_align, deform_conv2d, ...) are missing as a result; the models
the compatibility suite builds (ResNet) use none of them. Users install a matching pair from one index.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Any


class _TorchvisionImport(importlib.abc.MetaPathFinder):
    # Stays on sys.meta_path: transformers asks find_spec("torchvision") before it imports it, and a spec
    # handed to such a question is not the one the import then uses.
    searching = False

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "torchvision" or self.searching:
            return None
        self.searching = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.searching = False
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_tolerantly(module: Any) -> None:
            import torch.library

            real = torch.library.register_fake

            def register_fake(op: Any, *args: Any, **kwargs: Any) -> Any:
                ours = isinstance(op, str) and op.startswith("torchvision::")
                if ours and not hasattr(torch.ops.torchvision, op.split("::", 1)[1].split(".")[0]):
                    return lambda fn=None: fn
                return real(op, *args, **kwargs)

            torch.library.register_fake = register_fake
            try:
                exec_module(module)
            finally:
                torch.library.register_fake = real

        spec.loader.exec_module = exec_tolerantly  # type: ignore[method-assign]
        return spec


if not any(isinstance(f, _TorchvisionImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _TorchvisionImport())
