import numpy as np
import pytest
import torch

import turbine
from checks import D, check

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.int16, torch.int32,
          torch.int64, torch.uint8, torch.bool]

FACTORIES = {
    "empty_shape": lambda **k: torch.empty(3, 4, **k).shape,
    "zeros": lambda **k: torch.zeros(3, 4, **k),
    "ones": lambda **k: torch.ones(2, 5, dtype=torch.int32, **k),
    "full": lambda **k: torch.full((2, 3), 2.5, **k),
    "arange": lambda **k: torch.arange(1, 11, 3, **k),
    "linspace": lambda **k: torch.linspace(-1, 1, 7, **k),
    "eye": lambda **k: torch.eye(4, 3, **k),
    "tensor": lambda **k: torch.tensor([[1.5, 2.0], [3.0, -4.0]], **k),
    "as_tensor": lambda **k: torch.as_tensor(np.arange(6, dtype=np.int64), **k),
    "rand": lambda **k: torch.rand(3, 4, **k),
    "randn": lambda **k: torch.randn(3, 4, **k),
    "randint": lambda **k: torch.randint(0, 100, (5,), **k),
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_factories_match_torch_cpu(name):
    torch.manual_seed(7)
    expected = FACTORIES[name](device="cpu")
    torch.manual_seed(7)
    actual = FACTORIES[name](device=D)
    if isinstance(expected, torch.Size):
        assert actual == expected
        return
    assert actual.device.type == "turbine"
    torch.testing.assert_close(actual.cpu(), expected)


#: Factories with ``out=``: torch's C++ code reaches a device through these forms (``at::linspace``
#: is an empty tensor and ``linspace_out``: affine_grid's gradient; ``at::eye`` is ``eye_out``).
OUT_FACTORIES = {
    "arange": lambda out: torch.arange(6, out=out),
    "arange start": lambda out: torch.arange(1, 13, 2, out=out),
    "linspace": lambda out: torch.linspace(-1, 1, 6, out=out),
    "logspace": lambda out: torch.logspace(0, 1, 6, base=2, out=out),
    "zeros": lambda out: torch.zeros(6, out=out),
    "ones": lambda out: torch.ones(2, 3, out=out),
    "full": lambda out: torch.full((6,), 2.5, out=out),
    "eye": lambda out: torch.eye(2, 3, out=out),
    "rand": lambda out: torch.rand(6, out=out),
    "rand generator": lambda out: torch.rand(6, out=out, generator=torch.Generator().manual_seed(3)),
    "randn": lambda out: torch.randn(2, 3, out=out),
    "randperm": lambda out: torch.randperm(6, out=out),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64], ids=str)
@pytest.mark.parametrize("name", sorted(OUT_FACTORIES))
def test_factories_write_out_tensors_as_torch_does(name, dtype, stats):
    """Into a strided view of another shape (resized in place, so its base sees the values) and
    into a dense tensor of the result's shape, on IREE's kernels or torch's random numbers, no
    fallback."""
    if dtype == torch.int64 and name in ("rand", "rand generator", "randn"):
        pytest.skip("torch draws no integer rand or randn")
    for shape in ((6,), (2, 3)):
        torch.manual_seed(7)
        base, expected_base = torch.zeros(4, 7, dtype=dtype).to(D), torch.zeros(4, 7, dtype=dtype)
        with turbine.fallback("error"):
            result = OUT_FACTORIES[name](base[1:3, ::2])
        torch.manual_seed(7)
        expected = OUT_FACTORIES[name](expected_base[1:3, ::2])
        assert result.shape == expected.shape
        torch.testing.assert_close(base.cpu(), expected_base)
        dense = torch.empty(expected.shape, dtype=dtype).to(D)
        torch.manual_seed(7)
        OUT_FACTORIES[name](dense)
        torch.testing.assert_close(dense.cpu(), expected)
    assert stats()["fallbacks"] == {}


@pytest.mark.parametrize("name", ["arange", "linspace", "logspace"])
def test_a_range_keeps_its_out_tensors_shape_where_the_count_matches(name):
    """torch's range factories resize ``out=`` only where the number of elements differs: the
    values fill a (2, 3) tensor, or a transposed view, in its own order."""
    make = OUT_FACTORIES[name]
    for expected_base, base in ((torch.zeros(3, 2), torch.zeros(3, 2).to(D)), (torch.zeros(2, 3), torch.zeros(2, 3).to(D))):
        out, expected_out = (base, expected_base) if base.shape == (3, 2) else (base.t(), expected_base.t())
        with turbine.fallback("error"):
            make(out)
        make(expected_out)
        assert out.shape == expected_out.shape
        torch.testing.assert_close(base.cpu(), expected_base)


