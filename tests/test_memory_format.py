"""Results keep torch's memory order: copies (``memory_format=``, a dense input's own order),
transfers, elementwise ops, and the ops torch lays out as their inputs (convolutions, pooling,
normalisation, padding, ...): code reads those strides back,
``x.contiguous(memory_format=torch.channels_last).permute(0, 2, 3, 1).view(...)``.
"""

import pytest
import torch

import turbine

from checks import D, check
from turbine.errors import CompileError
from turbine.eager import dispatch, views
from turbine.kernels_cache import cache as cache_module
from turbine.eager.relaid_plan import RelaidPlan

CHANNELS_LAST = torch.channels_last

COPIES = {
    "contiguous as channels-last": lambda x: x.contiguous(memory_format=CHANNELS_LAST),
    "to channels-last": lambda x: x.to(memory_format=CHANNELS_LAST),
    "to channels-last and float64": lambda x: x.to(torch.float64, memory_format=CHANNELS_LAST),
    "clone as channels-last": lambda x: x.clone(memory_format=CHANNELS_LAST),
    "clone of a channels-last tensor": lambda x: x.contiguous(memory_format=CHANNELS_LAST).clone(),
    "cast of a channels-last tensor": lambda x: x.contiguous(memory_format=CHANNELS_LAST).to(torch.bfloat16),
    "clone of a slice of a channels-last tensor": lambda x: x.contiguous(memory_format=CHANNELS_LAST)[:, :, 1:].clone(),
    "clone of a transpose": lambda x: x.transpose(1, 3).clone(),
    "clone of a slice of a transpose": lambda x: x.transpose(1, 3)[:, 1:].clone(),
    "cast of a strided slice": lambda x: x[..., ::2].double(),
    "clone of an expanded tensor": lambda x: x[:1].expand(3, 3, 4, 5).clone(),
    "contiguous of a channels-last tensor": lambda x: x.contiguous(memory_format=CHANNELS_LAST).contiguous(),
    "channels-last 3d": lambda x: x.unsqueeze(2).expand(2, 3, 2, 4, 5).clone(memory_format=torch.channels_last_3d),
    "to uint8 as channels-last": lambda x: (x * 10).to(torch.uint8, memory_format=CHANNELS_LAST),
}


@pytest.mark.parametrize("name", sorted(COPIES))
def test_copies_have_torchs_strides_and_values(name):
    x = torch.randn(2, 3, 4, 5)
    expected = COPIES[name](x)
    actual = COPIES[name](x.to(D))
    assert actual.stride() == expected.stride()
    assert actual.is_contiguous(memory_format=CHANNELS_LAST) == expected.is_contiguous(memory_format=CHANNELS_LAST)
    torch.testing.assert_close(actual.cpu(), expected)


def test_a_channels_last_tensor_reads_as_rows_of_channels():
    """The motivating call: a channels-last tensor viewed as (batch, pixels, channels)."""
    x = torch.randn(2, 3, 4, 5)
    expected = x.contiguous(memory_format=CHANNELS_LAST).permute(0, 2, 3, 1).view(2, -1, 3)
    actual = x.to(D).contiguous(memory_format=CHANNELS_LAST).permute(0, 2, 3, 1).view(2, -1, 3)
    torch.testing.assert_close(actual.cpu(), expected)


def test_a_copy_in_another_order_does_not_change_with_its_source():
    x = torch.randn(2, 3, 4, 5).to(D)
    copy = x.clone(memory_format=CHANNELS_LAST)
    before = copy.cpu()
    x.add_(1)
    torch.testing.assert_close(copy.cpu(), before)
    again = copy.clone()
    copy.mul_(2)
    torch.testing.assert_close(again.cpu(), before)


def test_empty_tensors_take_their_memory_format_and_strides():
    like = torch.empty(2, 3, 4, 5, device=D, memory_format=CHANNELS_LAST)
    assert like.stride() == torch.empty(2, 3, 4, 5, memory_format=CHANNELS_LAST).stride()
    assert torch.empty_like(like).stride() == like.stride()
    assert torch.empty_like(like, memory_format=torch.contiguous_format).is_contiguous()
    assert torch.empty_strided((2, 3), (1, 2), device=D).stride() == (1, 2)
    spread = torch.empty_strided((2, 3), (4, 1), device=D)  # gaps between rows: the storage spans them
    spread.copy_(torch.arange(6.0).view(2, 3))
    torch.testing.assert_close(spread.cpu(), torch.arange(6.0).view(2, 3))


