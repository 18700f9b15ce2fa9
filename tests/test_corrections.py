"""Ops IREE 3.13 gets wrong or cannot take as they are, which turbine corrects (the op registry:
eager/ops/corrections.py and friends): each compared with torch on the CPU. All were found by the OpInfo run."""


import pytest
import torch

import turbine
from checks import D, check
from turbine.config import override



def test_negative_indices_read_and_write_from_the_end():
    x = torch.randn(5, 4)
    index = torch.tensor([-1, 0, -3, 3])  # rows 4, 0, 2, 3: no row twice, so a plain put is well defined
    check(lambda t, i: t[i], x, index)
    check(lambda t, i: t[:, i[:2]], x, index)

    def put(t, i):
        t = t.clone()
        t[i] = torch.arange(4.0, device=t.device).unsqueeze(1).expand(4, 4)
        return t

    check(put, x, index)
    check(lambda t, i: t.index_put((i,), torch.ones(4, device=t.device), accumulate=True), x, torch.tensor([-1, -1, 2, 0]))


@pytest.mark.filterwarnings("ignore::turbine.TurbineFallbackWarning")
def test_writing_through_a_boolean_mask():
    x = torch.randn(5, 3)
    mask = torch.rand(5) > 0.5
    check(lambda t, m: t.index_put((m,), torch.tensor(7.0)), x, mask)


def test_ops_whose_single_op_lowering_is_wrong():
    x = torch.randn(6, 5) * 2
    check(lambda t: torch.nn.functional.softshrink(t, 0.5), x)
    check(lambda t: t.renorm(2, -1, 0.5), x)
    check(lambda t, s: torch.select_scatter(t, s, -1, -1), x, torch.randn(6))
    check(lambda t, s: torch.select_scatter(t, s, 0, -2), x, torch.randn(5))


def test_max_unpool_puts_every_value_where_its_index_says():
    """IREE's max_unpool lowering dropped the second channel's value of a width-1 input unpooled to width 3."""
    unpool1d = torch.nn.functional.max_unpool1d
    check(lambda t, i: unpool1d(t, i, 3, 2, 0, output_size=[1, 2, 3]), torch.randn(1, 2, 1), torch.tensor([[[1], [2]]]))
    values, indices = torch.nn.functional.max_pool2d(torch.randn(2, 3, 6, 5), 2, return_indices=True)
    check(lambda t, i: torch.nn.functional.max_unpool2d(t, i, 2, output_size=[6, 5]), values, indices)
    values, indices = torch.nn.functional.max_pool3d(torch.randn(1, 2, 4, 5, 3), 2, return_indices=True)
    check(lambda t, i: torch.nn.functional.max_unpool3d(t, i, 2, output_size=[4, 5, 3]), values, indices)


def test_logcumsumexp_is_a_scan_of_log_add_exp():
    """IREE 3.13's own kernel gave inf; turbine's scan matches torch, infinities included."""
    x = torch.randn(4, 37) * 30
    x[0, :3] = -float("inf")
    x[1, 5] = float("inf")
    x[2, 7] = float("nan")
    with turbine.fallback("error"):
        check(lambda t: torch.logcumsumexp(t, 1), x, equal_nan=True)
        check(lambda t: torch.logcumsumexp(t, 0), x[:, :9], equal_nan=True)


@pytest.mark.parametrize("op", [torch.cummax, torch.cummin])
def test_cummax_and_cummin_point_at_the_latest_tie_and_nan(op):
    x = torch.randint(0, 4, (5, 23)).float()  # many ties
    x[1, 3] = float("nan")
    x[2, 10] = float("nan")
    x[2, 15] = float("nan")
    with turbine.fallback("error"):
        check(lambda t: op(t, 1), x, equal_nan=True)
        check(lambda t: op(t, 0), x, equal_nan=True)
        check(lambda t: op(t, 0), torch.randint(-9, 9, (17, 3)))


def test_reductions_of_0d_tensors():
    x = torch.randn(())
    check(lambda t: t.amax(0), x)
    check(lambda t: t.argmax(-1), x)
    check(lambda t: torch.max(t, 0), x)
    check(lambda t: torch.min(t, -1, keepdim=True), x)
    check(lambda t: torch.logsumexp(t, 0), x)
    check(lambda t: torch.logsumexp(t, [-1], keepdim=True), torch.tensor(float("-inf")))


