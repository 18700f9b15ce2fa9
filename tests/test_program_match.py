"""Comparing a dynamic kernel's program with a static one (kernels_cache/program_match.py): the
proof that lets a call with a size of 1 run on a kernel traced for sizes of 2 or more."""

from __future__ import annotations

import torch

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
