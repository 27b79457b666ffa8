"""A search of the training function the caller passes, in the caller's process: the spec, the executor
whose runner calls the function (autotune.finder.inprocess), the run's lines and the answer applied."""

from __future__ import annotations

import inspect
import os
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.core.budget import DEFAULT_HEADROOM, format_bytes
from autotune.core.errors import InputError
from autotune.core.paths import cache_dir
from autotune.core.protocol import BATCH_SIZE_ENV, GRAD_ACCUM_ENV, PLAN_ENV
from autotune.finder.inprocess import InProcessRunner, Train
from autotune.hardware.devices import Device, resolve_trial_device
from autotune.hardware.nvml import nvml_loader
from autotune.search import DEFAULT_TRIALS
from autotune.search.runner import Runner
from autotune.search.spec import TuneResult, TuneSpec, tune_spec
from autotune.trials.interrupts import InterruptShield
from autotune.trials.settings import TrialSettings
from autotune.workers.lines import LineReporter
from autotune.workers.tune import tune

DEVICE_BUDGET = "100%"  # no budget given: the whole device, as a finder that runs until it is out of memory


@dataclass(frozen=True)
class FinderOptions:
    """What a finder is asked (the ``autotune run`` options that make sense inside a process).

    ``budget``: ``"12GB"``, ``"90%"``...; None: the device's memory (``100%``, less the headroom). The
    rest as ``autotune.tune_spec``: ``batch_sizes`` (``"8-512"``), ``plans`` (empty: from the model),
    ``trials``, ``time_limit`` (seconds), ``headroom``, ``device``, ``cache_dir``, ``storage``, ``force``
    (search again though the database has the answer), ``settings`` (a trial's steps). ``quiet``: no line
    per trial on stderr."""

    budget: str | None = None
    batch_sizes: str | None = None
    plans: Sequence[str] = ()
    trials: int = DEFAULT_TRIALS
    time_limit: float | None = None
    headroom: str | float = DEFAULT_HEADROOM
    device: str = "auto"
    cache_dir: str | Path | None = None
    storage: str | None = None
    force: bool = False
    settings: TrialSettings = field(default_factory=TrialSettings)
    quiet: bool = False

    @classmethod
    def of(cls, who: str, options: dict[str, Any]) -> FinderOptions:
        """``options`` as given to ``who`` (a finder's name, for the message).

        Raises:
            InputError: an unknown option, before anything runs."""
        known = cls.__dataclass_fields__
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise InputError(f"{who}: unknown option {unknown[0]!r}; one of {', '.join(known)}")
        return cls(**options)

    def spec(self, function: str, script: str) -> TuneSpec:
        """The job: the script that defines ``function`` (its arguments too where it is the one running)."""
        args = sys.argv[1:] if sys.argv and _same_file(sys.argv[0], script) else []
        return tune_spec(
            [script, *args],
            self.budget or DEVICE_BUDGET,
            batch_sizes=self.batch_sizes,
            plans=list(self.plans),
            headroom=self.headroom,
            trials=self.trials,
            time_limit=self.time_limit,
            device=self.device,
            cache_dir=Path(self.cache_dir) if self.cache_dir is not None else None,
            storage=self.storage,
            force=self.force,
            settings=self.settings,
            sweep=False,
            warm=False,
            helpers=(),
            function=function,
        )


@dataclass
class InProcessExecutor:
    """Where a finder's trials run: this process (autotune.search.runner's Executor)."""

    train: Train
    spec: TuneSpec
    device: Device
    runners: list[InProcessRunner] = field(default_factory=list)

    def runner(
        self,
        device: Device,
        ceiling: int | None,
        stop: threading.Event | None,
        shield: InterruptShield | None,
    ) -> Runner:
        runner = InProcessRunner(
            self.train, self.spec.backend, device, self.spec.settings, cache_dir(self.spec.cache_dir),
            ceiling, shield,
        )  # fmt: skip
        self.runners.append(runner)
        return runner

    def close(self) -> None:
        for runner in self.runners:
            runner.close()


def search_in_process(
    train: Train,
    function: Callable[..., Any],
    options: FinderOptions,
    name: str | None = None,
    script: str | None = None,
) -> TuneResult:
    """Search ``train`` (one configuration's run at a batch size) here; ``function`` names the workload:
    its script (or ``script``: a callback's is the running one) and its qualified name (or ``name``).

    Raises:
        InputError: a bad option, or a function not defined in a file. AutotuneError: as autotune.tune.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the run's own lines say each trial
    spec = options.spec(
        name or f"{function.__module__}.{function.__qualname__}", script or _script_of(function)
    )
    device = resolve_trial_device(spec.device, 1, os.environ, nvml_loader(None))
    executor = InProcessExecutor(train, spec, device)
    reporter = _lines(options.quiet)
    try:
        result = tune(spec, reporter=reporter, executor=executor)
    finally:
        executor.close()
    if not options.quiet:
        _say(answer_line(result, options.budget))
    return result


def answer_line(result: TuneResult, budget: str | None) -> str:
    """The answer in one line, the budget said as it was set (the device's memory where none was given)."""
    best = result.best
    given = f"budget {budget}" if budget else "budget: the device's memory"
    accumulate = f" x {result.grad_accum} accumulated" if result.grad_accum and result.grad_accum > 1 else ""
    source = "from the database, zero trials" if result.cached else f"{result.new_trials} trial runs"
    return (
        f"autotune: batch {best.batch_size}{accumulate}, plan {best.plan}: "
        f"{best.verified_samples_per_sec:.1f} samples/s, peak {format_bytes(best.verified_peak_bytes)} under "
        f"{format_bytes(result.limit_bytes)} ({given}, {format_bytes(result.budget_bytes)}, less the "
        f"headroom; {source})"
    )


def answer_environment(result: TuneResult) -> None:
    """What a function reads of the answer outside a trial: ``autotune.batch_size()``, ``grad_accum()`` and
    the plan ``prepare`` applies (as ``autotune best --format env`` exports them)."""
    os.environ[BATCH_SIZE_ENV] = str(result.best.batch_size)
    os.environ[PLAN_ENV] = result.best.plan
    os.environ[GRAD_ACCUM_ENV] = str(result.grad_accum or 1)


def running_script() -> str | None:
    """The script this process runs (a callback's workload: its arguments shape the model as much as the
    model's class does); None where there is none (an interpreter, a notebook)."""
    main = sys.argv[0] if sys.argv else ""
    return str(Path(main).resolve()) if main and Path(main).is_file() else None


def _script_of(function: Callable[..., Any]) -> str:
    try:
        path = inspect.getsourcefile(function)
    except TypeError:
        path = None
    if path is None or not Path(path).is_file():
        raise InputError(
            f"{getattr(function, '__qualname__', function)!r} is not defined in a file: a finder names its "
            "workload by the script that defines the training function (a notebook's cell has none)"
        )
    return str(Path(path).resolve())


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _lines(quiet: bool) -> LineReporter | None:
    if quiet:
        return None
    return LineReporter("autotune", _say, threading.Lock())


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
