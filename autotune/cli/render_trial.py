"""What ``measure``, ``probe`` and ``doctor`` print."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table

from autotune.backends import probe
from autotune.backends.probe_report import OrtProbeReport, ProbeReport, TorchProbeReport
from autotune.cli.console import as_json, key_values
from autotune.cli.fit import PlanNames, plan_width
from autotune.core.budget import format_bytes, signed_bytes
from autotune.core.plans import OWN_OFF
from autotune.core.protocol import Outcome
from autotune.hardware.doctor import Check
from autotune.runtime.inputs import varied_lengths
from autotune.trials.result import TrialResult


def measured(result: TrialResult) -> str:
    """``autotune measure``'s human output."""
    rows = [
        ("outcome", result.outcome.value),
        ("device", f"{result.device} ({result.device_name})"),
        ("batch size", str(result.batch_size)),
    ]
    if result.grad_accum is not None or (result.micro_batches or 1) > 1:
        accumulation = result.grad_accum or result.micro_batches or 1
        how = "asked" if result.grad_accum is not None else "counted from the script's forwards"
        rows.append(
            (
                "accumulation",
                f"{accumulation} micro-batch{'es' if accumulation > 1 else ''} per optimizer step ({how}): "
                f"{result.batch_size * accumulation} samples per step",
            )
        )
    rows += [
        ("plan", result.plan),
        ("peak memory", f"{format_bytes(result.peak_bytes)} ({result.memory_method})"),
    ]
    if result.ranks:
        worst = max(result.ranks, key=lambda r: r.peak_bytes)
        rows[-1] = (
            "peak memory",
            f"{format_bytes(result.peak_bytes)} (rank {worst.rank}, the worst of "
            f"{result.world_size or len(result.ranks)}; {result.memory_method})",
        )
        rows += [
            (
                f"  rank {r.rank}",
                f"{format_bytes(r.peak_bytes)} on {r.device}"
                + (f", {r.outcome.value}" if r.outcome not in (None, Outcome.COMPLETE) else "")
                + ("" if r.outcome is not None else ", stopped"),
            )
            for r in result.ranks
        ]
    if result.samples_per_sec is not None:
        times = sorted(result.step_seconds)
        every = f" (every rank's samples, {result.world_size} ranks)" if (result.world_size or 1) > 1 else ""
        tokens = f", {result.tokens_per_sec:,.0f} tokens/s" if result.tokens_per_sec is not None else ""
        rows.append(("throughput", f"{result.samples_per_sec:,.1f} samples/s{tokens}{every}"))
        rows.append(
            (
                "step time",
                f"median {_ms(times[len(times) // 2])}, min {_ms(times[0])}, max {_ms(times[-1])} "
                f"over {len(times)} steps",
            )
        )
    if result.slow_start:
        rows.append(("warm-up", f"measured past {result.slow_start}"))
    if result.lengths is not None and result.lengths[0] != result.lengths[1]:
        rows.append(("inputs", varied_lengths(result.lengths)))
    if result.torch_peak_reserved is not None:
        rows.append(
            (
                "torch peak",
                f"{format_bytes(result.torch_peak_allocated or 0)} allocated, "
                f"{format_bytes(result.torch_peak_reserved)} reserved",
            )
        )
    if result.peak_phase is not None:
        jobs = "".join(
            f", {name} {format_bytes(peak)}" for name, peak in sorted((result.phase_peaks or {}).items())
        )
        unsampled = sorted(set(result.phase_seconds or {}) - set(result.phase_peaks or {}))
        rows.append(
            (
                "phases",
                f"warm-up ({result.warmup_steps} steps) {format_bytes(result.warmup_peak_bytes or 0)}, "
                f"steady {format_bytes(result.steady_peak_bytes or 0)}{jobs} (sampled): the peak was set in "
                f"{result.peak_phase}; the budget is checked against the whole run's"
                + (f" ({', '.join(unsampled)} too short for a sample)" if unsampled else ""),
            )
        )
    if result.own_checkpointing:
        rows.append(("own recompute", own_text(result.own_checkpointing, result.plan)))
    if result.compile_cache:
        cache = result.compile_cache
        rows.append(
            (
                "compile cache",
                f"graphs: {cache.get('fx_graph_hits', 0)} reused, {cache.get('fx_graph_misses', 0)} compiled "
                "(torch.compile's caches are the workload's own, under the cache dir: later trials reuse them)",
            )
        )
    if result.budget_bytes is not None:
        rows.append(
            ("budget", f"{format_bytes(result.budget_bytes)}: {_verdict(result, result.budget_bytes)}")
        )
    if result.memory_note:
        rows.append(("note", result.memory_note))
    rows.append(("logs", result.log_dir))
    text = key_values(rows)
    return f"{text}\n\n{result.error}" if result.error else text


