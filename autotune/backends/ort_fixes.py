"""The ONNX Runtime backend's compatibility fixes A-E (autotune.backends.ort explains each, with the failure
it prevents): small patches to torch and onnxruntime-training 1.19.2 so that ORTModule runs with the
installed torch. Applied once per trial process, by ``load_ortmodule``."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import sys
import types
from typing import Any

_NEW_EXPORTER = "torch.onnx._internal.torchscript_exporter"
_ALIASED = (
    "_globals",
    "_type_utils",
    "symbolic_helper",
    "utils",
    *(f"symbolic_opset{i}" for i in range(7, 21)),
)
EXTENSIONS = "onnxruntime.training.ortmodule.torch_cpp_extensions"


def alias_torchscript_exporter() -> None:
    import torch.onnx
    import torch.onnx._internal

    if importlib.util.find_spec(_NEW_EXPORTER) is None:
        return  # an older torch: the old paths are real
    jit_utils = importlib.import_module(f"{_NEW_EXPORTER}.jit_utils")
    sys.modules.setdefault("torch.onnx._internal.jit_utils", jit_utils)
    if not hasattr(torch.onnx._internal, "jit_utils"):
        torch.onnx._internal.jit_utils = jit_utils  # type: ignore[attr-defined]
    for name in _ALIASED:
        module = importlib.import_module(f"{_NEW_EXPORTER}.{name}")
        sys.modules.setdefault(f"torch.onnx.{name}", module)
        if not hasattr(torch.onnx, name):
            setattr(torch.onnx, name, module)


def export_without_dynamo() -> None:
    import torch.onnx

    export = torch.onnx.export
    signature = inspect.signature(export)
    if "dynamo" not in signature.parameters or getattr(export, "_autotune_no_dynamo", False):
        return

    @functools.wraps(export)
    def export_torchscript(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("dynamo", False)
        return export(*args, **kwargs)

    export_torchscript.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[
            p.replace(default=False) if p.name == "dynamo" else p for p in signature.parameters.values()
        ]
    )
    export_torchscript._autotune_no_dynamo = True  # type: ignore[attr-defined]
    torch.onnx.export = export_torchscript


def stub_torch_interop_utils() -> None:
    name = f"{EXTENSIONS}.torch_interop_utils"
    if name in sys.modules:
        return
    stub = types.ModuleType(name)
    stub.__doc__ = (
        "autotune: stand-in; ORT's torch_interop_utils does not build with this torch (no custom autograd)"
    )

    def unsupported(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("custom autograd Functions are not supported by autotune's ORT backend")

    def attribute(name: str) -> Any:
        if name.startswith("__"):  # inspect and importlib probe dunders: a stub has none
            raise AttributeError(name)
        return unsupported

    stub.__getattr__ = attribute  # type: ignore[method-assign]
    sys.modules[name] = stub


def nvtx_noops_without_cuda() -> None:
    import torch

    if torch.version.cuda is None:
        torch.cuda.nvtx.range_push = lambda *args, **kwargs: 0
        torch.cuda.nvtx.range_pop = lambda *args, **kwargs: 0


def register_mod_shape_handler() -> None:
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    init = SymbolicShapeInference.__init__
    if getattr(init, "_autotune_mod", False):
        return

    @functools.wraps(init)
    def with_mod(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if "Mod" not in self.dispatcher_:

            def infer_mod(node: Any) -> None:
                fmod = next((a.i for a in node.attribute if a.name == "fmod"), 0)
                if fmod:  # C's fmod: keep ONNX's own inference (no symbolic value)
                    return self._pass_on_shape_and_type(node)
                return self._compute_on_sympy_data(node, lambda values: values[0] % values[1])

            self.dispatcher_["Mod"] = infer_mod

    with_mod._autotune_mod = True  # type: ignore[attr-defined]
    SymbolicShapeInference.__init__ = with_mod
