"""`best --format hf` in the installed transformers' own words (issue 29), held to the real library: the
switch's name the installed version takes, fields a real TrainingArguments accepts, and Hugging Face's
every_n_layers=k checkpointing exactly the layers autotune's ratio 1/k plan chooses."""

from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path

import pytest

from autotune.core.plans import ModuleRule
from autotune.results.best import BestAnswer
from autotune.results.formats import hf_vocabulary, render

pytestmark = pytest.mark.compat


def installed() -> tuple[int, int]:
    major, minor = version("transformers").split(".")[:2]
    return int(major), int(minor)


def test_the_switch_is_named_as_the_installed_transformers_names_it() -> None:
    name, taken = hf_vocabulary()
    if installed() >= (5, 24):
        assert (name, taken) == ("activation_checkpointing", {"every_n_layers", "offload"})
    else:
        assert name == "gradient_checkpointing"


def test_the_printed_fields_are_what_a_real_training_arguments_takes(tmp_path: Path) -> None:
    from transformers import TrainingArguments

    answer = BestAnswer(
        "gpt-1", "train.py", 8, "GPT2Block:0.25/offload", 2**30, 38.8, 2**31, True, "verified",
        grad_accum=2, outermost=("GPT2Block",), layers={"GPT2Block": 8},
    )  # fmt: skip
    fields: dict[str, object] = {}
    for line in render(answer, "hf").splitlines():
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            fields[key] = json.loads(value.replace("True", "true")) if value.startswith("{") else value
    name = hf_vocabulary()[0]
    assert fields[name] == "True"
    arguments = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=int(str(fields["per_device_train_batch_size"])),
        gradient_accumulation_steps=int(str(fields["gradient_accumulation_steps"])),
        **{name: True},
        **({f"{name}_kwargs": fields[f"{name}_kwargs"]} if f"{name}_kwargs" in fields else {}),
    )
    assert getattr(arguments, name) is True
    if installed() >= (5, 24):
        assert arguments.activation_checkpointing_kwargs == {"every_n_layers": 4, "offload": True}


@pytest.mark.skipif(installed() < (5, 24), reason="every_n_layers is transformers 5.24's")
@pytest.mark.parametrize("k", [1, 2, 4])
def test_every_n_layers_checkpoints_the_layers_the_ratio_plan_chooses(k: int) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=8, n_embd=64, n_head=2, n_positions=64, vocab_size=128))
    model.activation_checkpointing_enable(every_n_layers=k)
    hf = [i for i, block in enumerate(model.transformer.h) if getattr(block, "gradient_checkpointing", False)]
    assert hf == ModuleRule("GPT2Block", 1 / k).chosen(8) == list(range(0, 8, k))
