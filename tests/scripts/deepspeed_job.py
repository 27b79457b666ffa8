"""A DeepSpeed training script for autotune's ZeRO-plan tests: run it under torchrun (gloo, CPU).

Each rank trains distributed.py's small stack of blocks through ``deepspeed.initialize`` (AdamW, fp32) with the batch size
autotune gives it, at the ZeRO stage its own config says (``--stage``, ``--offload``); it calls autotune only with
``--prepare`` (``autotune.prepare(engine)``, as a script applies an answer). ``--partitioned`` builds the model
inside ``deepspeed.zero.Init`` (stage 3's partitioned construction, as Hugging Face does at stage 3).
``--config-file`` passes the config as a JSON file through ``args.deepspeed_config`` instead of a dict.
``--grads FILE`` writes rank 0's first loss and full gradients (gathered over the ranks by DeepSpeed's
``safe_get_full_grad``) after the first backward, so a test can compare a plan's numbers with the script's
own. ``--zero-state DIR`` writes what DeepSpeed's engine runs after the first step (``rank-R.json``: its
ZeRO stage and offload), so a test reads a plan back from DeepSpeed itself.
"""

import argparse
import json
import os
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.utils import safe_get_full_grad
from distributed import Model  # the FSDP2 and DDP tests' model (this script's folder is on its path)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--stage", type=int, default=0)
    p.add_argument("--offload", action="store_true")
    p.add_argument("--config-file", default=None)
    p.add_argument("--grads", default=None)
    p.add_argument("--zero-state", default=None)
    p.add_argument("--prepare", action="store_true")
    p.add_argument("--partitioned", action="store_true")  # build the model in deepspeed.zero.Init (stage 3's)
    # DeepSpeed's launcher passes it; torchrun sets $LOCAL_RANK, which DeepSpeed checks it against
    p.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    args = p.parse_args()
    zero: dict = {"stage": args.stage}
    if args.offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    config = {
        "train_micro_batch_size_per_gpu": args.batch_size,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": zero,
    }
    kwargs: dict = {"config": config}
    if args.config_file:  # the config through args.deepspeed_config, as DeepSpeed's own examples pass it
        Path(args.config_file).write_text(json.dumps(config))
        kwargs = {"args": argparse.Namespace(deepspeed_config=args.config_file, local_rank=args.local_rank)}
    torch.manual_seed(0)
    if args.partitioned:
        with deepspeed.zero.Init(config_dict_or_path=config):
            model = Model(args.width, args.depth)
    else:
        model = Model(args.width, args.depth)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), **kwargs)
    if args.prepare:
        import autotune

        engine = autotune.prepare(engine)
    rank = dist.get_rank()
    generator = torch.Generator().manual_seed(1 + rank)
    for step in range(args.steps):
        x = torch.randn(args.batch_size, args.seq, args.width, generator=generator)
        loss = engine(x)
        engine.backward(loss)
        if step == 0 and args.grads:
            grads = {n: safe_get_full_grad(p).clone() for n, p in engine.module.named_parameters()}
            if rank == 0:
                torch.save({"loss": loss.detach().clone(), "grads": grads}, args.grads)
        engine.step()
        if step == 0 and args.zero_state:
            state = {
                "stage": engine.zero_optimization_stage(),
                "offload_optimizer": device(engine.zero_offload_optimizer()),
                "offload_param": device(engine.zero_offload_param()),
                "optimizer": type(engine.optimizer).__name__,
            }
            Path(args.zero_state, f"rank-{rank}.json").write_text(json.dumps(state))


def device(section: object) -> str | None:
    """An offload section's device as DeepSpeed's engine holds it (None: no offload section)."""
    where = getattr(section, "device", None)
    return None if where is None else str(getattr(where, "value", where))


if __name__ == "__main__":
    main()
