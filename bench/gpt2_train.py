"""Issue 31's script: a GPT-2 medium-class language model (24 layers x 1024, sequence 1024, random weights
from a config: nothing is downloaded) trained on random tokens with bf16 autocast and fused AdamW, the batch
size an argparse flag. Written as a user writes one, without autotune in mind:

    python bench/gpt2_train.py --batch-size 4 [--checkpointing]     # Hugging Face's own checkpointing
    autotune run --budget 12GiB -- python bench/gpt2_train.py --batch-size {batch_size}

With ``--find``, the peer autotune is compared with chooses the batch size: Accelerate's
``find_executable_batch_size`` (each try trains 3 steps; the allocator capped at ``--budget-bytes``, as
``torch.cuda.set_per_process_memory_fraction`` caps it), printing one JSON line: the batch size found, the
tries and their seconds. ``--layers``/``--width``/``--seq`` make it smaller (bench/gpu_side_by_side.py --quick).
``--device cpu`` trains in float32 on the CPU; its ``--find`` caps the process's address space at
``--budget-bytes`` (as ``ulimit -v`` does), where torch's CPU allocator raises the error Accelerate halves on
(bench/time_to_answer.py). With ``--autotune-find``, autotune's own finder searches in this process
(``@autotune.find_batch_size``, issue 44) at ``--budget-bytes`` and prints the same kind of line.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

VOCAB = 50257


def build(args: argparse.Namespace) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    config = GPT2Config(
        n_layer=args.layers,
        n_embd=args.width,
        n_head=args.width // 64,
        n_positions=args.seq,
        vocab_size=VOCAB,
    )
    with torch.device(args.device):
        model = GPT2LMHeadModel(config)
    if args.checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4, fused=args.device == "cuda")


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: int, seq: int) -> float:
    device = next(model.parameters()).device.type
    ids = torch.randint(VOCAB, (batch, seq), device=device)
    with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss)


def find(args: argparse.Namespace) -> None:
    from accelerate.utils import find_executable_batch_size

    started = time.monotonic()
    if args.device == "cuda":
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(args.budget_bytes / total, 1.0))
    else:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (args.budget_bytes, args.budget_bytes))
    model, optimizer = build(args)
    tried: list[int] = []

    @find_executable_batch_size(starting_batch_size=args.start)
    def train(batch_size: int) -> int:
        tried.append(batch_size)
        for _ in range(3):
            train_step(model, optimizer, batch_size, args.seq)
        if args.device == "cuda":
            torch.cuda.synchronize()
        return batch_size

    searching = time.monotonic()
    found = train()
    done = time.monotonic()
    print(json.dumps({"batch_size": found, "tries": len(tried), "tried": tried,
                      "search_seconds": done - searching, "wall_seconds": done - started}))  # fmt: skip


def autotune_find(args: argparse.Namespace) -> None:
    """autotune's finder in this process (``@autotune.find_batch_size``) at ``--budget-bytes``: the model
    built inside the function, as its docs ask; one JSON line as ``find`` prints, once the answer is known
    (the call that would then train at it returns at once)."""
    import autotune

    started = time.monotonic()
    tried: list[int] = []

    @autotune.find_batch_size(budget=f"{args.budget_bytes}B", cache_dir=args.cache_dir, quiet=True)
    def train(batch_size: int) -> None:
        if train.answer is not None:  # the search is over: this is the call at the answer
            return
        tried.append(batch_size)
        model, optimizer = build(args)
        for _ in range(args.steps):
            train_step(model, optimizer, batch_size, args.seq)

    train()
    done = time.monotonic()
    best = train.answer.best
    print(json.dumps({"batch_size": best.batch_size, "plan": best.plan, "tries": len(tried),
                      "wall_seconds": done - started}))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--checkpointing", action="store_true", help="model.gradient_checkpointing_enable()")
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--find", action="store_true", help="Accelerate's find_executable_batch_size")
    parser.add_argument("--start", type=int, default=64, help="--find's starting batch size")
    parser.add_argument("--budget-bytes", type=int, default=12 * 2**30, help="--find's allocator cap")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--autotune-find", action="store_true", help="@autotune.find_batch_size, in-process")
    parser.add_argument("--cache-dir", default=None, help="--autotune-find's cache dir")
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.find:
        find(args)
        return
    if args.autotune_find:
        autotune_find(args)
        return
    model, optimizer = build(args)
    for step in range(args.steps):
        loss = train_step(model, optimizer, args.batch_size, args.seq)
        if step % 20 == 0:
            print(f"step {step} loss {loss:.3f}", flush=True)


if __name__ == "__main__":
    main()
