"""What the trial runtime checks of a script as it trains: that its model sees the batch size asked
(BatchIgnored), that it accumulates where asked (AccumulationIgnored), that it runs the phases of its job
that were asked for (PhaseNotRun). Each fails the trial with a message that says how to fix the script."""

from __future__ import annotations

import sys

from autotune.core.plans import Backend
from autotune.runtime.inputs import Seen, batch_ignored_message
from autotune.runtime.state import TrialState

PHASE_PATIENCE = 8  # training steps past the measured ones a script may take before a phase asked runs
# training steps past the measured ones a probe trial takes to finish its probe: with its one measured step
# (trials.measurement.PROBE_MEASURED_STEPS), as many in all as the five measured steps and 4 once allowed
PROBE_PATIENCE = 8
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


class AccumulationIgnored(RuntimeError):
    """The trial asked for gradient accumulation and the script stepped its optimizer after every forward."""


class BatchIgnored(RuntimeError):
    """The model saw batches of another size than the trial asked for: the script ignores the batch size."""


class PhaseNotRun(RuntimeError):
    """The trial asked for a phase of the job (--with-eval, --with-save) that the script did not run."""


def check_batch(trial: TrialState, seen: Seen) -> None:
    """Fail the trial once its model saw a batch other than the one asked (per forward: a micro-batch).

    The largest batch dimension seen so far decides, so an epoch's last, shorter batch passes; a
    layout that puts the batch second (sequence-first RNNs, nn.Transformer) passes where one of its
    dimensions is the batch asked (autotune.runtime.inputs). A script that counts its steps with
    ``autotune.step(samples)`` is not checked: a sample need not be a row of its model's first input
    (a graph network's nodes)."""
    if seen.batch is None or trial.explicit_steps:  # a script that counts its samples itself says them
        return
    trial.batch_seen = max(trial.batch_seen or 0, seen.batch)
    if trial.batch_seen != trial.request.batch_size:
        raise BatchIgnored(batch_ignored_message(trial.batch_seen, trial.request.batch_size))


def phase_missing(trial: TrialState, what: str) -> str:
    phase = trial.due_phases()[0]
    verb, how = HOW_TO_RUN[phase]
    return f"--with-{phase}: the script {what} and did not {verb}: {how}"


def check_accumulation(trial: TrialState, samples: int | None, micro: int | None) -> None:
    """Fail a trial that asked for accumulation over several micro-batches where the script stepped its
    optimizer after one forward (a script counting its own samples is not checked)."""
    asked = trial.request.grad_accum
    if samples is None and asked is not None and asked > 1 and micro == 1:
        raise AccumulationIgnored(
            f"the trial asked for gradient accumulation over {asked} micro-batches of "
            f"{trial.request.batch_size}, but the script stepped its optimizer after one forward: pass "
            "{grad_accum} to its accumulation option (--gradient_accumulation_steps {grad_accum} for a "
            "Trainer) or accumulate autotune.grad_accum() micro-batches"
        )


def probe_pending(trial: TrialState) -> bool:
    """Whether a probe trial measures on because its probe has not timed a forward and checked the plans
    yet (it attaches to the model when the script first shows it, which can be after the first forwards:
    a loaded machine's probe trial once ended first, and offered every plan unchecked), or because a script
    that imported torch has shown no model yet; for at most PROBE_PATIENCE steps past the measured ones. A
    probe that did not finish by then offers no plan it did not check (autotune.backends.torch_probe)."""
    probe = trial.probe
    if probe is None:
        waiting = trial.request.probe and trial.request.backend is Backend.TORCH and "torch" in sys.modules
    else:
        waiting = bool(getattr(probe, "pending", False))
    return waiting and trial.steps < trial.warmup_steps + trial.request.measured_steps + PROBE_PATIENCE