def test_transfers_keep_a_dense_tensors_order_both_ways():
    for host in (torch.randn(2, 3, 4, 5).contiguous(memory_format=CHANNELS_LAST), torch.randn(3, 4).t()):
        moved = host.to(D)
        assert moved.stride() == host.stride()
        back = moved.cpu()
        assert back.stride() == host.stride()
        torch.testing.assert_close(back, host)
        torch.testing.assert_close((moved * 2).cpu(), host * 2)


def test_a_channels_last_model_trains_like_torch():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Conv2d(4, 2, 1)).to(memory_format=CHANNELS_LAST)
    ours = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Conv2d(4, 2, 1))
    ours.load_state_dict(model.state_dict())
    ours = ours.to(memory_format=CHANNELS_LAST).to(D)
    assert ours[0].weight.stride() == model[0].weight.stride()
    x = torch.randn(2, 3, 8, 8).contiguous(memory_format=CHANNELS_LAST)
    model(x).square().sum().backward()
    ours(x.to(D)).square().sum().backward()
    for theirs, mine in zip(model.parameters(), ours.parameters()):
        torch.testing.assert_close(mine.grad.cpu(), theirs.grad, rtol=1e-4, atol=1e-5)


ELEMENTWISE = {
    "relu": lambda x, b: torch.relu(x),
    "add a bias of [C, 1, 1]": lambda x, b: x + b,
    "mul by a number": lambda x, b: x * 2.5,
    "add itself": lambda x, b: torch.add(x, x, alpha=2),
    "where with a bias": lambda x, b: torch.where(x > 0, x, b),
    "sigmoid then pow": lambda x, b: torch.sigmoid(x).pow(2),
    "cast": lambda x, b: x.to(torch.float64) + 1,
    "compare": lambda x, b: x > b,
}


@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
@pytest.mark.parametrize("layout", ["channels-last", "transposed"])
def test_elementwise_ops_keep_their_inputs_memory_order_on_iree(name, layout):
    """torch's elementwise ops keep a channels-last (or transposed) input's order; turbine's ran
    on a row-major gather of it and gave row-major results."""
    x, b = torch.randn(2, 3, 4, 5), torch.randn(3, 1, 1)
    x = x.contiguous(memory_format=CHANNELS_LAST) if layout == "channels-last" else x.transpose(0, 3)
    expected = ELEMENTWISE[name](x, b)
    actual = check_and_return(ELEMENTWISE[name], x, b)
    assert actual.stride() == expected.stride()


def check_and_return(fn, *inputs, **tolerance):
    """``check``'s comparison (IREE kernels alone), and the turbine result."""
    results = []
    check(lambda *args: results.append(fn(*args)) or results[-1], *inputs, **tolerance)
    return results[0]


@pytest.mark.parametrize("first", ["channels-last", "row-major"])
def test_elementwise_ops_on_inputs_in_different_orders_take_torchs_order(first):
    """torch's TensorIterator takes the first input's order here: channels-last first gives a
    channels-last sum, row-major first a row-major one (the kernel runs row-major either way)."""
    x = torch.randn(2, 3, 4, 5)
    cl = lambda t: t.contiguous(memory_format=CHANNELS_LAST)  # noqa: E731
    fn = (lambda a, b: cl(a) + b) if first == "channels-last" else (lambda a, b: a + cl(b))
    assert check_and_return(fn, x, x).stride() == fn(x, x).stride()


RANDOM = {
    "dropout of a transpose": lambda t: torch.nn.functional.dropout(t.t(), 0.5, True),
    "rand_like of a transpose": lambda t: torch.rand_like(t.t()),
    "uniform_ of a transposed copy": lambda t: t.t().clone().uniform_(),
    "normal_ of a transposed view": lambda t: t.t().normal_(),
    "bernoulli_ of a strided view": lambda t: t[:, ::2].bernoulli_(0.3),
    "dropout of a channels-last image": lambda t: torch.nn.functional.dropout(t.reshape(1, 3, 2, 2).contiguous(memory_format=CHANNELS_LAST), 0.5, True),
}


@pytest.mark.parametrize("name", sorted(RANDOM))
def test_a_seed_gives_torchs_numbers_in_any_memory_order(name):
    """Found by a probe of DETR: torch draws random numbers in a tensor's memory order; turbine
    drew them row-major, so a seeded dropout of a permuted tensor gave another mask."""
    x = torch.randn(3, 4)
    torch.manual_seed(0)
    expected = RANDOM[name](x.clone())
    torch.manual_seed(0)
    actual = RANDOM[name](x.clone().to(D))
    assert actual.stride() == expected.stride()
    torch.testing.assert_close(actual.cpu(), expected)


