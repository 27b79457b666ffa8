"""The ONNX Runtime Training backend, trial side: ORTModule made to run with the supported torch.

ORTModule is deprecated upstream (no development since 2024; onnxruntime-training 1.19.2, Sept 2024, is
the last release). autotune supports exactly that release as a compatibility backend; torch is the primary
one. Facts this module rests on were measured on this project's machines (docs/ort_notes.md).

``prepare()`` of an ORT trial calls :func:`wrap`, which calls :func:`load_ortmodule` once per process
(fixes A-E live in ``ort_fixes``, F here):

1. compatibility fixes that must be in place before onnxruntime is imported (onnxruntime's own import
   already tries ortmodule and swallows the error), each with the failure it prevents:

   A ``cannot import name 'jit_utils' from 'torch.onnx._internal'`` (CNNs: ``'_convolution'``): torch >= 2.9
     moved the TorchScript exporter to ``torch.onnx._internal.torchscript_exporter``; the old module paths
     are aliased to their new homes.
   B ``No module named 'onnxscript'`` at export: torch >= 2.9 defaults ``torch.onnx.export(dynamo=True)``;
     the default becomes ``dynamo=False`` (the wrapped signature is kept: ORT inspects it).
   C ``cannot import name 'torch_interop_utils'`` at import: that extension does not compile against torch
     2.13 (autograd internals changed); a stub module stands in and ``ORTMODULE_ENABLE_CUSTOM_AUTOGRAD=0``
     keeps ORT from using it. Consequence: models with custom ``torch.autograd.Function``s are unsupported
     (the export fails; :func:`wrap` says so in one line).
   D ``NVTX functions not installed``: a CPU torch has ``torch.cuda.nvtx.range_push`` but it raises; no-ops
     on a torch without CUDA.
2. after the import:

   E ``assert is_literal(shape_rank)`` in symbolic_shape_infer.py (nn.MultiheadAttention models): ORT's
     SymbolicShapeInference has no ``Mod`` handler; one is registered (Python's ``%`` is ONNX Mod with
     fmod=0). Without it plan savings come back as unresolved ``empty_dim_param`` symbols.
   F ``ORTModule's extensions were not detected``: ORT's installer cannot build its C++ extensions with
     torch 2.13. autotune builds the one ORTModule needs, ``aten_op_executor``, from ORT's own source with
     torch's JIT extension builder into its cache (once per ORT x torch version: later trials load the
     built library in milliseconds), registers it under ORT's module name, and clears the init error ORT
     recorded because no library lay in its package folder.

The tuner sets the ORT environment of each trial (autotune.backends.ort_plans.environment):
``ORTMODULE_FALLBACK_POLICY=FALLBACK_DISABLE`` (a silent fallback to PyTorch would measure the wrong thing),
the plan (``ORTMODULE_MEMORY_OPT_CONFIG``, a JSON file path in 1.19.2, or ``ORTMODULE_MEMORY_OPT_LEVEL``)
and ``ORTMODULE_CACHE_DIR`` keyed by the workload fingerprint.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
import types
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from autotune.backends import ort_fixes as fixes
from autotune.backends.probe_report import OrtPlanSaving, OrtProbeReport

SUPPORTED_VERSION = "1.19.2"

_ortmodule: Any = None


class OrtUnavailable(RuntimeError):
    """ORTModule cannot run here; the message says why and what to do, in one line."""


def ort_source_dir() -> Path | None:
    """ORT's installed package folder, found without importing it (None if not installed)."""
    spec = importlib.util.find_spec("onnxruntime")
    return Path(spec.origin).parent if spec is not None and spec.origin else None


def extension_build_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where the aten_op_executor extension is built: one folder per ORT x torch x Python version, in the
    user's cache dir (``AUTOTUNE_ORT_BUILD_DIR`` overrides it) whatever ``--cache-dir`` a job uses: it
    belongs to the installed software, not to a job. Resolved from package metadata, so the tuner can
    find it without importing torch."""
    import importlib.metadata

    import platformdirs

    environ = os.environ if environ is None else environ
    root = environ.get("AUTOTUNE_ORT_BUILD_DIR") or platformdirs.user_cache_dir("autotune", appauthor=False)
    torch_version = importlib.metadata.version("torch")
    tag = f"ort{_ort_version()}-torch{torch_version}-py{sys.version_info.major}{sys.version_info.minor}"
    return Path(root) / "ort-extensions" / tag.replace("+", "_")


def extension_stamp(build: Path) -> str | None:
    """The built library's size and modification time (None before it is built): what a tuner compares to
    the stamp left after the extension last loaded, to skip re-checking an unchanged build."""
    try:
        st = (build / "aten_op_executor.so").stat()
    except FileNotFoundError:
        return None
    return f"{st.st_size}:{st.st_mtime_ns}"


def load_ortmodule() -> Any:
    """``onnxruntime.training.ortmodule``, working with the installed torch (fixes A-F above).

    Raises:
        OrtUnavailable: onnxruntime-training is missing, another version, or the extension cannot build.
    """
    global _ortmodule
    if _ortmodule is not None:
        return _ortmodule
    version = _ort_version()
    if version != SUPPORTED_VERSION:
        raise OrtUnavailable(
            f"onnxruntime-training {version} is installed; autotune's ORT backend supports "
            f"{SUPPORTED_VERSION} only: pip install 'autotune[ort]'"
        )
    os.environ.setdefault("ORTMODULE_ENABLE_CUSTOM_AUTOGRAD", "0")  # C
    fixes.alias_torchscript_exporter()  # A
    fixes.export_without_dynamo()  # B
    fixes.stub_torch_interop_utils()  # C
    fixes.nvtx_noops_without_cuda()  # D
    extension = build_extension()  # F, built before ORT's import so a failure is ours to report
    from onnxruntime.training import ortmodule

    fixes.register_mod_shape_handler()  # E
    sys.modules[f"{fixes.EXTENSIONS}.aten_op_executor"] = extension  # F
    init_error = getattr(ortmodule, "_FALLBACK_INIT_EXCEPTION", None)
    if init_error is not None and "extensions were not detected" in str(init_error):
        ortmodule._FALLBACK_INIT_EXCEPTION = None
    _ortmodule = ortmodule
    return ortmodule


def build_extension() -> types.ModuleType:
    """Build (first use) or load (later) ORT's aten_op_executor extension against the installed torch."""
    source = ort_source_dir()
    assert source is not None
    cc = source / "training/ortmodule/torch_cpp_extensions/cpu/aten_op_executor/aten_op_executor.cc"
    if not cc.exists():
        raise OrtUnavailable(f"ORT's extension source {cc} is missing: reinstall onnxruntime-training")
    from torch.utils import cpp_extension

    build = extension_build_dir()
    build.mkdir(parents=True, exist_ok=True)
    try:
        # torch's JIT builder: ninja, no rebuild while the source and flags are unchanged, and a lock file
        # in the build folder that concurrent builders wait on; building() clears one a dead build left
        with building(build):
            return cpp_extension.load(name="aten_op_executor", sources=[str(cc)], build_directory=str(build))
    except (RuntimeError, OSError, ImportError) as e:
        log = str(e).strip().splitlines()
        raise OrtUnavailable(
            f"cannot build ORTModule's aten_op_executor extension in {build} (a C++ compiler and the "
            f"Python headers are needed; autotune doctor checks): {log[-1] if log else e}"
        ) from e