@pytest.mark.filterwarnings("ignore::turbine.TurbineFallbackWarning")
def test_an_op_whose_lowering_cannot_be_traced_goes_to_the_fallback(monkeypatch, fresh_cache):
    """A lowering whose trace raises (a data-dependent shape inside a decomposition, say) is a
    lowering that failed: the op goes to the fallback policy."""
    from turbine.eager import registry

    def untraceable(x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("a data-dependent shape")

    registry.corrections_digest()  # read from the corrections as they are (once per process)
    monkeypatch.setattr(registry.entry(torch.ops.aten.log1p.default), "correction", untraceable)
    check(torch.log1p, torch.rand(5), executor="fallback")


def test_gradient_of_sgn_asks_for_efficient_zeros():
    x = torch.randn(6, requires_grad=True)
    (expected,) = torch.autograd.grad(torch.sgn(x).sum(), x)
    xd = x.detach().to(D).requires_grad_()
    (actual,) = torch.autograd.grad(torch.sgn(xd).sum(), xd)
    torch.testing.assert_close(actual.cpu(), expected)


def _with_nans(*shape):
    x = torch.randn(*shape)
    x.view(-1)[torch.randperm(x.numel())[: max(1, x.numel() // 5)]] = float("nan")
    return x


def _same(actual, expected):
    """Equal, NaNs included, on the CPU."""
    torch.testing.assert_close(actual.cpu(), expected, equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize(
    "fn",
    [
        lambda t: t.clamp(-0.5, 0.5),
        lambda t: t.clamp_min(0.1),
        lambda t: t.clamp_max(0.1),
        lambda t: t.clamp(min=torch.zeros(6, device=t.device)),
        lambda t: torch.nn.functional.hardtanh(t),
        lambda t: torch.maximum(t, t.flip(0)),
        lambda t: torch.minimum(t.flip(1), t),
        lambda t: t.clone().clamp_(-0.2, 0.3),
    ],
    ids=["clamp", "clamp_min", "clamp_max", "clamp_tensor", "hardtanh", "maximum", "minimum", "clamp_"],
)
def test_min_max_ops_keep_nans(fn):
    """IREE 3.13 turned NaN into a bound (maximum(nan, 2) gave 2); torch keeps the NaN."""
    x = _with_nans(5, 6)
    _same(fn(x.to(D)), fn(x))


@pytest.mark.parametrize(
    "fn",
    [
        lambda t, b: t.clamp(max=b),
        lambda t, b: t.clamp(min=b),
        lambda t, b: torch.clamp_max(t, b),
        lambda t, b: torch.clamp_min(t, b),
        lambda t, b: torch.maximum(t, b),
        lambda t, b: torch.minimum(t, b),
    ],
    ids=["clamp_max_bound", "clamp_min_bound", "clamp_max", "clamp_min", "maximum", "minimum"],
)
@pytest.mark.parametrize("bound", [False, True])
def test_min_max_ops_of_booleans(fn, bound):
    """IREE 3.13's clamp of a boolean tensor by a boolean tensor kept the input."""
    x, b = torch.rand(4, 5) > 0.5, torch.tensor(bound)
    _same(fn(x.to(D), b.to(D)), fn(x, b))


def test_argmax_and_argmin_point_at_the_first_nan():
    x = _with_nans(5, 6)
    for fn in (lambda t: t.argmax(1), lambda t: t.argmin(0), lambda t: t.argmax(), lambda t: t.argmin(1, keepdim=True)):
        _same(fn(x.to(D)), fn(x))


def test_max_and_min_along_a_dim_point_at_the_first_nan_and_the_first_tie():
    x = torch.tensor([[1.0, float("nan"), 3.0, float("nan")], [float("nan")] * 4, [float("-inf")] * 4, [2.0, 5.0, 5.0, 1.0]])
    check(lambda t: torch.max(t, 1), x, equal_nan=True)
    check(lambda t: torch.min(t, 0, keepdim=True), x, equal_nan=True)


@pytest.mark.parametrize("dims", [2, 3])
def test_max_pooling_indices_stay_in_the_input_at_the_padding_and_on_nans(dims):
    """IREE's lowering pads with -inf: a window of -inf at the padding pointed into it (index -5),
    and a window of NaNs gave -1, which the backward's index check then refused. torch's kernels
    point at the window's first element inside; with several NaNs torch points at the last, turbine
    at the first (both inside, both NaN)."""
    pool = getattr(torch.nn.functional, f"max_pool{dims}d")
    x = torch.randn((1, 2) + (4,) * dims)
    x[0, 0] = float("-inf")
    x[(0, 1) + (slice(1, 3),) * dims] = float("-inf")
    check(lambda t: pool(t, 2, 2, padding=1, return_indices=True), x)
    nans = torch.randn((1, 1) + (4,) * dims)
    nans.view(-1)[5] = float("nan")
    check(lambda t: pool(t, 3, 2, padding=1, return_indices=True), nans, equal_nan=True)
    leaf = torch.full((1, 1) + (4,) * dims, float("nan")).to(D).requires_grad_()
    values, indices = pool(leaf, 2, 2, padding=1, return_indices=True)
    values.sum().backward()
    assert indices.cpu().min() >= 0 and indices.cpu().max() < 4**dims
    assert leaf.grad.cpu().sum() == values.numel()  # every window's gradient landed inside


@pytest.mark.parametrize(
    "shape, size",
    [((2, 3, 4), (5,)), ((2, 3, 7, 9), (3, 4)), ((2, 3, 6, 5), (7, 8)), ((1, 2, 5, 6, 7), (3, 4, 2)), ((2, 3, 8, 8), (1, 1))],
)
def test_adaptive_average_pooling_with_overlapping_windows(shape, size):
    """Windows that overlap (area interpolation 4 -> 5 failed the GPU coverage run) are summed
    with weights; sizes that divide evenly keep IREE's own pooling. Gradients too."""
    pool = getattr(torch.nn.functional, f"adaptive_avg_pool{len(size)}d")

    def pooled_and_gradient(t, up):
        t = t.detach().requires_grad_()
        out = pool(t, size)
        return out, torch.autograd.grad(out, t, up)[0]

    x = torch.randn(shape)
    check(pooled_and_gradient, x, torch.randn(pool(x, size).shape))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.bool])
def test_sort_orders_nans_last_and_signed_zeros_as_equal(dtype):
    """And False before True (IREE 3.13 sorted True first)."""
    x = _with_nans(4, 5, 6) if dtype.is_floating_point else torch.randint(0, 4 if dtype != torch.bool else 2, (4, 5, 6))
    if dtype.is_floating_point:
        x[0, 0, :4] = torch.tensor([float("inf"), -0.0, 0.0, -float("inf")])
    x = x.to(dtype)
    for fn in (
        lambda t: t.sort(-1),
        lambda t: t.sort(0, descending=True),
        lambda t: torch.sort(t, dim=1, stable=True),
        lambda t: torch.sort(t, dim=-1, descending=True, stable=True),
    ):
        for a, e in zip(fn(x.to(D)), fn(x)):
            _same(a, e)  # indices too: IREE's sort keeps ties in order, as a stable sort must


def test_topk_counts_nan_as_largest():
    x = _with_nans(6, 8)
    for largest in (True, False):
        values, indices = x.to(D).topk(3, 1, largest=largest)
        expected, _ = x.topk(3, 1, largest=largest)
        _same(values, expected)
        _same(x.gather(1, indices.cpu()), expected)  # tied values may come in another order


@pytest.mark.parametrize("k", [1, 3, 8])
def test_an_unsorted_topk_runs_on_iree_in_order(k, stats):
    """``topk(sorted=False)``, which DeepSeek's MoE router asks for: IREE 3.13 compiled no such
    topk (every call fell back). The top k in order are a valid answer: the same values as torch's
    (which comes in its kernel's own order), each index pointing at its value."""
    x = torch.randn(32, 8)
    for largest in (True, False):
        with turbine.fallback("error"):
            values, indices = torch.topk(x.to(D), k, dim=-1, largest=largest, sorted=False)
        expected, _ = torch.topk(x, k, dim=-1, largest=largest, sorted=True)
        _same(values, expected)
        _same(x.gather(1, indices.cpu()), expected)
    assert stats()["fallbacks"] == {}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_sort_orders_close_negative_floats_and_gives_back_the_inputs_bits(dtype):
    """Sort keys of negative floats were computed with a negation IREE 3.13 did in float32, so
    close negatives tied and kept their input order (63 of 64 misplaced); the sorted values are
    decoded from the keys, with -0.0 and NaNs (whose keys are canonical) taken from the input."""
    x = -1 - torch.arange(64, dtype=torch.float64) * torch.finfo(dtype).eps
    x = torch.cat([x, torch.tensor([-0.0, 0.0, float("nan"), -float("nan"), torch.finfo(dtype).min, torch.finfo(dtype).tiny])])
    x = x.to(dtype)[torch.randperm(70)]
    bits = {torch.float64: torch.int64, torch.float32: torch.int32}.get(dtype, torch.int16)
    for descending in (False, True):
        with turbine.fallback("error"):
            values, indices = torch.sort(x.to(D), descending=descending, stable=True)
            top, _ = torch.topk(x.to(D), 9, largest=not descending)
        expected, expected_indices = torch.sort(x, descending=descending, stable=True)
        assert torch.equal(values.cpu().view(bits), expected.view(bits))
        assert torch.equal(indices.cpu(), expected_indices)
        _same(top, torch.topk(x, 9, largest=not descending)[0])


def test_order_kernels_compile_for_cuda():
    """IREE 3.13's CUDA target failed to bufferize a sort or topk whose sorted keys went unused,
    which the NaN-ordering sort's were (median and unique fell back on GPUs). Compiled here for
    the CUDA target, which needs no GPU."""
    from turbine.eager import lowering
    from turbine.eager.decompositions import order
    from turbine.kernels_cache import Target, compile_mlir

    cuda = Target("cuda", "sm_80", ())
    for fn, dtype in [
        (lambda t: list(order.sort(t, 1)), torch.float32),
        (lambda t: list(order.sort(t, 1, True)), torch.int64),
        (lambda t: list(order.topk(t, 5, 1)), torch.float32),
        (lambda t: list(order.median_dim(t, 1)), torch.float32),
    ]:
        assert len(compile_mlir(lowering.lower(fn, [((5, 60), dtype)]), cuda)) > 0


INTEGERS = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8]


@pytest.mark.parametrize("dtype", INTEGERS, ids=str)
def test_integer_negation_and_floor_division_are_exact(dtype):
    """IREE 3.13 negated int32/int64 through float32 and floor-divided int64 through float64
    (wrong above 2**53, and for large numbers of mixed signs); its int8 floor division did not
    compile (eager/decompositions/integers.py)."""
    info = torch.iinfo(dtype)
    x, y = torch.randint(info.min, info.max, (2, 500), dtype=dtype)
    y[:100] = torch.randint(1, 9, (100,), dtype=dtype)
    if dtype != torch.uint8:
        y[:50] = -y[:50]
    y[y == 0] = 1
    x[:2] = torch.tensor([info.min, info.max])
    check(torch.neg, x)
    check(lambda t: t.clone().neg_(), x)
    check(torch.floor_divide, x, y)
    check(lambda a, b: torch.div(a, b, rounding_mode="floor"), x, y)
    check(lambda a, b: a.clone().floor_divide_(b), x, y)
    check(lambda a: a // 7, x)
    check(lambda a: torch.div(a, -3 if dtype != torch.uint8 else 3, rounding_mode="floor"), x)
    check(lambda a, b: torch.div(a, b, rounding_mode="trunc"), x, y)


def test_order_statistics_follow_torchs_nan_rules():
    """median, nanmedian and kthvalue read a NaN-last sort (eager/decompositions/order.py), all
    as IREE kernels (on CUDA too, since the sort's keys feed its values)."""
    x = torch.randn(5, 9)
    x[1, 2] = x[3, 1] = x[3, 5] = float("nan")
    with turbine.fallback("error"):
        for fn in (
            lambda t: t.median(1),
            lambda t: t.nanmedian(1),
            lambda t: t.kthvalue(3, 1),
            lambda t: t.kthvalue(2, 0, keepdim=True),
            lambda t: t.median(),
            lambda t: t.nanmedian(),
            lambda t: t[0, 0].median(0),
        ):
            actual, expected = fn(x.to(D)), fn(x)
            for a, e in zip(actual, expected) if isinstance(expected, tuple) else [(actual, expected)]:
                _same(a, e)


def test_sinc_rounds_pi_x_as_torch_does_and_acosh_is_nan_below_1():
    """IREE's sinc took its own sine of pi x (1e-4 off at 1415.7); turbine's acosh correction
    gave -inf for large negative inputs (log1p(-1))."""
    x = torch.randn(2000) * torch.exp2(torch.randint(-20, 14, (2000,)).float())
    x[:4] = torch.tensor([0.0, -0.0, 1415.711669921875, -26195.814453125])
    check(torch.sinc, x, rtol=4e-6, atol=1e-30)
    check(torch.sinc, torch.arange(-5, 5))
    check(torch.acosh, x, rtol=4e-6, atol=0, equal_nan=True)


def test_tan_and_tanh_gelu_are_precise():
    """IREE 3.13's tan was 3% off near pi/2 and its gelu(tanh) 5e-5 off; torch's float32 is not."""
    x = torch.linspace(-6, 6, 4001)
    x[:3] = torch.tensor([1.5707964, -1.5708001, 4.712389])  # next to poles of tan
    check(torch.tan, x, rtol=2e-6, atol=0)
    check(lambda t: torch.nn.functional.gelu(t, approximate="tanh"), x, rtol=0, atol=1e-6)
    check(torch.nn.functional.gelu, x, rtol=0, atol=2e-6)


def test_tanh_gelu_gradient():
    x = torch.linspace(-6, 6, 2001)
    grad = torch.randn(2001)
    for approximate in ("tanh", "none"):
        expected = torch.ops.aten.gelu_backward(grad, x, approximate=approximate)
        actual = torch.ops.aten.gelu_backward(grad.to(D), x.to(D), approximate=approximate)
        torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=2e-5)


def test_floats_convert_to_uint8_as_torch_converts_them():
    """IREE converted floats to uint8 as to int8: 178.7 became 127."""
    x = torch.tensor([0.0, 7.4, 127.9, 128.0, 178.7, 254.99, 255.0])
    check(lambda t: t.byte(), x)
    check(lambda t: t.to(torch.uint8), x.double())


@pytest.mark.parametrize("other", [-3, 300, -256 - 7], ids=str)
def test_uint8_ops_wrap_their_other_integer_operands_as_torch_does(other):
    """uint8 with a 0-d int64 operand computes in uint8, -3 read as 253 (the trace widens uint8
    to int16 and read -3 as -3: maximum, <, floor_divide, remainder and clamp were wrong)."""
    x = torch.tensor([0, 1, 5, 200, 252, 253, 254, 255], dtype=torch.uint8)
    s = torch.tensor(other)
    for fn in (
        torch.maximum, torch.minimum, torch.lt, torch.ge, torch.eq, torch.floor_divide, torch.remainder,
        lambda a, b: torch.clamp(a, b, torch.tensor(44)), lambda a, b: a.clone().lt_(b),
        lambda a, b: torch.where(a > 3, a, b), torch.add, torch.div, torch.bitwise_xor,
    ):
        check(fn, x, s)
        check(lambda a: fn(a, torch.tensor(other)), x)  # a 0-d CPU tensor: a runtime scalar
    check(lambda a: a < -3, x)
    check(lambda a: torch.clamp(a, min=-3), x)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8], ids=str)
