"""How long a trial runs: its steps and time limits (light: the CLI reads its defaults at start-up)."""

from __future__ import annotations

from dataclasses import dataclass

from autotune.core.errors import InputError
from autotune.core.protocol import PHASES

DEFAULT_LOG_LIMIT = 16 * 2**20
MIN_LOG_LIMIT = 64 * 2**10


@dataclass(frozen=True)
class TrialSettings:
    """How long a trial runs: steps and time limits. Shared by ``measure`` and the search; the CLI's
    defaults are these."""

    warmup_steps: int = 2
    measured_steps: int = 5
    startup_timeout: float = 300.0
    timeout: float = 900.0
    grace: float = 5.0
    # at most this many warm-up steps: a first measured step that is an outlier (SETTLE_FACTOR times the
    # median of the others) becomes warm-up until then (autotune.runtime.trial)
    warmup_max: int = 8
    # phases of the job to run once after the measured steps (--with-eval, --with-save: core.protocol.PHASES),
    # each measured, its peak counted against the budget like the steps'
    phases: tuple[str, ...] = ()
    # a verification's peak must have stopped growing: up to this many steps past the measured ones (0: a
    # fixed length), and at most as long again as it ran, settle_seconds at most (autotune.trials.settle)
    settle_steps: int = 0
    settle_seconds: float = 120.0
    # the limit a settling verification's peak is judged by (bytes; None: not known): it ends early once the
    # limit has room for its peak's rise to go on (autotune.trials.settle.Settle.room)
    settle_limit: int | None = None
    # measured steps go on until the throughput's interval is this tight (relative half-width), for at most
    # a quarter of the trial's start-up and 10 s: issue 31's GPU trials started for ~18 s and measured 5
    # steps in 0.35 s, and readings of one configuration ranged 27.5-37.9 samples/s (0: a fixed count)
    tight: float = 0.03
    # bytes of each of a trial's stdout.log and stderr.log kept, the last ones (0: all of it): issue 27 found
    # 951 MiB of one configuration's output; an error needs its last lines (autotune.trials._shim.TailLog)
    log_limit: int = DEFAULT_LOG_LIMIT

    def __post_init__(self) -> None:
        object.__setattr__(self, "phases", tuple(self.phases))  # a job's stored settings give a list
        unknown = [p for p in self.phases if p not in PHASES]
        if unknown:
            raise InputError(f"unknown phase {unknown[0]!r}: one of {', '.join(PHASES)}")
        if self.warmup_steps < 1:
            raise InputError(
                f"warm-up steps must be at least 1 (the first step includes start-up), got {self.warmup_steps}"
            )
        if self.measured_steps < 1:
            raise InputError(f"measured steps must be at least 1, got {self.measured_steps}")
        if not 0 <= self.tight < 1:
            raise InputError(f"--tight must be a share from 0 up to below 1, got {self.tight}")
        if self.log_limit and self.log_limit < MIN_LOG_LIMIT:
            raise InputError(
                f"--log-limit must be 0 (keep all) or at least 64 KiB, got {self.log_limit} bytes"
            )
        for name in ("startup_timeout", "timeout", "grace"):
            if not getattr(self, name) > 0:
                raise InputError(f"{name.replace('_', ' ')} must be positive, got {getattr(self, name)}")
