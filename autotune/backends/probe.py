"""``autotune probe``: the recompute candidates of a model with what each would save, measured.

One trial of the script runs with the probe's instruments (autotune.backends.torch_probe). From its data this
module predicts, without torch, the memory any plan would save at the probed batch size.

The model is split into units, the instances of the outermost repeated class, in forward order. Without a
plan, backward starts with every unit's ``saved`` bytes alive. A checkpointed instance c keeps only its
inputs and what its operator policy caches (the outputs of the ops it saves), so its unit holds
``saved_u - sum_c (saved_c - kept_c - input_c)``. Backward walks the units in reverse, freeing as it goes,
and re-materialises a checkpointed unit when it reaches it, with only the earlier units still alive:

    peak = max(sum_u held_u,  max over checkpointed u of  sum_{v before u} held_v + saved_u)
    saving = sum_u saved_u - peak

A policy that caches outputs autograd would not have kept can save less than nothing; the prediction says so,
and such a plan is never offered.

An offload rule moves what its instances save to host memory, their inputs included, and brings it back
when backward reaches them: the same formula with nothing kept (on a GPU; on the CPU it saves nothing). A
compile budget saves what torch's partitioner says: the bytes its forward graphs save at the default
budget minus at this one (autotune.backends.torch_compile); module rules add theirs on top.

Which plans the search may use (:func:`default_plans`): those predicted to save memory that also passed the
probe's correctness check (each tried on the script's own model against no plan, torch_probe). Every other
plan the probe looked at is listed with the reason it was left out.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace

from autotune.backends import ort_plans
from autotune.backends.probe_report import InstanceStats, OrtProbeReport, ProbeReport, TorchProbeReport
from autotune.core.budget import format_bytes
from autotune.core.errors import InputError
from autotune.core.plans import (
    FSDP,
    OP_KINDS,
    OWN_OFF,
    ZERO,
    ModuleRule,
    OpPolicy,
    Plan,
    Sharding,
    Zero,
    parse_plan,
    recompute_part,
)

RECOMPUTABLE = ("activation", "softmax", "dropout", "norm", "elementwise")  # cheap to redo; matmuls are kept
EXPENSIVE = ("attention", "conv", "matmul")  # what the selective policy keeps, where a block has them
RATIOS = (0.25, 0.5, 0.75)  # partial checkpointing of the outermost repeated class (4 instances or more)


@dataclass(frozen=True)
class ProbeRow:
    """One line of the probe table, like ONNX Runtime's plan table."""

    level: str  # "module", "operator", "own", "offload", "compile", "fsdp" or "zero"
    plan: str
    frequency: int  # instances it applies to
    saving_bytes: int  # predicted, at the probed batch size
    saving_per_sample: float
    forward_share: float | None  # share of the forward pass that would be recomputed (None: not measured)
    detail: str = ""
    excluded: str = ""  # why the search leaves it out ("" if it may use it)
    # bytes a rank no longer holds whatever the batch size (a sharding's: parameters, gradients, optimizer
    # state; negative: it holds more); 0 where unknown (offload: measured)
    fixed_saving: int = 0


def predicted_saving(data: TorchProbeReport, plan: Plan) -> int:
    """Bytes ``plan`` is predicted to save at the probed batch size."""
    return _module_saving(data, plan) + _compile_saving(data, plan.compile_budget)


def _compile_saving(data: TorchProbeReport, budget: float | None) -> int:
    """What torch's partitioner saves at ``budget`` against its default (0 when it was not asked)."""
    if budget is None:
        return 0
    default, at = data.compile_partition(1.0), data.compile_partition(budget)
    return default.saved_bytes - at.saved_bytes if default is not None and at is not None else 0


def _module_saving(data: TorchProbeReport, plan: Plan) -> int:
    instances = {i.name: i for i in data.instances}
    chosen = _chosen(data, plan)
    outer = {c.cls for c in data.candidates if c.outermost}
    units = [i for i in data.instances if i.cls in outer]
    units = [u for u in units if not _has_ancestor(u.name, {v.name for v in units})]
    held, recomputed = [], []
    for unit in units:
        inside = [name for name in chosen if name == unit.name or name.startswith(unit.name + ".")]
        reduction = sum(_reduction(instances[n], chosen[n], data.gpu) for n in inside)
        held.append(unit.saved_bytes - reduction)
        recomputed.append(bool(inside))
    peak = sum(held)
    for index, unit in enumerate(units):
        if recomputed[index]:
            peak = max(peak, sum(held[:index]) + unit.saved_bytes)
    return int(sum(u.saved_bytes for u in units) - peak)


