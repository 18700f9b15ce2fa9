"""Indices are checked as torch checks them (issue 20, item 1; eager/index_checks.py,
eager/ops/bounds.py): an index out of range raises torch's error, at the next read from the
device (or at the op with ``TURBINE_CHECK_INDICES=eager``), and no kernel reads or writes outside
its tensors. A property-based test draws shapes and indices, in range and out, and compares each
op with torch on the CPU."""

from __future__ import annotations

import contextlib
import os
import re
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import turbine
from checks import D, check
from turbine.config import override

F = torch.nn.functional


def _set(tensor: torch.Tensor, index: torch.Tensor, value: float) -> torch.Tensor:
    tensor[index] = value
    return tensor


def _ones(like: torch.Tensor, count: int) -> torch.Tensor:
    return torch.ones(count, device=like.device)


#: name -> fn(x: 1-D float tensor, m: 2-D float tensor, i: 1-D int64 index) -> tensor.
OPS = {
    "index": lambda x, m, i: x[i],
    "index 2-d": lambda x, m, i: m[:, i],
    "index_put": lambda x, m, i: x.clone().index_put_((i,), _ones(x, i.numel())),
    "index_put accumulate": lambda x, m, i: x.clone().index_put_((i,), _ones(x, i.numel()), accumulate=True),
    "_index_put_impl_": lambda x, m, i: torch.ops.aten._index_put_impl_(x.clone(), (i,), _ones(x, i.numel()), False, False),
    "setitem": lambda x, m, i: _set(x.clone(), i, 2.0),
    "gather": lambda x, m, i: torch.gather(x, 0, i),
    "scatter": lambda x, m, i: x.clone().scatter_(0, i, _ones(x, i.numel())),
    "scatter_add": lambda x, m, i: x.clone().scatter_add_(0, i, _ones(x, i.numel())),
    "scatter_reduce": lambda x, m, i: x.clone().scatter_reduce(0, i, _ones(x, i.numel()), "amax"),
    "index_select": lambda x, m, i: torch.index_select(m, 1, i),
    "index_add": lambda x, m, i: x.clone().index_add_(0, i, _ones(x, i.numel())),
    "index_copy": lambda x, m, i: x.clone().index_copy_(0, i, _ones(x, i.numel())),
    "index_fill": lambda x, m, i: x.clone().index_fill_(0, i, 3.0),
    "take": lambda x, m, i: torch.take(m, i),
    "put": lambda x, m, i: m.clone().put_(i, _ones(x, i.numel())),
    "embedding": lambda x, m, i: F.embedding(i, m.T.contiguous()),
    "one_hot": lambda x, m, i: F.one_hot(i, x.numel()),
    "max_unpool2d": lambda x, m, i: F.max_unpool2d(_ones(x, i.numel()).reshape(1, 1, 1, -1), i.reshape(1, 1, 1, -1), (1, 1)),
    "embedding_bag": lambda x, m, i: F.embedding_bag(i, m.T.contiguous(), torch.zeros(1, dtype=torch.int64, device=i.device)),
    "nll_loss": lambda x, m, i: F.nll_loss(torch.log_softmax(m[:1].expand(i.numel(), -1), 1), i),
}


def _outcome(fn, *tensors: torch.Tensor) -> tuple[str, object]:
    """("value", result on the CPU) or (error type, its message with numbers as N)."""
    try:
        result = fn(*tensors)
        return "value", result.cpu() if isinstance(result, torch.Tensor) else result
    except (IndexError, RuntimeError) as error:
        return type(error).__name__, re.sub(r"-?\d+", "N", str(error).splitlines()[0])


def _as_turbine_words_it(name: str, outcome: tuple[str, object]) -> tuple[str, object]:
    """torch's CPU error, except index_select's, which torch's CPU kernel words by layout
    ("INDICES element is out of DATA bounds"): turbine gives torch's other devices' words."""
    return ("IndexError", "index out of range in self") if name == "index_select" else outcome


