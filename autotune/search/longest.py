"""The job's longest inputs, where its trials fed shorter ones: ``--max-seq-len`` carries each trial's peak
to the declared length.

A script that can pad its batches to the longest length does so where ``autotune.worst_case()`` is true,
and its trials measure that. One that cannot (it draws what its data set holds) declares the length:
``autotune run --max-seq-len 2048``. A training step's peak is the model's fixed part (weights, gradients,
optimizer state, the runtime) plus what grows with the tokens of the batch, B x T: activations, linear in T
as SDPA and FlashAttention compute attention (quadratic only where a model materializes the scores, which
this underestimates). So the study fits, as the memory model fits batch sizes,

    peak = fixed + per_token(plan) x B x T

over its measured trials, T being each trial's longest step (its peak is that step's at most), and reads
every trial at the declared length: ``peak + per_token(plan) x B x (L - T)``. The memory model, the budget
checks, the verification and the answer then all see peaks at length L. Until some plan was measured at
two token counts there is no per-token slope, and trials are read as measured (the calibration's first
trials; every later reading is carried over once the slope exists). A trial that fed lengths of L or more
is read as measured.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from autotune.core.protocol import Outcome
from autotune.search.memory_model import MemoryModel, Observation
from autotune.search.records import READINGS, TrialRecord

MAX_SEQ_LEN_ATTR = "max_seq_len"  # the study's user attribute: the declared longest length


def at_longest(records: Sequence[TrialRecord], longest: int) -> list[TrialRecord]:
    """``records`` with every measured peak read at sequence length ``longest`` (the module docstring);
    the reading itself is kept as ``measured_peak_bytes``."""
    per_token = _per_token(records)
    if per_token is None:
        return list(records)
    return [_carried(r, per_token, longest) for r in records]


def _per_token(records: Sequence[TrialRecord]) -> MemoryModel | None:
    """The fit of peak against tokens (B x T) per plan; None before some plan had two token counts."""
    observations = [
        Observation(
            r.batch_size * r.lengths[1], r.plan, r.peak_bytes, r.outcome is Outcome.COMPLETE, r.memory_method
        )
        for r in records
        if r.kind in READINGS
        and r.measured
        and r.lengths is not None
        and r.batch_size is not None
        and r.plan is not None
        and r.peak_bytes is not None
    ]
    model = MemoryModel.fit(observations)
    return model if model.calibrated else None


def _carried(record: TrialRecord, per_token: MemoryModel, longest: int) -> TrialRecord:
    if (
        not record.measured
        or record.lengths is None
        or record.lengths[1] >= longest
        or record.batch_size is None
        or record.plan is None
        or record.peak_bytes is None
    ):
        return record
    more = int(per_token.slope(record.plan) * record.batch_size * (longest - record.lengths[1]))
    return dataclasses.replace(
        record,
        peak_bytes=record.peak_bytes + more,
        measured_peak_bytes=record.peak_bytes,
        verified_peak_bytes=record.verified_peak_bytes + more if record.verified_peak_bytes else None,
    )
