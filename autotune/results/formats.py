"""``autotune best --format``: the answer in the user's own words.

- ``env``: shell exports (``AUTOTUNE_BATCH_SIZE``, ``AUTOTUNE_PLAN``...), for a script that calls
  ``autotune.batch_size()`` / ``autotune.prepare(model)``;
- ``json``: everything ``best`` knows;
- ``hf``: Hugging Face ``TrainingArguments`` fields (and the same as command-line flags);
- ``lightning``: ``Trainer`` arguments and the DataLoader's batch size;
- ``torchrun``: the run's own command (a torchrun argument list, or whatever the template was) with the
  answer filled in, ready to paste.

A plan a framework cannot express (a fraction of the blocks, an operator-level policy, an ORT plan) is given
as the one ``autotune.prepare`` line to add and the ``AUTOTUNE_PLAN`` it reads. Hugging Face's
``gradient_checkpointing=True`` recomputes every decoder layer: autotune's plan says the same when it names
the model's outermost repeated class with ratio 1 and no operator policy (or ``all``). Where the script
checkpoints by itself (the probe saw it: ``gradient_checkpointing_enable()``, or ``torch.utils.checkpoint``
in its own forwards), every trial measured it on and every plan added to it: each format says so, and
``hf`` keeps ``gradient_checkpointing=True``. A compile plan's
budget is one line of torch's own (``torch._functorch.config.activation_memory_budget = R`` before the
first compiled step), and a sharding plan's the arguments of the script's ``fully_shard`` calls on its
blocks, a ZeRO plan's ``zero_optimization`` section of the DeepSpeed config, given in every format: nothing
of autotune is needed to apply them.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.core.plans import Backend, Plan, Zero, parse_plan
from autotune.core.protocol import BACKEND_ENV, PLAN_ENV

if TYPE_CHECKING:
    from autotune.results.best import BestAnswer

FORMATS = ("env", "json", "hf", "lightning", "torchrun")
PREPARE_LINE = "model = autotune.prepare(model)"


def render(answer: BestAnswer, fmt: str) -> str:
    """``answer`` in format ``fmt`` (one of FORMATS), as the lines to print."""
    return {
        "env": env,
        "json": lambda a: json.dumps(a.to_dict(), indent=2, default=str),
        "hf": hugging_face,
        "lightning": lightning,
        "torchrun": command_line,
    }[fmt](answer)


def env(answer: BestAnswer) -> str:
    exports = [f"export {name}={shlex.quote(value)}" for name, value in answer.env().items()]
    return "\n".join(exports + _commented(torch_settings(answer)))


def torch_settings(answer: BestAnswer) -> list[str]:
    """torch's own settings for what the plan sets that torch can say itself, each a "# " line saying what
    it is, then its code: a compile plan's budget, a sharding plan's fully_shard arguments (nothing for any
    other plan, or one per rank), a ZeRO plan's section of the DeepSpeed config."""
    plan = parse_plan(answer.plan) if answer.backend is Backend.TORCH else Plan.none()
    lines = []
    if plan.compile_budget is not None:
        lines += [
            f"# torch.compile's activation memory budget {plan.compile_budget:g}: without autotune, set it "
            "before the first compiled step",
            "import torch._functorch.config",
            f"torch._functorch.config.activation_memory_budget = {plan.compile_budget:g}",
        ]
    if isinstance(plan.sharding, Zero):
        lines += [
            f"# {plan.sharding}: DeepSpeed's own settings, in the config the script passes to "
            "deepspeed.initialize (pin_memory on a GPU)",
            f'"zero_optimization": {json.dumps(plan.sharding.config(pin_memory=True))}',
        ]
    elif plan.sharding is not None:
        arguments = ", ".join(f"{k}={v}" for k, v in plan.sharding.arguments().items())
        lines += [
            f"# {plan.sharding}: FSDP2's own arguments, in the script's fully_shard call on each block "
            "(not the root)",
            *(["from torch.distributed.fsdp import CPUOffloadPolicy"] if plan.sharding.offload else []),
            f"fully_shard(block, {arguments})",
        ]
    return lines


def _commented(lines: list[str]) -> list[str]:
    return [line if line.startswith("#") else f"# {line}" for line in lines]


def every_block(answer: BestAnswer) -> str | None:
    """The class whose every instance the plan recomputes, whole, when that is the model's outermost repeated
    class (what a framework's own gradient-checkpointing switch does); None for any other plan."""
    if answer.backend is not Backend.TORCH:
        return None
    plan = parse_plan(answer.plan)
    if plan.everything:
        return answer.outermost[0] if answer.outermost else "every repeated block"
    if plan.ranks or len(plan.rules) != 1 or plan.compile_budget is not None or plan.sharding is not None:
        return None
    rule = plan.rules[0]
    if rule.ratio != 1 or rule.ops or rule.offload or (answer.outermost and rule.cls not in answer.outermost):
        return None
    return rule.cls


