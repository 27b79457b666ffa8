"""DeepSpeed ZeRO plans (``zero:...``: autotune.core.plans.Zero): the config the script passes to its own
``deepspeed.initialize`` gets the plan's stage and offload, with no change to the script.

DeepSpeed builds its engine, and partitions the optimizer state, gradients or parameters, in
``deepspeed.initialize``, before the first forward, so the plan cannot wait for the model as a recompute plan
does: in a trial, ``deepspeed.initialize`` is replaced as ``deepspeed`` is imported (autotune.runtime.hooks) by
:func:`watch_initialize`'s wrapper, which asks the running trial for its ZeRO plan at each call. The wrapper
reads the config where DeepSpeed would (``config``, the older ``config_params``, or a path in
``args.deepspeed_config``: a dict, a JSON/HJSON file or base64, through DeepSpeed's own loader), sets
``zero_optimization.stage`` and the offload sections in a copy (the script's dict is left as it was), passes
that copy, and checks that the engine it returns runs the stage asked (DeepSpeed's own word for it:
``engine.zero_optimization_stage()``). Every other key is the script's: micro-batch, precision, buckets.
What each call was given is recorded: a plan that found no ``deepspeed.initialize`` call is refused at the
model's first forward (:func:`check_applied`).

DeepSpeed's rules stand: a ``PipelineModule`` takes stages 0 and 1 only, and offload needs a stage (1-3). A
model built inside ``deepspeed.zero.Init`` (stage 3's partitioned construction, which Hugging Face uses when
the config says stage 3) is partitioned before ``deepspeed.initialize`` is called; only stage 3 can train
it, so any other stage is refused with one line. Outside a trial (``autotune.prepare`` after a run) the
engine exists already: an engine that runs the plan's stage passes, one that runs another is one line naming
the config to write (:func:`check_applied`).
"""

from __future__ import annotations

import copy
import functools
import inspect
import json
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from autotune.core.errors import InputError
from autotune.core.plans import Zero

# what each of this run's deepspeed.initialize calls was given by the plan (None: no plan), and what each
# engine it built runs (ZeroEngine); a warm process's next configuration starts them anew
_APPLIED: list[Zero | None] = []
_ENGINES: list[ZeroEngine] = []


@dataclass(frozen=True)
class ZeroEngine:
    """What a DeepSpeed engine of the script runs: its ZeRO stage, the data-parallel ranks it partitions
    over, and its model's parameters' full bytes (a stage-3 parameter's too, of which a rank holds a part)."""

    stage: int
    ranks: int
    parameter_bytes: int


def watch_initialize(zero_now: Callable[[], Zero | None]) -> None:
    """From now on, every ``deepspeed.initialize`` the script reaches through the ``deepspeed`` module
    applies ``zero_now()`` to the config it passes. A script that bound the function before this call
    (``from deepspeed import initialize`` before autotune saw ``deepspeed`` imported) is not seen: in a trial
    the wrapper goes in as the module is imported, before the script's own import returns."""
    module: Any = sys.modules.get("deepspeed")
    original = getattr(module, "initialize", None)
    if original is None or getattr(original, "_autotune_zero", False):
        return
    module.initialize = _wrapped(original, zero_now, module)


def _wrapped(
    original: Callable[..., Any], zero_now: Callable[[], Zero | None], deepspeed: Any
) -> Callable[..., Any]:
    @functools.wraps(original)
    def initialize(*args: Any, **kwargs: Any) -> Any:
        zero = zero_now()
        _APPLIED.append(zero)
        if zero is None:
            return _seen(original(*args, **kwargs))
        bound = _bind(original, args, kwargs)
        model = bound.get("model")
        if zero.stage not in (None, 3) and _built_partitioned(model):
            raise InputError(
                f"plan {zero}: the script built its model inside deepspeed.zero.Init (ZeRO stage 3's "
                "partitioned construction), which only stage 3 trains; zero plans other than zero:3 do not apply"
            )
        config, script_args = _config(bound, deepspeed)
        bound["config"] = _with_zero(config, zero, pin_memory=torch.cuda.is_available())
        bound.pop("config_params", None)
        if script_args is not None:  # the config came from its args: DeepSpeed takes one source
            bound["args"] = script_args
        out = _seen(original(**bound))
        stage = _ENGINES[-1].stage if _ENGINES else None
        if zero.stage is not None and stage is not None and stage != zero.stage:
            raise InputError(
                f"plan {zero}: DeepSpeed was given ZeRO stage {zero.stage} and runs stage {stage}"
            )
        return out

    initialize._autotune_zero = True  # type: ignore[attr-defined]
    return initialize