def test_a_number_the_dtype_cannot_hold_wraps_in_binary_ops_and_is_refused_elsewhere(dtype):
    """``image < 256``: torch's binary ops convert a Python number operand to the tensor's dtype,
    wrapping (256 is 0 to uint8); turbine raised "value cannot be converted". torch's other ops
    (fills, clamp) and add/sub's alpha refuse such a number, and so does turbine, in torch's words
    (an alpha alone, with no number operand, had wrapped)."""
    x = torch.tensor([-5, 0, 1, 100, 127], dtype=torch.int64).to(dtype)
    for fn in (
        lambda t: t < 256, lambda t: t == 256, lambda t: t != 300, lambda t: t >= -200, lambda t: t + 256,
        lambda t: 300 - t, lambda t: t * 300, lambda t: t % 300, lambda t: t & 300, lambda t: t.clone().add_(300),
        lambda t: torch.add(t, 300, alpha=3), lambda t: torch.sub(t, t, alpha=2),
    ):
        check(fn, x)
    for fn in (
        lambda t: torch.full((3,), 256, dtype=t.dtype, device=t.device), lambda t: t.masked_fill(t > 3, 300),
        lambda t: torch.full_like(t, 256), lambda t: t.new_full((2,), -300),
        lambda t: torch.add(t, t, alpha=300), lambda t: torch.sub(t, t, alpha=-300), lambda t: t.clone().add_(t, alpha=256),
    ):
        with pytest.raises(RuntimeError) as expected:
            fn(x)
        with pytest.raises(RuntimeError, match=str(expected.value).split(" type ")[0]):
            fn(x.to(D))


def test_rrelu_in_training_draws_torchs_slopes():
    x = torch.randn(40)
    torch.manual_seed(3)
    expected = torch.nn.functional.rrelu(x, 0.1, 0.3, training=True)
    torch.manual_seed(3)
    actual = torch.nn.functional.rrelu(x.to(D), 0.1, 0.3, training=True)
    torch.testing.assert_close(actual.cpu(), expected)
    check(lambda t: torch.nn.functional.rrelu(t, 0.1, 0.3, training=False), x)


def test_rrelu_in_place_in_evaluation_is_a_kernel_that_writes_its_input():
    """``rrelu_with_noise_`` writes two arguments (its input, and the noise in training), which
    no plan of turbine's takes: in evaluation it fell back."""
    x = torch.randn(40)

    def in_place(t):
        view = t.clone()[::2]
        result = torch.nn.functional.rrelu(view, 0.1, 0.3, training=False, inplace=True)
        assert result is view
        return view, torch.nn.functional.rrelu(t.clone(), inplace=True)

    check(in_place, x)