@settings(max_examples=int(os.environ.get("TURBINE_INDEX_EXAMPLES", "40")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(sorted(OPS)),
    size=st.integers(2, 6),
    entries=st.lists(st.integers(-9, 9) | st.sampled_from([10**11, -(10**11)]), min_size=1, max_size=5),
)
def test_an_index_op_matches_torch_in_range_and_out(name, size, entries):
    x = torch.arange(float(size))
    m = torch.arange(float(3 * size)).reshape(3, size)
    i = torch.tensor(entries)
    expected = _outcome(OPS[name], x, m, i)
    with contextlib.suppress(IndexError, RuntimeError):
        turbine.synchronize(D)  # no report left from an earlier (failing) example
    turbine.reset_stats()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = _outcome(OPS[name], x.to(D), m.to(D), i.to(D))
    if expected[0] == "value":
        assert ours[0] == "value", f"{name}{entries} on size {size}: torch gave a value, turbine {ours}"
        torch.testing.assert_close(ours[1], expected[1])
    else:
        assert ours == _as_turbine_words_it(name, expected), f"{name}{entries} on size {size}"
    assert not turbine.stats()["fallbacks"], turbine.stats()["fallbacks"]  # IREE's kernels ran it, checked


@pytest.mark.parametrize("name", sorted(OPS))
def test_a_backward_through_an_index_out_of_range_neither_crashes_nor_hides_the_error(name):
    """Autograd keeps the indices as the caller gave them, so the backward ops get the bad entry
    too (torch's CPU kernel for embedding_bag's gradient wrote outside its tensor on it: a crash);
    each backward op checks again, and the first read raises torch's error for the forward."""
    x = torch.arange(4.0).to(D).requires_grad_()
    m = torch.arange(12.0).reshape(3, 4).to(D).requires_grad_()
    index = torch.tensor([1, 19])
    expected = _outcome(OPS[name], torch.arange(4.0), torch.arange(12.0).reshape(3, 4), index)
    assert expected[0] != "value", expected
    with contextlib.suppress(IndexError, RuntimeError):
        turbine.synchronize(D)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")

        def forward_and_backward(x, m, i):
            out = OPS[name](x, m, i)
            if out.requires_grad:
                out.float().sum().backward()
            return torch.stack([x.grad.sum() if x.grad is not None else x.sum(), m.grad.sum() if m.grad is not None else m.sum()])

        assert _outcome(forward_and_backward, x, m, index.to(D)) == _as_turbine_words_it(name, expected)
    torch.testing.assert_close((x * 2).cpu(), torch.arange(4.0) * 2)  # the device runs on


def test_the_error_comes_at_the_next_read_and_the_device_runs_on():
    x = torch.arange(5.0, device=D)
    bad = x[torch.tensor([7], device=D)]  # returns at once, as on CUDA
    unrelated = x * 2
    with pytest.raises(IndexError, match="index 7 is out of bounds for dimension 0 with size 5"):
        unrelated.cpu()
    torch.testing.assert_close(unrelated.cpu(), torch.arange(5.0) * 2)  # reported once
    assert bad.shape == (1,)
    torch.gather(x, 0, torch.tensor([9], device=D))
    with pytest.raises(RuntimeError, match="index 9 is out of bounds"):
        turbine.synchronize(D)
    torch.testing.assert_close(x[torch.tensor([-1, 2], device=D)].cpu(), torch.tensor([4.0, 2.0]))


def test_eager_checks_raise_at_the_op():
    x = torch.arange(5.0, device=D)
    with override(check_indices="eager"):
        with pytest.raises(IndexError, match="index -6 is out of bounds"):
            x[torch.tensor([1, -6], device=D)]
        with pytest.raises(IndexError, match="index out of range in self"):
            F.embedding(torch.tensor([[0, 5]], device=D), torch.ones(5, 2, device=D))
    with override(check_indices="sometimes"), pytest.raises(ValueError, match="TURBINE_CHECK_INDICES"):
        x[torch.tensor([1], device=D)]


def test_huge_indices_neither_read_nor_write_outside(stats):
    """An index of 10**11 crashed the process before the checks (a write far outside the buffer)."""
    x = torch.zeros(4, device=D)
    x.index_put_((torch.tensor([10**11], device=D),), torch.ones(1, device=D))
    x.scatter_(0, torch.tensor([-(10**11)], device=D), torch.ones(1, device=D))
    with pytest.raises(IndexError, match="index 100000000000 is out of bounds"):
        x.cpu()  # the first error among the reports read (as CUDA reports one device-side assert)
    torch.testing.assert_close(x.cpu(), torch.tensor([1.0, 0.0, 0.0, 0.0]))  # the bad entries wrote entry 0
    assert stats()["check_reports"] >= 2


def test_reports_wait_in_a_bounded_list():
    x = torch.arange(5.0, device=D)
    for step in range(200):
        x = x + x[torch.tensor([step % 5], device=D)] * 0
    assert len(x._storage.device._expected) <= 64
    torch.testing.assert_close(x.cpu(), torch.arange(5.0))


def test_negative_indices_count_from_the_end_where_the_op_allows_them():
    """IREE's index_fill wrote a -1 before its tensor instead of at its end (a wrong result, then
    a crash at the next garbage collection); the check kernel counts negatives from the end."""
    for size in (3, 5, 4, 6):  # a second size makes the kernels shape-generic too
        x = torch.arange(float(size))
        for index in ([-1], [-size, 1], [-2]):
            i = torch.tensor(index)
            torch.testing.assert_close(x.to(D).index_fill(0, i.to(D), 3.0).cpu(), x.index_fill(0, i, 3.0))
            torch.testing.assert_close(torch.take(x.to(D), i.to(D)).cpu(), torch.take(x, i))
            torch.testing.assert_close(x.to(D)[i.to(D)].cpu(), x[i])


def test_ignored_targets_and_bags_out_of_range_give_torchs_results_and_errors():
    """nll_loss skips targets equal to ``ignore_index`` (-100 by default, outside the class range)
    instead of reporting them; an embedding_bag index out of range raises torch's own error."""
    scores = torch.randn(4, 3).log_softmax(1)
    target = torch.tensor([0, -100, 2, -100])
    torch.testing.assert_close(F.nll_loss(scores.to(D), target.to(D)).cpu(), F.nll_loss(scores, target))
    with pytest.raises(IndexError, match="Target 7 is out of bounds"):
        F.nll_loss(scores.to(D), torch.tensor([0, 7, 1, 1], device=D)).cpu()
    weight = torch.randn(5, 2)
    with pytest.raises(RuntimeError, match="takes value 9 which is not in the valid range"):
        F.embedding_bag(torch.tensor([1, 9], device=D), weight.to(D), torch.tensor([0], device=D)).cpu()
    bags = torch.tensor([1, 4, 0])
    torch.testing.assert_close(
        F.embedding_bag(bags.to(D), weight.to(D), torch.tensor([0, 2], device=D)).cpu(), F.embedding_bag(bags, weight, torch.tensor([0, 2]))
    )


#: name -> (fn(device) -> tensor, the same with a value out of range). Targets, probabilities and
#: mask counts whose range torch's GPU kernels assert on (losing the CUDA context) or do not check
#: (reading outside a tensor), where its CPU kernels raise.
RANGED = {
    "binary_cross_entropy input": (
        lambda d: F.binary_cross_entropy(torch.tensor([0.2, 0.9], device=d), torch.tensor([0.0, 1.0], device=d)),
        lambda d: F.binary_cross_entropy(torch.tensor([0.2, 1.5], device=d), torch.tensor([0.0, 1.0], device=d)),
    ),
    "binary_cross_entropy NaN": (
        lambda d: F.binary_cross_entropy(torch.tensor([0.0, 1.0], device=d), torch.tensor([0.3, 1.0], device=d)),
        lambda d: F.binary_cross_entropy(torch.tensor([0.2, float("nan")], device=d), torch.tensor([0.0, 1.0], device=d)),
    ),
    "binary_cross_entropy target": (
        lambda d: F.binary_cross_entropy(torch.tensor([0.2, 0.9], device=d), torch.tensor([0.5, 1.0], device=d)),
        lambda d: F.binary_cross_entropy(torch.tensor([0.2, 0.9], device=d), torch.tensor([-0.5, 1.0], device=d)),
    ),
    "multi_margin_loss": (
        lambda d: F.multi_margin_loss(torch.arange(6.0, device=d).reshape(2, 3) / 5, torch.tensor([2, 0], device=d)),
        lambda d: F.multi_margin_loss(torch.arange(6.0, device=d).reshape(2, 3) / 5, torch.tensor([2, 3], device=d)),
    ),
    "multilabel_margin_loss": (
        lambda d: F.multilabel_margin_loss(torch.arange(6.0, device=d).reshape(2, 3) / 5, torch.tensor([[2, -1, 0], [0, 1, -1]], device=d)),
        lambda d: F.multilabel_margin_loss(torch.arange(6.0, device=d).reshape(2, 3) / 5, torch.tensor([[2, 4, -1], [0, 1, -1]], device=d)),
    ),
    "embedding max_norm": (
        lambda d: F.embedding(torch.tensor([1, 4], device=d), torch.arange(15.0, device=d).reshape(5, 3), max_norm=2.0),
        lambda d: F.embedding(torch.tensor([1, 7], device=d), torch.arange(15.0, device=d).reshape(5, 3), max_norm=2.0),
    ),
    "masked_scatter": (
        lambda d: torch.zeros(4, device=d).masked_scatter(torch.tensor([True, False, True, False], device=d), torch.arange(1.0, 3.0, device=d)),
        lambda d: torch.zeros(4, device=d).masked_scatter(torch.tensor([True, True, True, False], device=d), torch.arange(1.0, 3.0, device=d)),
    ),
    "repeat_interleave output_size": (
        lambda d: torch.repeat_interleave(torch.tensor([1, 2, 3], device=d), output_size=6),
        lambda d: torch.repeat_interleave(torch.tensor([1, 2, 3], device=d), output_size=4),
    ),
    "masked_scatter broadcast": (  # the result takes the broadcast shape of the tensor and the mask
        lambda d: torch.zeros(3, device=d).masked_scatter(torch.tensor([[True], [False]], device=d), torch.arange(1.0, 4.0, device=d)),
        lambda d: torch.zeros(3, device=d).masked_scatter(torch.tensor([[True], [True]], device=d), torch.arange(1.0, 4.0, device=d)),
    ),
    "lu_unpack pivots": (
        lambda d: torch.stack(torch.lu_unpack(torch.arange(9.0, device=d).reshape(3, 3), torch.tensor([2, 3, 3], dtype=torch.int32, device=d))),
        lambda d: torch.stack(torch.lu_unpack(torch.arange(9.0, device=d).reshape(3, 3), torch.tensor([2, 0, 3], dtype=torch.int32, device=d))),
    ),
}


@pytest.mark.parametrize("name", sorted(RANGED))
def test_values_and_targets_out_of_range_give_torchs_errors(name):
    good, bad = RANGED[name]
    with contextlib.suppress(IndexError, RuntimeError):
        turbine.synchronize(D)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # the anchor only carries the device: the turbine one on turbine's side, the CPU on torch's
        check(lambda anchor: good(anchor.device), torch.zeros(1))
        assert _outcome(lambda: bad(D)) == _outcome(lambda: bad("cpu")), name
    torch.testing.assert_close(good(D).cpu(), good("cpu"))  # the device runs on


@pytest.mark.parametrize("size", [6, 9])  # two sizes: the check's shape-generic kernel too
def test_int32_indices_are_checked_as_int64(size):
    """IREE could not compile the check for int32 indices for cuda: they are widened first, and
    the op still gets int32 indices."""
    x = torch.randn(size, 3)
    check(lambda t, i: torch.index_select(t, 0, i), x, torch.tensor([size - 1, 0, 2], dtype=torch.int32))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bad = torch.tensor([1, size], dtype=torch.int32)
        assert _outcome(lambda t, i: torch.index_select(t, 0, i), x.to(D), bad.to(D)) == ("IndexError", "index out of range in self")


def _pooling(dims: int, kind: str) -> tuple:
    """A pooling backward (aten op) and its arguments on the CPU: (gradient, input, the arguments
    between them and the indices, the forward's indices). All three kinds take them in that order."""
    torch.manual_seed(0)
    x = torch.randn((1, 2) + (4,) * dims)
    aten, window = torch.ops.aten, [2] * dims
    if kind == "max":
        out, indices = getattr(aten, f"max_pool{dims}d_with_indices")(x, window, window)
        rest = (window, window, [0] * dims, [1] * dims, False)
        return getattr(aten, f"max_pool{dims}d_with_indices_backward"), (torch.ones_like(out), x, *rest), indices
    if kind == "adaptive":
        out, indices = getattr(aten, f"adaptive_max_pool{dims}d")(x, window)
        return getattr(aten, f"adaptive_max_pool{dims}d_backward"), (torch.ones_like(out), x), indices
    out, indices = getattr(aten, f"fractional_max_pool{dims}d")(x, window, window, torch.rand(1, 2, dims))
    return getattr(aten, f"fractional_max_pool{dims}d_backward"), (torch.ones_like(out), x, window, window), indices


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("kind", ["max", "adaptive", "fractional"])
@pytest.mark.parametrize("bad", [16**3, -1, 10**11])
def test_pooling_backward_indices_outside_the_input_are_reported(kind, dims, bad):
    """A pooling backward adds each gradient at its index into the input's plane. torch's CPU and
    GPU kernels for max and adaptive pooling do it unchecked (a write outside the result, which
    crashed the process at exit on the CPU), its fractional ones assert; turbine reports the first
    index outside at the next read, and the device runs on."""
    backward, arguments, indices = _pooling(dims, kind)
    on_device = [a.to(D) if isinstance(a, torch.Tensor) else a for a in arguments]
    with contextlib.suppress(IndexError, RuntimeError):
        turbine.synchronize(D)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(backward(*on_device, indices.to(D)).cpu(), backward(*arguments, indices))
        bad_indices = indices.clone()
        bad_indices.view(-1)[1] = bad
        plane = "x".join(["4"] * dims)
        with pytest.raises(RuntimeError, match=rf"Found an invalid max index: {bad} \(input planes are of size {plane}\)"):
            backward(*on_device, bad_indices.to(D)).cpu()
    torch.testing.assert_close((arguments[1].to(D) * 2).cpu(), arguments[1] * 2)


#: grouped_mm's layouts: (mat_a's shape, mat_b's shape); offs end groups along the jagged dim (length 32).
GROUPED = {"2-d by 3-d": ((32, 16), (3, 16, 8)), "3-d by 2-d": ((3, 8, 16), (16, 32)), "2-d by 2-d": ((8, 32), (32, 16))}


@pytest.mark.parametrize("layout", sorted(GROUPED))
@pytest.mark.parametrize("offs, words", [
    ([8, 16, 32], None),
    ([8, 16, 40], r"offs\[2\] is 40, outside \[0, 32\]"),
    ([-8, 16, 32], r"offs\[0\] is -8, outside \[0, 32\]"),
    ([16, 8, 32], r"offs must not decrease, but offs\[1\] is 8 below offs\[0\]"),
    ([8, 20, 32], "on a GPU"),  # a group of 12 bfloat16s: 24 bytes, misaligned where the jagged dim is contiguous
])
def test_grouped_mm_offsets_outside_out_of_order_or_misaligned_are_reported(layout, offs, words):
    """grouped_mm's offsets end each group along its jagged dim: torch's CUDA kernel asserts on a
    group out of order or not spanning a multiple of 16 bytes (losing the CUDA context) and reads
    outside its operands past their end; its CPU kernel slices (so clamps) and checks nothing.
    turbine gives torch's result where torch's kernels agree, names the bad entry otherwise, and
    runs on (eager/ops/grouped.py)."""
    torch.manual_seed(0)
    a, b = (torch.randn(shape, dtype=torch.bfloat16) for shape in GROUPED[layout])
    o = torch.tensor(offs, dtype=torch.int32)
    misaligned = words == "on a GPU" and (layout != "2-d by 3-d")  # there the jagged dim is a's rows: 16 elements apart
    torchs_kernel = D.startswith("turbine:cuda") and turbine.config.executors != "iree"  # eager/ops/grouped.py
    if words == "on a GPU" and not (misaligned and torchs_kernel):
        words = None  # torch's CPU kernel, and turbine's matmul per group, take any group size
    with contextlib.suppress(IndexError, RuntimeError):
        turbine.synchronize(D)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if words is None:
            torch.testing.assert_close(torch._grouped_mm(a.to(D), b.to(D), o.to(D)).cpu(), torch._grouped_mm(a, b, o))
        else:  # at the call where the offsets are read on the host, at the read where checked on the device
            with pytest.raises(RuntimeError, match=words):
                torch._grouped_mm(a.to(D), b.to(D), o.to(D)).cpu()
    torch.testing.assert_close((a.to(D) * 2).cpu(), a * 2)
