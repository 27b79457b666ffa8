"""A Hugging Face ``Trainer`` script that knows nothing of autotune: a small GPT-2 built from a config (no
download) trained on synthetic tokens. Tune it through a command template, keeping the global batch fixed:

    autotune run --budget 2GiB --global-batch 32 -- python examples/hf_trainer.py \\
        --per_device_train_batch_size {batch_size} --gradient_accumulation_steps {grad_accum}

then train with the answer (or read it in a launcher script):

    eval "$(autotune best --env --budget 2GiB -- python examples/hf_trainer.py \\
        --per_device_train_batch_size {batch_size} --gradient_accumulation_steps {grad_accum})"
    python examples/hf_trainer.py --per_device_train_batch_size $AUTOTUNE_BATCH_SIZE \\
        --gradient_accumulation_steps $AUTOTUNE_GRAD_ACCUM --recompute "$AUTOTUNE_PLAN"

With ``--eval_steps N`` the Trainer evaluates every N steps on a held-out set (``--per_device_eval_batch_size``;
its token accuracy needs every logit, which the Trainer gathers in memory); ``autotune run --with-eval --with-save`` makes each trial
also evaluate once and save a checkpoint once after its measured steps, so the answer fits those too.

Inside a trial autotune counts the Trainer's optimizer steps (each one ``batch x accumulation`` samples) and
applies the trial's recompute plan to the model at its first forward; ``--recompute PLAN`` applies a plan
outside autotune through the same code (``autotune.prepare`` reads ``AUTOTUNE_PLAN``).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch
from torch.utils.data import Dataset


class RandomTokens(Dataset):
    """Synthetic language-model data: fixed random token sequences, labels = inputs."""

    def __init__(self, size: int, length: int, vocab: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (size, length), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def token_accuracy(prediction: Any) -> dict[str, float]:
    """The share of next tokens predicted right (a metric needs the logits: the Trainer keeps them all)."""
    logits, labels = prediction.predictions, prediction.label_ids
    return {"accuracy": float((logits[:, :-1].argmax(-1) == labels[:, 1:]).mean())}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--per_device_train_batch_size", type=int, default=8)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    parser.add_argument("--max_steps", type=int, default=1000)
    parser.add_argument("--seq", type=int, default=256, help="sequence length")
    parser.add_argument("--recompute", default="", help="a recompute plan to apply (AUTOTUNE_PLAN's form)")
    parser.add_argument(
        "--gradient_checkpointing", action="store_true", help="the Trainer's own: every layer recomputed"
    )
    parser.add_argument("--eval_steps", type=int, default=0, help="evaluate every N steps (0: never)")
    parser.add_argument("--per_device_eval_batch_size", type=int, default=8)
    parser.add_argument("--eval_samples", type=int, default=256, help="the held-out set's size")
    parser.add_argument(
        "--output_dir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "autotune-hf-trainer-example")
    )
    args = parser.parse_args()

    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=4, n_embd=128, n_head=4, n_positions=args.seq, vocab_size=512, bos_token_id=0, eos_token_id=0
    )
    model = GPT2LMHeadModel(config)
    if args.recompute:
        import autotune

        os.environ["AUTOTUNE_PLAN"] = args.recompute
        model = autotune.prepare(model)
    training = TrainingArguments(
        output_dir=args.output_dir,
        per_device_train_batch_size=args.per_device_train_batch_size,
        per_device_eval_batch_size=args.per_device_eval_batch_size,
        gradient_checkpointing=args.gradient_checkpointing,
        eval_strategy="steps" if args.eval_steps else "no",
        eval_steps=args.eval_steps or None,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        max_steps=args.max_steps,
        learning_rate=1e-4,
        logging_steps=max(args.max_steps, 1),
        save_strategy="no",
        report_to=[],
        use_cpu=not torch.cuda.is_available(),
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    samples = args.max_steps * args.per_device_train_batch_size * args.gradient_accumulation_steps
    data = RandomTokens(max(samples, 1), args.seq, config.vocab_size)
    held_out = RandomTokens(args.eval_samples, args.seq, config.vocab_size) if args.eval_samples else None
    trainer = Trainer(
        model=model,
        args=training,
        train_dataset=data,
        eval_dataset=held_out,
        compute_metrics=token_accuracy,  # the Trainer gathers every logit of the held-out set for it
    )
    metrics = trainer.train().metrics
    print(f"train_samples_per_second={metrics['train_samples_per_second']}")


if __name__ == "__main__":
    main()