def test_moves_between_devices_take_a_memory_format():
    x = torch.randn(2, 3, 4, 5)
    expected = x.to(memory_format=CHANNELS_LAST).stride()
    assert x.to(D, memory_format=CHANNELS_LAST).stride() == expected
    assert x.to(D, torch.float64, memory_format=CHANNELS_LAST).stride() == expected
    assert x.requires_grad_().to(D, memory_format=CHANNELS_LAST).stride() == expected
    assert x.detach().to(D).to("cpu", memory_format=CHANNELS_LAST).stride() == expected
    conv = torch.nn.Conv2d(3, 4, 3)
    assert conv.to(D, memory_format=CHANNELS_LAST).weight.stride() == torch.nn.Conv2d(3, 4, 3).to(memory_format=CHANNELS_LAST).weight.stride()


def test_an_empty_tensor_whose_strides_share_memory_is_written_as_in_torch():
    """torch's fill_ writes an empty_strided tensor with a stride of 0; turbine keeps such
    strides out, so that its in-place ops' overlap check does not refuse it."""
    filled = torch.empty_strided((2, 3), (0, 1), device=D).fill_(2)
    torch.testing.assert_close(filled.cpu(), torch.full((2, 3), 2.0))


def test_in_place_ops_on_a_channels_last_tensor_keep_it_so():
    x = torch.randn(2, 3, 4, 5)
    expected = x.contiguous(memory_format=CHANNELS_LAST)
    actual = expected.to(D)
    for t in (expected, actual):
        t.mul_(2).add_(torch.ones(3, 1, 1, device=t.device))
    assert actual.stride() == expected.stride()
    torch.testing.assert_close(actual.cpu(), expected)


def test_a_kernel_stored_for_row_major_inputs_does_not_decide_a_channels_last_call():
    """Kernels are stored by sizes alone: the row-major call's kernel must not make the
    channels-last call's result row-major."""
    x = torch.randn(2, 3, 4, 7)
    (x.to(D) * 3).cpu()
    expected = x.contiguous(memory_format=CHANNELS_LAST) * 3
    actual = x.to(D).contiguous(memory_format=CHANNELS_LAST) * 3
    assert actual.stride() == expected.stride()
    torch.testing.assert_close(actual.cpu(), expected)


def test_an_in_place_result_laid_out_as_its_target_takes_its_place_without_a_copy(monkeypatch):
    """The elementwise result already has the target's strides: its buffer is installed, no
    gather into row-major order and scatter back."""
    gathered = gathers(monkeypatch)  # the gather and scatter kernels' names, as views asks for them
    x = torch.randn(2, 3, 4, 5).contiguous(memory_format=CHANNELS_LAST)
    target = x.to(D)
    target.mul_(2).add_(1)
    assert not gathered
    torch.testing.assert_close(target.cpu(), x * 2 + 1)