def _reduction(instance: InstanceStats, rule: ModuleRule, gpu: bool) -> int:
    """What an instance no longer holds on the device until backward reaches it."""
    if rule.offload:
        return instance.saved_bytes if gpu else 0
    return instance.saved_bytes - _kept(instance, rule.ops) - instance.input_bytes


def _chosen(data: TorchProbeReport, plan: Plan) -> dict[str, ModuleRule]:
    """The instances ``plan`` checkpoints, as apply_plan picks them (nested ones inside a chosen one dropped)."""
    rules = plan.rules
    if plan.everything:
        rules = tuple(ModuleRule(c.cls) for c in data.candidates if c.outermost)
    chosen: dict[str, ModuleRule] = {}
    for rule in rules:
        names = [i.name for i in data.instances if i.cls == rule.cls]
        chosen.update((names[i], rule) for i in rule.chosen(len(names)))
    return {name: rule for name, rule in chosen.items() if not _has_ancestor(name, set(chosen))}


def saving_per_sample(data: ProbeReport, plan: str) -> float:
    """The probe's predicted saving of ``plan`` per sample (either backend's probe)."""
    if isinstance(data, OrtProbeReport):
        return ort_plans.saving_per_sample(data, plan)
    return predicted_saving(data, parse_plan(plan)) / data.batch_size


def forward_share(data: ProbeReport, plan: str) -> float | None:
    """The share of the forward pass ``plan`` repeats in backward: the forward time of the instances it
    checkpoints, times the share of operator time its policy recomputes (None for an ORT probe)."""
    if isinstance(data, OrtProbeReport) or not data.forward_seconds:
        return None
    op_total = sum(data.op_seconds.values())
    instances = {i.name: i for i in data.instances}
    seconds = 0.0
    parsed = parse_plan(plan)
    if parsed.compile_budget is not None:
        return None  # the partitioner's choice of ops: not timed by the probe
    if parsed.sharding is not None and parsed.sharding.may_beat_own:
        return None  # communication saved (an all-gather per block, a ZeRO stage): not timed by the probe
    if parsed.own_off:  # negative: what the script's own checkpointing repeats is no longer repeated
        rest = forward_share(data, str(dataclasses.replace(parsed, own_off=False))) or 0.0
        return rest - _own_share(data)
    for name, rule in _chosen(data, parsed).items():
        recomputed = 0.0 if rule.offload else 1.0
        if rule.ops is not None and op_total > 0:
            recomputed = sum(t for kind, t in data.op_seconds.items() if not rule.ops.saves(kind)) / op_total
        seconds += instances[name].forward_seconds * recomputed
    return min(seconds / data.forward_seconds, 1.0)


def _own_share(data: TorchProbeReport) -> float:
    """The share of the forward pass the script's own checkpointing repeats: a Hugging Face model's switch
    checkpoints its layers, the outermost repeated class; calls of its own, anything up to all of it."""
    if not (data.own_checkpointing or "").startswith("gradient_checkpointing"):
        return 1.0
    outermost = {c.cls for c in data.candidates if c.outermost}
    seconds = sum(i.forward_seconds for i in data.instances if i.cls in outermost)
    return min(seconds / data.forward_seconds, 1.0) if data.forward_seconds else 1.0


def rows(data: ProbeReport) -> list[ProbeRow]:
    """Module rows (each repeated class in full), then operator rows inside the outermost regions, each with
    why it is excluded if it is; for an ORT probe, ORT's own recompute plans (its table: plan, frequency,
    bytes saved at the probed batch)."""
    if isinstance(data, OrtProbeReport):
        return [
            ProbeRow(
                "ort", p.plan, p.freq, p.saving_bytes, p.saving_bytes / data.batch_size, None, p.symbolic
            )
            for p in sorted(data.plans, key=lambda p: -p.saving_bytes)
        ]
    out = []
    forward = data.forward_seconds or 1e-9
    for c in data.candidates:
        seconds = sum(i.forward_seconds for i in data.instances if i.cls == c.cls)
        detail = "outermost" if c.outermost else "nested"
        out.append(_row(data, "module", f"{c.cls}:1", c.count, seconds / forward, detail))
    for region in (c for c in data.candidates if c.outermost):
        members = [i for i in data.instances if i.cls == region.cls]
        out += _operator_rows(data, region.cls, members)
    if data.own_checkpointing:
        out.append(
            _row(
                data, "own", OWN_OFF, 1, 0.0, f"the script's own checkpointing off: {data.own_checkpointing}"
            )
        )
    for region in (c for c in data.candidates if c.outermost):
        row = _row(
            data, "offload", f"{region.cls}:1/offload", region.count, 0.0, "saved tensors in host memory"
        )
        if not data.gpu:
            row = replace(row, excluded=GPU_ONLY)
        out.append(row)
    return out + _compile_rows(data) + _sharding_rows(data) + _zero_rows(data)