def test_hardtanh_of_integers_with_runtime_bounds_is_a_kernel():
    """torch's reference hardtanh branches on integer bounds, which are runtime numbers here."""
    check(lambda t: torch.nn.functional.hardtanh(t, -2, 3), torch.arange(-6, 6))
    check(lambda t: torch.nn.functional.relu6(t * 2), torch.arange(-6, 6))
    check(lambda t: torch.nn.functional.hardtanh(t, -0.5, 0.5), torch.tensor([float("nan"), -3.0, 0.25, 4.0]), equal_nan=True)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_multilabel_margin_loss_counts_targets_up_to_the_first_minus_one(reduction):
    """IREE's lowering (and torch's decomposition) counted the target entries after a sample's
    first -1 too: another loss for most inputs (decompositions/margins.py)."""
    torch.manual_seed(0)
    scores = torch.randn(4, 5)
    target = torch.tensor([[2, -1, 0, 4, 1], [0, 1, -1, -1, 3], [4, 3, 2, 1, 0], [-1, 2, 2, 0, 1]])
    loss = torch.nn.functional.multilabel_margin_loss
    check(lambda s, t: loss(s, t, reduction=reduction), scores, target)

    def gradient(s: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        s = s.clone().requires_grad_()
        return torch.autograd.grad(loss(s, t, reduction=reduction).sum(), s)[0]

    # torch gives the backward op no shape rule; turbine's (decompositions/margins.py) makes it a kernel
    check(gradient, scores, target)
    check(gradient, scores[0], target[0])  # one sample, unbatched


@pytest.mark.filterwarnings("ignore:index_reduce.. is in beta")
def test_an_integer_scatter_mean_rounds_down_as_torchs():
    """IREE's lowering rounded an integer mean toward zero ((-6 - 9) / 2 gave -7, torch -8)."""
    x = torch.randint(-9, 10, (10, 5))
    index = torch.randint(0, 10, (6, 5))
    src = torch.randint(-9, 10, (6, 5))
    for include_self in (True, False):
        check(lambda t, i, s: t.scatter_reduce(0, i, s, "mean", include_self=include_self), x, index, src)
    check(lambda t, i, s: t.scatter_reduce(1, i, s, "mean"), x.to(torch.int32), index % 5, src.to(torch.int32))
    check(lambda t, i, s: t.scatter_reduce(0, i, s, "mean"), x.float(), index, src.float())
    check(lambda t, i, s: t.index_reduce(0, i, s, "mean"), x, torch.tensor([0, 0, 2, 0, 9, 2]), src)


def test_scatters_along_a_dim_counted_from_the_back():
    """IREE 3.13 scattered along the wrong dim for a dim below -2: sort's backward along dim -3
    (a scatter of the gradient) gave wrong gradients."""
    x = torch.randn(3, 4, 5, 2)
    for dim in (-4, -3):
        index = torch.argsort(torch.randn(3, 4, 5, 2), dim)
        check(lambda t, i, s: t.scatter(dim, i, s), torch.zeros(3, 4, 5, 2), index, x)
        check(lambda t, i: t.scatter(dim, i, 2.5), torch.zeros(3, 4, 5, 2), index)
        check(lambda t, i, s: t.scatter_add(dim, i, s), torch.ones(3, 4, 5, 2), index, x)
        check(lambda t, i, s: t.scatter_reduce(dim, i, s, "amax", include_self=False), torch.ones(3, 4, 5, 2), index, x)
    leaf = torch.randn(5, 5, 5, requires_grad=True)
    check(lambda t: torch.autograd.grad(torch.sort(t, -3, descending=True)[0].mul(torch.arange(125.0, device=t.device).view(5, 5, 5)).sum(), t)[0], leaf)


def test_pow_is_as_precise_as_torchs():
    """IREE's pow is exp(log(base) * exponent): in float32 up to 2e-6 off, 30 times torch's error."""
    base = torch.rand(4000) * 9 + 0.5
    exponent = torch.rand(4000) * 18 - 9
    check(torch.pow, base, exponent, rtol=2e-7, atol=0)
    check(lambda b: b ** 7.3, base, rtol=2e-7, atol=0)
    check(lambda e: 4.55 ** e, exponent, rtol=2e-7, atol=0)
    check(torch.pow, -base, exponent.round())  # negative bases, integral exponents


@pytest.mark.parametrize("dtype", [torch.int64, torch.int8, torch.uint8])  # (int32 multiplies as int64 does, int16 as int8)
def test_integer_powers_are_kernels_that_wrap_around_as_torchs(dtype):
    """IREE 3.13 could not compile an integer pow (nor an integer base to a float exponent): they
    fell back. turbine squares, bit by bit of the exponent, wrapping around as torch's kernels do
    (7 ** 40 overflows every type); a negative exponent gives 1, +-1 or 0 as torch's."""
    low = 0 if dtype == torch.uint8 else -7
    base = torch.randint(low, 8, (300,), dtype=dtype)
    exponent = torch.randint(0, 60, (300,), dtype=dtype)
    check(torch.pow, base, exponent)
    check(lambda b: b**2, base)
    check(lambda b: b**40, base)
    check(lambda e: 3**e, exponent)
    check(lambda b: b**2.5, base, equal_nan=True)
    check(lambda e: 1.5**e, exponent)
    if dtype != torch.uint8:
        check(torch.pow, torch.tensor([1, -1, -1, 2, 0, -3], dtype=dtype), torch.tensor([-5, -2, -3, -1, -4, -2], dtype=dtype))
        with pytest.raises(RuntimeError, match="Integers to negative integer powers are not allowed"):
            base.to(D) ** -3


@pytest.mark.parametrize("relu", [torch.relu, torch.relu_, torch.nn.functional.relu], ids=["relu", "relu_", "F.relu"])
def test_relu_of_booleans_raises_torchs_error(relu):
    """torch's kernels refuse relu of booleans, its shape rule does not: turbine's kernel gave all
    False (tests/test_fuzz.py found it)."""
    mask = torch.tensor([True, False])
    with pytest.raises(RuntimeError, match="Boolean inputs not supported for relu"):
        relu(mask.clone())
    with pytest.raises(RuntimeError, match="Boolean inputs not supported for relu"):
        relu(mask.to(D))


@pytest.mark.parametrize("dims", [1, 3])  # (avg_pool1d pools an unbatched input with avg_pool2d)
def test_average_pooling_of_unbatched_inputs(dims):
    """IREE 3.13 pools batched inputs only: avg_pool of a (channels, *spatial) input fell back
    (module_db's AvgPool2d/3d samples); it runs as a batch of one, forward and backward."""
    pool = [torch.nn.functional.avg_pool1d, torch.nn.functional.avg_pool2d, torch.nn.functional.avg_pool3d][dims - 1]
    x = torch.randn((3,) + (6,) * dims)
    upstream = torch.randn(pool(x, 3, 2, 1, ceil_mode=True, count_include_pad=False).shape)

    def pooled_and_gradient(t, u):
        t = t.detach().requires_grad_()
        y = pool(t, 3, 2, 1, ceil_mode=True, count_include_pad=False)
        return y, torch.autograd.grad(y, t, u)[0]

    check(pooled_and_gradient, x, upstream)
    check(lambda t: pool(t, 2), x)


CEIL_MODE_POOLS = {
    # name: (input sizes, kernel, stride, padding, count_include_pad, divisor_override)
    "Funnel's (2, 1) windows": ((2, 1, 7, 32), (2, 1), (2, 1), 0, True, None),
    "EfficientNet's window wider than the input": ((2, 8, 2, 2), 16, 16, 0, True, None),
    "padded, padding not counted": ((2, 3, 7, 9), 3, 2, 1, False, None),
    "stride wider than the kernel": ((2, 3, 7, 9), 2, (2, 3), 0, True, None),
    "a divisor": ((1, 2, 6, 5), (3, 2), 2, 1, True, 3),
    "3-D": ((1, 2, 5, 4, 7), 2, 2, 0, True, None),
}


@pytest.mark.parametrize("name", sorted(CEIL_MODE_POOLS))
def test_average_pooling_in_ceil_mode_runs_on_iree(name):
    """Windows that reach past the padded input (``ceil_mode``) failed IREE 3.13's compile
    ('linalg.generic' op inferred input/output operand #2 has shape's dimension #2 to be 33, but
    found 32) and fell back (Funnel, EfficientNet); they are sums over a zero-padded input
    divided by torch's counts. Forward and backward."""
    sizes, kernel, stride, padding, include_pad, divisor = CEIL_MODE_POOLS[name]
    pool = torch.nn.functional.avg_pool2d if len(sizes) == 4 else torch.nn.functional.avg_pool3d

    def pooled_and_gradient(t):
        t = t.detach().requires_grad_()
        y = pool(t, kernel, stride, padding, True, include_pad, divisor)
        return y, torch.autograd.grad(y.square().sum(), t)[0]

    check(pooled_and_gradient, torch.randn(sizes), rtol=1e-5, atol=1e-5)


def test_average_pooling_that_leaves_the_end_of_a_dim_unread():
    """IREE 3.13's lowering failed where the windows leave the end of a dim unread (a 3x4x4
    input in 2x2x2 windows: 'linalg.generic' op inferred ... to be 3, but found 2) and fell back
    (OpInfo's first avg_pool3d sample); it pools the part the windows read."""
    x = torch.randn(2, 3, 3, 4, 5)
    check(lambda t: torch.nn.functional.avg_pool3d(t, 2), x)
    check(lambda t: torch.nn.functional.avg_pool3d(t, 2, 2, divisor_override=3), x)


@pytest.mark.parametrize(
    "weights, reduction", [("weight", "mean"), ("weight", "sum"), ("both", "mean"), ("pos_weight", "none")]
)
def test_binary_cross_entropy_with_logits_and_per_class_weights(weights, reduction):
    """IREE 3.13's lowering failed to compile with a per-class weight and a reduction, or with
    both weights: BCEWithLogitsLoss(weight=...) fell back (module_db's samples)."""
    torch.manual_seed(0)
    x, target = torch.randn(15, 10) * 30, torch.rand(15, 10)
    x[0, :4] = torch.tensor([100.0, -100.0, 1e-3, -20.0])
    given = {"weight": {"weight": torch.rand(10)}, "pos_weight": {"pos_weight": torch.rand(10) * 3}}
    given["both"] = {**given["weight"], **given["pos_weight"]}
    names = list(given[weights])
    upstream = torch.randn(() if reduction != "none" else (15, 10))

    def loss_and_gradient(t, y, u, *w):
        t = t.detach().requires_grad_()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(t, y, reduction=reduction, **dict(zip(names, w)))
        return loss, torch.autograd.grad(loss, t, u)[0]

    check(loss_and_gradient, x, target, upstream, *given[weights].values())


def test_logcumsumexp_gradients_of_large_inputs():
    """The backward subtracts results from inputs: a float32 scan's rounding made gradients of
    inputs near 10000 0.6% off; the scan runs in float64, as torch's CPU kernel does."""
    x = (torch.randn(5, 6) + 10000).requires_grad_()
    upstream = torch.randn(5, 6)
    for dim in (0, 1):
        check(lambda t, u: torch.autograd.grad(t.logcumsumexp(dim), t, u)[0], x, upstream)


def test_pow_gives_cs_special_values():
    """IREE's pow (exp(log(base) * exponent)) gave 0.0 ** -2 = -inf, (-0.0) ** -3 = +inf,
    (-inf) ** 1.5 = NaN and (-1) ** inf = NaN, where torch follows C's pow."""
    special = [0.0, -0.0, 2.0, -2.0, float("inf"), float("-inf"), float("nan"), 1.0, -1.0, 0.3]
    x = torch.tensor(special)
    for exponent in (-2, -1, -0.5, 0, 0.5, 2, 3, -3, 1.5, 4, float("inf"), float("-inf"), float("nan")):
        check(lambda t: t**exponent, x, equal_nan=True)
    bases, exponents = torch.tensor(special).repeat_interleave(10), torch.tensor(special).repeat(10)
    check(torch.pow, bases, exponents, equal_nan=True)
    result = (x.to(D) ** -3).cpu()
    assert torch.equal(torch.signbit(result[:2]), torch.tensor([False, True]))  # +inf, -inf


def test_activations_at_their_bounds_and_at_nan():
    """IREE 3.13 passed relu6's and hardtanh's gradient at their bounds (MobileNet's relu6 at
    exactly 0), turned NaN into threshold's value and hardshrink's 0, stopped relu's gradient at
    NaN and gave softplus a gradient there, where torch's CPU kernels do as checked here."""
    F = torch.nn.functional
    x = torch.tensor([float("nan"), -1.0, -0.0, 0.0, 0.3, 1.0, 6.0, 7.0, 25.0])
    upstream = torch.arange(1.0, 10.0)

    def gradient(fn):
        return lambda t, u: torch.autograd.grad(fn(t), t, u)[0]

    leaf = x.clone().requires_grad_()
    for fn in (F.relu6, F.hardtanh, lambda t: F.hardtanh(t, 0.0, 6.0), torch.relu, F.softplus, lambda t: F.threshold(t, 0.3, -2.0)):
        check(fn, x, equal_nan=True)
        check(gradient(fn), leaf, upstream, equal_nan=True)
    check(F.hardshrink, x, equal_nan=True)


def test_functions_near_zero_are_exact_to_float32():
    """IREE 3.13 computed elu's exp(x) - 1, asinh's log(x + sqrt(x * x + 1)), atanh's
    log((1 + x) / (1 - x)) and sinh's exp(x) - exp(-x) as written: 5-30% off for small x, where
    torch is exact to float32; its cosh overflowed before 89 (torch's: 2.2e38)."""
    F = torch.nn.functional
    small = torch.cat([torch.logspace(-30, 0, 61), -torch.logspace(-30, 0, 61), torch.linspace(-12, 12, 97)])
    specials = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 89.0, -89.0, 1e30])
    for fn in (F.elu, F.selu, lambda t: F.celu(t, 0.7), torch.asinh, torch.sinh, torch.cosh, lambda t: torch.atanh(t / 13)):
        check(fn, small, rtol=5e-7, atol=0)
        check(fn, specials, equal_nan=True)
    check(torch.atanh, torch.tensor([0.99999, -0.99999, 1.0, -1.0, 1.5, 1e-20, -1e-30]), rtol=5e-7, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_radians_to_degrees_as_torchs(dtype):
    """IREE 3.13's rad2deg multiplied by 180 / 3.14159: 8.4e-7 relative off, past float64's
    tolerance at its 7th digit (found by a float64 OpInfo sweep); its deg2rad was an ulp off for
    half its results. Both are torch's, bit for bit."""
    x = (torch.randn(500, dtype=torch.float64) * 100).to(dtype)
    check(torch.rad2deg, x, rtol=0, atol=0)
    check(torch.deg2rad, x, rtol=0, atol=0)


def test_sines_and_cosines_of_large_and_tiny_arguments():
    """IREE's float32 sine reduced its argument badly: sin(100) was 5e-6 off and sin(-1e-30)
    6e-8; rotary position embeddings take sines and cosines of positions in the thousands."""
    positions = torch.arange(0, 8192.0) * 0.7
    for fn in (torch.sin, torch.cos):
        check(fn, positions, rtol=2.4e-7, atol=6e-8)
        check(fn, torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0, -0.0]), equal_nan=True)
    tiny = torch.cat([torch.logspace(-30, -4, 27), -torch.logspace(-30, -4, 27)])
    check(torch.sin, tiny, rtol=2.4e-7, atol=0)