def same_layout(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    """The same strides but at dims of size 1, which nothing reads (torch's own kernels differ there)."""
    return all(a == e for n, a, e in zip(expected.shape, actual.stride(), expected.stride()) if n != 1)


W = torch.randn(6, 3, 3, 3)

LAID_OUT_AS_INPUT = {
    "conv2d": lambda x: torch.nn.functional.conv2d(x, W.to(x.device), padding=1),
    "conv2d with a channels-last weight": lambda x: torch.nn.functional.conv2d(
        x.contiguous(), W.to(x.device).contiguous(memory_format=CHANNELS_LAST), stride=2
    ),
    "depthwise conv2d": lambda x: torch.nn.functional.conv2d(x, W[:3, :1].to(x.device), groups=3),
    "max_pool2d": lambda x: torch.nn.functional.max_pool2d(x, 2),
    "max_pool2d with indices": lambda x: torch.nn.functional.max_pool2d(x, 2, return_indices=True),
    "avg_pool2d": lambda x: torch.nn.functional.avg_pool2d(x, 2, ceil_mode=True),
    "adaptive_avg_pool2d": lambda x: torch.nn.functional.adaptive_avg_pool2d(x, (2, 3)),
    "batch_norm": lambda x: torch.nn.functional.batch_norm(x, None, None, training=True),
    "group_norm": lambda x: torch.nn.functional.group_norm(x, 3),
    "bilinear": lambda x: torch.nn.functional.interpolate(x, scale_factor=2, mode="bilinear"),
    "pad": lambda x: torch.nn.functional.pad(x, (1, 2, 0, 1)),
    "cat": lambda x: torch.cat([x, x * 2], 1),
}


@pytest.mark.parametrize("name", sorted(LAID_OUT_AS_INPUT))
def test_ops_torch_lays_out_as_their_input_give_torchs_strides_on_iree(name):
    """torch gives these a channels-last result for a channels-last input (or weight); turbine's
    kernels write row-major, and the result is copied into torch's layout."""
    x = torch.randn(2, 3, 6, 5).contiguous(memory_format=CHANNELS_LAST)
    expected = LAID_OUT_AS_INPUT[name](x)
    actual = check_and_return(LAID_OUT_AS_INPUT[name], x)
    for mine, theirs in zip(actual if isinstance(actual, tuple) else [actual], expected if isinstance(expected, tuple) else [expected]):
        assert same_layout(mine, theirs), (mine.stride(), theirs.stride())


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_convolution_gradients_take_torchs_layout(dims):
    """The input's and weight's gradients are laid out as torch's CPU kernel lays them out
    (channels-last for a channels-last input; 1-D and 3-D ones by the same rule)."""
    torch.manual_seed(0)
    x, w = torch.randn(2, 4, *(7,) * dims), torch.randn(5, 4, *(3,) * dims)
    if dims == 1:
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    else:
        x = x.contiguous(memory_format={2: CHANNELS_LAST, 3: torch.channels_last_3d}[dims])
    conv = {1: torch.nn.functional.conv1d, 2: torch.nn.functional.conv2d, 3: torch.nn.functional.conv3d}[dims]

    def grads(x, w):
        x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
        out = conv(x, w, stride=2)
        out.backward(torch.ones_like(out))
        return out, x.grad, w.grad

    for mine, theirs in zip(check_and_return(grads, x, w), grads(x, w)):
        assert same_layout(mine, theirs), (mine.stride(), theirs.stride())


def test_a_channels_last_network_keeps_its_layout_from_layer_to_layer():
    """Each layer's output and each gradient as torch lays it out, and the output viewed as rows
    of channels (which raised while convolutions gave row-major results)."""

    def layers_and_grads(x):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2), torch.nn.GroupNorm(2, 8),
            torch.nn.Upsample(scale_factor=2, mode="bilinear"), torch.nn.AvgPool2d(2),
        ).to(x.device, memory_format=CHANNELS_LAST)
        outputs, out = [], x
        for layer in model:
            out = layer(out)
            outputs.append(out)
        out.square().sum().backward()
        return (*outputs, out.permute(0, 2, 3, 1).view(2, -1, 8), *[p.grad for p in model.parameters()])

    x = torch.randn(2, 3, 16, 16).contiguous(memory_format=CHANNELS_LAST)
    for mine, theirs in zip(check_and_return(layers_and_grads, x, rtol=1e-4, atol=1e-4), layers_and_grads(x)):
        assert same_layout(mine, theirs), (mine.stride(), theirs.stride())


def test_row_major_inputs_pay_no_copy_for_layouts():
    """Only calls with an input in another order are planned with a copy into torch's layout."""
    x = torch.randn(1, 3, 7, 5)

    def relaid() -> set:
        return {key for key, plan in dispatch.plans().items() if isinstance(plan, RelaidPlan)}

    before = relaid()
    torch.nn.functional.conv2d(x.to(D), W.to(D)).cpu()
    assert relaid() == before
    torch.nn.functional.conv2d(x.to(D).contiguous(memory_format=CHANNELS_LAST), W.to(D)).cpu()
    assert [key[0] for key in relaid() - before] == [torch.ops.aten.convolution.default]


def gathers(monkeypatch) -> list:
    """The names of the gather kernels views.py runs from now on (a view made dense)."""
    names = []
    real_kernel = views._generic_kernel
    monkeypatch.setattr(views, "_generic_kernel", lambda name, *rest: names.append(name) or real_kernel(name, *rest))
    return names


#: name: (function, the first input's sizes, the second's, whether the first is channels-last)
KERNELS_READING_IN_ORDER = {
    "matmul by a transpose": (lambda a, b: a @ b.t(), (8, 6), (5, 6), False),
    "linear": (lambda a, b: torch.nn.functional.linear(a, b), (8, 6), (5, 6), False),
    "bmm by a transpose": (lambda a, b: torch.bmm(a, b.transpose(1, 2)), (2, 8, 6), (2, 5, 6), False),
    "sum of a channels-last image": (lambda a, b: a.sum((0, 2, 3)) + b, (2, 3, 4, 5), (3,), True),
    "softmax of a transpose": (lambda a, b: (a.t() * 2).softmax(1) + b, (6, 4), (6,), False),
    "batch norm of a channels-last image": (
        lambda a, b: torch.nn.functional.batch_norm(a, None, None, b, b, training=True), (2, 3, 4, 5), (3,), True,
    ),
}


