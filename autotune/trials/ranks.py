"""The ranks of a multi-process trial (torchrun, or any launcher that sets ``$RANK``), seen from the tuner.

Each rank runs the trial runtime on its own (autotune.runtime.trial): from its start it writes
``progress.rank-N.json`` (its steps, pid, local rank and world size), and at its end ``report.rank-N.json``.
This module reads them back:

- :class:`RankWatch`: the pids of the ranks that have started, for the meters (each rank measured on its
  own) — re-read until every rank of the world has started, then cached;
- :func:`rank_failed`: a rank has reported an end other than success — the launcher then stops the whole
  process tree at once, so no rank is left waiting in a collective for one that is gone;
- :func:`merge_reports`: the trial's one report. One rank's out-of-memory is the trial's; a rank that
  failed makes the trial fail with that rank's error; it completes only when every rank that started
  completed. Its steps are the ranks' steps side by side: a step's samples are every rank's (the global
  throughput), its time the slowest rank's.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from autotune.core.errors import InputError
from autotune.core.plans import Plan, parse_plan
from autotune.core.protocol import (
    Outcome,
    RankIdentity,
    TrialReport,
    rank_files,
    read_rank_identities,
)


class RankWatch:
    """``watch()``: pid -> identity of each rank of the trial that has started (progress files).
    ``declared``: the trial's command is torchrun (autotune.hardware.meters.Ranks)."""

    def __init__(self, progress_path: str | Path, declared: bool = True) -> None:
        self._path = progress_path
        self.declared = declared
        self._known: dict[int, RankIdentity] = {}
        self._complete = False

    def __call__(self) -> dict[int, RankIdentity]:
        if not self._complete:
            ranks = read_rank_identities(self._path)
            self._known = {identity.pid: identity for identity in ranks.values()}
            world = max((i.world_size for i in ranks.values()), default=0)
            self._complete = bool(ranks) and len(ranks) >= world
        return self._known

    def identities(self) -> dict[int, RankIdentity]:
        """By rank."""
        return {identity.rank: identity for identity in self().values()}


def rank_reports(report_path: str | Path) -> dict[int, TrialReport]:
    """The reports the ranks have written so far, by rank (unreadable ones left out)."""
    found = {}
    for rank, path in rank_files(report_path).items():
        try:
            found[rank] = TrialReport.read(path)
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return found


def rank_failed(report_path: str | Path) -> bool:
    """Whether a rank has reported an end other than success (its out-of-memory, its error)."""
    return any(r.outcome is not Outcome.COMPLETE for r in rank_reports(report_path).values())


def merge_reports(
    reports: dict[int, TrialReport], started: dict[int, RankIdentity], expected: Iterable[int] | None = None
) -> TrialReport:
    """The trial's report from its ranks' (see the module docstring); ``started``: the ranks that started;
    ``expected``: the ranks that must report (None: every rank of the world; one node's share of a
    multi-node trial: its own ranks, the driver merging the nodes' reports with the whole world's)."""
    ranks = sorted(set(reports) | set(started))
    first = reports[min(reports)] if reports else None
    world = max([i.world_size for i in started.values()] + [r.world_size or 0 for r in reports.values()])
    failed = [r for r in ranks if r in reports and reports[r].outcome is not Outcome.COMPLETE]
    ooms = [r for r in failed if reports[r].outcome.out_of_memory]
    missing = [r for r in (range(world) if expected is None else expected) if r not in reports]
    if ooms or failed:
        culprit = (ooms or failed)[0]
        outcome = reports[culprit].outcome
        error = f"rank {culprit} of {world}: {reports[culprit].error or outcome.value}"
    elif missing:
        outcome = Outcome.FAILED
        error = (
            f"rank {missing[0]} of {world} ended without a report (killed, or it never started the script)"
        )
    else:
        outcome, error = Outcome.COMPLETE, None
    complete = [reports[r] for r in ranks if r in reports and reports[r].outcome is Outcome.COMPLETE]
    steps = min((len(r.step_seconds) for r in complete), default=0)
    return TrialReport(
        outcome=outcome,
        steps_done=min((r.steps_done for r in reports.values()), default=0),
        step_seconds=tuple(max(r.step_seconds[i] for r in complete) for i in range(steps)),
        step_samples=tuple(sum(r.step_samples[i] for r in complete) for i in range(steps)),
        # one machine's pressure, read by each rank over its own step: a step is as busy as its busiest read
        step_pressure=(
            tuple(max(r.step_pressure[i] for r in complete) for i in range(steps))
            if complete and all(len(r.step_pressure) >= steps for r in complete)
            else ()
        ),
        torch_peak_allocated=_largest(r.torch_peak_allocated for r in reports.values()),
        torch_peak_reserved=_largest(r.torch_peak_reserved for r in reports.values()),
        error=error,
        plan_applied=_plans_applied(reports, world),
        candidates=first.candidates if first else None,
        probe=first.probe if first else None,
        micro_batches=first.micro_batches if first else None,
        compile_cache=first.compile_cache if first else None,
        warmup_steps=first.warmup_steps if first else None,
        warmup_seconds=first.warmup_seconds if first else None,
        rank=None,
        world_size=world,
        step_tokens=(
            tuple(sum(r.step_tokens[i] for r in complete) for i in range(steps))
            if complete and all(len(r.step_tokens) >= steps for r in complete)
            else ()
        ),
        lengths=_span([r.lengths for r in reports.values() if r.lengths is not None]),
        batch_seen=_largest(r.batch_seen for r in reports.values()),
        phase_seconds=_slowest([r.phase_seconds for r in reports.values() if r.phase_seconds]),
        own_checkpointing=first.own_checkpointing if first else None,
        settled=first.settled if first else None,
    )


def _slowest(phases: list[dict[str, float]]) -> dict[str, float] | None:
    """Each phase's seconds on the rank that took longest in it."""
    if not phases:
        return None
    return {name: max(p[name] for p in phases if name in p) for name in {n for p in phases for n in p}}


def _span(lengths: list[tuple[int, int]]) -> tuple[int, int] | None:
    """The shortest and longest of every rank's lengths."""
    if not lengths:
        return None
    return min(low for low, _ in lengths), max(high for _, high in lengths)


def _largest(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _plans_applied(reports: dict[int, TrialReport], world: int) -> str | None:
    """The plan as the ranks applied it: one plan, or one per rank where they differ."""
    if not reports or any(r not in reports or reports[r].plan_applied is None for r in range(world)):
        return None
    try:
        return str(Plan.per_rank([parse_plan(reports[r].plan_applied or "none") for r in range(world)]))
    except InputError:  # another backend's plan (ORT): as rank 0 applied it
        return reports[0].plan_applied
