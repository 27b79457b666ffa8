"""autotune: the fastest batch size and recompute plan whose measured peak memory fits a budget.

Inside a training script (harmless no-ops outside a trial)::

    import autotune
    batch = autotune.batch_size(default=32)
    model = autotune.prepare(model)      # applies the trial's recompute plan
    autotune.step(samples=batch)         # only for loops without torch.optim

From Python, one measured trial: ``autotune.measure(MeasureSpec(...))``.

Importing autotune never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.core.budget import Budget, format_bytes, parse_budget
from autotune.core.errors import AutotuneError
from autotune.core.plans import Plan, parse_plan
from autotune.runtime.trial import batch_size, prepare, step

if TYPE_CHECKING:
    from autotune.trials.measurement import MeasureSpec, TrialResult, TrialSettings, measure

__all__ = [
    "AutotuneError",
    "Budget",
    "MeasureSpec",
    "Plan",
    "TrialResult",
    "TrialSettings",
    "batch_size",
    "format_bytes",
    "measure",
    "parse_budget",
    "parse_plan",
    "prepare",
    "step",
]

_LAZY = {"measure", "MeasureSpec", "TrialResult", "TrialSettings"}


def __getattr__(name: str) -> Any:
    # The tuner-side API pulls in the launcher and meters; a training script importing autotune does not need them.
    if name in _LAZY:
        from autotune.trials import measurement

        return getattr(measurement, name)
    raise AttributeError(f"module 'autotune' has no attribute {name!r}")
