"""The peer on examples/gpt.py: Accelerate's ``find_executable_batch_size`` picks its batch size (each try
trains 3 steps; the allocator capped at ``--budget-bytes``), without or with checkpointing every Block by
hand (``torch.utils.checkpoint``, what a user of a plain PyTorch model writes). One JSON line out, as
bench/gpt2_train.py --find prints. Run by bench/gpu_side_by_side.py."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from gpt import GPT, GPTConfig


class Checkpointed(torch.nn.Module):
    def __init__(self, block: torch.nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.block, x, use_reentrant=False)


def main() -> None:
    from accelerate.utils import find_executable_batch_size

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument("--start", type=int, default=4096)
    parser.add_argument("--budget-bytes", type=int, default=3 * 2**30)
    args = parser.parse_args()
    started = time.monotonic()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(args.budget_bytes / total, 1.0))
    cfg = GPTConfig()
    model = GPT(cfg).cuda()
    if args.checkpointing:
        model.blocks = torch.nn.ModuleList(Checkpointed(b) for b in model.blocks)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    tried: list[int] = []

    @find_executable_batch_size(starting_batch_size=args.start)
    def train(batch_size: int) -> int:
        tried.append(batch_size)
        for _ in range(3):
            idx = torch.randint(cfg.vocab_size, (batch_size, cfg.block_size), device="cuda")
            loss = model(idx, torch.roll(idx, -1, dims=1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        torch.cuda.synchronize()
        return batch_size

    searching = time.monotonic()
    found = train()
    done = time.monotonic()
    print(json.dumps({"batch_size": found, "tries": len(tried), "tried": tried,
                      "search_seconds": done - searching, "wall_seconds": done - started}))  # fmt: skip


if __name__ == "__main__":
    main()
