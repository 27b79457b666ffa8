"""The trials of one job on one device: what a search and a verification call to measure a configuration.

``Runner`` is what the search needs of it; ``TrialRunner`` runs each trial here, and
``autotune.cluster.ray_executor.RayRunner`` places each on a Ray cluster (``--executor ray``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol

from autotune.backends import parse_backend_plan
from autotune.core.protocol import Outcome
from autotune.hardware.devices import Device
from autotune.trials.interrupts import InterruptShield, StopRequested
from autotune.trials.measurement import TrialJob, run_trial
from autotune.trials.result import TrialResult
from autotune.trials.settings import TrialSettings
from autotune.trials.warm import WarmTrials, Watch


class Runner(Protocol):
    """Measures a configuration for a search: where, and how it is stopped."""

    @property
    def device(self) -> Device: ...  # what each trial runs on (one node's share, on a cluster)

    @property
    def stop(self) -> threading.Event | None: ...

    @property
    def shield(self) -> InterruptShield | None: ...

    @property
    def host_budget(self) -> int | None: ...

    def __call__(
        self,
        batch: int,
        plan: str,
        *,
        poll: Callable[[int, float], None] | None = None,
        settings: TrialSettings | None = None,
        probe: bool = False,
        interruptible: Callable[[], AbstractContextManager[None]] | None = None,
        grad_accum: int | None = None,
        check_plans: tuple[str, ...] = (),
        sweep: tuple[str, ...] = (),
        fresh: bool = False,
    ) -> TrialResult: ...

    def check(self) -> None: ...

    def close(self) -> None:
        """The job's trials are over: end what the runner keeps between them (a warm process)."""


class Executor(Protocol):
    """Where a job's trials run when not here (``--executor ray``): the device one trial gets there, and
    the runner that places each trial."""

    @property
    def device(self) -> Device: ...

    def runner(
        self,
        device: Device,
        ceiling: int | None,
        stop: threading.Event | None,
        shield: InterruptShield | None,
    ) -> Runner: ...


@dataclass(frozen=True)
class TrialRunner(TrialJob):
    """Runs the job's command at a batch size and plan on its device, metered, files under its root; the
    job's ``ceiling`` is the budget (not the probe's). One meter serves every trial of the runner (it is
    reset at each start)."""

    stop: threading.Event | None = None  # a stopping worker: trials are stopped and raise StopRequested
    shield: InterruptShield | None = None  # the tuner's Ctrl-C shield: trials run inside its allow()
    # one process measures configuration after configuration where it can (autotune.trials.warm); ``say``
    # tells the run why, once, where it cannot go on so
    warm: bool = False
    say: Callable[[str], None] | None = None
    _warm: WarmTrials | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.warm:
            object.__setattr__(self, "_warm", WarmTrials(self, self.say))

    def __call__(
        self,
        batch: int,
        plan: str,
        *,
        poll: Callable[[int, float], None] | None = None,
        settings: TrialSettings | None = None,
        probe: bool = False,
        interruptible: Callable[[], AbstractContextManager[None]] | None = None,
        grad_accum: int | None = None,
        check_plans: tuple[str, ...] = (),
        sweep: tuple[str, ...] = (),
        fresh: bool = False,
    ) -> TrialResult:
        """One trial at ``batch`` with ``plan`` (accumulating ``grad_accum`` micro-batches per step); a probe
        also checks ``check_plans`` against no plan; ``sweep``: more plans measured after ``plan`` in the
        same process (autotune.search.sweep), their results in the result's ``sweep``; without a sweep, in
        the runner's warm process where the configuration suits one, unless ``fresh`` asks for a process of
        its own (a warm reading just over the limit, read again). A probe (or a check) starts a warm process
        (autotune.trials.warm); one the budget stopped there runs again in a process of its own, where
        nothing stops it."""
        settings = settings or self.settings
        interruptible = interruptible or (self.shield.allow if self.shield is not None else None)
        if self._warm is not None:
            probing = probe or bool(check_plans)
            if not (sweep or fresh) and self._warm.suits(plan, settings):
                watch = Watch(poll, interruptible, self.stop)
                parsed = parse_backend_plan(plan, self.backend)
                result = self._warm.run(batch, parsed, grad_accum, watch, check_plans if probing else None)
                if not (probing and result.outcome is Outcome.OVER_BUDGET):
                    return result
            self._warm.close()  # a fresh process measures this one: the device to itself
        return run_trial(
            self.command,
            batch,
            parse_backend_plan(plan, self.backend),
            self.device,
            self.meter,
            settings,
            self.root,
            self.environ,
            self.backend,
            on_poll=poll,
            probe=probe,
            interruptible=interruptible,
            stop=self.stop,
            ceiling=None if probe else self.ceiling,
            grad_accum=grad_accum,
            check_plans=check_plans,
            host_budget=self.host_budget,
            sweep=sweep,
        )

    def check(self) -> None:
        check_between(self.shield, self.stop)

    def close(self) -> None:
        if self._warm is not None:
            self._warm.close()


def check_between(shield: InterruptShield | None, stop: threading.Event | None) -> None:
    """Between trials (a wait): raise the Ctrl-C the shield holds, or StopRequested once ``stop`` is set."""
    if shield is not None:
        shield.check()
    if stop is not None and stop.is_set():
        raise StopRequested
