"""The trial runtime: the part of autotune that runs inside the user's training process.

Public API (re-exported as ``autotune.batch_size``, ``autotune.grad_accum``, ``autotune.prepare``,
``autotune.step``):

- ``batch_size(default)``: the trial's batch size. Outside a trial: ``AUTOTUNE_BATCH_SIZE`` if set (what
  ``autotune best --env`` exports), else ``default``.
- ``grad_accum(default=1)``: micro-batches per optimizer step: the trial's (from ``--global-batch`` or
  ``--grad-accum``), else ``AUTOTUNE_GRAD_ACCUM``, else ``default``.
- ``prepare(model)``: applies the trial's recompute plan. Outside a trial: ``AUTOTUNE_PLAN`` if set, else
  nothing. A plan per rank (``Block:1|none``) applies the entry of this process's ``$RANK``.
- ``step(samples)``: counts a training step. Steps are also counted automatically through torch's global
  optimizer step hook (first optimizer only); the first explicit ``step()`` call turns that off.

Warm-up adapts: once the measured steps are done, a first measured step slower than SETTLE_FACTOR times the
median of the others is counted as warm-up instead and one more step is measured, until the warm-up steps
reach the request's ``warmup_max``: a recompilation, cuDNN's autotuning or a growing allocator at the start
of the measured window does not pull samples/s down. (Not in a multi-process job, whose ranks must stop at
the same step.)

A step's samples are what the model saw: the batch dimension of the inputs of each of its forwards (with
gradients on) since the previous optimizer step (autotune.runtime.inputs), so a script that accumulates
on its own is measured right too; where no forward showed a tensor, the batch size times the accumulation
asked (else the forwards counted). For (B, T) token inputs the tokens are counted too (tokens/s) and the
longest T of each step is kept: a trial whose lengths varied says so. A trial whose model saw batches of
another size than it asked for fails with a message that names both and the fix (BatchIgnored: a script
that ignores the batch size would otherwise be measured at a size it never trained at); a trial that asked
for accumulation while the script steps its optimizer after every forward fails with a message too.

The hooks that count steps and apply the plan without a change to the script are in
``autotune.runtime.hooks``.

In a multi-process job (torchrun sets ``$RANK``), each rank is a trial process of its own: it writes its
progress (with its pid, from its start) and its report to files of its rank, and the tuner merges them.

When warm-up + measured steps are done, the runtime writes its report and raises :class:`TrialComplete`
(a ``SystemExit(0)``), so the script ends cleanly even if it would train forever.

Phases of the job (``phase(name)``, ``due(name)``): a trial asked for ``eval`` or ``save`` (``--with-eval``,
``--with-save``) does not end after its measured steps: it waits for the script to run each phase once,
inside ``with autotune.phase(name):`` (a Hugging Face Trainer's evaluate and checkpoint save, and a
Lightning trainer's validation loop and save_checkpoint, are wrapped so by autotune.runtime.frameworks), and
ends as the last one is done. ``due(name)`` tells a loop of the user's own that a phase is awaited. The
phase the process is in goes into its progress file, so the tuner's meter files its samples under that
phase; after the measured steps the last phase stays named until the trial ends (a GPU's cache keeps what a
phase reserved). A script that trains PHASE_PATIENCE steps past its measured ones without running a phase
asked, or ends before, fails with a message that says how to run it (PhaseNotRun).

torch is never imported here: hooks are installed when the script itself imports torch.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, TypeVar

from autotune.core.errors import InputError
from autotune.core.plans import Backend, Plan, parse_plan
from autotune.core.protocol import (
    BACKEND_ENV,
    BATCH_SIZE_ENV,
    EXIT_COMPLETE,
    EXIT_FAILED,
    EXIT_OOM,
    GRAD_ACCUM_ENV,
    PLAN_ENV,
    REQUEST_ENV,
    SEGMENT_PHASE,
    Outcome,
    RankIdentity,
    Segment,
    TrialReport,
    TrialRequest,
    rank_path,
    read_settled,
    worst_case_enabled,
    write_progress,
)
from autotune.core.stats import median_interval
from autotune.runtime.inputs import Inputs, Seen, batch_ignored_message

M = TypeVar("M")

SETTLE_FACTOR = 1.5  # a first measured step this much slower than the median of the others is warm-up
PHASE_PATIENCE = 8  # training steps past the measured ones a script may take before a phase asked runs
HOW_TO_RUN = {
    "eval": (
        "evaluate",
        "give a Hugging Face Trainer an eval_dataset or a Lightning module a val_dataloader, or in a loop of "
        "your own evaluate when autotune.due('eval') is true, inside `with autotune.phase('eval'):`",
    ),
    "save": (
        "save a checkpoint",
        "a Hugging Face Trainer and a Lightning trainer save on their own; in a loop of your own save when "
        "autotune.due('save') is true, inside `with autotune.phase('save'):`",
    ),
}


class TrialComplete(SystemExit):
    """Raised from the last measured step: the trial is over and its report is written."""

    def __init__(self) -> None:
        super().__init__(EXIT_COMPLETE)


class AccumulationIgnored(RuntimeError):
    """The trial asked for gradient accumulation and the script stepped its optimizer after every forward."""


class BatchIgnored(RuntimeError):
    """The model saw batches of another size than the trial asked for: the script ignores the batch size."""


class PhaseNotRun(RuntimeError):
    """The trial asked for a phase of the job (--with-eval, --with-save) that the script did not run."""


class _Trial:
    """State of the one trial this process is running."""

    def __init__(self, request: TrialRequest, rank: RankIdentity | None = None) -> None:
        self.request = request
        self.rank = rank  # in a multi-process job (torchrun): this process's rank; it reports on its own
        self.report_path = rank_path(request.report_path, rank.rank if rank else None)
        self.progress_path = rank_path(request.progress_path, rank.rank if rank else None)
        self.concluded = False  # its final report is written (a later exit handler leaves it)
        self.exit_code = EXIT_FAILED
        if rank is not None:  # from its start on, the tuner knows this rank's process (its memory, its steps)
            write_progress(self.progress_path, 0, rank)
        self.steps = 0
        self.warmup_steps = request.warmup_steps  # grows while the first measured step is an outlier
        self.started = self.last_step_end = time.perf_counter()
        self.step_ends: list[float] = []  # seconds from the runtime's start to the end of each step
        self.step_seconds: list[float] = []
        self.step_samples: list[int] = []
        self.plan_applied: str | None = None
        self.candidates: list[dict[str, Any]] | None = None
        self.probe: Any = None  # autotune.backends.torch_probe.Probe, in a probe trial
        self.settled: str | None = None  # why a settling verification ended: settled, time cap, step cap
        self.optimizer: Any = None
        self.explicit_steps = False
        self.counted_optimizer: int | None = None
        self.finished = False
        self.forwards = 0  # forwards of the model with gradients on, since the last optimizer step
        self.seen = Seen()  # what those forwards' inputs showed (batch dimensions, tokens, lengths)
        self.step_tokens: list[int] = []  # per measured step, where its inputs were (B, T) tokens
        self.step_lengths: list[int] = []  # the longest T of each step (warm-up included), where known
        self.batch_seen: int | None = None  # the largest batch dimension a forward of the model showed
        self.counting = True  # off while the probe checks plans on the model
        self.micro_batches: int | None = None  # forwards in the last step that counted any
        self.compiled = False  # the script called torch.compile (autotune.runtime.hooks)
        self.phases = () if request.probe else request.phases  # to run once after the measured steps
        self.measured = False  # the measured steps are done: the phases asked may run now
        self.phase_now: str | None = None  # the phase the script is in (autotune.phase)
        self.phase_depth = 0  # phases inside it of the same name (a Trainer's evaluate inside the user's)
        self.phase_seconds: dict[str, float] = {}
        self.phases_done: set[str] = set()  # asked, and run after the measured steps
        self.extra_steps = 0  # training steps past the measured ones, while phases are due
        self.last_phase: str | None = None  # after the measured steps: the phase the meter files under
        self.own_hf_checkpointing = False  # the script turned a Hugging Face model's own checkpointing on
        # a sweep (TrialRequest.sweep): the plans still to measure in this process, the segments measured,
        # and what switches the prepared model's plan (set by prepare(); None: the script applies plans
        # itself from $AUTOTUNE_PLAN, which a switch rewrites)
        self.sweep = list(request.sweep) if not request.probe and rank is None else []
        self.segments: list[Segment] = []
        self.segment_plan = request.plan
        self.segment_start = 0  # the steps done when the current segment began
        self.segment_phase: str | None = None  # what the meter files this segment's samples under
        self.switch: Callable[[str], str] | None = None
        # a warm process's later configurations (autotune.runtime.warm): the seconds its first one took to
        # start, which a fresh trial of this configuration would have taken too (how long it may measure on)
        self.process_startup = 0.0

    def restart(self, request: TrialRequest) -> None:
        """A warm process's next configuration (autotune.runtime.warm): this trial starts over with
        ``request``. The same object, since the hooks and the frameworks' wrappers hold it."""
        startup = self.process_startup or self._startup()
        self.__init__(request, self.rank)  # type: ignore[misc]
        self.process_startup = startup

    def let_go(self) -> None:
        """Drop what this trial holds of the script's objects (its optimizer holds the model's parameters; a
        sweep's switch and a probe hold the model): a warm process returns to rest after the report."""
        self.optimizer = self.probe = self.switch = None

    def _startup(self) -> float:
        """Seconds from the runtime's start to the end of warm-up (0 before then)."""
        warm = self.segments[0].warmup_steps if self.segments else self.warmup_steps
        return self.step_ends[warm - 1] if len(self.step_ends) >= warm > 0 else 0.0

    def forward(self, inputs: Inputs | None = None) -> None:
        """One forward of the model being trained (the hooks call it), with what its inputs showed."""
        if self.counting:
            self.forwards += 1
            if inputs is not None:
                self.seen.add(inputs)

    def step(self, samples: int | None) -> None:
        if self.finished:  # the script swallowed TrialComplete and kept going: stop it for good
            _flush_stdio()
            os._exit(EXIT_COMPLETE)
        if self.measured:  # past the measured steps: training on until the phases asked have run
            self._step_while_due()
            return
        _synchronize_cuda()
        now = time.perf_counter()
        self.steps += 1
        self.step_ends.append(now - self.started)
        micro, self.forwards = self.forwards or None, 0
        seen, self.seen = self.seen, Seen()
        self.micro_batches = micro or self.micro_batches
        asked = self.request.grad_accum
        self._check_batch(seen)
        if samples is None and asked is not None and asked > 1 and micro == 1:
            raise AccumulationIgnored(
                f"the trial asked for gradient accumulation over {asked} micro-batches of "
                f"{self.request.batch_size}, but the script stepped its optimizer after one forward: pass "
                "{grad_accum} to its accumulation option (--gradient_accumulation_steps {grad_accum} for a "
                "Trainer) or accumulate autotune.grad_accum() micro-batches"
            )
        if seen.longest is not None:
            self.step_lengths.append(seen.longest)
        if self.steps > self.warmup_steps:
            self.step_seconds.append(now - self.last_step_end)
            if samples is not None:
                counted = int(samples)
            elif seen.samples and seen.forwards == micro:
                counted = seen.samples  # what the model saw, every forward of the step
            else:
                counted = self.request.batch_size * (asked or micro or 1)
            self.step_samples.append(counted)
            if seen.tokens:
                self.step_tokens.append(seen.tokens)
        self.last_step_end = now
        if self.probe is not None and hasattr(self.probe, "after_step"):
            self.probe.after_step(self)  # the probe's plan checks, between two training steps
            self.last_step_end = time.perf_counter()
        write_progress(
            self.progress_path, self.steps, self.rank, self.phase_now or self.segment_phase, _pinned_bytes()
        )
        if (
            len(self.step_seconds) >= self.request.measured_steps
            and not self._unsettled()
            and not self._peak_settling()
            and not self._measuring_on()
        ):
            if self.sweep:
                self._next_segment()
                return
            self.measured = True
            if not self.due_phases():
                self.finish()

    def _close_segment(self) -> None:
        """The current plan's segment is measured: keep it (a sweep)."""
        allocated, reserved = _cuda_peaks()
        self.segments.append(
            Segment(
                plan=self.segment_plan,
                plan_applied=self.plan_applied,
                step_seconds=tuple(self.step_seconds),
                step_samples=tuple(self.step_samples),
                warmup_steps=self.warmup_steps - self.segment_start,
                first_step=self.segment_start,
                last_step=self.steps,
                step_tokens=tuple(self.step_tokens)
                if len(self.step_tokens) == len(self.step_seconds)
                else (),
                rss_peak=_rss_high_water(),
                torch_peak_allocated=allocated,
                torch_peak_reserved=reserved,
            )
        )

    def _next_segment(self) -> None:
        """Between two steps of a sweep: keep the segment just measured, switch the model to the next plan,
        give back what the last plan's step held (CUDA's cached blocks; the peak counters and the
        resident high-water mark reset), and measure the next plan as a trial of its own: its warm-up, its
        measured steps, its samples filed by the meter under its own phase."""
        self._close_segment()
        plan = self.sweep.pop(0)
        os.environ[PLAN_ENV] = plan  # a script that applies plans itself reads it
        if self.switch is not None:
            self.plan_applied = self.switch(plan)
        else:
            self.plan_applied = None
        _release_segment_memory()
        self.segment_plan = plan
        self.segment_start = self.steps
        self.warmup_steps = self.steps + max(1, self.request.warmup_steps)
        self.step_seconds, self.step_samples, self.step_tokens = [], [], []
        self.segment_phase = SEGMENT_PHASE + plan
        write_progress(self.progress_path, self.steps, self.rank, self.segment_phase, _pinned_bytes())
        self.last_step_end = time.perf_counter()

    def finish(self) -> None:
        """The trial is over: write its report and end the script (TrialComplete)."""
        self.finished = True
        self.report(Outcome.COMPLETE)
        raise TrialComplete()

    def due_phases(self) -> list[str]:
        """The phases asked that the script has yet to run (none before the measured steps are done)."""
        return [p for p in self.phases if p not in self.phases_done] if self.measured else []

    def _step_while_due(self) -> None:
        """A training step after the measured ones, while a phase asked has not run: counted, not measured;
        past PHASE_PATIENCE of them the trial fails saying how to run the phase."""
        self.steps += 1
        self.extra_steps += 1
        self.forwards, self.seen = 0, Seen()
        write_progress(self.progress_path, self.steps, self.rank, self.phase_now or self.last_phase)
        if self.extra_steps >= PHASE_PATIENCE:
            raise PhaseNotRun(self._phase_missing(f"trained {self.extra_steps} steps past its measured ones"))

    def _phase_missing(self, what: str) -> str:
        phase = self.due_phases()[0]
        verb, how = HOW_TO_RUN[phase]
        return f"--with-{phase}: the script {what} and did not {verb}: {how}"

    def enter_phase(self, name: str) -> bool:
        """The script starts phase ``name``; False for a phase inside one of the same name (not counted)."""
        if self.phase_now == name:
            self.phase_depth += 1
            return False
        self.phase_now, self.phase_depth = name, 1
        _synchronize_cuda()
        write_progress(self.progress_path, self.steps, self.rank, name)
        return True

    def exit_phase(self, name: str, seconds: float, ok: bool) -> None:
        """Phase ``name`` ended (``ok``: without an error); the trial ends once every phase asked ran."""
        self.phase_depth -= 1
        if self.phase_depth > 0:
            return
        _synchronize_cuda()
        self.phase_now = None
        self.phase_seconds[name] = self.phase_seconds.get(name, 0.0) + seconds
        if not self.measured:  # a phase of the script's own during the steps: back to training
            write_progress(self.progress_path, self.steps, self.rank)
            return
        self.last_phase = name  # samples from now on still count towards it (see the module docstring)
        if ok and name in self.phases:
            self.phases_done.add(name)
            if not self.due_phases():
                self.finish()

    def _check_batch(self, seen: Seen) -> None:
        """Fail the trial once its model saw a batch other than the one asked (per forward: a micro-batch).

        The largest batch dimension seen so far decides, so an epoch's last, shorter batch passes; a
        layout that puts the batch second (sequence-first RNNs, nn.Transformer) passes where one of its
        dimensions is the batch asked (autotune.runtime.inputs). A script that counts its steps with
        ``autotune.step(samples)`` is not checked: a sample need not be a row of its model's first input
        (a graph network's nodes)."""
        if seen.batch is None or self.explicit_steps:  # a script that counts its samples itself says them
            return
        self.batch_seen = max(self.batch_seen or 0, seen.batch)
        if self.batch_seen != self.request.batch_size:
            raise BatchIgnored(batch_ignored_message(self.batch_seen, self.request.batch_size))

    def _peak_settling(self) -> bool:
        """Whether a verification runs on while its peak may still grow (autotune.trials.settle): until
        the step the tuner wrote, or ``settle_steps`` past the measured ones."""
        if not self.request.settle_steps:
            return False
        end = read_settled(self.request.settled_path)
        if end is not None:
            self.settled = end[1]
            return self.steps < end[0]
        past = len(self.step_seconds) - self.request.measured_steps
        if past >= self.request.settle_steps:
            self.settled = "step cap"
            return False
        return True

    def _measuring_on(self) -> bool:
        """Whether the throughput's interval is still wider than the request's ``tight`` and the trial may
        measure longer: its measured steps have taken less than ``measure_share`` of its start-up (to the end
        of its warm-up) and ``measure_cap`` seconds. A trial that took 18 s to start is worth more than 0.35 s
        of measured steps. Not in a multi-process job: each rank would decide alone, and one that stopped
        a step before another would leave it waiting in a collective."""
        if not self.request.tight or self.rank is not None or not self.step_seconds:
            return False
        spent = sum(self.step_seconds)
        startup = max(self._startup(), self.process_startup)  # the process's start-up
        if spent >= min(self.request.measure_share * startup, self.request.measure_cap):
            return False
        speed = median_interval([n / s for n, s in zip(self.step_samples, self.step_seconds, strict=True)])
        return speed is not None and speed.noise > self.request.tight

    def _unsettled(self) -> bool:
        """Whether the first measured step is still warming up: then it becomes warm-up (up to the cap)."""
        cap = max(self.request.warmup_max, self.request.warmup_steps)
        # Not in a multi-process job: each rank would decide alone, and a rank that stopped a step before
        # another would leave it waiting in a collective.
        if self.rank is not None or len(self.step_seconds) < 3 or self.warmup_steps >= cap:
            return False
        rest = sorted(self.step_seconds[1:])
        if self.step_seconds[0] <= SETTLE_FACTOR * rest[(len(rest) - 1) // 2]:  # the lower median
            return False
        self.warmup_steps += 1
        del self.step_seconds[0], self.step_samples[0]
        if len(self.step_tokens) > len(self.step_seconds):
            del self.step_tokens[0]
        return True

    def report(self, outcome: Outcome, error: str | None = None) -> None:
        allocated, reserved = _cuda_peaks()
        if self.request.sweep and outcome is Outcome.COMPLETE:
            self._close_segment()  # the last plan's
        first = self.segments[0] if self.segments else None
        TrialReport(
            outcome=outcome,
            steps_done=self.steps,
            step_seconds=first.step_seconds if first else tuple(self.step_seconds),
            step_samples=first.step_samples if first else tuple(self.step_samples),
            torch_peak_allocated=first.torch_peak_allocated if first else allocated,
            torch_peak_reserved=first.torch_peak_reserved if first else reserved,
            error=error,
            plan_applied=first.plan_applied if first else self.plan_applied,
            candidates=self.candidates,
            probe=self._probe_result(),
            micro_batches=self.micro_batches,
            compile_cache=_compile_cache(),
            warmup_steps=first.warmup_steps if first else self.warmup_steps,
            warmup_seconds=(
                self.step_ends[self.warmup_steps - 1] if len(self.step_ends) >= self.warmup_steps else None
            ),
            rank=self.rank.rank if self.rank else None,
            world_size=self.rank.world_size if self.rank else None,
            step_tokens=(
                first.step_tokens
                if first
                else (tuple(self.step_tokens) if len(self.step_tokens) == len(self.step_seconds) else ())
            ),
            lengths=(min(self.step_lengths), max(self.step_lengths)) if self.step_lengths else None,
            batch_seen=self.batch_seen,
            phase_seconds=dict(self.phase_seconds) or None,
            own_checkpointing=self.own_checkpointing(),
            settled=f"{self.settled} after {self.steps} steps" if self.settled else None,
            segments=list(self.segments) if self.request.sweep else None,
            rss_peak=_rss_high_water(),
        ).write(self.report_path)

    def own_checkpointing(self, counted: bool = True) -> str | None:
        """What checkpointing the script does by itself, in words (None: none seen): every plan adds to it,
        and ``none`` keeps it (autotune.backends.torch_modules.watch_own_checkpointing). ``counted``: with
        the calls a step (not in a probe, whose plan checks run the model's forward too)."""
        modules = sys.modules.get("autotune.backends.torch_modules")
        calls = modules.own_checkpoint_calls() if modules is not None else 0
        per_step = (
            f" ({calls / max(self.steps, 1):.3g} torch.utils.checkpoint calls a step)" if counted else ""
        )
        if self.own_hf_checkpointing:
            return f"gradient_checkpointing_enable() on the model{per_step}"
        return f"torch.utils.checkpoint in its own forwards{per_step}" if calls else None

    def _probe_result(self) -> dict[str, Any] | None:
        if self.probe is None:
            return None
        self.probe.optimizer = self.optimizer
        if self.request.backend is Backend.TORCH:
            self.probe.own_checkpointing = self.own_checkpointing(counted=False)  # its checks call it too
        return dict(self.probe.result().to_json())

    def conclude(self, error: BaseException | None) -> int:
        """Write the final report for a script that ended (``error`` is what it raised) and pick the exit code.

        The first conclusion stands: an exit handler that runs after an uncaught error was reported (a
        command that is not ``python ...``, a torchrun rank) does not overwrite the error with "ended"."""
        if self.finished:
            return EXIT_COMPLETE
        if self.concluded:
            return self.exit_code
        self.concluded = True
        self.exit_code = self._conclude(error)
        return self.exit_code

    def _measured_before_the_end(self) -> bool:
        """A script that ended of itself after the trial's measured steps, while the trial measured on for a
        tighter reading or a verification's settling peak: what it measured is the trial's reading (a
        short script on a loaded machine, whose tiny steps never read tight). Reported complete; True.
        Not where a sweep's plans or a phase asked for are still to run: those were not measured."""
        if self.sweep or len(self.step_seconds) < self.request.measured_steps:
            return False
        self.measured = True
        if self.due_phases():
            return False
        if self.request.settle_steps and self.settled is None:
            self.settled = "the script's end"
        self.finished = True
        self.report(Outcome.COMPLETE)
        return True

    def _conclude(self, error: BaseException | None) -> int:
        if error is None or isinstance(error, SystemExit):
            code = getattr(error, "code", 0)
            how = f"exited with code {code}" if code not in (None, 0) else "ended"
            if how == "ended" and self._measured_before_the_end():
                return EXIT_COMPLETE
            if self.due_phases():
                self.report(Outcome.FAILED, f"PhaseNotRun: {self._phase_missing(how)}")
                return EXIT_FAILED
            self.report(
                Outcome.FAILED,
                f"the script {how} after {self.steps} of {self.warmup_steps + self.request.measured_steps} steps",
            )
            return EXIT_FAILED
        traceback.print_exception(error)  # the user's traceback, into the trial's log
        if is_out_of_memory(error):
            self.report(Outcome.OOM, _one_line(error))
            return EXIT_OOM
        self.report(Outcome.FAILED, _one_line(error))
        return EXIT_FAILED


_trial: _Trial | None = None
_loaded = False


def current() -> _Trial | None:
    """The running trial, or None outside one. Reads ``AUTOTUNE_TRIAL_REQUEST`` once."""
    global _trial, _loaded
    if not _loaded:
        _loaded = True
        path = os.environ.get(REQUEST_ENV)
        if path:
            _trial = _Trial(TrialRequest.read(path), RankIdentity.from_environ())
    return _trial


def batch_size(default: int | None = None) -> int:
    """The batch size to train with: the trial's, else ``$AUTOTUNE_BATCH_SIZE``, else ``default``.

    Raises:
        InputError: none of the three is set, or the variable is not a positive integer.
    """
    trial = current()
    if trial is not None:
        return trial.request.batch_size
    text = os.environ.get(BATCH_SIZE_ENV)
    if text:
        if not text.isascii() or not text.isdigit() or int(text) <= 0:
            raise InputError(f"{BATCH_SIZE_ENV} must be a positive integer, got {text!r}")
        return int(text)
    if default is None:
        raise InputError(
            f"no batch size: not in an autotune trial, {BATCH_SIZE_ENV} is unset and no default given"
        )
    return default


def grad_accum(default: int = 1) -> int:
    """Micro-batches to accumulate per optimizer step: the trial's (``--global-batch``: the global batch over
    the trial's batch size; ``--grad-accum N``: N), else ``$AUTOTUNE_GRAD_ACCUM``, else ``default``.

    Raises:
        InputError: the variable is not a positive integer.
    """
    trial = current()
    if trial is not None:
        return trial.request.grad_accum or 1
    text = os.environ.get(GRAD_ACCUM_ENV)
    if text:
        if not text.isascii() or not text.isdigit() or int(text) <= 0:
            raise InputError(f"{GRAD_ACCUM_ENV} must be a positive integer, got {text!r}")
        return int(text)
    return default


def worst_case() -> bool:
    """Whether the script should feed its longest inputs: pad every batch to the maximum sequence length (or
    draw the largest images) so that a trial's few steps see the shapes the whole job's worst step will
    (OpenNMT-tf's batch autotune mode does the same). On while ``$AUTOTUNE_WORST_CASE`` is 1, in a trial and
    outside it: ``AUTOTUNE_WORST_CASE=1 autotune run ...`` tunes every trial so, and the study is a workload
    of its own."""
    return worst_case_enabled(os.environ)


def prepare(model: M) -> M:
    """Apply the recompute plan (the trial's, else ``$AUTOTUNE_PLAN``) to ``model`` and return it: in place
    for the torch backend; for the ORT backend (the trial's, else ``$AUTOTUNE_BACKEND=ort``) the model
    wrapped in ORTModule, whose plan is in ORT's own environment variables."""
    trial = current()
    backend = (
        trial.request.backend if trial is not None else Backend.parse(os.environ.get(BACKEND_ENV, "torch"))
    )
    if backend is Backend.ORT:
        return _prepare_ort(model, trial)
    plan = parse_plan(trial.request.plan if trial is not None else os.environ.get(PLAN_ENV, "none"))
    if plan.ranks:  # a plan per rank: this rank's entry
        identity = trial.rank if trial is not None else RankIdentity.from_environ()
        plan = plan.for_rank(identity.rank if identity is not None else None)
    if plan.is_none and trial is None:
        return model  # outside a trial with no plan: not even torch is imported
    if plan.compile_budget is not None and trial is None:  # in a trial, set as torch was imported (hooks)
        from autotune.backends.torch_compile import set_compile_budget

        set_compile_budget(plan.compile_budget)
    from autotune.backends.torch_modules import apply_plan, find_candidates  # torch: only once a model exists

    if trial is not None:
        from autotune.backends.torch_modules import own_gradient_checkpointing

        trial.own_hf_checkpointing = own_gradient_checkpointing(model)  # type: ignore[arg-type]
        trial.candidates = [asdict(c.summary()) for c in find_candidates(model)]  # type: ignore[arg-type]
        if trial.request.probe:
            from autotune.backends.torch_probe import Probe

            if trial.probe is None:
                trial.probe = Probe(model, trial.request.batch_size, trial.request.check_plans)  # type: ignore[arg-type]
                trial.plan_applied = "none"
            return model
    if trial is not None and trial.sweep:
        return _prepare_switchable(model, plan, trial)
    applied = apply_plan(model, plan)  # type: ignore[arg-type]
    if trial is not None:
        trial.plan_applied = str(applied)
    return model


def _prepare_switchable(model: M, plan: Plan, trial: _Trial) -> M:
    """A sweep's model: ``plan`` applied so that the trial can switch it to the next plan between two steps
    (each undone as the probe's checks undo theirs: autotune.backends.torch_modules.plan_applied)."""
    from autotune.backends.torch_modules import plan_applied

    if trial.switch is not None:  # prepared already (a framework's wrapper of the same model)
        return model
    held = [plan_applied(model, plan)]  # type: ignore[arg-type]
    trial.plan_applied = str(held[0].__enter__())

    def switch(new: str) -> str:
        held[0].__exit__(None, None, None)
        held[0] = plan_applied(model, parse_plan(new))  # type: ignore[arg-type]
        return str(held[0].__enter__())

    trial.switch = switch
    return model


def _prepare_ort(model: M, trial: _Trial | None) -> M:
    from autotune.backends.ort import OrtProbe, wrap

    wrapped = wrap(model)
    if trial is not None:
        trial.candidates = []
        trial.plan_applied = trial.request.plan
        if trial.request.probe and trial.probe is None:
            trial.probe = OrtProbe(wrapped, trial.request.batch_size)
    return wrapped


def step(samples: int | None = None) -> None:
    """Count one training step of ``samples`` samples (default: the batch size). A no-op outside a trial."""
    trial = current()
    if trial is not None:
        trial.explicit_steps = True
        trial.step(samples)


class phase:  # a context manager named as the function users call it as
    """``with autotune.phase("eval"):`` (or ``"save"``, or any name): the code inside is that phase of the
    job, its memory measured on its own. In a trial asked for it (``--with-eval``, ``--with-save``) after its
    measured steps, the trial ends as the last such phase ends (TrialComplete from the ``with``). A no-op
    outside a trial."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._started: float | None = None
        self._counted = False

    def __enter__(self) -> phase:
        trial = current()
        if trial is not None:
            self._counted = trial.enter_phase(self.name)
            self._started = time.perf_counter()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: Any) -> None:
        trial = current()
        if trial is not None and self._started is not None:
            trial.exit_phase(self.name, time.perf_counter() - self._started, ok=kind is None)


def due(name: str) -> bool:
    """Whether the trial awaits phase ``name`` now (``--with-eval``: "eval", ``--with-save``: "save"): its
    measured steps are done and the script has not run it since. A training loop of the user's own runs
    that phase when this is true (inside ``autotune.phase(name)``); a Trainer or Lightning needs nothing.
    False outside a trial."""
    trial = current()
    return trial is not None and name in trial.due_phases()


def is_out_of_memory(error: BaseException) -> bool:
    """CUDA OOM (``torch.OutOfMemoryError``), a Python MemoryError, or torch's CPU allocator refusing."""
    if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and (
        "out of memory" in text.lower() or "can't allocate memory" in text
    )


def _synchronize_cuda() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _release_segment_memory() -> None:
    """Between a sweep's segments: CUDA's cached blocks back to the driver (NVML's reading falls to what the
    process holds) and torch's peak counters reset; on Linux, the resident high-water mark reset to the
    current resident size (/proc/self/clear_refs, 5), so each segment's peak is its own."""
    import gc

    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _rss_high_water() -> int | None:
    """This process's resident high-water mark (VmHWM; None where /proc has none)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cuda_peaks() -> tuple[int | None, int | None]:
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None, None
    return int(torch.cuda.max_memory_allocated()), int(torch.cuda.max_memory_reserved())


def _pinned_bytes() -> int | None:
    """The bytes CUDA's pinned host allocator holds now (activation offload's saved tensors): the tuner's
    account of a trial the kernel kills for host memory (None without CUDA, or a torch without the stat)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    try:
        return int(torch.cuda.host_memory_stats().get("allocated_bytes.current", 0)) or None
    except (AttributeError, RuntimeError):
        return None


def _compile_cache() -> dict[str, int] | None:
    """torch.compile's cache lookups so far in this process (torch's own counters; never imports torch)."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return None
    counters = utils.counters
    found = {
        "fx_graph_hits": counters["inductor"].get("fxgraph_cache_hit", 0),
        "fx_graph_misses": counters["inductor"].get("fxgraph_cache_miss", 0),
        "aot_autograd_hits": counters["aot_autograd"].get("autograd_cache_hit", 0),
        "aot_autograd_misses": counters["aot_autograd"].get("autograd_cache_miss", 0),
    }
    return {k: int(v) for k, v in found.items()} if any(found.values()) else None


def _one_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def _flush_stdio() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