def test_arctangents_are_exact_to_float32():
    """IREE 3.13's float32 atan and atan2 were 40 ulps off (2.4e-6 relative at 0.66, past torch's
    default tolerance), atan2(-3, -inf) had the wrong sign, and the CPU had no float64 atan (it
    fell back to torch's kernel)."""
    torch.manual_seed(0)
    x = torch.cat([torch.randn(20000) * scale for scale in (1e-3, 0.1, 1, 10, 1e4)])
    y = torch.cat([torch.randn(20000) * scale for scale in (1, 1e-3, 10, 0.1, 1)])
    check(torch.atan, x, rtol=1.2e-7, atol=0)
    check(torch.atan2, y, x, rtol=1.2e-7, atol=0)
    check(torch.atan, x.double(), rtol=1e-15, atol=0)
    check(torch.atan2, y.double(), x.double(), rtol=1e-15, atol=0)
    special = torch.tensor([0.0, -0.0, 3.0, -3.0, float("inf"), float("-inf"), float("nan")])
    check(torch.atan, special, equal_nan=True)
    # every pair of special values, signed zeros included (assert_close tells 0.0 from -0.0)
    check(torch.atan2, special.repeat_interleave(7), special.repeat(7), equal_nan=True)
    check(torch.atan2, torch.tensor(-0.0), torch.tensor(-5.0))
    leaf = x[:1000].clone().requires_grad_()
    check(lambda t: torch.autograd.grad(torch.atan2(t, t.flip(0) + 0.5).sum(), t)[0], leaf)


