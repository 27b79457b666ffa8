"""A plain training loop over one of the compatibility suite's models (tests/compat/scripts/models.py).

    python tests/compat/scripts/train.py --model gpt2 --batch-size 8
    python tests/compat/scripts/train.py --model llama --lora --batch-size 8

It knows nothing of autotune: trials run it through a command template (``--batch-size {batch_size}``),
the harness counts its optimizer steps and applies the plan at its model's first forward.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from models import FAMILIES, build, loss_of


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=FAMILIES, required=True)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--lora", action="store_true", help="train PEFT LoRA adapters on q and v only")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, batch = build(args.model)
    if args.lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    for _ in range(args.steps):
        inputs = batch(args.batch_size)
        loss_of(model(**inputs)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


if __name__ == "__main__":
    main()
