"""Library models (transformers' GPT-2, Llama, BERT, ViT, ResNet; small configs, random weights)
train on turbine:cpu as on torch's CPU: outputs, losses, gradients, parameters after an
optimizer step and buffers (batch norm's running statistics) match, no op falls back, and the
decoder models generate torch's tokens. The models come from tests/library_models.py.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

import turbine

pytest.importorskip("transformers")

import library_models  # noqa: E402  (needs transformers)

D = os.environ.get("TURBINE_TEST_DEVICE", "turbine:cpu")  # the GPU run sets turbine:cuda0
TOLERANCE = {"rtol": 1e-4, "atol": 2e-5}


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict) -> torch.Tensor:
    """One training step; dropout draws from torch's CPU generator on both sides (seeded alike)."""
    torch.manual_seed(7)
    optimizer.zero_grad()
    output = model(**batch)
    output.loss.backward()
    optimizer.step()
    return output.logits.detach()


#: Below this, a gradient is float rounding noise: attention's key bias, whose true gradient is
#: zero (softmax ignores a constant added to a row). AdamW scales any gradient to a step of about
#: lr, so each side moves such a parameter by its own noise: compared before the step only.
NOISE = 1e-6


def _assert_same_state(model: torch.nn.Module, reference: torch.nn.Module, what: str) -> None:
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        if q.grad is not None:
            torch.testing.assert_close(p.grad.cpu(), q.grad, **TOLERANCE, msg=lambda m: f"gradient of {name}: {m}")
        if q.grad is None or q.grad.abs().max() > NOISE:
            torch.testing.assert_close(p.detach().cpu(), q.detach(), **TOLERANCE, msg=lambda m: f"{what} {name}: {m}")
    for (name, b), (_, c) in zip(model.named_buffers(), reference.named_buffers()):
        torch.testing.assert_close(b.cpu(), c, **TOLERANCE, msg=lambda m: f"buffer {name}: {m}")


@pytest.mark.parametrize("name", sorted(library_models.MODELS))
def test_model_trains_like_torch(name, stats):
    reference = library_models.build(name)
    model = copy.deepcopy(reference).to(D)
    tied = {id(p) for p in reference.parameters()}
    assert len({id(p) for p in model.parameters()}) == len(tied), "module.to() untied shared parameters"
    batch = library_models.batch(name)
    device_batch = {key: value.to(D) for key, value in batch.items()}
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (reference, model)]
    for step in range(2):
        expected = _step(reference, optimizers[0], batch)
        logits = _step(model, optimizers[1], device_batch)
        torch.testing.assert_close(logits.cpu(), expected, **TOLERANCE)
        _assert_same_state(model, reference, f"after step {step + 1}, parameter")
    assert turbine.stats()["fallbacks"] == {}


@pytest.mark.parametrize("name", sorted(n for n, (_, _, generates) in library_models.MODELS.items() if generates))
def test_decoder_generates_torchs_tokens(name, stats):
    reference = library_models.build(name).eval()
    model = copy.deepcopy(reference).to(D)
    prompt = library_models.prompt()
    options = {"max_new_tokens": 4, "do_sample": False, "pad_token_id": 1}
    expected = reference.generate(prompt, **options)
    tokens = model.generate(prompt.to(D), **options)
    assert tokens.cpu().tolist() == expected.tolist()
    assert turbine.stats()["fallbacks"] == {}


def test_eval_mode_under_inference_mode_reads_like_no_grad(stats):
    """A model evaluated under torch.inference_mode: outputs, .cpu(), .item() and argmax read as
    under no_grad, and batch norm uses its running statistics without falling back."""
    reference = library_models.build("resnet").eval()
    model = copy.deepcopy(reference).to(D)
    pixels = library_models.batch("resnet")["pixel_values"]
    with torch.no_grad():
        expected = reference(pixel_values=pixels).logits
    with torch.inference_mode():
        logits = model(pixel_values=pixels.to(D)).logits
        torch.testing.assert_close(logits.cpu(), expected, **TOLERANCE)
        assert logits.argmax(-1).tolist() == expected.argmax(-1).tolist()
        assert logits.sum().item() == pytest.approx(expected.sum().item(), rel=1e-4, abs=1e-4)
    assert turbine.stats()["fallbacks"] == {}