def test_acosh_near_one_is_exact_to_float32():
    """IREE computed log(x + sqrt(x * x - 1)): 7e-5 off at 1 + 2e-7, where x * x - 1 cancels."""
    near_one = 1 + torch.arange(1, 200, dtype=torch.float32) * 1.1920929e-07
    wide = torch.cat([near_one, torch.logspace(0, 38, 77), torch.tensor([0.5, float("inf"), float("nan")])])
    check(torch.acosh, wide, rtol=3e-7, atol=0, equal_nan=True)
    check(torch.acosh, wide.double(), rtol=1e-15, atol=0, equal_nan=True)


def test_float64_log1p_and_expm1_are_exact_for_tiny_arguments():
    """IREE 3.13's float64 log1p and expm1 (on the CPU) computed log(1 + x) and exp(x) - 1 as
    written: 0 below 1e-16 and 1.6e-5 off near 1e-11; so were the float64 functions turbine
    builds on them (asinh, atanh, sinh, elu, softplus), and log_ndtr's upper tail (0 past 8, in float32 too)."""
    F = torch.nn.functional
    small = torch.cat([torch.logspace(-300, 0, 121, dtype=torch.float64), -torch.logspace(-300, -0.01, 121, dtype=torch.float64)])
    wide = torch.cat([small, torch.linspace(-700, 700, 57, dtype=torch.float64)])
    specials = torch.tensor([0.0, -0.0, -1.0, float("inf"), float("-inf"), float("nan")], dtype=torch.float64)
    for fn in (torch.log1p, torch.expm1, torch.asinh, torch.sinh, F.elu, F.softplus, lambda t: torch.atanh(t / 701)):
        check(fn, wide, rtol=1e-15, atol=0, equal_nan=True)
        check(fn, specials, equal_nan=True)
    tails = torch.tensor([-40.0, -5.0, 0.0, 3.0, 8.5, 10.0, 26.0, 30.0])
    check(torch.special.log_ndtr, tails.double(), rtol=1e-12, atol=0)
    # float32 against float64: torch's own float32 one is 2.4e-6 off at 8.5
    exact = torch.special.log_ndtr(tails.double()).float()
    torch.testing.assert_close(torch.special.log_ndtr(tails.to(D)).cpu(), exact, rtol=2.4e-7, atol=0)


def test_float64_sines_keep_float64_precision_near_multiples_of_pi():
    """The float32 sine's reduction by pi in float64 (x / pi) rounds by 1e-16 of x: for a
    float64 sine near a multiple of pi that was 1e-10 relative error. float64 sines are the op
    itself: IREE's kernel, on the CPU linked against the C library's sine."""
    x = torch.cat([torch.arange(1, 300, dtype=torch.float64) * 3.141592653589793, torch.linspace(-40, 40, 101, dtype=torch.float64)])
    for fn in (torch.sin, torch.cos, torch.tan):
        check(fn, x, rtol=1e-15, atol=0)


@pytest.mark.parametrize(
    "fn",
    [torch.sin, torch.cos, torch.tan, torch.asin, torch.acos, torch.tanh, torch.log2, torch.erf, torch.special.sinc,
     torch.nn.functional.gelu, torch.nn.functional.mish, lambda t: torch.remainder(t, 0.3)],
    ids=["sin", "cos", "tan", "asin", "acos", "tanh", "log2", "erf", "sinc", "gelu", "mish", "remainder"],
)
def test_float64_functions_iree_has_no_cpu_code_for_run_on_iree(fn):
    """IREE 3.13's CPU kernels carry their own math, which has no float64 sin, cos, tan, asin,
    acos, tanh, log2 or fmod ("undefined symbol: sin" at link) and no float64 vector erf: these
    fell back to torch's kernel. Such kernels are now linked against the C library's libm, and
    erf (gelu's too) is turbine's float64 series. Forward and gradient, to float64 precision."""

    def value_and_gradient(t, up):
        t = t.detach().requires_grad_()
        out = fn(t)
        return out, torch.autograd.grad(out, t, up)[0]

    x = torch.rand(200, dtype=torch.float64) * 1.8 - 0.9
    check(value_and_gradient, x, torch.randn(200, dtype=torch.float64), rtol=1e-13, atol=1e-15, equal_nan=True)  # log2 of x < 0


def test_float64_lgamma_and_digamma_keep_float64_precision():
    """IREE 3.13's own float64 lgamma was 3.3e-8 off below 0 and its digamma 2e-11 off; they are
    turbine's float64 series (the decompositions of gamma.py) for float64, IREE's op for float32."""
    x = torch.linspace(-6, 6, 2001, dtype=torch.float64)
    x = torch.cat([x[x != x.round()], torch.linspace(6, 300, 500, dtype=torch.float64)])
    for fn in (torch.lgamma, torch.digamma):
        check(fn, x, rtol=1e-13, atol=1e-13)
        check(fn, x.float())


