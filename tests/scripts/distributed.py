"""A data-parallel training script for autotune's multi-process tests: run it under torchrun (gloo, CPU).

Each rank trains a small stack of blocks wrapped in DDP, FSDP2 (``fully_shard``; ``fsdp-keep``: its blocks
with ``reshard_after_forward=False``) or FSDP1, with the batch size autotune gives it; the plan (``autotune.prepare``, or the hooks at the first forward) is applied through the
wrapper. ``--grads FILE`` writes rank 0's loss and gradients after the first step, so a test can compare a
plan's numbers with no plan's. ``--extra-mib R=MIB`` makes rank R hold that much more memory.
``--fsdp-state DIR`` writes what FSDP2's own state holds for each sharded module after the first step
(``rank-R.json``: its reshard after forward and offload), so a test reads a sharding plan back from FSDP, and
after every later step to ``rank-R-last.json``. ``--write-after-forward`` makes each block scale its first
layer's weights in place after using them (as a script's own in-place weight edits do): FSDP2's resharding
discards the write before backward, keeping the parameters gathered (``fsdp:keep``) does not, so that plan
changes the gradients.
"""

import argparse
import gc
import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import autotune


class Block(nn.Module):
    def __init__(self, width: int, write_after_forward: bool = False) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)
        self.write_after_forward = write_after_forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))
        if self.write_after_forward:  # into the storage the backward of self.up reads (.data: unversioned)
            self.up.weight.data.mul_(1.5)
        return out


class Model(nn.Module):
    def __init__(self, width: int, depth: int, write_after_forward: bool = False) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width, write_after_forward) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x).mean()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--wrap", choices=["ddp", "fsdp", "fsdp-keep", "fsdp1"], default="ddp")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--grads", default=None)
    p.add_argument("--extra-mib", default="")
    p.add_argument("--fsdp-state", default=None)
    p.add_argument("--write-after-forward", action="store_true")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Model(args.width, args.depth, args.write_after_forward)
    if args.wrap == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
    elif args.wrap in ("fsdp", "fsdp-keep"):  # fsdp-keep: the blocks keep their parameters after forward
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block, **({"reshard_after_forward": False} if args.wrap == "fsdp-keep" else {}))
        fully_shard(model)
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        model = FullyShardedDataParallel(
            model, auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=torch.device("cpu")
        )
    model = autotune.prepare(model)
    extra = dict(item.split("=") for item in filter(None, args.extra_mib.split(",")))
    held = bytearray(b"\x01") * int(float(extra.get(str(rank), 0)) * 2**20)  # noqa: F841
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = args.batch_size or autotune.batch_size(default=4)
    generator = torch.Generator().manual_seed(1 + rank)
    for step in range(args.steps):
        x = torch.randn(batch, args.seq, args.width, generator=generator)
        loss = model(x)
        loss.backward()
        if step == 0 and args.grads:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
            # FSDP2's gradients are sharded DTensors: rank 0's shards are compared
            grads = {n: (g.to_local() if hasattr(g, "to_local") else g) for n, g in grads.items()}
            if rank == 0:
                torch.save({"loss": loss.detach(), "grads": grads}, args.grads)
        if args.fsdp_state:
            from autotune.backends.torch_sharding import read_state

            name = f"rank-{rank}.json" if step == 0 else f"rank-{rank}-last.json"
            Path(args.fsdp_state, "tmp-" + name).write_text(json.dumps(read_state(model)))
            Path(args.fsdp_state, "tmp-" + name).replace(Path(args.fsdp_state, name))  # whole, if stopped
        optimizer.step()
        optimizer.zero_grad()
    # The wrapper's last gloo work holds tensors; left for interpreter shutdown, gloo's threads free them without
    # the GIL and the rank aborts ("terminate called without an active exception", pytorch issue 190489) in
    # about one run in seven on a loaded 2-core machine. Released here first, it happened in none of 40.
    del model, optimizer
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
