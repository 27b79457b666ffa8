"""The search space: batch sizes x recompute plans.

Batch sizes are a ladder — powers of two and the midpoints between them (1, 2, 3, 4, 6, 8, 12, 16, 24,
...) — which GPUs like and which keeps neighbouring candidates 25-50% apart. ``--batch-sizes`` takes a
range (``8-512``: the ladder within it) or a list (``8,16,24``). The default range is the whole ladder up to
65536: the memory model then skips, without running them, the batch sizes it predicts cannot fit, so the
range that is actually searched is derived from the model and the budget.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autotune.backends import ort_plans, parse_backend_plan
from autotune.backends.probe import operator_plans
from autotune.backends.probe_report import ModuleCandidate, OrtProbeReport, ProbeReport
from autotune.core.errors import InputError
from autotune.core.plans import Backend, parse_plan

DEFAULT_MAX_BATCH = 65536
MAX_BATCH_SIZE = 2**31 - 1  # what every database's integer columns (and Optuna's params) hold
RATIOS = (0.25, 0.5, 0.75)  # partial checkpointing of the outermost repeated class


@dataclass(frozen=True)
class SearchSpace:
    batch_sizes: tuple[int, ...]
    plans: tuple[str, ...]  # canonical plan strings; "none" first when present

    def as_dict(self) -> dict[str, Any]:
        return {"batch_sizes": list(self.batch_sizes), "plans": list(self.plans)}


def ladder(low: int, high: int) -> tuple[int, ...]:
    """Powers of two and their midpoints (x1.5) within [low, high]."""
    values: set[int] = set()
    power = 1
    while power <= high:
        values.update(v for v in (power, power * 3 // 2) if low <= v <= high)
        power *= 2
    return tuple(sorted(values))


def parse_batch_sizes(text: str | None) -> tuple[int, ...]:
    """``None`` (the default ladder), ``LOW-HIGH`` (the ladder within) or ``A,B,C``.

    Raises:
        InputError: one line naming the bad value.
    """
    if text is None:
        return ladder(1, DEFAULT_MAX_BATCH)
    sizes = _parse_batch_sizes(text)
    if sizes[-1] > MAX_BATCH_SIZE:
        raise InputError(f"invalid batch sizes {text!r}: at most {MAX_BATCH_SIZE}, got {sizes[-1]}")
    return sizes


def _parse_batch_sizes(text: str) -> tuple[int, ...]:
    spec = text.strip()
    if match := re.fullmatch(r"(\d+)\s*-\s*(\d+)", spec, re.ASCII):
        low, high = int(match[1]), int(match[2])
        if not 1 <= low <= high:
            raise InputError(f"invalid batch-size range {text!r}: expected LOW-HIGH with 1 <= LOW <= HIGH")
        return ladder(low, high) or (low,)
    if re.fullmatch(r"\d+(\s*,\s*\d+)*", spec, re.ASCII):
        values = sorted({int(v) for v in spec.split(",")})
        if values[0] < 1:
            raise InputError(f"invalid batch sizes {text!r}: batch sizes must be positive")
        return tuple(values)
    raise InputError(
        f"invalid batch sizes {text!r}: expected a range such as 8-512 or a list such as 8,16,32"
    )


def parse_plan_list(texts: Sequence[str], backend: Backend | str = Backend.TORCH) -> tuple[str, ...]:
    """Plans given with ``--plans`` (separated by ';' or given several times), canonical and deduplicated."""
    plans: list[str] = []
    for text in texts:
        for part in text.split(";"):
            if part.strip():
                plan = str(parse_backend_plan(part, backend))
                if plan not in plans:
                    plans.append(plan)
    if not plans:
        raise InputError("--plans names no plan")
    return tuple(plans)


def default_plans(
    candidates: Sequence[ModuleCandidate], operator_level: Sequence[str] = ()
) -> tuple[str, ...]:
    """In the order the search's frontier visits them: none; the outermost classes in full; the probe's
    operator-level plans; the outermost classes at 25/50/75%; the nested classes in full."""
    outer = [c for c in candidates if c.outermost]
    plans = ["none", *(f"{c.cls}:1" for c in outer), *operator_level]
    plans += [f"{c.cls}:{ratio:g}" for c in outer if c.count >= 4 for ratio in RATIOS]
    plans += [f"{c.cls}:1" for c in candidates if not c.outermost]
    return tuple(dict.fromkeys(str(parse_plan(p)) for p in plans))


def build_space(
    batch_sizes: tuple[int, ...], plans: tuple[str, ...] | None, probe: ProbeReport | None
) -> SearchSpace:
    """The user's plans, or the defaults from the probe: for torch the module-level plans with the operator
    level ones, for ORT ORT's own plans with the largest savings and its levels."""
    if plans:
        return SearchSpace(batch_sizes, plans)
    if isinstance(probe, OrtProbeReport):
        return SearchSpace(batch_sizes, ort_plans.default_plans(probe))
    if probe is None:
        return SearchSpace(batch_sizes, default_plans(()))
    return SearchSpace(batch_sizes, default_plans(probe.candidates, operator_plans(probe)))
