"""autotune: the fastest batch size and recompute plan whose measured peak memory fits a budget.

Inside a training script (harmless no-ops outside a trial)::

    import autotune
    batch = autotune.batch_size(default=32)
    accumulate = autotune.grad_accum()   # micro-batches per optimizer step (--global-batch), else 1
    model = autotune.prepare(model)      # applies the trial's recompute plan
    autotune.step(samples=batch)         # only for loops without torch.optim
    pad_to_max = autotune.worst_case()   # AUTOTUNE_WORST_CASE=1: feed the longest inputs
    if step % 500 == 0 or autotune.due("eval"):   # --with-eval: the trial awaits an evaluation
        with autotune.phase("eval"):     # measured on its own; Trainer and Lightning need neither
            evaluate(model)

A finder inside your own process (autotune.finder)::

    @autotune.find_batch_size(budget="12GB")   # no budget: the device's memory
    def train(batch_size): ...
    train()                              # searches here, then trains at the answer

From Python, what the CLI does (autotune.api)::

    result = autotune.tune(autotune.tune_spec(["train.py"], "40GB", trials=8))
    answer = autotune.best(["train.py"], budget="40GB")
    report = autotune.probe(["train.py"])
    trial = autotune.measure(autotune.measure_spec(["train.py"], 32, plan="all"))

Importing autotune imports neither torch nor Optuna: the tuner-side names are loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.core.budget import Budget, format_bytes, parse_budget
from autotune.core.errors import AutotuneError
from autotune.core.plans import Backend, Plan, parse_plan
from autotune.runtime.api import batch_size, due, grad_accum, phase, prepare, step, worst_case

if TYPE_CHECKING:
    from autotune.api import best, doctor, measure, probe, show, studies, submit, tune, work
    from autotune.finder.decorator import find_batch_size
    from autotune.search.spec import TuneResult, TuneSpec, tune_spec
    from autotune.trials.measurement import MeasureSpec, measure_spec
    from autotune.trials.result import TrialResult
from autotune.trials.settings import TrialSettings

_LAZY = {
    "autotune.api": ("best", "doctor", "measure", "probe", "show", "studies", "submit", "tune", "work"),
    "autotune.finder.decorator": ("find_batch_size",),
    "autotune.search.spec": ("TuneResult", "TuneSpec", "tune_spec"),
    "autotune.trials.measurement": ("MeasureSpec", "measure_spec"),
    "autotune.trials.result": ("TrialResult",),
    "autotune.trials.settings": ("TrialSettings",),
}
_WHERE = {name: module for module, names in _LAZY.items() for name in names}

__all__ = [
    "AutotuneError",
    "Backend",
    "Budget",
    # tuner side, loaded on first use
    "MeasureSpec",
    "Plan",
    "TrialResult",
    "TrialSettings",
    "TuneResult",
    "TuneSpec",
    "batch_size",
    "best",
    "doctor",
    "due",
    "find_batch_size",
    "format_bytes",
    "grad_accum",
    "measure",
    "measure_spec",
    "parse_budget",
    "parse_plan",
    "phase",
    "prepare",
    "probe",
    "show",
    "step",
    "studies",
    "submit",
    "tune",
    "tune_spec",
    "work",
    "worst_case",
]


def __dir__() -> list[str]:
    """The public API, the names loaded on first use included (``dir(autotune)``, ``help(autotune)``)."""
    return sorted({*globals(), *__all__})


def __getattr__(name: str) -> Any:
    # The tuner-side API pulls in the launcher, meters and storage; a training script importing autotune
    # needs none of it.
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'autotune' has no attribute {name!r}")
