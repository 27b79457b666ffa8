"""ONNX Runtime plans (``--backend ort``): their string form, the trial environment that applies them, and the
probe's ORT data. No torch, no onnxruntime: the tuner side.

A plan is one of::

    none                                 ORT without its memory optimizer
    level:1  level:2                     ORTMODULE_MEMORY_OPT_LEVEL: ORT recomputes every transformer layer's
                                         subgraphs (2: more aggressively)
    BiasGelu+:1:-1                       one of ORT's recompute plans, as its probe prints them:
                                         <subgraph cluster>:<1 recompute | 2 with compromise>:<count, -1 all>
    BiasGelu+:1:-1,FusedMatMul+Softmax+:1:-1
                                         several, in ORTMODULE_MEMORY_OPT_CONFIG's JSON list

The canonical form sorts and deduplicates the clusters, so equal plans name the same stored trials.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.core.errors import InputError, TrialError

if TYPE_CHECKING:
    from autotune.backends.probe_report import OrtProbeReport

FALLBACK_POLICY = "FALLBACK_DISABLE"  # a silent fallback to PyTorch would measure the wrong thing
LEVELS = (1, 2)
_CLUSTER = re.compile(r"[A-Za-z0-9_]+(?:\+[A-Za-z0-9_]+)*\+?:[12]:(?:-1|\d+)", re.ASCII)
_LEVEL = re.compile(r"level:(\d+)", re.ASCII)
MAX_SINGLE_PLANS = 4  # the default space: ORT's plans with the largest savings, one by one


@dataclass(frozen=True)
class OrtPlan:
    """An ORT memory-optimizer plan: a level, or a set of ORT's cluster plans (both empty: none)."""

    level: int = 0
    clusters: tuple[str, ...] = ()

    @property
    def is_none(self) -> bool:
        return not self.level and not self.clusters

    def __str__(self) -> str:
        if self.level:
            return f"level:{self.level}"
        return ",".join(self.clusters) if self.clusters else "none"


def parse_ort_plan(text: str) -> OrtPlan:
    """Parse an ORT plan string into its canonical :class:`OrtPlan`.

    Raises:
        InputError: one line naming the bad part and the grammar.
    """
    spec = text.strip()
    if spec.lower() in ("none", ""):
        return OrtPlan()
    if level := _LEVEL.fullmatch(spec.lower()):
        if int(level[1]) not in LEVELS:
            raise InputError(f"invalid ORT plan {text!r}: levels are 1 and 2")
        return OrtPlan(level=int(level[1]))
    clusters = [part.strip() for part in spec.split(",")]
    for cluster in clusters:
        if not _CLUSTER.fullmatch(cluster):
            raise InputError(
                f"invalid ORT plan {text!r}: expected none, level:1, level:2 or ORT's plans such as "
                f"BiasGelu+:1:-1 separated by ',' (got {cluster!r})"
            )
    return OrtPlan(clusters=tuple(sorted(set(clusters))))


_extension_ready = False
_LOADED_STAMP = ".autotune-loaded"


def ensure_extension(environ: Mapping[str, str]) -> None:
    """Build ORTModule's C++ extension (autotune.backends.ort, fix F) before the first ORT trial of this
    process, in a child process of its own (the tuner never imports torch): the build's compiler would
    otherwise be measured as part of a trial. The child loads it once built (~3 s: torch and ORT imports),
    and leaves a stamp of the library it loaded; a later tuner process that finds the same library skips
    the child (an `autotune measure` would otherwise pay those 3 s every time). A changed or missing
    library runs the child again.

    Raises:
        TrialError: the build failed; its last line says why.
    """
    global _extension_ready
    if _extension_ready:
        return
    import importlib.metadata

    from autotune.backends.ort import OrtUnavailable, extension_build_dir, extension_stamp

    try:
        stamp: Path | None = extension_build_dir(environ) / _LOADED_STAMP
    except (OrtUnavailable, importlib.metadata.PackageNotFoundError):  # the child says what is missing
        stamp = None
    if stamp is not None and stamp.is_file() and stamp.read_text() == extension_stamp(stamp.parent):
        _extension_ready = True
        return
    _build_in_a_child(environ)
    if stamp is not None and (loaded := extension_stamp(stamp.parent)) is not None:
        with contextlib.suppress(OSError):  # a read-only cache: no shortcut next time, nothing worse
            stamp.write_text(loaded)
    _extension_ready = True