def _bind(original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``deepspeed.initialize``'s arguments by name, as its signature binds them (its first is ``args``)."""
    return dict(inspect.signature(original).bind(*args, **kwargs).arguments)


def _config(bound: dict[str, Any], deepspeed: Any) -> tuple[dict[str, Any], Any]:
    """The script's DeepSpeed config as a dict, found where ``deepspeed.initialize`` looks for it (``config``,
    ``config_params``, then ``args.deepspeed_config`` or the older ``args.deepscale_config``), and, when it
    came from the args, a copy of them without it (DeepSpeed refuses a config given twice)."""
    config = bound.get("config")
    if config is None:
        config = bound.get("config_params")
    script_args = None
    if config is None:
        args = bound.get("args")
        for name in ("deepspeed_config", "deepscale_config"):
            if getattr(args, name, None) is not None:
                config = getattr(args, name)
                script_args = copy.copy(args)
                setattr(script_args, name, None)
                break
    if config is None:
        raise InputError("deepspeed.initialize was called with no config (config=, or args.deepspeed_config)")
    if isinstance(config, dict):
        return copy.deepcopy(config), script_args
    loader = getattr(deepspeed, "load_ds_config", None)  # DeepSpeed's own: a path (JSON or HJSON) or base64
    if loader is not None:
        return loader(config), script_args
    if isinstance(config, (str, os.PathLike)) and os.path.exists(config):
        with open(config) as f:
            return json.load(f), script_args
    raise InputError(
        f"deepspeed.initialize's config {config!r} is neither a dict nor a file autotune can read"
    )


def _with_zero(config: dict[str, Any], zero: Zero, pin_memory: bool) -> dict[str, Any]:
    """``config`` with the plan's ZeRO settings in ``zero_optimization`` (the script's other keys kept; its
    offload sections kept unless the plan offloads, which writes its own)."""
    section = dict(config.get("zero_optimization") or {})
    section.update(zero.config(pin_memory))
    if zero.offload and section.get("stage") == 3:  # zero:offload on the script's own stage 3
        section["offload_param"] = dict(section["offload_optimizer"])
    return {**config, "zero_optimization": section}


def _built_partitioned(model: Any) -> bool:
    """Whether ``model``'s parameters were partitioned as they were made (``deepspeed.zero.Init``: each has
    a ``ds_id``)."""
    return isinstance(model, nn.Module) and any(hasattr(p, "ds_id") for p in model.parameters())


def _seen(out: Any) -> Any:
    """Records what the engine ``deepspeed.initialize`` returned (first in its tuple) runs."""
    engine = out[0] if isinstance(out, tuple) else out
    stage = getattr(engine, "zero_optimization_stage", None)
    if callable(stage):
        size = sum(
            int(getattr(p, "ds_numel", p.numel())) * p.element_size() for p in engine.module.parameters()
        )
        _ENGINES.append(ZeroEngine(int(stage()), int(getattr(engine, "dp_world_size", 1)), size))
    return out


def script_engine() -> ZeroEngine | None:
    """What the script's DeepSpeed engine runs (its last, if it built several); None: it built none."""
    return _ENGINES[-1] if _ENGINES else None


def reset_calls() -> None:
    """A warm process's next configuration: no call seen yet, as in a fresh process."""
    _APPLIED.clear()
    _ENGINES.clear()


def check_applied(model: Any, zero: Zero | None, in_trial: bool) -> None:
    """At the model's first forward: in a trial, refuse a ZeRO plan that reached no ``deepspeed.initialize``
    call. Outside one (``$AUTOTUNE_PLAN`` with ``autotune.prepare``, after a run) the engine was built
    before autotune saw it, and DeepSpeed takes ZeRO only in its config, where ``autotune best`` tells the
    user to write it: an engine that runs the plan's stage and offload passes; one that runs another is
    one line naming the config; a model that is not (yet) an engine gets that line as a warning, and the
    rest of the plan applies.

    Raises:
        InputError: as said.
    """
    if zero is None or (in_trial and zero in _APPLIED):
        return
    if in_trial:
        raise InputError(
            f"plan {zero}: the script made no deepspeed.initialize call before its model's first forward; zero "
            "plans are for scripts that train with DeepSpeed"
        )
    config = f'"zero_optimization": {json.dumps(zero.config(pin_memory=torch.cuda.is_available()))}'
    stage = getattr(model, "zero_optimization_stage", None)
    if not callable(stage):
        warnings.warn(
            f"plan {zero}: DeepSpeed takes ZeRO only in its config: set {config} in the config the script "
            "passes to deepspeed.initialize (autotune.prepare applies the rest of the plan)",
            stacklevel=3,
        )
        return
    offloads = model.zero_offload_optimizer() is not None
    if (zero.stage is None or stage() == zero.stage) and (not zero.offload or offloads):
        return
    raise InputError(
        f"plan {zero}: the script's DeepSpeed engine runs ZeRO stage {stage()}"
        + (" with" if offloads else " without")
        + f" offload; DeepSpeed takes ZeRO only in its config: set {config} in the config the script passes "
        "to deepspeed.initialize"
    )