def _plan_lines(answer: BestAnswer, where: str, prepare: str = PREPARE_LINE) -> list[str]:
    """How to apply a plan the framework has no argument for: the prepare line, and what it reads."""
    if _no_plan(answer):
        return []
    setting = torch_settings(answer)
    if setting and not parse_plan(answer.plan).rules:  # torch's lines are the whole plan
        return setting
    return [
        *setting,
        f"# the plan {answer.plan} has no argument here: add one line {where}",
        f"#   {prepare}",
        "# and train with these in the environment (autotune.prepare reads them):",
        *(f"export {k}={shlex.quote(v)}" for k, v in _plan_env(answer).items()),
    ]


def _own_lines(answer: BestAnswer) -> list[str]:
    """What the script checkpoints by itself, kept: every configuration was measured with it."""
    if answer.own_checkpointing is None:
        return []
    if answer.backend is Backend.TORCH and parse_plan(answer.plan).own_off:
        return [
            f"# the script checkpoints by itself ({answer.own_checkpointing}): the plan {answer.plan} turns "
            "it off, measured faster and within the budget: train with it off"
        ]
    return [
        f"# the script checkpoints by itself ({answer.own_checkpointing}): every trial measured it on, and "
        f"the plan {answer.plan} adds to it; keep it on (the plans that turn it off, own:off, did not win)"
    ]


def _header(answer: BestAnswer, framework: str) -> str:
    accum = f" x {answer.grad_accum} accumulated" if answer.grad_accum else ""
    return (
        f"# {framework}: batch {answer.batch_size}{accum}, plan {answer.plan}, "
        f"{answer.samples_per_sec:,.1f} samples/s ({answer.source})"
    )


def hf_vocabulary() -> tuple[str, frozenset[str]]:
    """The checkpointing switch the installed transformers names, and which of Hugging Face's placement and
    offload its kwargs take (``activation_checkpointing_kwargs={"every_n_layers": k, "offload": True}``):
    transformers 5.24 renamed ``gradient_checkpointing`` to ``activation_checkpointing`` (the old name a
    deprecated alias until v6) and added both. Read from its files, never imported (``best`` imports no
    torch); without transformers here, the old name, which every 5.x version takes."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or spec.origin is None:
        return "gradient_checkpointing", frozenset()
    package = Path(spec.origin).parent
    try:
        arguments = (package / "training_args.py").read_text(encoding="utf-8")
        modeling = (package / "modeling_utils.py").read_text(encoding="utf-8")
    except OSError:
        return "gradient_checkpointing", frozenset()
    if "activation_checkpointing_kwargs" not in arguments:
        return "gradient_checkpointing", frozenset()
    enable = re.search(r"def activation_checkpointing_enable\(([^)]*)\)", modeling)
    words = enable[1] if enable else ""
    return "activation_checkpointing", frozenset(k for k in ("every_n_layers", "offload") if k in words)


def every_n_layers(answer: BestAnswer) -> tuple[int, bool] | None:
    """The plan as Hugging Face's own placement, where it is one: a ratio 1/k of the outermost repeated
    class (with offload or not), whose chosen layers (autotune.core.plans.ModuleRule.chosen) are exactly
    those Hugging Face's ``every_n_layers=k`` checkpoints (``layer_index % k == 0``); None otherwise."""
    if answer.backend is not Backend.TORCH:
        return None
    plan = parse_plan(answer.plan)
    if (
        plan.ranks
        or len(plan.rules) != 1
        or plan.compile_budget is not None
        or plan.own_off
        or plan.sharding is not None
    ):
        return None
    rule = plan.rules[0]
    layers = answer.layers.get(rule.cls)
    if rule.ops or not layers or not answer.outermost or rule.cls not in answer.outermost:
        return None
    chosen = rule.chosen(layers)
    k = layers // len(chosen)
    return (k, rule.offload) if chosen == list(range(0, layers, k)) else None


