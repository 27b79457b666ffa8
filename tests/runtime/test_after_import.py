"""The hooks that wait for a module's import (FSDP2's, DeepSpeed's, the frameworks') see the import that
follows a ``importlib.util.find_spec`` of it: Accelerate asks whether DeepSpeed is installed so, before it
imports it, and a finder that left at that question missed the import."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from autotune.runtime.hooks import _AfterImport


def test_a_find_spec_before_the_import_leaves_the_hook_for_the_import(tmp_path: Path, monkeypatch) -> None:
    name = "autotune_test_after_import_target"
    (tmp_path / f"{name}.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[ModuleType] = []
    finder = _AfterImport(name, seen.append)
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    try:
        assert importlib.util.find_spec(name) is not None  # asked, not imported
        assert seen == [] and finder in sys.meta_path and name not in sys.modules
        module = importlib.import_module(name)
        assert seen == [module] and module.VALUE == 1 and finder not in sys.meta_path
        assert importlib.util.find_spec("autotune_test_after_import_absent") is None
    finally:
        sys.modules.pop(name, None)
