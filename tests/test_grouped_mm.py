"""grouped_mm (eager/ops/grouped.py), the matmul of transformers' mixture-of-experts layers: each
layout against torch's CPU kernel with its gradients, on turbine's own ops (no fallback); torch's
errors for calls its kernels refuse; new group sizes compile nothing once the sizes have changed
once."""

from __future__ import annotations

import pytest
import torch

import turbine
from checks import D

#: layout -> (mat_a's shape, mat_b's shape, the jagged dim of each 2-d operand); 3 groups of a jagged dim of 24.
LAYOUTS = {
    "2-d by 3-d": ((24, 8), (3, 8, 16), {"a": 0}),
    "3-d by 2-d": ((3, 8, 16), (16, 24), {"b": 1}),
    "2-d by 2-d": ((8, 24), (24, 16), {"a": 1, "b": 0}),
}

#: Group ends: even, with an empty group, with the last group short of the end (left uncovered).
OFFSETS = {"even": [8, 16, 24], "an empty group": [8, 8, 24], "a tail no group covers": [0, 8, 16]}

TOLERANCE = {torch.float32: {}, torch.bfloat16: {"rtol": 2e-2, "atol": 5e-2}, torch.float16: {"rtol": 2e-3, "atol": 5e-3}}


def _along(tensor: torch.Tensor, layout: str, part: slice) -> torch.Tensor:
    """``part`` of a result (or of the jagged operand's gradient) along the jagged dim's
    elements: the rows of a 2-d by 3-d result, the columns of a 3-d by 2-d one. Groups cover up
    to the last offset; torch's kernels leave the rest unwritten (whatever memory held), turbine
    writes zeros there."""
    if layout == "2-d by 3-d":
        return tensor[part]
    if layout == "3-d by 2-d":
        return tensor[..., part]
    return tensor  # one result per group: every group is written


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("offsets", sorted(OFFSETS))
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_grouped_mm_and_its_gradients_match_torch(layout, offsets, dtype, stats):
    torch.manual_seed(0)
    shape_a, shape_b, jagged = LAYOUTS[layout]
    a, b = (torch.randn(shape, dtype=dtype, requires_grad=True) for shape in (shape_a, shape_b))
    offs = torch.tensor(OFFSETS[offsets], dtype=torch.int32)
    covered, past = slice(0, OFFSETS[offsets][-1]), slice(OFFSETS[offsets][-1], None)
    on_device = [t.detach().to(D).requires_grad_() for t in (a, b)]
    turbine.reset_stats()
    with turbine.fallback("error"):
        result = torch._grouped_mm(*on_device, offs.to(D))
        expected = torch._grouped_mm(a, b, offs)
        grad = torch.zeros_like(expected)
        _along(grad, layout, covered).normal_()
        expected.backward(grad)
        result.backward(grad.to(D))
    assert stats()["fallbacks"] == {}
    actual = result.detach().cpu()
    torch.testing.assert_close(_along(actual, layout, covered), _along(expected.detach(), layout, covered), **TOLERANCE[dtype])
    if layout != "2-d by 2-d" and dtype == torch.float32:  # one matmul per group (bfloat16 on a GPU: torch's kernel)
        assert not _along(actual, layout, past).any()
    for name, turbines, torchs in (("a", on_device[0].grad.cpu(), a.grad), ("b", on_device[1].grad.cpu(), b.grad)):
        if name in jagged:  # past the groups, torch leaves a jagged operand's gradient unwritten too
            part = (slice(None),) * jagged[name] + (covered,)
            turbines, torchs = turbines[part], torchs[part]
        torch.testing.assert_close(turbines, torchs, **TOLERANCE[dtype])


def test_three_d_by_three_d_is_a_batched_matmul(stats):
    a, b = torch.randn(3, 8, 16), torch.randn(3, 16, 4)
    with turbine.fallback("error"):
        torch.testing.assert_close(torch._grouped_mm(a.to(D), b.to(D)).cpu(), torch._grouped_mm(a, b))


def _int32(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


@pytest.mark.parametrize("arguments, words", [
    ((torch.randn(4, 4, dtype=torch.float64), torch.randn(2, 4, 4, dtype=torch.float64), _int32([1, 3])), "Expected mat_a to be Float32, BFloat16 or Float16"),
    ((torch.randn(4, 4), torch.randn(2, 4, 4), torch.tensor([1, 3])), "Offsets have to be int32"),
    ((torch.randn(4, 4), torch.randn(2, 4, 4)), "Have to provide offsets if there is a 2d matrix"),
    ((torch.randn(4, 4), torch.randn(3, 4, 4), _int32([1, 3])), "matrix batch sizes have to match"),
    ((torch.randn(4, 5), torch.randn(2, 4, 4), _int32([1, 3])), "contraction dimension of mat_a and mat_b must match"),
    ((torch.randn(4, 6), torch.randn(2, 6, 6), _int32([1, 3])), "strides should be multiple of 16 bytes"),
    ((torch.randn(3, 4, 4), torch.randn(2, 4, 4)), "batched dimension has to match"),
], ids=["float64", "int64 offsets", "no offsets", "groups", "contraction", "strides", "batch"])
def test_calls_torchs_kernels_refuse_raise_torchs_error(arguments, words):
    with pytest.raises(RuntimeError, match=words):
        torch._grouped_mm(*arguments)
    with pytest.raises(RuntimeError, match=words):
        torch._grouped_mm(*[t.to(D) for t in arguments]).cpu()


def test_new_group_sizes_compile_nothing_once_they_have_changed(stats):
    """A router sends each batch's tokens to the experts in new proportions: the groups' matmuls
    and the join take any size after the first change (eager/dynamic.py)."""
    torch.manual_seed(0)
    weights = torch.randn(4, 16, 32)
    on_device = weights.to(D)
    compiled = []
    for counts in ([9, 11, 14, 6], [14, 12, 5, 9], [7, 15, 11, 7], [9, 13, 8, 10]):
        tokens = torch.randn(40, 16)
        offs = torch.tensor(counts).cumsum(0).to(torch.int32)
        before = stats()["kernels_compiled"]
        result = torch._grouped_mm(tokens.to(D), on_device, offs.to(D)).cpu()
        compiled.append(stats()["kernels_compiled"] - before)
        torch.testing.assert_close(result, torch._grouped_mm(tokens, weights, offs))
    assert compiled[2:] == [0, 0], compiled
