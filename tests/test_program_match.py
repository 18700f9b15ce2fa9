"""Comparing a dynamic kernel's program with a static one (kernels_cache/program_match.py): the
proof that lets a call with a size of 1 run on a kernel traced for sizes of 2 or more."""

from __future__ import annotations

import torch

from turbine.eager.decompositions.order import max_dim
from turbine.kernels_cache.program_match import same_program
from turbine.kernels_cache.tracing import Dynamic

aten = torch.ops.aten
F32 = torch.float32


def rows(size: int, symbol: str = "s0") -> Dynamic:
    return Dynamic(symbol, size)


def test_ops_whose_program_at_one_is_the_dynamic_one():
    cases = [
        (lambda x: [aten.gelu.default(x)], [((rows(1), 24), F32)], [(1, 24)]),
        (lambda b, x, w: [aten.addmm.default(b, x, w)], [((24,), F32), ((rows(1), 12), F32), ((12, 24), F32)], [(1, 24)]),
        (lambda x: [aten._softmax.default(x, 0, False)], [((rows(1), 8), F32)], [(1, 8)]),
        (lambda x, y: [aten.add.Tensor(x, y)], [((rows(1), 4), F32), ((rows(1), 4), F32)], [(1, 4)]),
        (lambda x: [aten.sum.dim_IntList(x, [0])], [((rows(1), 4), F32)], [(4,)]),
        # a NaN among the arguments equals itself (NaN != NaN made every such program differ)
        (lambda x: [torch.where(x > 0, float("nan"), x)], [((rows(1), 4), F32)], [(1, 4)]),
        (lambda x: [max_dim(x, 0)[0]], [((rows(1), 4), F32)], [(4,)]),  # max.dim's correction fills with NaN
    ]
    for fn, inputs, results in cases:
        assert same_program(fn, inputs, {"s0": 7}, results)


def test_a_program_that_differs_at_one_is_not_the_same():
    squeeze = lambda x: [aten.squeeze.dim(x, 0).clone()]  # noqa: E731 - drops the dim only at 1
    assert not same_program(squeeze, [((rows(1), 4), F32)], {"s0": 7}, [(4,)])
    assert not same_program(squeeze, [((rows(1), 4), F32)], {"s0": 7}, [(1, 4)])


def test_results_of_other_shapes_than_torchs_rule_are_refused():
    gelu = lambda x: [aten.gelu.default(x)]  # noqa: E731
    assert not same_program(gelu, [((rows(1), 24), F32)], {"s0": 7}, [(1, 25)])


def test_a_symbol_with_two_sizes_or_no_traced_size_shows_nothing():
    add = lambda x, y: [aten.add.Tensor(x, y)]  # noqa: E731
    assert not same_program(add, [((rows(1), 4), F32), ((rows(3), 4), F32)], {"s0": 7}, [(3, 4)])
    assert not same_program(add, [((rows(1), 4), F32), ((rows(1), 4), F32)], {"s9": 7}, [(1, 4)])


def test_sizes_computed_from_a_symbol_are_compared_at_its_size():
    """A view to (3 * rows, 4): the dynamic program's size arithmetic, evaluated at 1, is the
    static program's constant."""
    view = lambda x: [aten.view.default(x, [x.shape[0] * 3, 4]).sum(0)]  # noqa: E731
    assert same_program(view, [((rows(1), 12), F32)], {"s0": 5}, [(4,)])


def test_constants_values_from_the_data_and_number_types_are_part_of_the_program():
    """Programs that differ at 1 only in a captured constant tensor, in which tensor ``.item()``
    reads, or in 2 against 2.0, are not the same."""
    def constant(x):
        table = torch.tensor([1.0, 2, 3, 4]) if x.shape[0] == 1 else torch.tensor([5.0, 6, 7, 8])
        return [aten.add.Tensor(x, table)]

    def item(x, a, b):
        return [aten.mul.Tensor(x, (a if x.shape[0] == 1 else b).item())]

    def number(x):
        return [aten.mul.Tensor(x, 2 if x.shape[0] == 1 else 2.0)]

    assert not same_program(constant, [((rows(1), 4), F32)], {"s0": 7}, [(1, 4)])
    assert not same_program(item, [((rows(1), 4), F32), ((), F32), ((), F32)], {"s0": 7}, [(1, 4)])
    assert not same_program(number, [((rows(1), 4), F32)], {"s0": 7}, [(1, 4)])
    same_constant = lambda x: [aten.add.Tensor(x, torch.tensor([1.0, 2, 3, 4]))]  # noqa: E731
    assert same_program(same_constant, [((rows(1), 4), F32)], {"s0": 7}, [(1, 4)])


def test_a_size_that_cannot_be_evaluated_at_one_shows_nothing_and_raises_nothing():
    """Align-corners bilinear upsampling divides by (size - 1): at 1 that is a division by zero
    inside the size arithmetic, which must be a plain 'not shown'."""
    from torch._decomp import core_aten_decompositions

    upsample = lambda x: [aten.upsample_bilinear2d.vec(x, None, True, [1.5, 1.5])]  # noqa: E731
    inputs = [((1, 1, rows(1, "s0"), rows(1, "s1")), F32)]
    assert not same_program(upsample, inputs, {"s0": 5, "s1": 5}, [(1, 1, 1, 1)], core_aten_decompositions())
