"""Loading NVML (through nvidia-ml-py's ``pynvml`` module) once, with the traps handled.

- nvidia-ml-py is the maintained binding. An old ``pynvml`` 11.x package installs a module of the same name
  that shadows it; we warn, naming the fix. (pynvml 12+ is only a shim over nvidia-ml-py.)
- Without NVIDIA's driver library there is no GPU to measure: we say so without importing the bindings
  (330 KB of ctypes definitions, ~50 ms), which ``autotune best`` would otherwise pay on every CPU machine.
- Tests without a GPU pass a fake module to the meters and device resolution instead (tests/fake_nvml.py).
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import sys
import warnings
from collections.abc import Callable
from typing import Any

from autotune.core.errors import DeviceError

NVML_LIBRARY = "libnvidia-ml.so.1"
_nvml: Any = None


def load_nvml() -> Any:
    """The initialised ``pynvml`` module.

    Raises:
        DeviceError: nvidia-ml-py is not installed, or NVML cannot be initialised (no driver, no GPU).
    """
    global _nvml
    if _nvml is not None:
        return _nvml
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(NVML_LIBRARY)  # what pynvml's nvmlInit loads first, on Linux
        except OSError as e:
            raise DeviceError(f"NVML is not available (no NVIDIA driver or GPU?): {e}") from e
    _warn_if_shadowed()  # only where the bindings are about to be imported
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # pynvml 12+ shim warns on every import
            import pynvml
    except ImportError as e:
        raise DeviceError("NVML bindings are missing: pip install nvidia-ml-py") from e
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise DeviceError(f"NVML is not available (no NVIDIA driver or GPU?): {e}") from e
    _nvml = pynvml
    return _nvml


def nvml_loader(nvml: Any = None) -> Callable[[], Any]:
    """What loads NVML: ``nvml`` itself where one is given (tests pass a fake module), else :func:`load_nvml`."""
    return load_nvml if nvml is None else lambda: nvml


def _warn_if_shadowed() -> None:
    try:
        version = importlib.metadata.version("pynvml")
    except importlib.metadata.PackageNotFoundError:
        return
    if int(version.split(".")[0]) < 12:
        warnings.warn(
            f"the installed 'pynvml' {version} package shadows nvidia-ml-py's NVML bindings with an old copy; "
            "run: pip uninstall pynvml && pip install --force-reinstall nvidia-ml-py",
            RuntimeWarning,
            stacklevel=3,
        )
