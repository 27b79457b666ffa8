"""One stored trial as autotune reads it: a view over an Optuna FrozenTrial's params and user attributes.

Every trial carries ``kind``: ``measured`` (ran here), ``verification`` (the winner re-run longer),
``warm-start`` (measured for another budget of the same workload), ``skipped`` (the memory model predicted
it cannot fit; not run), ``copy`` (the sampler proposed a configuration measured already). Only
``measured`` trials count against ``--trials``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

MiB = 2**20
COUNTED = ("measured",)


@dataclass(frozen=True)
class TrialRecord:
    number: int
    state: str  # Optuna's: COMPLETE, FAIL, PRUNED, RUNNING, WAITING
    kind: str
    batch_size: int | None
    plan: str | None
    outcome: str | None = None
    peak_bytes: int | None = None
    samples_per_sec: float | None = None
    predicted_peak_bytes: int | None = None
    proposed_by: str | None = None
    log_dir: str | None = None
    error: str | None = None
    worker: str | None = None
    device: str | None = None
    note: str | None = None
    verified_peak_bytes: int | None = None
    verified_samples_per_sec: float | None = None

    @classmethod
    def from_frozen(cls, trial: FrozenTrial) -> TrialRecord:
        attrs: dict[str, Any] = trial.user_attrs
        return cls(
            number=trial.number,
            state=trial.state.name,
            kind=attrs.get("kind", "measured"),
            batch_size=trial.params.get("batch_size"),
            plan=trial.params.get("plan"),
            **{name: attrs.get(name) for name in _ATTRS},
        )

    @property
    def counted(self) -> bool:
        """Ran to an end in this study (not skipped, copied, warm-started or interrupted)."""
        return self.kind in COUNTED and self.outcome is not None

    @property
    def measured(self) -> bool:
        """Its peak is a measurement (a complete or out-of-memory trial, here or for another budget)."""
        return self.outcome in ("complete", "oom") and self.peak_bytes is not None

    def fits(self, limit: int) -> bool:
        return self.outcome == "complete" and self.peak_bytes is not None and self.peak_bytes <= limit


_ATTRS = (
    "outcome",
    "peak_bytes",
    "samples_per_sec",
    "predicted_peak_bytes",
    "proposed_by",
    "log_dir",
    "error",
    "worker",
    "device",
    "note",
    "verified_peak_bytes",
    "verified_samples_per_sec",
)


def constraint_mib(peak_bytes: int, limit: int, complete: bool) -> float:
    """Optuna's constraint (<= 0 is feasible): MiB over the limit; an OOM is infeasible by at least 1 MiB."""
    over = (peak_bytes - limit) / MiB
    return over if complete else max(over, 1.0)