def test_fmod_is_exact_for_any_quotient():
    """IREE 3.13's float32 fmod computed x - trunc(x / y) * y as written: from quotients near 1e7
    on it was wrong, even in sign (fmod(3e7, 0.7) gave -0.289, not 0.411). fmod's result is always
    representable, and torch's is exact (up to quotients past float32's range, where its CPU
    kernel gives NaN)."""
    torch.manual_seed(0)
    x = torch.cat([torch.randn(4000) * scale for scale in (1e-3, 1, 100, 1e7, 1e20)])
    y = torch.cat([torch.randn(4000) * scale for scale in (1, 1e-3, 1e-5, 0.7, 1e-15)])
    check(torch.fmod, x, y, rtol=0, atol=0)
    check(lambda t: torch.fmod(t, 0.7), x, rtol=0, atol=0)
    check(torch.fmod, x.to(torch.bfloat16), y.to(torch.bfloat16), rtol=0, atol=0)
    check(torch.fmod, torch.tensor(-7.5), torch.tensor([2.0, -2.0, 0.3]), rtol=0, atol=0)
    special = torch.tensor([0.0, -0.0, 1.0, -2.5, 3e38, float("inf"), float("-inf"), float("nan")])
    check(torch.fmod, special.repeat_interleave(8), special.repeat(8), rtol=0, atol=0, equal_nan=True)
    check(torch.fmod, torch.tensor([5, -7, 9]), torch.tensor([3, 3, -4]))


def test_exp2_is_exact_to_float32_far_from_zero():
    """IREE 3.13's exp2 was exp(x log 2), whose rounding of x log 2 grows with |x|: 34 ulps
    (2e-6) at -71 in float32, 1e-14 in float64."""
    x = torch.cat([torch.linspace(-126, 127, 2001), torch.tensor([0.0, -0.0, 0.5, 1e9, -1e9, float("inf"), float("-inf"), float("nan")])])
    check(torch.exp2, x, rtol=1.2e-7, atol=0, equal_nan=True)
    check(torch.exp2, torch.linspace(-1000, 1000, 2001, dtype=torch.float64), rtol=4.5e-16, atol=0)
    check(torch.exp2, torch.tensor([3, -2, 0]))


def test_running_sums_and_products_accumulate_in_float64():
    """IREE 3.13's float32 scan added in float32, in order: 3.5e-5 off after 32000
    probabilities (a top-p sampler compares such sums with its threshold), where torch's CPU
    kernel, accumulating in double, is 5e-8 off. Now equal to torch's."""
    torch.manual_seed(0)
    probabilities = torch.softmax(torch.randn(4, 32000) * 3, -1)
    check(lambda t: torch.cumsum(t, -1), probabilities, rtol=0, atol=0)
    check(lambda t: torch.cumprod(t, 1), 1 + torch.randn(4, 2000) * 1e-3, rtol=1.2e-7, atol=0)
    leaf = torch.randn(3, 50).requires_grad_()
    check(lambda t: torch.autograd.grad(torch.cumsum(t, 1).pow(2).sum(), t)[0], leaf)
    check(lambda t: torch.cumsum(t, 0), torch.tensor([1.0, 2.5], dtype=torch.bfloat16))
    check(lambda t: torch.cumsum(t, 0, dtype=torch.float64), torch.tensor([1.0, 2.5]))
    check(lambda t: torch.cumsum(t, 0), torch.tensor([3, -1, 4]))


def test_integer_running_products_wrap_around_as_torchs():
    """IREE 3.13 could not compile an integer cumprod (masked.cumprod fell back): a scan of
    products, which wrap around in int64 as torch's do; booleans and int32 count as int64."""
    torch.manual_seed(0)
    check(lambda t: torch.cumprod(t, 1), torch.randint(-9, 10, (4, 60)))  # past 2**63: wraps
    check(lambda t: torch.cumprod(t, -1), torch.randint(-3, 4, (2, 3, 5), dtype=torch.int32))
    check(lambda t: torch.cumprod(t, 0), torch.rand(7) > 0.3)
    check(lambda t: torch.cumprod(t, 0, dtype=torch.int32), torch.tensor([3, -1, 4]))
    check(lambda t: torch.cumprod(t, 0), torch.tensor(5))


