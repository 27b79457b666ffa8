"""The model families of the compatibility suite, built from small configs (nothing is downloaded).

Each is sized so that its activations, not its weights, dominate a training step's memory at a batch of
8-16 on the CPU: what a plan saves then shows in the process's peak RSS. ``build(name)`` returns the model
and a function that makes one batch of inputs (keyword arguments of its forward, labels included where the
model computes its own loss).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

FAMILIES = ("gpt2", "llama", "bert", "resnet", "lightning", "t5")
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
Batch = Callable[[int], dict[str, Any]]
# Four layers 128 wide, 4 heads, 256 tokens from a vocabulary of 512 (GPT-2's names differ: n_layer, ...).
SMALL: dict[str, Any] = dict(
    num_hidden_layers=4, hidden_size=128, num_attention_heads=4, vocab_size=512, max_position_embeddings=256
)


def build(name: str, seed: int = 0) -> tuple[nn.Module, Batch]:
    torch.manual_seed(seed)
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(n_layer=4, n_embd=128, n_head=4, n_positions=256, vocab_size=512)
        return GPT2LMHeadModel(config), _tokens(512, 256)
    if name == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(**SMALL, intermediate_size=384, num_key_value_heads=2)
        return LlamaForCausalLM(config), _tokens(512, 256)
    if name == "bert":
        from transformers import BertConfig, BertForMaskedLM

        config = BertConfig(**SMALL, intermediate_size=512)
        return BertForMaskedLM(config), _tokens(512, 256)
    if name == "resnet":
        import torchvision

        model = torchvision.models.resnet18(num_classes=10)
        return model, lambda batch: {"x": torch.randn(batch, 3, 128, 128)}
    if name == "lightning":  # the Lightning module of examples/lightning_module.py
        spec = importlib.util.spec_from_file_location("lightning_module", EXAMPLES / "lightning_module.py")
        assert spec is not None and spec.loader is not None
        example = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(example)
        return example.Classifier(), lambda batch: {"tokens": torch.randint(0, 512, (batch, 256))}
    if name == "t5":  # an encoder-decoder: the decoder's inputs are the labels, shifted by the model
        from transformers import T5Config, T5ForConditionalGeneration

        config = T5Config(
            vocab_size=512,
            d_model=128,
            d_kv=32,
            d_ff=512,
            num_layers=4,
            num_heads=4,
            decoder_start_token_id=0,
        )
        return T5ForConditionalGeneration(config), _tokens(512, 256)
    raise ValueError(f"unknown model family {name!r}: one of {', '.join(FAMILIES)}")


def _tokens(vocab: int, length: int) -> Batch:
    def batch(size: int) -> dict[str, Any]:
        ids = torch.randint(0, vocab, (size, length))
        return {"input_ids": ids, "labels": ids}

    return batch


def loss_of(output: Any) -> torch.Tensor:
    """A Hugging Face model's own loss, or cross-entropy against class 0 for a classifier's logits."""
    if hasattr(output, "loss") and output.loss is not None:
        return output.loss
    return nn.functional.cross_entropy(output, torch.zeros(output.shape[0], dtype=torch.long))