@pytest.mark.parametrize("name", sorted(KERNELS_READING_IN_ORDER))
def test_kernels_read_transposed_and_channels_last_inputs_as_they_lie(name, monkeypatch):
    """A dense input in another order is read by the kernel as its buffer lies: no gather kernel
    (a 512x512 transposed weight took 1.7 ms to gather on a 2-core CPU, more than its matmul),
    and results have torch's strides and values."""
    fn, first, second, channels_last = KERNELS_READING_IN_ORDER[name]
    a, b = torch.randn(first), torch.randn(second)
    if channels_last:
        a = a.contiguous(memory_format=CHANNELS_LAST)  # and so on the device: transfers keep it
    a_device, b_device = a.to(D), b.to(D)
    fn(a_device, b_device).cpu()  # planned and compiled
    names = gathers(monkeypatch)
    actual = fn(a_device, b_device)
    assert names == []
    expected = fn(a, b)
    assert same_layout(actual, expected), (actual.stride(), expected.stride())
    check(fn, a, b, rtol=1e-4, atol=1e-5)


META_STRIDES_DIFFER = {
    "batch norm of a transpose": (lambda t: torch.nn.functional.batch_norm(t.transpose(1, 2), None, None, training=True), (4, 5, 3)),
    "batch norm of a permutation": (lambda t: torch.nn.functional.batch_norm(t.permute(0, 2, 1, 3), None, None, training=True), (2, 4, 3, 6)),
    "group norm of channels-last": (lambda t: torch.nn.functional.group_norm(t.contiguous(memory_format=CHANNELS_LAST), 1), (2, 4, 6, 6)),
    "reflection pad of channels-last": (lambda t: torch.nn.functional.pad(t.contiguous(memory_format=CHANNELS_LAST), (1, 1, 1, 1), mode="reflect"), (2, 4, 6, 6)),
    "replication pad of channels-last": (lambda t: torch.nn.functional.pad(t.contiguous(memory_format=CHANNELS_LAST), (1, 2, 1, 0), mode="replicate"), (2, 4, 6, 6)),
    "roll of channels-last": (lambda t: t.contiguous(memory_format=CHANNELS_LAST).roll(1, 1), (2, 4, 6, 6)),
}


@pytest.mark.parametrize("name", sorted(META_STRIDES_DIFFER))
def test_ops_whose_shape_rule_lays_results_out_otherwise_take_torchs_cpu_strides(name):
    """torch's meta kernels lay these out otherwise than its CPU kernels (batch norm of a
    transposed input: the meta result is transposed, the CPU's row-major, and ``.view`` of it
    raised on turbine); the CPU's strides count (eager/meta.py runs the op on CPU stand-ins)."""
    fn, sizes = META_STRIDES_DIFFER[name]
    x = torch.randn(sizes)
    expected = fn(x)
    actual = check_and_return(fn, x, rtol=1e-4, atol=1e-5)
    assert same_layout(actual, expected), (actual.stride(), expected.stride())


def test_a_view_with_gaps_gets_the_same_strides_whatever_kernels_are_stored():
    """Results of views that are not dense stay row-major, whether or not a kernel of their
    sizes was stored before (one is found by sizes alone, without the meta call)."""
    a = torch.randn(6, 10)

    def strides() -> tuple:
        view = a.to(D)[:, ::2].t()
        return view.sin().stride(), view.sort(1)[0].stride()

    first = strides()
    dispatch.clear_plans()
    torch.randn(5, 6, device=D).sin().cpu()
    torch.randn(5, 6, device=D).sort(1)[0].cpu()
    dispatch.clear_plans()
    assert strides() == first


def test_a_kernel_that_does_not_compile_gives_the_same_strides_on_every_call(fresh_cache, monkeypatch):
    """The fallback of a kernel that reads or writes another order lays its results out as the
    kernel would, on the first (queued) call and on later ones alike."""
    compile_mlir = cache_module.compile_mlir

    def failing(text, target):
        if "aten.sort" in text:
            raise CompileError("broken on purpose")
        return compile_mlir(text, target)

    monkeypatch.setattr(cache_module, "compile_mlir", failing)
    a = torch.randn(5, 4)
    expected = [t.stride() for t in a.t().sort(1)]
    with turbine.fallback("device"):
        for _ in range(3):
            values, indices = a.to(D).t().sort(1)
            assert [values.stride(), indices.stride()] == expected
            torch.testing.assert_close(values.cpu(), a.t().sort(1)[0])
