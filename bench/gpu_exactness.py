"""Issue 31, item 6, on a GPU: selective plans on a Hugging Face GPT-2 with dropout everywhere (attention
through SDPA's fused kernel, whose dropout draws from CUDA's generator) give no plan's loss and gradients.
Before the fix, ``GPT2Block:1/save=attention+matmul`` was left out on an H100: "gradients by 0.36".

    python bench/gpu_exactness.py        # one line per plan: loss equal, largest relative gradient difference
"""

from __future__ import annotations

import copy

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from autotune.backends.torch_modules import apply_plan
from autotune.core.plans import parse_plan

PLANS = ("GPT2Block:1", "GPT2Block:1/save=attention", "GPT2Block:1/save=attention+matmul",
         "GPT2Block:1/save=dropout", "GPT2Block:1/recompute=dropout", "GPT2Block:0.5/save=matmul")  # fmt: skip


def step(model: torch.nn.Module, ids: torch.Tensor) -> tuple[float, list[torch.Tensor]]:
    torch.manual_seed(7)  # CUDA's generator too: the same dropout masks with and without a plan
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return float(loss), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def main() -> None:
    torch.manual_seed(0)
    config = GPT2Config(n_layer=4, n_embd=256, n_head=4, n_positions=128, vocab_size=1000,
                        attn_pdrop=0.1, resid_pdrop=0.1, embd_pdrop=0.1, attn_implementation="sdpa")  # fmt: skip
    base = GPT2LMHeadModel(config).cuda().train()
    ids = torch.randint(1000, (4, 128), device="cuda")
    loss, grads = step(copy.deepcopy(base), ids)
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}: no plan's loss {loss:.6f}")
    for plan in PLANS:
        model = copy.deepcopy(base)
        apply_plan(model, parse_plan(plan))
        planned, planned_grads = step(model, ids)
        worst = max(((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()
                    for a, b in zip(planned_grads, grads, strict=True))  # fmt: skip
        exact = planned == loss and all(torch.equal(a, b) for a, b in zip(planned_grads, grads, strict=True))
        print(f"{plan:40} loss equal {planned == loss}  gradients: largest relative difference {worst:.3g}"
              f"  {'EXACT' if exact else 'DIFFERS'}")  # fmt: skip


if __name__ == "__main__":
    main()