def _build_in_a_child(environ: Mapping[str, str]) -> None:
    """Load ORTModule (building its extension if needed) in a child process; raises TrialError if it fails."""
    code = (
        "import sys\nfrom autotune.backends.ort import OrtUnavailable, load_ortmodule\n"
        "try:\n    load_ortmodule()\nexcept OrtUnavailable as e:\n    sys.exit(str(e))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**environ, "ORTMODULE_ENABLE_CUSTOM_AUTOGRAD": "0"},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        raise TrialError(f"ORT backend: {lines[-1] if lines else 'the extension build failed'}")


def export_cache_dir(cache: Path, fingerprint: str) -> Path:
    """ORTMODULE_CACHE_DIR of one workload. ORT keys its cache by the model's printed repr only (nhead=4 and
    nhead=8 print alike: a different model would silently reuse a wrong graph), so each workload
    fingerprint (script bytes, arguments, device, versions) gets a folder of its own."""
    return cache / "ort-export" / fingerprint[:24]


def environment(plan: OrtPlan, plan_file: Path, cache: Path, fingerprint: str) -> dict[str, str]:
    """ORT's variables for training with ``plan``: in a trial (``plan_file`` in its folder) and for
    ``autotune best --env``. Writes ``plan_file`` when the plan has clusters."""
    export = export_cache_dir(cache, fingerprint)
    export.mkdir(parents=True, exist_ok=True)
    env = {
        "ORTMODULE_FALLBACK_POLICY": FALLBACK_POLICY,
        "ORTMODULE_ENABLE_CUSTOM_AUTOGRAD": "0",  # see autotune.backends.ort, fix C
        "ORTMODULE_CACHE_DIR": str(export),
        "ORTMODULE_MEMORY_OPT_LEVEL": str(plan.level),
    }
    if plan.clusters:
        env["ORTMODULE_MEMORY_OPT_CONFIG"] = str(write_plan_file(plan, plan_file))
    return env


def write_plan_file(plan: OrtPlan, path: Path) -> Path:
    """ORTMODULE_MEMORY_OPT_CONFIG's file (1.19.2 takes a path to a JSON list of plan strings)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(list(plan.clusters)) + "\n")
    return path


# The probe's ORT data (autotune.backends.probe_report.OrtProbeReport): ORTModule's own analysis of the
# first forward (autotune.backends.ort).


def predicted_saving(data: OrtProbeReport, plan: OrtPlan) -> int:
    """ORT's predicted saving of ``plan`` at the probed batch size. A level recomputes every layer's
    subgraphs: predicted as the sum of all of ORT's recompute plans (ORT's own estimate, which tends to be
    high for levels)."""
    savings = {p.plan: p.saving_bytes for p in data.plans}
    if plan.level:
        return int(sum(s for p, s in savings.items() if ":1:" in p))
    return int(sum(savings.get(c, 0) for c in plan.clusters))


def saving_per_sample(data: OrtProbeReport, plan: str) -> float:
    return predicted_saving(data, parse_ort_plan(plan)) / data.batch_size


def default_plans(data: OrtProbeReport | None) -> tuple[str, ...]:
    """In the order the frontier visits them: none; ORT's plans with the largest savings, all of them
    together, then each of the top ones alone; level 1 and level 2."""
    plans = ["none"]
    ranked = sorted(
        (p for p in (data.plans if data else ()) if p.saving_bytes > 0 and ":1:" in p.plan),
        key=lambda p: -p.saving_bytes,
    )
    top = [p.plan for p in ranked[:MAX_SINGLE_PLANS]]
    if len(top) > 1:
        plans.append(str(parse_ort_plan(",".join(top))))
    plans += [str(parse_ort_plan(p)) for p in top]
    plans += [f"level:{level}" for level in LEVELS]
    return tuple(dict.fromkeys(plans))