def _sharding_rows(data: TorchProbeReport) -> list[ProbeRow]:
    """For a script that shards its blocks with FSDP2: keeping their parameters unsharded from forward to
    backward (each holds the rest of its parameters, (1 - 1/ranks) of them, at the forward's end) or, for a
    script that keeps them itself, resharding them; resharding to each smaller group the ranks allow; and
    offloading (GPU only). Each is a question of speed against memory the probe does not time: measured,
    never left out as saving nothing."""
    if not data.sharded_blocks or data.shard_ranks < 2:
        return []
    ranks, size, blocks = data.shard_ranks, data.block_parameter_bytes, data.sharded_blocks
    # What a rank holds of the blocks' gathered parameters changes by "up to" the detail's bytes: all the
    # blocks' at backward's start, where the activations peak too. FSDP2's default holds two of them there
    # anyway (the block in backward and the one prefetched), so the number the memory model takes is the
    # other blocks' share (on this CPU, 2 and 4 ranks: fsdp:keep read 33-37 and 49-53 MiB over none where
    # this says 32 and 48; bench/results/sharding-cpu.txt).
    at_peak = max(blocks - 2, 0) / blocks
    if data.blocks_kept:  # the script keeps them: what resharding would free, at an all-gather's cost
        freed = size * (1 - 1 / ranks)
        out = [
            ProbeRow(
                "fsdp", str(Sharding(reshard=True)), blocks, 0, 0.0, None,
                f"up to {_mib(freed)} MiB less a rank, one all-gather more",
                fixed_saving=round(freed * at_peak),
            )
        ]  # fmt: skip
    else:
        held = size * (1 - 1 / ranks)
        out = [
            ProbeRow(
                "fsdp", str(Sharding(reshard=False)), blocks, 0, 0.0, None,
                f"up to {_mib(held)} MiB more a rank, one all-gather less",
                fixed_saving=-round(held * at_peak),
            )
        ]  # fmt: skip
    for group in (g for g in range(2, ranks) if ranks % g == 0):
        if data.blocks_kept:
            saving = size * (1 - 1 / group)
            change = f"up to {_mib(saving)} MiB less a rank"
        else:
            saving = -size * (1 / group - 1 / ranks)
            change = f"up to {_mib(-saving)} MiB more a rank"
        detail = f"{change}, backward's all-gather in groups of {group}"
        row = ProbeRow("fsdp", str(Sharding(reshard=group)), blocks, 0, 0.0, None, detail)
        out.append(replace(row, fixed_saving=round(saving * at_peak)))
    offload = ProbeRow(
        "fsdp", str(Sharding(offload=True)), blocks, 0, 0.0, None,
        "parameters, gradients and optimizer state in host memory",
    )  # fmt: skip
    checks = {c.plan: c for c in data.checks}
    out = [replace(r, excluded=checks[r.plan].reason) if r.plan in checks else r for r in out]
    return [*out, offload if data.gpu else replace(offload, excluded=GPU_ONLY)]


def _zero_rows(data: TorchProbeReport) -> list[ProbeRow]:
    """For a script that trains with DeepSpeed on several ranks: each ZeRO stage but its own, with what a
    rank holds of the parameters, gradients and optimizer state at that stage against its own (stage 1
    partitions the optimizer state over the ranks, 2 the gradients too, 3 the parameters too, gathered for
    each use), and offloading the optimizer state (GPU only). Each is a question of speed against memory
    the probe does not time: measured, never left out as saving nothing."""
    own, ranks = data.zero_stage, data.zero_ranks
    if own is None or ranks < 2:
        return []
    params, state = data.zero_parameter_bytes, data.zero_optimizer_bytes

    def held(stage: int) -> float:  # a rank's parameters, gradients (as large) and optimizer state
        return sum(
            size / ranks if stage >= at else size for size, at in ((params, 3), (params, 2), (state, 1))
        )

    out = []
    for stage in (s for s in range(4) if s != own):
        change = held(own) - held(stage)
        words = f"{_mib(abs(change))} MiB {'less' if change >= 0 else 'more'} a rank than stage {own}"
        gathers = ", parameters gathered for each use" if stage == 3 else ""
        out.append(
            ProbeRow(
                "zero", str(Zero(stage)), ranks, 0, 0.0, None, words + gathers, fixed_saving=round(change)
            )
        )
    offload = ProbeRow(
        "zero", str(Zero(max(own, 1), offload=True)), ranks, 0, 0.0, None,
        "optimizer state in host memory, its step on the CPU",
    )  # fmt: skip
    return [*out, offload if data.gpu else replace(offload, excluded=GPU_ONLY)]