@pytest.mark.parametrize("name", ["arange", "linspace", "logspace"])
def test_ranges_refuse_booleans_as_torch_does(name):
    """torch has no boolean range kernel; turbine's gave values."""
    factory, arguments = getattr(torch, name), (6,) if name == "arange" else (0, 1, 6)
    for device in ("cpu", D):
        with pytest.raises(NotImplementedError, match="not implemented for 'Bool'"):
            factory(*arguments, dtype=torch.bool, device=device)
        with pytest.raises(NotImplementedError, match="not implemented for 'Bool'"):
            factory(*arguments, out=torch.empty(6, dtype=torch.bool, device=device))


def test_like_and_new_factories():
    x = torch.randn(3, 2)
    xd = x.to(D)
    torch.manual_seed(3)
    expected = torch.rand_like(x)
    torch.manual_seed(3)
    torch.testing.assert_close(torch.rand_like(xd).cpu(), expected)
    torch.testing.assert_close(torch.zeros_like(xd).cpu(), torch.zeros_like(x))
    torch.testing.assert_close(torch.ones_like(x, device=D).cpu(), torch.ones_like(x))
    torch.testing.assert_close(torch.full_like(xd, 7.0).cpu(), torch.full_like(x, 7.0))
    assert torch.empty_like(xd).shape == x.shape
    torch.testing.assert_close(xd.new_zeros(4).cpu(), x.new_zeros(4))
    torch.testing.assert_close(xd.new_ones((2, 2)).cpu(), x.new_ones((2, 2)))
    torch.testing.assert_close(xd.new_full((3,), 1.25).cpu(), x.new_full((3,), 1.25))
    torch.testing.assert_close(xd.new_tensor([1.0, 2.0]).cpu(), x.new_tensor([1.0, 2.0]))
    assert xd.new_empty((2, 3)).shape == (2, 3)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_round_trips(dtype):
    x = (torch.randn(4, 3) * 50).to(dtype)
    xd = x.to(D)
    assert xd.dtype == dtype
    torch.testing.assert_close(xd.cpu(), x)


def test_to_with_dtype_and_back():
    x = torch.randn(5, 5)
    torch.testing.assert_close(x.to(D, torch.float16).cpu(), x.to(torch.float16))
    torch.testing.assert_close(x.to(device=D, dtype=torch.float64).to("cpu"), x.double())
    xd = x.to(D)
    torch.testing.assert_close(xd.to(torch.int32).cpu(), x.to(torch.int32))
    assert xd.to(D) is xd or torch.equal(xd.to(D).cpu(), x)


def test_item_and_tolist():
    x = torch.randn(2, 3)
    xd = x.to(D)
    assert xd.sum().item() == pytest.approx(x.sum().item(), rel=1e-5)
    assert xd.tolist() == x.tolist()
    assert torch.tensor(7, device=D).item() == 7


def test_numpy_asks_for_cpu_first():
    with pytest.raises(TypeError, match=r"Use Tensor.cpu\(\) to copy the tensor to host memory first"):
        torch.ones(2, device=D).numpy()


def test_dtypes_turbine_cannot_hold_are_a_clear_error():
    with pytest.raises(turbine.UnsupportedDtypeError, match="uint16"):
        torch.zeros(2, dtype=torch.uint16, device=D)
    with pytest.raises(turbine.UnsupportedDtypeError, match="float8_e4m3fn"):
        torch.randn(2).to(torch.float8_e4m3fn).to(D)


@pytest.mark.filterwarnings("ignore::turbine.TurbineFallbackWarning")
def test_complex_tensors_live_on_the_device_and_their_ops_go_to_the_fallback():
    c = torch.randn(3, 4, dtype=torch.complex64)
    on_device = c.to(D)
    torch.testing.assert_close(on_device.cpu(), c)
    torch.testing.assert_close(on_device.t().cpu(), c.t())
    torch.testing.assert_close((on_device * 2).abs().cpu(), (c * 2).abs())
    torch.testing.assert_close(torch.fft.rfft(c.real.contiguous().to(D)).cpu(), torch.fft.rfft(c.real.contiguous()))
    on_device[1:, 2:].mul_(3)
    c[1:, 2:].mul_(3)
    torch.testing.assert_close(on_device.cpu(), c)
    # torch's lazy conjugate views (ifft of a real input returns one) keep their conjugation
    torch.testing.assert_close(on_device.conj().cpu(), c.conj())
    torch.testing.assert_close(c.conj().to(D).cpu(), c.conj())
    real = torch.randn(8)
    torch.testing.assert_close(torch.fft.ifft(real.to(D)).cpu(), torch.fft.ifft(real))
    with turbine.fallback("error"), pytest.raises(turbine.UnsupportedOpError, match="complex64"):
        on_device + 1


