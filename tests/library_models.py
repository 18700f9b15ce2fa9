"""Small models from transformers, built from configs with random weights (nothing downloaded),
and PyTorch's own MNIST example network, with a batch for each: what tests/test_models.py checks
and benchmarks/models.py times.

It imports transformers: import it where transformers is installed (the tests skip without it).
Each entry makes a CPU model (seeded, so every call gives the same weights) and a batch of CPU
tensors for its forward pass, labels included so that the model returns a loss. Two sizes:
``test`` (hidden size 64, 2 layers, 16 tokens: quick to compile and check) and ``bench``
(hidden size 256, 4 layers, 4 x 128 tokens: big enough that the kernels' work, not the cost of
issuing them, decides a step's time, as in real use).
"""

from __future__ import annotations

import copy
import types
from typing import Callable

import torch
from transformers import (
    BertConfig,
    BertForMaskedLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    ResNetConfig,
    ResNetForImageClassification,
    T5Config,
    T5ForConditionalGeneration,
    ViTConfig,
    ViTForImageClassification,
)

#: The dimensions of each size.
SIZES = {
    "test": {"layers": 2, "hidden": 64, "vocab": 128, "batch": 2, "tokens": 16, "image": 32, "patch": 8, "widths": [16, 32]},
    "bench": {"layers": 4, "hidden": 256, "vocab": 1024, "batch": 4, "tokens": 128, "image": 64, "patch": 8, "widths": [32, 64, 128, 256]},
}


def gpt2(size: dict) -> torch.nn.Module:
    config = GPT2Config(
        n_layer=size["layers"], n_embd=size["hidden"], n_head=4, vocab_size=size["vocab"], n_positions=256,
        bos_token_id=0, eos_token_id=1,
    )
    return GPT2LMHeadModel(config)


def llama(size: dict) -> torch.nn.Module:
    config = LlamaConfig(
        num_hidden_layers=size["layers"], hidden_size=size["hidden"], intermediate_size=2 * size["hidden"],
        num_attention_heads=4, num_key_value_heads=2, vocab_size=size["vocab"], max_position_embeddings=256,
        bos_token_id=0, eos_token_id=1, pad_token_id=1,
    )
    return LlamaForCausalLM(config)


def mixtral(size: dict) -> torch.nn.Module:
    """A mixture of experts: a router picks 2 of 4 experts per token, whose matmuls run as
    ``grouped_mm`` over the tokens sorted by expert (transformers' default experts)."""
    config = MixtralConfig(
        num_hidden_layers=size["layers"], hidden_size=size["hidden"], intermediate_size=2 * size["hidden"],
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
        vocab_size=size["vocab"], max_position_embeddings=256, bos_token_id=0, eos_token_id=1, pad_token_id=1,
    )
    return MixtralForCausalLM(config)


def bert(size: dict) -> torch.nn.Module:
    config = BertConfig(
        num_hidden_layers=size["layers"], hidden_size=size["hidden"], intermediate_size=2 * size["hidden"],
        num_attention_heads=4, vocab_size=size["vocab"], max_position_embeddings=256,
    )
    return BertForMaskedLM(config)


def t5(size: dict) -> torch.nn.Module:
    """An encoder-decoder with relative position buckets (logs and integer casts of distances)."""
    config = T5Config(
        num_layers=size["layers"], d_model=size["hidden"], d_kv=size["hidden"] // 4, d_ff=2 * size["hidden"], num_heads=4,
        vocab_size=size["vocab"], decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
    )
    return T5ForConditionalGeneration(config)


def vit(size: dict) -> torch.nn.Module:
    config = ViTConfig(
        image_size=size["image"], patch_size=size["patch"], num_hidden_layers=size["layers"], hidden_size=size["hidden"],
        intermediate_size=2 * size["hidden"], num_attention_heads=4, num_labels=10,
    )
    return ViTForImageClassification(config)


def resnet(size: dict) -> torch.nn.Module:
    widths = size["widths"]
    config = ResNetConfig(embedding_size=widths[0], hidden_sizes=widths, depths=[1] * len(widths), num_labels=10)
    return ResNetForImageClassification(config)


class MnistNet(torch.nn.Module):
    """PyTorch's MNIST example network (pytorch/examples, mnist/main.py), with a loss as the
    transformers models give one."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 32, 3, 1)
        self.conv2 = torch.nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = torch.nn.Dropout(0.25)
        self.dropout2 = torch.nn.Dropout(0.5)
        self.fc1 = torch.nn.Linear(9216, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor | None = None) -> types.SimpleNamespace:
        x = torch.relu(self.conv1(pixel_values))
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.relu(self.fc1(torch.flatten(self.dropout1(x), 1)))
        logits = torch.log_softmax(self.fc2(self.dropout2(x)), dim=1)
        loss = None if labels is None else torch.nn.functional.nll_loss(logits, labels)
        return types.SimpleNamespace(logits=logits, loss=loss)


def mnist(size: dict) -> torch.nn.Module:
    return MnistNet()  # the example's own size at both sizes


def tokens(size: dict, batch: int | None = None, length: int | None = None) -> dict[str, torch.Tensor]:
    shape = (batch or size["batch"], length or size["tokens"])
    ids = torch.randint(2, size["vocab"], shape, generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids}


def images(size: dict) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    batch, side = size["batch"], size["image"]
    return {
        "pixel_values": torch.randn(batch, 3, side, side, generator=generator),
        "labels": torch.randint(0, 10, (batch,), generator=generator),
    }


def digits(size: dict) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return {
        "pixel_values": torch.randn(64, 1, 28, 28, generator=generator),
        "labels": torch.randint(0, 10, (64,), generator=generator),
    }


#: name -> (model builder, batch builder, whether it generates text)
MODELS: dict[str, tuple[Callable[[dict], torch.nn.Module], Callable[[dict], dict], bool]] = {
    "gpt2": (gpt2, tokens, True),
    "llama": (llama, tokens, True),
    "mixtral": (mixtral, tokens, True),
    "bert": (bert, tokens, False),
    "t5": (t5, tokens, True),
    "vit": (vit, images, False),
    "resnet": (resnet, images, False),
    "mnist": (mnist, digits, False),
}


def build(name: str, size: str = "test") -> torch.nn.Module:
    """The named model on the CPU, with the same random weights every time."""
    torch.manual_seed(0)
    return MODELS[name][0](SIZES[size])


def in_float64(model: torch.nn.Module) -> torch.nn.Module:
    """A float64 copy of ``model``, the truth the tests measure float32 rounding against. A
    mixture of experts computes its experts one by one there (transformers' "eager" experts):
    torch's grouped_mm multiplies float32 and half precision only."""
    truth = copy.deepcopy(model).double()
    if getattr(getattr(truth, "config", None), "_experts_implementation", "eager") != "eager":
        truth.set_experts_implementation("eager")
    return truth


def batch(name: str, size: str = "test") -> dict[str, torch.Tensor]:
    return MODELS[name][1](SIZES[size])


def prompt(size: str = "test", length: int = 5) -> torch.Tensor:
    """A one-sequence prompt for generate()."""
    return tokens(SIZES[size], batch=1, length=length)["input_ids"]