GPU_ONLY = "GPU only: offloading to host memory saves nothing on the CPU"


def _compile_rows(data: TorchProbeReport) -> list[ProbeRow]:
    """A row per budget torch's partitioner was asked about (1, its default, is the plan none): a budget
    with the partition of a larger one is left out as that one."""
    default = data.compile_partition(1.0)
    out = []
    for part in data.compile_partitions:
        if part.ratio == 1.0 or default is None:
            continue
        detail = f"keeps {_mib(part.saved_bytes)} of {_mib(default.saved_bytes)} MiB" + (
            f" in {part.graphs} graphs" if part.graphs > 1 else ""
        )
        row = _row(data, "compile", f"compile:{part.ratio:g}", part.graphs, 0.0, detail)
        if part.same_as is not None:
            same = "none" if part.same_as == 1.0 else f"compile:{part.same_as:g}"
            row = replace(row, excluded=f"same partition as {same}")
        out.append(replace(row, forward_share=None))
    return out


def _operator_rows(data: TorchProbeReport, cls: str, members: list[InstanceStats]) -> list[ProbeRow]:
    """Inside one outermost class: recomputing each cheap op kind alone, then the selective policy (keep
    the expensive kinds this block has, recompute the rest), each only where the block has those ops."""
    op_total = sum(data.op_seconds.values()) or 1e-9
    out = []
    for kind in RECOMPUTABLE:
        saved = sum(i.saved_by_kind.get(kind, 0) for i in members)
        if saved:
            share = data.op_seconds.get(kind, 0.0) / op_total
            detail = f"{_mib(saved / data.batch_size)} MiB/sample kept"
            out.append(_row(data, "operator", f"{cls}:1/recompute={kind}", len(members), share, detail))
    policy = selective_policy(members)
    if policy is not None:
        share = sum(data.op_seconds.get(k, 0.0) for k in OP_KINDS if not policy.saves(k)) / op_total
        detail = f"keeps {' and '.join(policy.kinds)} outputs"
        out.append(_row(data, "operator", f"{cls}:1/{policy}", len(members), share, detail))
    return out


def selective_policy(members: list[InstanceStats]) -> OpPolicy | None:
    """Keep the outputs of the expensive op kinds these instances run (attention, convolutions, matmuls),
    recompute the rest (Megatron's selective recompute); None for a block that has none of them."""
    kinds = tuple(k for k in EXPENSIVE if any(i.output_bytes.get(k, 0) for i in members))
    return OpPolicy("save", kinds) if kinds else None


def plans_to_check(data: TorchProbeReport) -> tuple[str, ...]:
    """The plans the search may propose by default, each class in full (its ratios apply the same
    mechanism to fewer instances): the probe's correctness check tries each on the model."""
    table = rows(data)
    searched = {
        r.plan
        for r in table
        if r.level in ("module", "offload", "compile", "own") or "/save=" in r.plan
        if not r.excluded.startswith(("same partition", GPU_ONLY))
    }
    # what FSDP2 takes after sharding (keep, reshard) is tried on the script's model as the rest are; a
    # group, offload and a ZeRO stage are taken only as the model is sharded (checked_part)
    settable = {r.plan for r in table if r.level == "fsdp" and checked_part(r.plan) == r.plan}
    return tuple(
        r.plan
        for r in table
        if (r.plan in searched and (r.saving_bytes > 0 or r.level == "own")) or r.plan in settable
    )