@pytest.mark.filterwarnings("ignore::turbine.TurbineFallbackWarning")
def test_complex_factories_copies_views_and_printing_never_reach_the_compiler(monkeypatch):
    """IREE 3.13's compiler crashes on complex kernels: complex factories are made on the host,
    and a kernel whose trace has a complex value is refused before it reaches the compiler."""
    from turbine.kernels_cache import cache as cache_module

    compiled = []
    real_compile = cache_module.compile_mlir

    def watched(text, target):
        compiled.append(text)
        return real_compile(text, target)

    monkeypatch.setattr(cache_module, "compile_mlir", watched)
    makers = [
        lambda d: torch.ones(3, dtype=torch.complex64, device=d),
        lambda d: torch.zeros(2, 3, dtype=torch.complex128, device=d),
        lambda d: torch.full((2, 2), 1 + 2j, device=d),
        lambda d: torch.eye(3, dtype=torch.complex64, device=d),
    ]
    for make in makers:
        torch.testing.assert_close(make(D).cpu(), make("cpu"))
    x = torch.randn(2, 4, dtype=torch.complex64)
    y = x.to(D)
    torch.testing.assert_close(y.to(torch.complex128).cpu(), x.to(torch.complex128))
    torch.testing.assert_close(y[:, 1:3].cpu(), x[:, 1:3])
    torch.testing.assert_close(y.real.cpu(), x.real)
    torch.testing.assert_close(torch.view_as_real(y).cpu(), torch.view_as_real(x))
    real = torch.view_as_real(y)
    real[0, 0, 1] = 7.0  # a write through the real view is a write to the complex tensor
    x_real = torch.view_as_real(x)
    x_real[0, 0, 1] = 7.0
    torch.testing.assert_close(y.cpu(), x)
    torch.testing.assert_close(torch.view_as_complex(real).cpu(), x)
    assert str(x.cpu()).removesuffix(")") in str(y) and "device='turbine" in str(y)
    assert not [text for text in compiled if "complex<" in text]


def test_module_to_moves_parameters():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x = torch.randn(5, 4)
    expected = model(x)
    model.to(D)
    assert all(p.device.type == "turbine" for p in model.parameters())
    assert all(isinstance(p, torch.nn.Parameter) or p.requires_grad for p in model.parameters())
    torch.testing.assert_close(model(x.to(D)).cpu(), expected)


def test_in_place_random_ops_give_torch_cpu_numbers():
    x = torch.empty(4, 6)
    xd = torch.empty(4, 6).to(D)
    for op in [lambda t: t.uniform_(-2, 3), lambda t: t.normal_(1.0, 0.5), lambda t: t.bernoulli_(0.3)]:
        torch.manual_seed(11)
        expected = op(x.clone())
        torch.manual_seed(11)
        actual = op(xd)
        assert actual is xd
        torch.testing.assert_close(xd.cpu(), expected)
    assert turbine.stats()["host_ops"].get("aten.uniform_.default", 0) >= 1
    torch.manual_seed(5)
    row = torch.zeros(3, 4).to(D)
    row[1].uniform_()
    torch.manual_seed(5)
    expected = torch.zeros(3, 4)
    expected[1].uniform_()
    torch.testing.assert_close(row.cpu(), expected)


@pytest.mark.parametrize("p", [0.0, 0.3, 1.0])
def test_dropout_gives_torch_cpu_numbers_and_gradients(p):
    x = torch.randn(6, 7)
    leaf, device_leaf = x.clone().requires_grad_(), x.to(D).requires_grad_()
    torch.manual_seed(3)
    expected = torch.nn.functional.dropout(leaf, p)
    torch.manual_seed(3)
    actual = torch.nn.functional.dropout(device_leaf, p)
    torch.testing.assert_close(actual.cpu(), expected)
    expected.sum().backward()
    actual.sum().backward()
    torch.testing.assert_close(device_leaf.grad.cpu(), leaf.grad)


def test_a_tensor_made_from_a_list_of_zero_dim_turbine_tensors():
    """``torch.tensor([a, b])`` reads each 0-d tensor in torch's C++ (``_local_scalar_dense`` on
    the turbine key, where ``__torch_dispatch__`` is not asked): it raised NotImplementedError."""
    x = torch.randn(2, 3)
    on_device = x.to(D)
    assert torch.equal(torch.tensor([on_device[0, 0], on_device[1, 2]]), torch.tensor([x[0, 0], x[1, 2]]))
    made = torch.tensor([[on_device[0, 1]], [2.5]], device=D, dtype=torch.float64)
    assert isinstance(made, turbine.DeviceTensor)
    assert torch.equal(made.cpu(), torch.tensor([[x[0, 1]], [2.5]], dtype=torch.float64))


def test_uint8_zeros_and_ones_run_on_iree():
    """A uint8 constant does not compile (torch-mlir typed its literal si8): zeros_like(image) and
    friends, common in image code, ran on the fallback, and torch.zeros(..., uint8) on the host."""
    image = torch.randint(0, 256, (2, 5), dtype=torch.uint8)
    for fn in (
        torch.zeros_like, torch.ones_like, lambda t: t.new_zeros(3), lambda t: t.new_ones((2, 2)),
        lambda t: torch.where(t > 128, t, torch.zeros_like(t)), lambda t: torch.zeros_like(t.float(), dtype=torch.uint8),
        lambda t: torch.zeros(4, 3, dtype=torch.uint8, device=t.device) + torch.ones((3,), dtype=torch.uint8, device=t.device),
    ):
        check(fn, image)
