"""Several plans measured in one trial process (issue 31, item 5): which, and at what batch size.

A GPT-2 medium trial on an H100 spent ~18 s starting (imports, building the model, CUDA, the first step)
and 0.35 s in its measured steps; on an H200 12-24 s against 0.4-3.8 s. What a search needs of most plans
is one reading each, to set the plan's own memory slope and its speed (autotune.search.memory_model,
throughput_model). So once the memory model is calibrated on the first plan, the plans that have no
reading yet are measured together at the first plan's largest batch that fitted — every plan that saves
memory fits there too — in one process: the runtime switches the model's plan between two steps
(autotune.runtime.trial, TrialRequest.sweep), each plan with its own warm-up and measured steps, its own
peak (CUDA's cache emptied and torch's counters reset between plans, samples filed under the plan; on the
CPU the resident high-water mark reset), in order of predicted peak, smallest first, so what one plan
leaves behind is below the next one's peak. What stays resident can still add to a later plan's peak — on
the CPU up to 3.7% over its own trial's (tests/trials/test_sweep_trial.py), never under: a conservative
reading, and the winner is verified in a process of its own. The sweep is one trial of ``--trials``; every plan's reading is
a trial of its own in the study (``proposed_by`` ``sweep``, ``process`` the first one's number), and a
plan the sweep did not reach (the process ran out of memory, or passed the budget, on the plan before) is
measured later on its own.

Not swept: compile plans (torch's partitioner reads the budget when the graph is first compiled), plans per
rank and multi-process trials (every rank would have to switch at the same step), ORT plans (the session
is built for one plan), a probe, a job with phases (--with-eval, --with-save run once, after the last
plan: their peak would be no plan's). ``run --sweep`` forces it on, ``--no-sweep`` off; by default it is on for
GPU trials, where start-up dominates, and off on the CPU, where a trial starts in seconds and a freed
tensor's pages may stay resident.
"""

from __future__ import annotations

from autotune.core.plans import parse_plan
from autotune.search.memory_model import MemoryModel
from autotune.search.records import Configuration, ProposedBy, TrialRecord
from autotune.search.space import SearchSpace


def sweep_of(
    records: list[TrialRecord],
    model: MemoryModel,
    space: SearchSpace,
    limit: int,
    taken: set[Configuration],
) -> tuple[int, list[str]] | None:
    """The batch size and the plans (in the order to measure them) of the study's sweep, or None: the model
    is not yet calibrated, a sweep ran already, or fewer than two plans are without a reading."""
    if space.world_size > 1 or not (model.calibrated and model.resolved):
        return None
    if any(r.proposed_by == ProposedBy.SWEEP for r in records):
        return None
    plans = space.uniform_plans
    if not plans:
        return None
    first = plans[0]
    fitted = [
        r.batch_size for r in records if r.plan == first and r.batch_size and r.counted and r.fits(limit)
    ]
    if not fitted:
        return None
    batch = max(fitted)
    read = {r.plan for r in records if r.measured}
    left = [
        p
        for p in plans
        if p not in read
        and not parse_plan(p).compiles
        and Configuration(batch, p) not in taken
        and "|" not in p
    ]
    if len(left) < 2:
        return None
    return batch, sorted(left, key=lambda p: (model.predict(batch, p) or 0.0, plans.index(p)))