def _verdict(result: TrialResult, budget_bytes: int) -> str:
    if result.outcome is Outcome.OVER_BUDGET:
        return "does not fit: stopped as soon as its peak passed the budget"
    if result.outcome is not Outcome.COMPLETE:
        return f"unknown: the trial did not complete ({result.outcome.value})"
    margin = budget_bytes - result.peak_bytes
    verdict = "fits" if result.fits(budget_bytes) else "does not fit"
    return f"{verdict} ({format_bytes(abs(margin))} {'to spare' if margin >= 0 else 'over'})"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def probed(out: Console, result: TrialResult, as_json_flag: bool) -> None:
    """``autotune probe``: fixed memory, activations per sample, and the candidate table."""
    data = result.probe
    if result.outcome is not Outcome.COMPLETE:
        out.print(f"probe trial {result.outcome.value}: {result.error}\nlogs: {result.log_dir}", markup=False)
        return
    if data is None:
        out.print("nothing to probe: the script never ran the forward of a torch module", markup=False)
        return
    table_rows = probe.rows(data)
    if as_json_flag:
        out.print(
            as_json(
                {
                    "outcome": result.outcome.value,
                    "batch_size": data.batch_size,
                    "peak_bytes": result.peak_bytes,
                    **probe.summary(data),
                    "candidates": [row.__dict__ for row in table_rows],
                }
            ),
            markup=False,
        )
        return
    if isinstance(data, OrtProbeReport):
        out.print(
            f"ONNX Runtime: {len(table_rows)} recompute plan(s) from ORTModule's memory optimizer "
            f"(savings at batch {data.batch_size}); peak {format_bytes(result.peak_bytes)} "
            f"({result.memory_method}, probe trial)",
            markup=False,
        )
    else:
        _torch_probe_header(out, data, result)
    if not table_rows:
        out.print("no repeated modules found: only the plan none applies to this model", markup=False)
        return
    _probe_table(out, data, table_rows)


def fixed_text(data: TorchProbeReport) -> str:
    """The probe's fixed memory in words: what this rank holds, said so where FSDP2 or ZeRO shards it."""
    state = data.optimizer_state_bytes
    ranks = data.shard_ranks if data.sharded_blocks else data.zero_ranks if (data.zero_stage or 0) >= 1 else 0
    return (
        f"weights {format_bytes(data.weights_bytes)}, gradients {format_bytes(data.gradients_bytes)}, "
        f"optimizer state {format_bytes(state) if state is not None else 'unknown (no torch.optim)'}"
        + (f" (this rank's: sharded over {ranks} ranks)" if ranks >= 2 else "")
    )


def _torch_probe_header(out: Console, data: TorchProbeReport, result: TrialResult) -> None:
    out.print(
        key_values(
            [
                ("fixed", fixed_text(data)),
                (
                    "activations",
                    f"{format_bytes(data.activation_bytes / data.batch_size)} per sample kept for backward "
                    f"({format_bytes(data.activation_bytes)} at batch {data.batch_size})",
                ),
                ("peak", f"{format_bytes(result.peak_bytes)} ({result.memory_method}, instrumented trial)"),
            ]
        ),
        markup=False,
    )


LEVELS_WIDTH = 100  # the probe table's level column, from this many columns


def _probe_table(out: Console, data: ProbeReport, table_rows: list[probe.ProbeRow]) -> None:
    """One row per candidate plan, readable at 80 columns: plan names shortened as ``run`` and ``show``
    shorten them (with the legend below), numbers never wrapped, only the note folds; a plan the search
    does not offer says so in its note and why below (issue 44: at 80 columns five rows read
    ``Block:…`` and every number wrapped onto three lines)."""
    names = PlanNames(plan_width(out.width))
    levels = out.width >= LEVELS_WIDTH  # narrower, the plan's name says it: X:1, X:1/rc=op, X:1/offload
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    if levels:
        table.add_column("level", no_wrap=True)
    table.add_column("plan", no_wrap=True)
    for column in ("freq", f"saved @{data.batch_size}", "/sample", "fwd"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("note")
    for row in table_rows:
        table.add_row(
            *([row.level] if levels else []),
            names(row.plan),
            str(row.frequency),
            signed_bytes(row.saving_bytes),
            signed_bytes(row.saving_per_sample),
            f"{row.forward_share:.0%}" if row.forward_share is not None else "-",
            _probe_note(row),
        )
    out.print(table)
    out.print(
        "saved: activation memory the plan frees at the probe's batch, and per sample; fwd: the share of the "
        "forward it runs again in the backward",
        markup=False,
        soft_wrap=False,  # prose: wrapped at words
    )
    if legend := names.legend():
        out.print(legend, markup=False, soft_wrap=False)
    for row in table_rows:
        if row.excluded:
            out.print(f"not offered: {row.plan}: {row.excluded}", markup=False, soft_wrap=False)
    checked = [c for c in data.checks if c.skipped is None] if isinstance(data, TorchProbeReport) else []
    if checked:
        passed = [c for c in checked if c.ok]
        worst = max((c.grad_delta or 0.0 for c in passed), default=0.0)
        out.print(
            f"checked against no plan (one step on the probe's batch): {len(passed)} of {len(checked)} "
            f"plan(s) give the same loss and gradients (largest relative gradient difference {worst:.1e})",
            markup=False,
            soft_wrap=False,
        )


def _probe_note(row: probe.ProbeRow) -> str:
    """A candidate's note: what it keeps or where it sits, and whether the search leaves it out (why: below
    the table)."""
    return "not offered" if row.excluded else row.detail


def check_lines(out: Console, c: Check) -> None:
    """One of doctor's checks, printed as soon as it is done: ``ok  torch: ...``, then what to do if not."""
    out.print(f"{'ok ' if c.ok else 'no '} {c.name}: {c.detail}", markup=False)
    if c.hint:
        out.print(f"     -> {c.hint}", markup=False)


def own_text(own: str, plan: str) -> str:
    """What a script that checkpoints by itself is told beside a trial or an answer of ``plan``."""
    if OWN_OFF in plan.split(","):
        return f"the script checkpoints by itself: {own}; the plan turns it off (train with it off)"
    return f"the script checkpoints by itself: {own}; the plan adds to it, none keeps it (keep it on)"