def hugging_face(answer: BestAnswer) -> str:
    name, taken = hf_vocabulary()
    block = every_block(answer)
    own = (answer.own_checkpointing or "").startswith("gradient_checkpointing")
    # where the script checkpoints every layer itself, every trial measured that: no placement replaces it
    every, kwargs = _hf_placement(answer, taken) if not own else (False, {})
    fields: list[tuple[str, str]] = [("per_device_train_batch_size", str(answer.batch_size))]
    if answer.grad_accum:
        fields.append(("gradient_accumulation_steps", str(answer.grad_accum)))
    none = _no_plan(answer)
    plan = parse_plan(answer.plan) if answer.backend is Backend.TORCH else Plan.none()
    fields.append((name, "True" if block or every or (own and not plan.own_off) else "False"))
    if kwargs:
        fields.append((f"{name}_kwargs", json.dumps(kwargs)))
    lines = [_header(answer, "Hugging Face TrainingArguments"), *(f"{k}={_python(v)}" for k, v in fields)]
    flags = " ".join(f"--{k} {_flag(v)}" for k, v in fields)
    lines.append(f"# as command-line flags: {flags}")
    lines += _own_lines(answer)
    whole = own and plan == Plan(own_off=True)  # checkpointing off is the whole plan
    if every and not none:
        lines.append(f"# {name} with {json.dumps(kwargs)} checkpoints the layers the plan {answer.plan} does")
    elif block and not none:
        lines.append(f"# {name} recomputes every {block}: the plan {answer.plan}")
    elif not none and not whole:
        lines += _plan_lines(answer, "after the model is built, before the Trainer")
    return "\n".join(lines)


def _hf_placement(answer: BestAnswer, taken: frozenset[str]) -> tuple[bool, dict[str, object]]:
    """Whether Hugging Face's own placement says the plan beyond its switch, and the kwargs that say it
    (none for every layer, which the switch alone says; nothing where this transformers takes no such
    kwargs: autotune.prepare applies the plan then)."""
    every = every_n_layers(answer)
    if every is None or every == (1, False):
        return False, {}
    kwargs: dict[str, object] = {
        **({"every_n_layers": every[0]} if every[0] > 1 else {}),
        **({"offload": True} if every[1] else {}),
    }
    return (True, kwargs) if set(kwargs) <= taken else (False, {})


def _python(value: str) -> str:
    """A field's value as Python source: a JSON object of kwargs becomes a dict (true -> True)."""
    return value.replace("true", "True") if value.startswith("{") else value


def _flag(value: str) -> str:
    """A field's value on a command line: booleans in lower case, a JSON object quoted for the shell."""
    if value in ("True", "False"):
        return value.lower()
    return shlex.quote(value) if value.startswith("{") else value


def lightning(answer: BestAnswer) -> str:
    lines = [
        _header(answer, "Lightning"),
        f"Trainer(accumulate_grad_batches={answer.grad_accum or 1})",
        f"DataLoader(..., batch_size={answer.batch_size})  # in train_dataloader(): the batch per device",
    ]
    block = every_block(answer)
    lines += _own_lines(answer)
    if block and answer.outermost:
        lines.append(f"# with FSDPStrategy, activation_checkpointing_policy={{{block}}} is the same plan")
    lines += _plan_lines(
        answer, "in your LightningModule's configure_model()", "self.model = autotune.prepare(self.model)"
    )
    return "\n".join(lines)


def command_line(answer: BestAnswer) -> str:
    """The study's own command with the batch size (and accumulation) filled in, the plan in front."""
    from autotune.trials.command import PLACEHOLDER, fill

    if not answer.command and answer.command_check:  # no signed command to print: say why
        return "\n".join([_header(answer, "the tuned command"), f"# {answer.command_check}"])
    if answer.template:
        words = fill(answer.command, answer.batch_size, answer.grad_accum)
        if not any(PLACEHOLDER in w for w in answer.command):  # the script asks autotune.batch_size()
            exports = answer.env()
        else:
            exports = {} if _no_plan(answer) else _plan_env(answer)
    else:  # a script run under the harness: it reads the batch size from autotune.batch_size()
        words = ["python", *answer.command]
        exports = answer.env()
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in exports.items())
    line = f"{prefix} {shlex.join(words)}" if prefix else shlex.join(words)
    lines = [_header(answer, "the tuned command"), line, *_own_lines(answer)]
    if answer.command_check:
        lines.insert(1, f"# {answer.command_check}")
    if exports.get(PLAN_ENV, "none") != "none" and answer.template:
        lines.insert(1, f"# the script applies the plan with one line: {PREPARE_LINE}")
    return "\n".join(lines + _commented(torch_settings(answer)))


def _no_plan(answer: BestAnswer) -> bool:
    return parse_plan(answer.plan) == Plan.none()


def _plan_env(answer: BestAnswer) -> dict[str, str]:
    """The plan's variables (and a backend's own, ORT's), without the batch size the framework is given."""
    kept = (PLAN_ENV, BACKEND_ENV)
    return {k: v for k, v in answer.env().items() if k in kept or not k.startswith("AUTOTUNE_")}
