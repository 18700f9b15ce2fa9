"""Small models from transformers, built from configs with random weights (nothing downloaded),
and PyTorch's own MNIST example network, with a batch for each: what tests/test_models.py checks
and benchmarks/models.py times.

It imports transformers: import it where transformers is installed (the tests skip without it).
Each entry makes a CPU model (seeded, so every call gives the same weights) and a batch of CPU
tensors for its forward pass, labels included so that the model returns a loss.
"""

from __future__ import annotations

from typing import Callable

import types

import torch
from transformers import (
    BertConfig,
    BertForMaskedLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    ResNetConfig,
    ResNetForImageClassification,
    ViTConfig,
    ViTForImageClassification,
)

VOCAB = 128


def gpt2() -> torch.nn.Module:
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=128, bos_token_id=0, eos_token_id=1)
    return GPT2LMHeadModel(config)


def llama() -> torch.nn.Module:
    config = LlamaConfig(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=VOCAB, max_position_embeddings=128, bos_token_id=0, eos_token_id=1, pad_token_id=1,
    )
    return LlamaForCausalLM(config)


def bert() -> torch.nn.Module:
    config = BertConfig(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, vocab_size=VOCAB,
        max_position_embeddings=128,
    )
    return BertForMaskedLM(config)


def vit() -> torch.nn.Module:
    config = ViTConfig(
        image_size=32, patch_size=8, num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_labels=10,
    )
    return ViTForImageClassification(config)


def resnet() -> torch.nn.Module:
    config = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], num_labels=10)
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

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor | None = None):
        x = torch.relu(self.conv1(pixel_values))
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.relu(self.fc1(torch.flatten(self.dropout1(x), 1)))
        logits = torch.log_softmax(self.fc2(self.dropout2(x)), dim=1)
        loss = None if labels is None else torch.nn.functional.nll_loss(logits, labels)
        return types.SimpleNamespace(logits=logits, loss=loss)


def mnist() -> torch.nn.Module:
    return MnistNet()


def digits(batch: int = 64) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return {
        "pixel_values": torch.randn(batch, 1, 28, 28, generator=generator),
        "labels": torch.randint(0, 10, (batch,), generator=generator),
    }


def tokens(batch: int = 2, length: int = 16) -> dict[str, torch.Tensor]:
    ids = torch.randint(2, VOCAB, (batch, length), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids}


def images(batch: int = 2) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return {"pixel_values": torch.randn(batch, 3, 32, 32, generator=generator), "labels": torch.tensor([1, 3])[:batch]}


#: name -> (model builder, batch builder, whether it generates text)
MODELS: dict[str, tuple[Callable[[], torch.nn.Module], Callable[[], dict], bool]] = {
    "gpt2": (gpt2, tokens, True),
    "llama": (llama, tokens, True),
    "bert": (bert, tokens, False),
    "vit": (vit, images, False),
    "resnet": (resnet, images, False),
    "mnist": (mnist, digits, False),
}


def build(name: str) -> torch.nn.Module:
    """The named model on the CPU, with the same random weights every time."""
    torch.manual_seed(0)
    return MODELS[name][0]()


def batch(name: str) -> dict[str, torch.Tensor]:
    return MODELS[name][1]()