def default_plans(data: ProbeReport | None) -> tuple[tuple[str, ...], dict[str, str]]:
    """The plans a search uses when the user names none, in the order its frontier visits them, and the
    plans left out with why.

    Order: none; for a script that checkpoints by itself, its own checkpointing off (own:off); for one
    that shards its blocks with FSDP2, keeping them unsharded after forward (fsdp:keep; fsdp:reshard for
    one that keeps them itself), each smaller reshard group, offload (GPU only); for one that trains with DeepSpeed, each ZeRO stage but its own, then
    offload (GPU only); the outermost classes in full; the selective operator-level plan of
    each; the outermost classes at 25/50/75% (four instances or more); the nested classes in full; for a script that compiles,
    each distinct compile budget, largest first; on a GPU, offloading the outermost classes. Left out: a
    plan predicted to save nothing, one that failed the probe's correctness check (its ratios with it), a
    budget with another's partition, offload on the CPU."""
    if isinstance(data, OrtProbeReport):
        return ort_plans.default_plans(data), {}
    if data is None:
        return ("none",), {}
    table = {r.plan: r for r in rows(data)}
    outer = [c for c in data.candidates if c.outermost]
    full = [f"{c.cls}:1" for c in outer]
    selective = [p for p in table if "/save=" in p]
    ratios = [f"{c.cls}:{ratio:g}" for c in outer if c.count >= 4 for ratio in RATIOS]
    nested = [f"{c.cls}:1" for c in data.candidates if not c.outermost]
    compiled = sorted((p for p in table if p.startswith("compile:")), key=lambda p: -float(p.split(":")[1]))
    offload = [p for p in table if p.endswith("/offload")]
    own = [OWN_OFF] if OWN_OFF in table else []  # right after none: the plan that may be fastest of all
    # resharding less may be faster too, and a ZeRO stage may fit where no recompute does
    sharding = [p for p in table if p.startswith((f"{FSDP}:", f"{ZERO}:"))]
    plans, excluded = ["none"], {}
    if data.compiles and data.compile_error:
        excluded["compile:*"] = f"torch's partitioner could not be asked: {data.compile_error}"
    for plan in dict.fromkeys(
        str(parse_plan(p))
        for p in [*own, *sharding, *full, *selective, *ratios, *nested, *compiled, *offload]
    ):
        row = table.get(plan) or table[f"{parse_plan(plan).rules[0].cls}:1"]  # a ratio: as its class
        if plan not in table and row.excluded:
            excluded[plan] = f"as {row.plan}: {row.excluded}"
        elif plan in table and row.excluded:
            excluded[plan] = row.excluded
        else:
            plans.append(plan)
    return tuple(plans), excluded


def fixed_saving(data: ProbeReport, plan: str) -> int:
    """Bytes a rank no longer holds whatever the batch size under ``plan``: its sharding's (the probe's row
    for it), 0 for a plan without one, one the probe has no row for, or an ORT probe."""
    if isinstance(data, OrtProbeReport) or recompute_part(plan) is None:
        return 0
    sharding = str(parse_plan(plan).sharding)
    return next((r.fixed_saving for r in rows(data) if r.plan == sharding), 0)


def checked_part(plan: str) -> str:
    """What of a plan (one rank's entry) the probe's check tries on the script's model in its process: all of
    it where its sharding is one FSDP2 takes after sharding (fsdp:keep, fsdp:reshard: Sharding.settable),
    else all of it but the sharding (a reshard group, offload, a ZeRO stage: the script's own fully_shard or
    deepspeed.initialize takes those before the first forward; they keep the numbers by FSDP's and
    DeepSpeed's design, and tests/ranks check them)."""
    rest = recompute_part(plan)
    if rest is None:
        return str(parse_plan(plan))
    parsed = parse_plan(plan)
    return str(parsed) if isinstance(parsed.sharding, Sharding) and parsed.sharding.settable else rest


def named_plans(plans: tuple[str, ...], data: ProbeReport | None) -> tuple[tuple[str, ...], dict[str, str]]:
    """The plans named with ``--plans`` that the search may use, and those whose check against no plan
    failed, with why.

    Raises:
        InputError: every named plan failed its check.
    """
    checks = {c.plan: c for c in data.checks} if isinstance(data, TorchProbeReport) else {}
    excluded = _same_partitions(plans, data) if isinstance(data, TorchProbeReport) else {}
    for plan in plans if checks else ():  # a per-rank plan stands or falls with its entries
        parts = (checked_part(str(x)) for x in parse_plan(plan).entries)
        failed = [checks[e] for e in parts if e in checks and not checks[e].ok]
        if failed:
            excluded[plan] = (
                failed[0].reason
                if len(parse_plan(plan).entries) == 1
                else f"{failed[0].plan}: {failed[0].reason}"
            )
    kept = tuple(p for p in plans if p not in excluded)
    if not kept:
        reasons = "; ".join(f"{plan}: {why}" for plan, why in excluded.items())
        raise InputError(f"no plan named with --plans keeps the numbers of no plan: {reasons}")
    return kept, excluded