@contextlib.contextmanager
def building(build: Path) -> Iterator[None]:
    """Hold the build folder while torch's builder loads (or builds) the extension in it.

    torch's builder (``cpp_extension.load``) marks a build with a ``lock`` file that every other builder
    waits on, polling, for as long as it exists, and only the builder that made it removes it: a build
    killed mid-way (a trial stopped at its timeout, a kill -9 of the tuner) leaves the file behind, and
    every later ORT trial on the machine then waited silently until its start-up timeout (CI's ORT tests
    failed so). Every autotune builder first takes an ``flock`` on ``build.lock`` beside it, which the kernel
    drops when its holder dies: whoever holds it is the only builder alive, so a ``lock`` file found then
    is a dead build's and is removed. A live build is waited for (about a minute, once per ORT x torch),
    and the wait is said on stderr (the trial's log)."""
    import fcntl

    with open(build / "build.lock", "a") as held:
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(
                f"autotune: waiting for another process's build of ORTModule's extension in {build}",
                file=sys.stderr,
                flush=True,
            )
            fcntl.flock(held, fcntl.LOCK_EX)
        try:
            (build / "lock").unlink(missing_ok=True)  # a dead build's: no live builder holds the flock
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


def wrap(model: Any) -> Any:
    """``model`` wrapped in ORTModule (the plan comes from the trial's environment)."""
    ortmodule = load_ortmodule()
    if isinstance(model, ortmodule.ORTModule):
        return model
    custom = _custom_autograd_functions(model)
    if custom:
        raise OrtUnavailable(
            f"the model uses custom autograd Functions ({', '.join(sorted(custom))}), which autotune's ORT "
            "backend does not support (ORT's torch_interop_utils does not build with this torch): use "
            "--backend torch"
        )
    return ortmodule.ORTModule(model)


def _ort_version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("onnxruntime-training")
    except importlib.metadata.PackageNotFoundError:
        raise OrtUnavailable("onnxruntime-training is not installed: pip install 'autotune[ort]'") from None


def _custom_autograd_functions(model: Any) -> set[str]:
    """Names of custom ``torch.autograd.Function`` classes the model's modules define (a best-effort scan of
    their forward's globals; the export's own error still stops a trial that uses one we did not see)."""
    import torch

    found: set[str] = set()
    for module in model.modules():
        forward = getattr(type(module), "forward", None)
        code = getattr(forward, "__code__", None)
        names = set(code.co_names) if code is not None else set()
        for name, value in getattr(forward, "__globals__", {}).items():
            if (
                name in names
                and isinstance(value, type)
                and issubclass(value, torch.autograd.Function)
                and not value.__module__.startswith("torch.")
            ):
                found.add(value.__name__)
    return found


class OrtProbe:
    """The probe of an ORT trial: ORT's recompute plans with their frequencies and savings, read from
    ORTModule's own memory analysis of the first forward (private API of 1.19.2: the runtime inspector's
    ``cluster_id_combination_to_saving_symbolics_map``). The savings are evaluated at the probed batch."""

    def __init__(self, model: Any, batch_size: int) -> None:
        self.model, self.batch_size = model, batch_size
        self.optimizer: Any = None  # set by the runtime (the torch probe reads it; ORT's does not)

    def result(self) -> OrtProbeReport:
        manager = self.model._torch_module._execution_manager(self.model.training)
        observer = manager._runtime_inspector.memory_ob
        plans = tuple(
            OrtPlanSaving(
                plan=plan,
                freq=int(info.freq),
                saving_bytes=int(float(info.evaluated_saving)),
                symbolic=str(info.simplified_symbolic_saving_expr),
            )
            for plan, info in observer.cluster_id_combination_to_saving_symbolics_map.items()
        )
        weights = sum(p.numel() * p.element_size() for p in self.model.parameters())
        return OrtProbeReport(batch_size=self.batch_size, plans=plans, weights_bytes=weights)
