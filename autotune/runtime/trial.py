"""The trial runtime: the part of autotune that runs inside the user's training process. Its public API
(``batch_size``, ``prepare``, ``step``...) is autotune.runtime.api; this module holds the state of the one
trial the process runs.

Warm-up adapts: once the measured steps are done, a first measured step slower than SETTLE_FACTOR (autotune.runtime.settling) times the
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
(a ``SystemExit(0)``), so the script ends cleanly even if it would train forever. A probe trial measures on
(up to PROBE_PATIENCE steps) until its probe has timed a forward and checked the plans: the probe attaches
at the model's first forward, after which it needs three (autotune.runtime.checks.probe_pending).

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

import os
import sys
import time
import traceback
from typing import Any

from autotune.core.plans import Backend
from autotune.core.pressure import pressure_total
from autotune.core.protocol import (
    EXIT_COMPLETE,
    EXIT_FAILED,
    EXIT_OOM,
    REQUEST_ENV,
    Outcome,
    RankIdentity,
    TrialReport,
    TrialRequest,
    write_progress,
)
from autotune.runtime.checks import (
    PHASE_PATIENCE,
    PhaseNotRun,
    check_accumulation,
    check_batch,
    phase_missing,
    probe_pending,
)
from autotune.runtime.inputs import Inputs, Seen
from autotune.runtime.process import (
    compile_cache,
    cuda_peaks,
    flush_stdio,
    is_out_of_memory,
    one_line,
    pinned_bytes,
    rss_high_water,
    synchronize_cuda,
)
from autotune.runtime.segments import close_segment, next_segment
from autotune.runtime.settling import measuring_on, peak_settling, unsettled
from autotune.runtime.state import TrialState


class TrialComplete(SystemExit):
    """Raised from the last measured step: the trial is over and its report is written."""

    def __init__(self) -> None:
        super().__init__(EXIT_COMPLETE)


class _Trial(TrialState):
    """The one trial this process is running: its steps, its end and its report."""

    def restart(self, request: TrialRequest) -> None:
        """A warm process's next configuration (autotune.runtime.warm): this trial starts over with
        ``request``. The same object, since the hooks and the frameworks' wrappers hold it."""
        startup = self.process_startup or self.startup_seconds()
        self.__init__(request, self.rank)  # type: ignore[misc]
        self.process_startup = startup

    def let_go(self) -> None:
        """Drop what this trial holds of the script's objects (its optimizer holds the model's parameters; a
        sweep's switch and a probe hold the model): a warm process returns to rest after the report."""
        self.optimizer = self.probe = self.switch = self.undo_plan = None

    def forward(self, inputs: Inputs | None = None) -> None:
        """One forward of the model being trained (the hooks call it), with what its inputs showed."""
        if self.guard is not None:
            self.guard()
        if self.counting:
            self.forwards += 1
            if inputs is not None:
                self.seen.add(inputs)

    def step(self, samples: int | None) -> None:
        if self.finished:  # the script swallowed TrialComplete and kept going: stop it for good
            if self.in_process:  # the user's own process (autotune.finder): never ended, told again
                raise TrialComplete()
            flush_stdio()
            os._exit(EXIT_COMPLETE)
        if self.guard is not None:
            self.guard()
        if self.measured:  # past the measured steps: training on until the phases asked have run
            self._step_while_due()
            return
        synchronize_cuda()
        now, pressure = time.perf_counter(), pressure_total()
        self.steps += 1
        self.step_ends.append(now - self.started)
        micro, self.forwards = self.forwards or None, 0
        seen, self.seen = self.seen, Seen()
        self.micro_batches = micro or self.micro_batches
        asked = self.request.grad_accum
        check_batch(self, seen)
        check_accumulation(self, samples, micro)
        if seen.longest is not None:
            self.step_lengths.append(seen.longest)
        if self.steps > self.warmup_steps:
            self.step_seconds.append(now - self.last_step_end)
            if pressure is not None and self.last_pressure is not None and now > self.last_step_end:
                waited = (pressure - self.last_pressure) / 1e6 / (now - self.last_step_end)
                self.step_pressure.append(min(max(waited, 0.0), 1.0))
            if samples is not None:
                counted = int(samples)
            elif seen.samples and seen.forwards == micro:
                counted = seen.samples  # what the model saw, every forward of the step
            else:
                counted = self.request.batch_size * (asked or micro or 1)
            self.step_samples.append(counted)
            if seen.tokens:
                self.step_tokens.append(seen.tokens)
        self.last_step_end, self.last_pressure = now, pressure
        if self.probe is not None and hasattr(self.probe, "after_step"):
            self.probe.after_step(self)  # the probe's plan checks, between two training steps
            self.restart_clock()
        write_progress(
            self.progress_path, self.steps, self.rank, self.phase_now or self.segment_phase, pinned_bytes()
        )
        if (
            len(self.step_seconds) >= self.request.measured_steps
            and not unsettled(self)
            and not peak_settling(self)
            and not measuring_on(self)
            and not probe_pending(self)
        ):
            if self.sweep:
                next_segment(self)
                return
            self.measured = True
            if not self.due_phases():
                self.finish()

    def finish(self) -> None:
        """The trial is over: write its report and end the script (TrialComplete)."""
        self.finished = True
        self.report(Outcome.COMPLETE)
        raise TrialComplete()

    def _step_while_due(self) -> None:
        """A training step after the measured ones, while a phase asked has not run: counted, not measured;
        past PHASE_PATIENCE of them the trial fails saying how to run the phase."""
        self.steps += 1
        self.extra_steps += 1
        self.forwards, self.seen = 0, Seen()
        write_progress(self.progress_path, self.steps, self.rank, self.phase_now or self.last_phase)
        if self.extra_steps >= PHASE_PATIENCE:
            raise PhaseNotRun(phase_missing(self, f"trained {self.extra_steps} steps past its measured ones"))

    def enter_phase(self, name: str) -> bool:
        """The script starts phase ``name``; False for a phase inside one of the same name (not counted)."""
        if self.phase_now == name:
            self.phase_depth += 1
            return False
        self.phase_now, self.phase_depth = name, 1
        synchronize_cuda()
        write_progress(self.progress_path, self.steps, self.rank, name)
        return True

    def exit_phase(self, name: str, seconds: float, ok: bool) -> None:
        """Phase ``name`` ended (``ok``: without an error); the trial ends once every phase asked ran."""
        self.phase_depth -= 1
        if self.phase_depth > 0:
            return
        synchronize_cuda()
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

    def report(self, outcome: Outcome, error: str | None = None) -> None:
        allocated, reserved = cuda_peaks()
        if self.request.sweep and outcome is Outcome.COMPLETE:
            close_segment(self)  # the last plan's
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
            compile_cache=compile_cache(),
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
            shifted=self.shifted,
            slow_start=self.slow_start,
            segments=list(self.segments) if self.request.sweep else None,
            rss_peak=rss_high_water(),
            step_pressure=first.step_pressure if first else self.measured_pressure(),
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
            how = (
                f"exited with the message {code!r}"  # sys.exit("bad config: ..."): Python printed it, exit 1
                if isinstance(code, str)
                else f"exited with code {code}"
                if code not in (None, 0)
                else "ended"
            )
            if how == "ended" and self._measured_before_the_end():
                return EXIT_COMPLETE
            if self.due_phases():
                self.report(Outcome.FAILED, f"PhaseNotRun: {phase_missing(self, how)}")
                return EXIT_FAILED
            self.report(
                Outcome.FAILED,
                f"the script {how} after {self.steps} of {self.warmup_steps + self.request.measured_steps} steps",
            )
            return EXIT_FAILED
        traceback.print_exception(error)  # the user's traceback, into the trial's log
        if is_out_of_memory(error):
            self.report(Outcome.OOM, one_line(error))
            return EXIT_OOM
        self.report(Outcome.FAILED, one_line(error))
        return EXIT_FAILED


_trial: _Trial | None = None
_loaded = False


def enter(trial: _Trial | None) -> None:
    """A search inside the user's own process (autotune.finder): ``trial`` is the one this process runs
    from now on; None: none (the hooks stay in, and only apply the answer's plan)."""
    global _trial, _loaded
    _trial, _loaded = trial, True


def current() -> _Trial | None:
    """The running trial, or None outside one. Reads ``AUTOTUNE_TRIAL_REQUEST`` once."""
    global _trial, _loaded
    if not _loaded:
        _loaded = True
        path = os.environ.get(REQUEST_ENV)
        if path:
            _trial = _Trial(TrialRequest.read(path), RankIdentity.from_environ())
    return _trial