def _same_partitions(plans: tuple[str, ...], data: TorchProbeReport) -> dict[str, str]:
    """Named compile plans whose partition is an earlier named plan's (or the default's: none): one
    candidate, measured once. Plans whose budget the probe did not ask about are kept."""
    seen: dict[tuple[object, ...], str] = {}
    default = data.compile_partition(1.0)
    if default is not None:
        seen[((), default.partition)] = "none"
    excluded = {}
    for plan in plans:
        parsed = parse_plan(plan)
        part = data.compile_partition(parsed.compile_budget) if parsed.compile_budget is not None else None
        if parsed.ranks or part is None:
            continue
        key = (parsed.rules, part.partition)
        if key in seen:
            excluded[plan] = f"same partition as {seen[key]} (measured once)"
        else:
            seen[key] = plan
    return excluded


def summary(data: ProbeReport) -> dict[str, int | float | None]:
    """Fixed memory and the activation total."""
    if isinstance(data, OrtProbeReport):
        return {"weights_bytes": data.weights_bytes, "ort_plans": len(data.plans)}
    return {
        "weights_bytes": data.weights_bytes,
        "gradients_bytes": data.gradients_bytes,
        "optimizer_state_bytes": data.optimizer_state_bytes,
        "activation_bytes": data.activation_bytes,
        "activation_bytes_per_sample": data.activation_bytes / data.batch_size,
    }


def check_plans(plans: tuple[str, ...] | None, data: ProbeReport | None) -> None:
    """Refuse, before any measured trial, a torch plan naming a module class the probe did not find.

    Raises:
        InputError: naming the class and the model's candidates.
    """
    if not plans or not isinstance(data, TorchProbeReport):
        return  # nothing to check against: ORT plans, or a script that trained no torch module
    known = {c.cls: c.count for c in data.candidates}
    for plan in plans:
        if parse_plan(plan).compiles and not data.compiles:
            raise InputError(
                f"plan {plan!r} sets torch.compile's activation memory budget, but the script never calls "
                "torch.compile (the probe saw it train eagerly)"
            )
        for rule in (r for entry in parse_plan(plan).entries for r in entry.rules):
            if rule.cls not in known:
                listed = (
                    ", ".join(f"{cls} x{count}" for cls, count in known.items())
                    or "none (no repeated modules)"
                )
                raise InputError(
                    f"plan {plan!r} names {rule.cls}, not a repeated module class of this model; "
                    f"candidates: {listed} (autotune probe lists them)"
                )


def _row(
    data: TorchProbeReport, level: str, plan: str, frequency: int, share: float, detail: str
) -> ProbeRow:
    saving = predicted_saving(data, parse_plan(plan))
    check = next((c for c in data.checks if c.plan == plan), None)
    if level == "own":  # it keeps more than none, to recompute less: a question of speed, not of memory
        excluded = check.reason if check is not None and not check.ok else ""
        if data.checks and check is None:
            excluded = "not checked against no plan"
    elif saving <= 0:
        excluded = (
            "predicted to save nothing" if saving == 0 else f"predicted to cost {format_bytes(-saving)}"
        )
    elif check is not None and not check.ok:
        excluded = check.reason
    elif data.checks and check is None and (level in ("module", "offload", "compile") or "/save=" in plan):
        excluded = "not checked against no plan"
    else:
        excluded = ""
    return ProbeRow(level, plan, frequency, saving, saving / data.batch_size, share, detail, excluded)


def _kept(instance: InstanceStats, ops: OpPolicy | None) -> int:
    """The output bytes a checkpointed instance caches under ``ops``: every recorded kind the policy saves,
    ops of no named kind ("other": embeddings, gathers, ...) included, as the policy in the trial decides
    (autotune.backends.torch_modules._policy; the probe records only the outputs it may cache)."""
    if ops is None:
        return 0
    return sum(size for kind, size in instance.output_bytes.items() if ops.saves(kind))


def _has_ancestor(name: str, names: set[str]) -> bool:
    parts = name.split(".")
    return any(".".join(parts[:i]) in names for i in range(1, len(parts)))


def _mib(size: float) -> str:
    return f"{size / 2**20:.2f}"