def test_float32_reductions_of_a_million_numbers_are_rounded_once():
    """IREE adds float32 reductions in float32 along vector lanes: a sum or mean of a million
    numbers came out 8.6e-6 relative off, a norm 2e-3, an MSE loss 4e-3, a batch norm's running
    mean and weight gradient 1e-5, a layer norm 2e-5 (torch's CPU kernels 2e-8 to 2e-5).
    Accumulated in float64 and rounded once, each is within two float32 ulps of the exact value
    (softmax and layer norm, whose elementwise parts stay float32: within torch's tolerance)."""
    torch.manual_seed(0)
    x = torch.rand(16, 4, 128, 128) + 0.5
    reductions = {
        "sum over dims": (lambda t: t.sum((0, 2, 3)), 2.5e-7, 0),
        "mean": (lambda t: t.mean(), 2.5e-7, 0),
        "norm": (lambda t: torch.linalg.vector_norm(t), 2.5e-7, 0),
        "mse loss": (lambda t: torch.nn.functional.mse_loss(t, t * 0.25), 2.5e-7, 0),
        "logsumexp": (lambda t: t.reshape(-1).logsumexp(0), 2.5e-7, 0),
        "log-softmax": (lambda t: t.reshape(4, -1).log_softmax(1), 1e-6, 1e-6),
        "layer norm": (lambda t: torch.nn.functional.layer_norm(t.reshape(4, -1), (t.numel() // 4,)), 1e-6, 1e-6),
        "batch norm, no running statistics": (lambda t: torch.nn.functional.batch_norm(t, None, None, training=True), 1e-6, 1e-6),
    }
    # Kernels for these sizes: where the suite's earlier calls made a family shape-generic in
    # every dim, a kernel counts none of its sizes and adds as IREE does (accumulation.py).
    with turbine.fallback("error"), override(dynamic="off"):
        for name, (f, rtol, atol) in reductions.items():
            torch.testing.assert_close(f(x.to(D)).cpu(), f(x.double()).float(), rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")
        exact, ours = torch.nn.BatchNorm2d(4).double(), torch.nn.BatchNorm2d(4).to(D)
        torch.testing.assert_close(ours(x.to(D)).cpu(), exact(x.double()).float())
        torch.testing.assert_close(ours.running_mean.cpu(), exact.running_mean.float(), rtol=2.5e-7, atol=0)
        torch.testing.assert_close(ours.running_var.cpu(), exact.running_var.float(), rtol=2.5e-7, atol=0)
        x.requires_grad_()
        for model, inputs in ((exact, x.double()), (ours, x.detach().to(D).requires_grad_())):
            (model(inputs) * inputs).sum().backward()
        torch.testing.assert_close(ours.weight.grad.cpu(), exact.weight.grad.float(), rtol=2e-6, atol=0)  # saved statistics rounded to float32
        rows = x.detach().reshape(16, -1)  # a kernel generic in the count of rows counts the row's length
        ours = turbine.mark_dynamic(rows.to(D), 0)
        torch.testing.assert_close(ours.sum(1).cpu(), rows.double().sum(1).float(), rtol=2.5e-7, atol=0)


def test_a_refinement_that_does_not_compile_leaves_the_op_as_it_is(monkeypatch, fresh_cache, stats):
    """IREE's CUDA target failed to compile a float64 mean of 16x4x128x128 numbers, which then fell
    back. A correction that only refines a right lowering gives way to the op itself; here the
    widening is made to fail on the CPU (complex numbers, which turbine refuses to compile)."""
    from turbine.eager.decompositions import accumulation

    monkeypatch.setattr(accumulation, "WIDE", torch.complex128)
    x = torch.rand(64, 32) + 0.5
    with turbine.fallback("error"):
        check(lambda t: t.mean(), x)
        check(lambda t: t.log_softmax(0), x.reshape(-1, 1))
        check(lambda t: t.nansum(), x)  # IREE lowers nansum decomposed only
    assert stats()["compile_failures"] == 0 and stats()["kernels_compiled"] == 3


def test_float64_to_float16_keeps_float16_subnormals():
    """IREE 3.13 converted float64 to float16 with float16's subnormals (below 6.1e-5) flushed to
    0; torch goes through float32 (c10::Half is made from a float), and so does turbine."""
    x = torch.tensor([1.23e-7, 3e-5, -3e-5, 6e-8, 1e-4, 65519.0, 70000.0, 1 / 3], dtype=torch.float64)
    for dtype in (torch.float16, torch.bfloat16):
        check(lambda t: t.to(dtype), x, rtol=0, atol=0)
        check(lambda t: torch.zeros(8, dtype=dtype, device=t.device).copy_(t), x, rtol=0, atol=0)
    # and floats copied into uint8 go through int32 (IREE converted them as to int8: 178.7 gave 127)
    check(lambda t: torch.zeros(4, dtype=torch.uint8, device=t.device).copy_(t), torch.tensor([178.7, 200.2, 3.0, 255.0]), rtol=0, atol=0)
    # A sum of 1100 float16 numbers adds in float64 (accumulation.py), rounded to float16 by the trace.
    tiny = torch.tensor([6e-8] * 560 + [-6e-8] * 540, dtype=torch.float16)[torch.randperm(1100)]
    check(torch.sum, tiny, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.int64], ids=str)
def test_ldexp_is_exact(dtype):
    """IREE's ldexp was an ulp off (9.2e17 * 2**32 in float32): x * 2**e is exact until it rounds."""
    x = torch.randn(300, dtype=torch.float64) * 1e3 if dtype != torch.int64 else torch.randint(-(2**62), 2**62, (300,))
    x[0] = 9.2245092756893914e17
    exponent = torch.randint(-40, 40, (300,))
    exponent[0] = 32
    if dtype == torch.float64:
        exponent[1:4] = torch.tensor([1100, -1000, 2000])
    check(torch.ldexp, x.to(dtype), exponent, rtol=0, atol=0)
    check(torch.ldexp, x.to(dtype), exponent.to(torch.int32), rtol=0, atol=0)


def test_addmm_does_not_read_the_term_whose_factor_is_zero():
    """torch's kernel skips the term scaled by 0: a NaN in ``input`` with beta=0, or an infinity in
    the matrices with alpha=0, stays out of the result; IREE multiplied it by 0 (NaN)."""
    a, b, c = torch.randn(3, 4), torch.randn(4, 2), torch.randn(3, 2)
    c[0, 0] = float("nan")
    infinite = a.clone()
    infinite[1, 1] = float("inf")
    for factors in ({"beta": 0}, {"beta": 0, "alpha": 2.5}):
        check(lambda c, a, b: torch.addmm(c, a, b, **factors), c, a, b)
        check(lambda c, a, b: torch.addmm(c, a, b, **factors), c[0], a, b)
    for factors in ({"alpha": 0}, {"alpha": 0, "beta": -2}, {"alpha": 0, "beta": 0}):
        check(lambda c, a, b: torch.addmm(c, a, b, **factors), c.nan_to_num(), infinite, b)
        check(lambda c, a, b: torch.addmm(c, a, b, **factors), c[1], infinite, b)


@pytest.mark.parametrize("dtype", INTEGERS, ids=str)
def test_shifts_run_on_iree_at_every_shift_amount(dtype):
    """``x >> 4`` and ``x << y`` fell back (torch-mlir lowers no __rshift__); shifts by a negative
    amount or past the width give torch's 0 or sign fill."""
    info = torch.iinfo(dtype)
    x = torch.tensor([info.min, -77, -1, 0, 1, 77, info.max] * 12).clamp(info.min, info.max).to(dtype)
    amounts = torch.arange(0 if dtype == torch.uint8 else -6, 84)[: x.numel()].to(dtype)
    for fn in (lambda a, b: a >> b, lambda a, b: a << b, lambda a, b: a.clone().__irshift__(b), lambda a, b: a.clone().__iand__(b)):
        check(fn, x, amounts)
    check(lambda a: (a >> 4, a << 2, a >> 70), x)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.uint8], ids=str)
def test_an_integer_division_by_zero_raises_torchs_error_and_never_traps(dtype):
    """x // 0, x % 0, fmod and div(rounding_mode) of integers by 0 killed the process (SIGFPE in
    IREE's kernel), as did the most negative value divided by -1. torch's CPU raises
    "ZeroDivisionError"; turbine raises it for a number at once, for a tensor's 0 at the next read."""
    x = torch.tensor([5, 7, 0, 100], dtype=dtype)
    zeros = torch.tensor([0, 2, 1, 3], dtype=dtype)
    for fn in (
        lambda a, b: a // b, lambda a, b: a % b, torch.fmod, lambda a, b: torch.div(a, b, rounding_mode="trunc"),
        lambda a, b: torch.div(a, b, rounding_mode="floor"), lambda a, b: a.clone().remainder_(b),
    ):
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            fn(x, zeros)
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            fn(x.to(D), zeros.to(D)).cpu()
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            fn(x.to(D), 0)
        check(fn, x, zeros + 1)  # and the device goes on
    if dtype != torch.uint8:
        info = torch.iinfo(dtype)
        smallest = torch.tensor([info.min, info.min, -7, 7], dtype=dtype)
        minus_one = torch.tensor([-1, 3, -1, -1], dtype=dtype)
        for fn in (lambda a, b: a // b, lambda a, b: a % b, torch.fmod, lambda a, b: a // -1):
            check(fn, smallest, minus_one)


@pytest.mark.parametrize("dynamic", ["off", "all"])
def test_a_correction_over_the_count_divides_by_zero_as_torch_does(dynamic):
    """torch divides by max(0, N - correction): inf, or NaN where every number is the mean."""
    with override(dynamic=dynamic):
        for n in (3, 5):
            x = torch.randn(4, n)
            x[0] = 1.0  # a row of equal numbers: 0 / 0
            for correction in (1, 2, 2.5, n, 6):
                check(lambda t: t.var(1, correction=correction), x, equal_nan=True)
                check(lambda t: torch.std_mean(t, -1, correction=correction, keepdim=True), x, equal_nan=True)
        x = torch.randn(2, 3)
        check(lambda t: t.std(correction=9), x, equal_nan=True)
        check(lambda t: torch.var_mean(t.double(), [0, 1], correction=7.5), x, equal_nan=True)
        check(lambda t: t.half().var(0, correction=3), x, equal_nan=True)
        check(lambda t: torch.var(t, 0, correction=2), torch.tensor(1.5), equal_nan=True)  # a 0-d tensor's dim 0


def test_bounds_that_promote_an_integer_clamp_run_on_iree():
    """torch-mlir did not compile a clamp whose bounds promote its input (fell back)."""
    x = torch.randint(-5, 5, (4, 6))
    check(lambda t: t.clamp(-1.5, 2.5), x)
    check(lambda t: t.clamp(min=0.5), x)
    check(lambda t: t.clamp(max=torch.tensor(2.5, device=t.device)), x)
    check(lambda t: (t > 0).clamp(0, 1), x)
    check(lambda t: t.to(torch.uint8).clamp(0.5, 3), x)
    check(lambda t: torch.maximum(t, torch.tensor(1.5, device=t.device)), x)


def test_a_mean_of_integers_in_a_float_dtype_runs_on_iree():
    x = torch.randint(-50, 50, (4, 600))
    check(lambda t: t.mean(1, dtype=torch.float64), x)
    check(lambda t: t.mean(dtype=torch.float32), x)
    check(lambda t: t.to(torch.int16).mean(0, keepdim=True, dtype=torch.float32), x)
