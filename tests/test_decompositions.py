"""turbine's own decompositions (eager/decompositions.py) and the torch ones it adds
(declared in the op registry): each op runs as an IREE kernel, with no fallback, and matches torch on
the CPU, special values included."""

import math

import pytest
import torch

import turbine
from checks import D, check
from turbine.config import override


# IREE's CPU code flushes subnormal floats to zero, so the special values stay normal.
SPECIAL = [0.0, -0.0, math.nan, math.inf, -math.inf, 1e-30, -3e-32, 1.0, -1.0, 2.0, 0.5]


def _inputs(*shape, low=-4.0, high=4.0):
    x = torch.empty(*shape).uniform_(low, high)
    x.view(-1)[: len(SPECIAL)] = torch.tensor(SPECIAL)
    return x


def check_on_iree(fn, *inputs, **tolerance):
    """fn on turbine matches torch, and no op of it fell back."""
    with turbine.fallback("error"):
        actual = fn(*[t.to(D) for t in inputs])
    expected = fn(*inputs)
    actual = [a.cpu() for a in actual] if isinstance(actual, tuple) else actual.cpu()
    expected = list(expected) if isinstance(expected, tuple) else expected
    torch.testing.assert_close(actual, expected, equal_nan=True, **tolerance)


@pytest.mark.parametrize(
    "fn",
    [torch.signbit, torch.frexp, torch.angle, lambda t: torch.log10(t.abs()), lambda t: torch.copysign(t, -0.0)],
    ids=["signbit", "frexp", "angle", "log10", "copysign_scalar"],
)
def test_unary_bit_and_sign_ops(fn):
    check_on_iree(fn, _inputs(7, 9))
    check_on_iree(fn, _inputs(7, 9)[2, 3].clone())  # 0-d: IREE's compiler crashed on frexp's


@pytest.mark.parametrize(
    "fn",
    [torch.copysign, torch.hypot, torch.fmax, torch.fmin, torch.nextafter],
    ids=["copysign", "hypot", "fmax", "fmin", "nextafter"],
)
def test_binary_sign_and_magnitude_ops(fn):
    x, y = _inputs(7, 9), _inputs(7, 9).flip(1)
    check_on_iree(fn, x, y)
    check_on_iree(fn, x, y[0, 3].clone())  # a 0-d second operand


def test_hypot_is_inf_when_either_side_is_inf_even_with_nan():
    check_on_iree(torch.hypot, torch.tensor([math.inf, math.nan, 3e30]), torch.tensor([math.nan, -math.inf, 4e30]))


@pytest.mark.parametrize(
    "fn",
    [
        lambda t: torch.nn.functional.max_pool2d(t, 3, stride=2, padding=1, return_indices=True),
        lambda t: torch.nn.functional.adaptive_max_pool2d(t, (3, 5), return_indices=True),
        lambda t: torch.nn.functional.adaptive_max_pool3d(t, (2, 3, 5), return_indices=True),
        lambda t: torch.nn.functional.interpolate(t, scale_factor=2, mode="bilinear"),
        lambda t: torch.nn.functional.interpolate(t, size=(5, 9), mode="bicubic", align_corners=True),
        lambda t: torch.addmv(t[0, 0, :, 0], t[0, 0], t[1, 1, 0]),
        lambda t: torch.dist(t[0], t[1], 3),
        lambda t: t.permute(3, 1, 0, 2).contiguous(),
    ],
    ids=["max_pool2d", "adaptive_max_pool2d", "adaptive_max_pool3d", "bilinear", "bicubic", "addmv", "dist", "permute_copy"],
)
def test_ops_from_torchs_wider_decomposition_table(fn):
    check_on_iree(fn, torch.randn(2, 3, 8, 8))


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
def test_grid_sample_and_its_gradients(mode, padding_mode):
    """The forward is torch's decomposition (reflection padding needed fmod by a number); the
    gradient, which torch has no decomposition of and IREE cannot lower, is the vjp of that
    decomposition (eager/decompositions/vjp.py): spatial transformers and flow warps fell back."""
    torch.manual_seed(0)
    grid = torch.rand(2, 5, 4, 2) * 2.4 - 1.2  # some samples outside [-1, 1]: the padding counts
    x = torch.randn(2, 3, 6, 7)

    def sampled_and_gradients(t, g, up):
        t, g = t.detach().requires_grad_(), g.detach().requires_grad_()
        out = torch.nn.functional.grid_sample(t, g, mode=mode, padding_mode=padding_mode, align_corners=padding_mode == "border")
        return (out, *torch.autograd.grad(out, (t, g), up))

    check_on_iree(sampled_and_gradients, x, grid, torch.randn(2, 3, 5, 4), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
def test_grid_sample_3d_and_its_gradients(mode, padding_mode):
    """torch has no decomposition of grid_sampler_3d: turbine's (decompositions/sampling.py),
    and its gradient as the vjp of it; both fell back."""
    torch.manual_seed(0)
    grid = torch.rand(2, 3, 4, 5, 3) * 2.4 - 1.2
    x = torch.randn(2, 3, 4, 5, 6)

    def sampled_and_gradients(t, g, up):
        t, g = t.detach().requires_grad_(), g.detach().requires_grad_()
        out = torch.nn.functional.grid_sample(t, g, mode=mode, padding_mode=padding_mode, align_corners=padding_mode != "border")
        return (out, *torch.autograd.grad(out, (t, g), up))

    check_on_iree(sampled_and_gradients, x, grid, torch.randn(2, 3, 3, 4, 5), atol=1e-4, rtol=1e-4)


@pytest.mark.timeout(120)
def test_grid_sample_3d_gradient_of_a_single_point():
    """IREE 3.13 never finished compiling this gradient for a grid of one point (over 10
    minutes); turbine takes it as two points, the second's gradient zero."""
    torch.manual_seed(0)

    def sampled_and_gradients(t, g):
        t, g = t.detach().requires_grad_(), g.detach().requires_grad_()
        out = torch.nn.functional.grid_sample(t, g, align_corners=False)
        return (out, *torch.autograd.grad(out.sum(), (t, g)))

    with override(compile_timeout=100):  # a hang fails here, not at the suite's limit
        check_on_iree(sampled_and_gradients, torch.randn(1, 1, 2, 2, 2), torch.rand(1, 1, 1, 1, 3) * 2 - 1)


def test_grid_sample_3d_gradient_is_nearer_exact_than_torchs():
    """The grid's gradient sums products over channels and corners that cancel: differentiated
    in float32 it was at times farther from the float64 gradient than torch's kernel (the OpInfo
    coverage's failure); turbine's runs in float64, an order of magnitude nearer than torch's."""
    torch.manual_seed(0)
    x, grid, up = torch.randn(2, 21, 6, 7, 8), torch.rand(2, 6, 5, 4, 3) * 2.4 - 1.2, torch.randn(2, 21, 6, 5, 4)

    def grid_gradient(t, g, u):
        g = g.detach().requires_grad_()
        return torch.autograd.grad(torch.nn.functional.grid_sample(t, g, align_corners=False), g, u)[0]

    with turbine.fallback("error"):
        ours = grid_gradient(x.to(D), grid.to(D), up.to(D)).cpu()
    exact = grid_gradient(x.double(), grid.double(), up.double())
    torchs = (grid_gradient(x, grid, up).double() - exact).abs().max()
    assert (ours.double() - exact).abs().max() <= torchs / 4


@pytest.mark.parametrize("dim", [0, 2])
def test_weight_norm_gradients(dim, stats):
    """weight_norm's gradient (wav2vec2, HiFi-GAN and WaveNet vocoders) fell back: IREE 3.13
    cannot lower ``_weight_norm_interface_backward``."""
    torch.manual_seed(0)
    conv = torch.nn.utils.parametrizations.weight_norm(torch.nn.Conv1d(8, 6, 5, padding=2, groups=2), dim=dim)
    x = torch.randn(2, 8, 12)

    def gradients(x, v, g, b):
        leaves = [t.detach().requires_grad_() for t in (v, g)]
        weight = torch._weight_norm(*leaves, dim)
        out = torch.nn.functional.conv1d(x, weight, b, padding=2, groups=2)
        return torch.autograd.grad((out * out).sum(), leaves)

    parts = conv.parametrizations.weight
    check_on_iree(gradients, x, parts.original1.detach(), parts.original0.detach(), conv.bias.detach(), atol=1e-4, rtol=1e-4)
    assert stats()["fallbacks"] == {}


@pytest.mark.parametrize("ord", [float("inf"), float("-inf"), 3.5])
def test_a_norm_in_another_dtype_and_renorms_gradient(ord):
    """A norm with ``dtype=`` is the norm of the input cast to it: torch-mlir's max norm kept the
    input's dtype and did not compile, so renorm's gradient (a float64 max norm of float32 slices)
    fell back."""
    x = _inputs(4, 3, 5)
    check_on_iree(lambda t: torch.linalg.vector_norm(t, ord, dim=(0, 2), keepdim=True, dtype=torch.float64), x)
    if ord > 0:  # renorm takes positive norms only
        check_on_iree(_gradient(lambda t: torch.renorm(t, ord, 1, 0.5)), x, torch.randn(4, 3, 5))


def test_masked_scatter_gradients_as_a_multimodal_model_takes_them():
    """masked_scatter's gradients (a vision-language model places its image features among the
    token embeddings with it): the source's is the gradient at the mask's ones in row-major
    order, 0 past their count; IREE 3.13 could not compile ``masked_scatter_backward``."""
    embeds, features = torch.randn(2, 6, 4), torch.randn(5, 4)
    image = torch.tensor([[0, 1, 1, 0, 0, 0], [1, 0, 0, 1, 1, 0]], dtype=torch.bool)  # 5 image tokens

    def gradients(embeds, features, grad):
        leaves = [t.detach().requires_grad_() for t in (embeds, features)]
        placed = leaves[0].masked_scatter(image.to(embeds.device).unsqueeze(-1).expand_as(embeds), leaves[1])
        return torch.autograd.grad(placed, leaves, grad)

    check_on_iree(gradients, embeds, features, torch.randn(2, 6, 4))
    fewer = torch.rand(3, 5) > 0.6  # a broadcast mask with fewer ones than the source has elements
    check_on_iree(_gradient(lambda r: torch.zeros(2, 3, 5, device=r.device).masked_scatter(fewer.to(r.device), r)), torch.randn(40), torch.randn(2, 3, 5))


def test_hardshrink_gradient():
    """hardshrink_backward (IREE 3.13 cannot lower it); 0 at NaN, as torch's CPU kernel."""
    x = _inputs(6, 7)
    check_on_iree(_gradient(lambda t: torch.nn.functional.hardshrink(t, 0.7)), x, torch.randn(6, 7))


def test_softshrink_gradient():
    """softshrink_backward (IREE 3.13 cannot lower it): 0 inside the bounds, at them and at NaN,
    the gradient outside, as torch's CPU kernel."""
    x = _inputs(6, 7)
    x[0, :2] = torch.tensor([0.7, -0.7])
    check_on_iree(_gradient(lambda t: torch.nn.functional.softshrink(t, 0.7)), x, torch.randn(6, 7))


@pytest.mark.parametrize(
    "shape, dim, size, step",
    [((4, 7), 1, 3, 1), ((5, 3, 4), 0, 2, 3), ((3, 8, 2), -2, 3, 2), ((6,), 0, 6, 1), ((), 0, 1, 1)],
    ids=["overlapping", "gaps", "negative dim", "one window", "0-d"],
)
def test_unfold_gradient(shape, dim, size, step):
    """unfold_backward: IREE 3.13 cannot lower it, and torch's decomposition indexes with a list
    holding None, which IREE's importer refuses; turbine adds the windows back with index_add."""
    x = torch.randn(shape)
    grad = torch.randn(x.unfold(dim, size, step).shape)
    check_on_iree(_gradient(lambda t: t.unfold(dim, size, step)), x, grad)


@pytest.mark.parametrize("indices", [torch.tensor(3), torch.tensor([[3, 0, 3], [9, 3, 1]])], ids=["0-d", "2-d"])
def test_embedding_gradient(indices):
    """The weight's gradient adds each looked-up row's gradient; IREE 3.13 could not compile it
    for a 0-d index (one token looked up as ``embedding(torch.tensor(3))``)."""
    weight = torch.randn(10, 4)
    grad = torch.randn(indices.shape + (4,))
    check_on_iree(lambda w, i, g: torch.autograd.grad(torch.nn.functional.embedding(i, w.requires_grad_()), w, g)[0], weight, indices, grad)


def test_embedding_with_max_norm_renormalises_the_rows_it_looks_up():
    """embedding_renorm (nn.Embedding(max_norm=...)) rescales, in place, the rows a lookup reads
    that are longer than max_norm; IREE 3.13 cannot lower it, so every such lookup fell back."""
    torch.manual_seed(0)
    weight = torch.randn(10, 4) * 2
    indices = torch.tensor([[1, 3, 3], [7, 1, 0]])

    def looked_up(w, i):
        w = w.clone()
        out = torch.nn.functional.embedding(i, w, max_norm=1.5, norm_type=3.0)
        return out, w  # the rows looked up are renormalised in the weight too

    check_on_iree(looked_up, weight, indices)


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_multi_margin_loss_and_its_gradient(p, reduction):
    """IREE 3.13 lowers neither; torch has no decomposition of the gradient, nor a shape rule
    (decompositions/margins.py adds one). With and without class weights, a margin of 0.3."""
    torch.manual_seed(0)
    scores, target, weight = torch.randn(6, 5), torch.randint(0, 5, (6,)), torch.rand(5)

    def loss_and_gradient(x, t, w, up):
        x = x.detach().requires_grad_()
        losses = [torch.nn.functional.multi_margin_loss(x, t, p=p, margin=m, weight=v, reduction=reduction) for m, v in ((1.0, None), (0.3, w))]
        return (*losses, *torch.autograd.grad(losses, x, [up.reshape(losses[0].shape)] * 2))

    check_on_iree(loss_and_gradient, scores, target, weight, torch.randn(6 if reduction == "none" else 1))


def test_rrelu_gradient_in_evaluation():
    """rrelu_with_noise_backward (evaluation: the mean slope) is torch's decomposition; IREE
    cannot lower it, so it fell back."""
    check_on_iree(_gradient(lambda t: torch.nn.functional.rrelu(t, 0.1, 0.3)), torch.randn(5, 6), torch.randn(5, 6))


def _special_inputs(low, high, n=600):
    x = torch.empty(n).uniform_(low, high)
    x[: len(SPECIAL)] = torch.tensor(SPECIAL)
    return x


def check_against_float64(fn, *inputs, rtol=2e-6, atol=1e-5):
    """fn on turbine (float32, no fallback) against torch's float64 values rounded to float32:
    torch's own float32 kernels are less precise than that for some of these (erfcx near -9,
    polygamma of negative arguments)."""
    with turbine.fallback("error"):
        actual = fn(*[t.to(D) for t in inputs]).cpu()
    expected = fn(*[t.double() for t in inputs]).float()
    torch.testing.assert_close(actual, expected, equal_nan=True, rtol=rtol, atol=atol)


@pytest.mark.parametrize(
    "fn, low, high",
    [
        (torch.lgamma, -12, 12),
        (torch.digamma, -12, 12),
        (lambda t: torch.mvlgamma(t, 3), 1.01, 12),
        (lambda t: torch.polygamma(1, t + (t == t.round()) * 0.25), -12, 12),  # poles: below
        (lambda t: torch.polygamma(3, t), 0.1, 12),
        (torch.erfc, -12, 12),
        (torch.special.erfcx, -9, 30),
        (torch.special.log_ndtr, -40, 12),
        (torch.special.ndtri, 0, 1),
        (torch.erfinv, -1, 1),
        (torch.i0, -60, 60),
        (torch.special.i0e, -90, 90),
        (torch.special.i1, -60, 60),
        (torch.special.i1e, -90, 90),
    ],
    ids=["lgamma", "digamma", "mvlgamma", "polygamma1", "polygamma3", "erfc", "erfcx", "log_ndtr", "ndtri",
         "erfinv", "i0", "i0e", "i1", "i1e"],
)
def test_special_functions(fn, low, high):
    x = _special_inputs(low, high)
    if low >= 0:
        x = x.abs().clamp(low, high)
    check_against_float64(fn, x)


def test_polygamma_is_infinite_at_its_poles():
    """torch's Cephes-based kernel gives large finite numbers at -1, -2 (1.29e15 for n = 1)."""
    poles = torch.tensor([0.0, -1.0, -2.0, -7.0])
    with turbine.fallback("error"):
        assert torch.polygamma(1, poles.to(D)).cpu().isinf().all()


def test_hurwitz_zeta():
    s = _special_inputs(1, 8).abs() + 1
    q = _special_inputs(-5, 10).flip(0)
    check_against_float64(torch.special.zeta, s, q)


@pytest.mark.parametrize("kind", ["t", "u", "v", "w"])
@pytest.mark.parametrize("shifted", [False, True], ids=["plain", "shifted"])
def test_chebyshev_polynomials_small_and_large_degrees(kind, shifted):
    """Degrees up to 16 by the recurrence, above by the closed forms; +-1 exactly; n < 0 gives 0."""
    name = f"{'shifted_' if shifted else ''}chebyshev_polynomial_{kind}"
    fn = getattr(torch.special, name)
    x = torch.empty(300).uniform_(-0.25, 1.25) if shifted else torch.empty(300).uniform_(-2, 2)
    x[:4] = torch.tensor([1.0, -1.0, 0.0, 0.5]) if not shifted else torch.tensor([1.0, 0.0, 0.5, 0.75])
    n = torch.empty(300).uniform_(-3, 30)
    n[:8] = torch.tensor([20.0, 21.0, 3.0, 25.0, 20.0, 21.0, 3.0, 25.0])
    check_against_float64(fn, x, n, rtol=5e-5, atol=1e-4)  # float32 phase error above degree 16
    check_against_float64(lambda t: fn(t, 5), x)


@pytest.mark.parametrize(
    "fn, low, high",
    [
        (torch.special.bessel_j0, -40, 40),
        (torch.special.bessel_j1, -40, 40),
        (torch.special.bessel_y0, 0, 40),
        (torch.special.bessel_y1, 0.05, 40),
        (torch.special.modified_bessel_k0, 0, 60),
        (torch.special.modified_bessel_k1, 0.01, 60),
        (torch.special.scaled_modified_bessel_k0, 0, 60),
        (torch.special.scaled_modified_bessel_k1, 0.01, 60),
        (torch.special.spherical_bessel_j0, -60, 60),
    ],
    ids=["j0", "j1", "y0", "y1", "k0", "k1", "k0_scaled", "k1_scaled", "spherical_j0"],
)
def test_bessel_functions(fn, low, high):
    """Against torch's float64, whose own J and Y kernels are off by up to 4e-7 (so atol 1e-6)."""
    x = _special_inputs(low, high)
    if low >= 0:
        x = x.abs().clamp(low, high)
    check_against_float64(fn, x, atol=1e-6)


def test_isclose_equal_and_allclose_run_on_the_device(stats):
    """equal and allclose compute on the device; the host reads one bool (one small transfer)."""
    a = _inputs(6, 7)
    b = a.clone()
    b[3, 3] += 1e-3
    check_on_iree(lambda x, y: torch.isclose(x, y, rtol=1e-4, equal_nan=True), a, b)
    with turbine.fallback("error"):
        for x, y in [(a, a), (a, b), (a, a[:3])]:
            assert torch.equal(x.to(D), y.to(D)) == torch.equal(x, y)
        assert torch.allclose(a.to(D), b.to(D), atol=1e-2, equal_nan=True)
        assert not torch.allclose(a.to(D), b.to(D), equal_nan=True)
        assert not torch.allclose(a.to(D), a.to(D))  # NaN is not close to NaN by default
    assert not stats()["fallbacks"]


@pytest.mark.parametrize("p", [0.0, 1.0, 2.0, 3.0, math.inf])
def test_cdist_and_pdist(p):
    a, b = torch.randn(2, 5, 3), torch.randn(2, 7, 3)
    if p == 0:
        a, b = a.round(), b.round()  # equal coordinates, so the count is not always 3
    check_on_iree(lambda x, y: torch.cdist(x, y, p), a, b)
    check_on_iree(lambda x: torch.nn.functional.pdist(x, p), a[0])


@pytest.mark.parametrize("p", [0.0, 0.5, 1.0, 1.5, 2.0, math.inf])
def test_cdist_and_pdist_gradients(p):
    """_cdist_backward and _pdist_backward (IREE 3.13 lowers them not, torch has no
    decomposition), for both sets, with a zero distance among them (its gradient is 0, as
    torch's) and, for p < 1, an equal coordinate (its term is 0, not NaN: |0|^(p-1) is inf)."""
    torch.manual_seed(0)
    a, b = torch.randn(2, 5, 3), torch.randn(2, 4, 3)
    b[0, 1] = a[0, 2]
    b[1, 0, 0] = a[1, 3, 0]
    a[0, 4] = a[0, 1]
    grad = torch.randn(2, 5, 4)

    def gradients(x, y, g):
        x, y = x.detach().requires_grad_(), y.detach().requires_grad_()
        return torch.autograd.grad(torch.cdist(x, y, p), (x, y), g)

    def pdist_gradient(x, g):
        x = x.detach().requires_grad_()
        return torch.autograd.grad(torch.nn.functional.pdist(x, p), x, g)[0]

    check_on_iree(gradients, a, b, grad)
    check_on_iree(pdist_gradient, a[0], torch.randn(10))
    if p in (1.0, 2.0, 0.5):  # a NaN coordinate: NaN where torch's kernels give it (for p = 1, that coordinate's alone)
        a[1, 0, 1] = math.nan
        check_on_iree(gradients, a, b, grad)
        check_on_iree(pdist_gradient, a[1], torch.randn(10))


def test_cdist_takes_torchs_matrix_product_form_for_large_inputs():
    check_on_iree(torch.cdist, torch.randn(30, 3), torch.randn(27, 3))  # > 25 rows: the mm form
    check_on_iree(lambda x, y: torch.cdist(x, y, compute_mode="use_mm_for_euclid_dist"), torch.randn(4, 3), torch.randn(5, 3))


def test_histc():
    x = torch.randn(1000)
    x[:3] = torch.tensor([math.nan, 2.0, -2.0])  # NaN not counted; the top edge in the last bin
    check_on_iree(lambda t: torch.histc(t, 10, -2, 2), x)
    check_on_iree(lambda t: torch.histc(t, 7), x[3:])  # the data's own range
    check_on_iree(lambda t: torch.histc(t, 3), torch.ones(5))  # a point range, widened


@pytest.mark.parametrize("invert", [False, True])
def test_isin(invert):
    """Tensors in tensors (NaN in nothing, -0.0 in 0.0, mixed dtypes) and a number in a tensor."""
    ids, eos = torch.randint(0, 50, (4, 7)), torch.tensor([[3, 17], [42, 0]])
    check_on_iree(lambda x, t: torch.isin(x, t, invert=invert), ids, eos)
    floats = torch.tensor([1.0, math.nan, -0.0, 2.5, 3.0])
    check_on_iree(lambda x, t: torch.isin(x, t, invert=invert), floats, torch.tensor([0.0, math.nan, 2.5]))
    check_on_iree(lambda x, t: torch.isin(x, t, invert=invert), floats, torch.tensor([3, 1]))
    check_on_iree(lambda x, t: torch.isin(x, t, invert=invert), ids[0, 0], eos)  # 0-d elements
    for number in (3, 2.5, 42):
        check_on_iree(lambda t: torch.isin(number, t, invert=invert), eos)
        check_on_iree(lambda t: torch.isin(number, t, invert=invert), floats)


def test_distributions_validate_their_values_on_iree():
    """torch.distributions asks ``_is_all_true`` of every value it validates: it fell back."""
    loc = torch.randn(4, 5)
    check(lambda loc: torch.distributions.Normal(loc, 1.0).log_prob(loc * 2), loc)
    check(lambda loc: torch.distributions.Categorical(logits=loc).log_prob(torch.arange(4).to(loc.device)), loc)
    check(lambda x: (torch._is_all_true(x > 0), torch._is_any_true(x > 0), torch._is_all_true(x > -9)), loc)


def test_isin_of_more_pairs_than_one_kernel_compares_falls_back(stats):
    elements, tests = torch.arange(3000), torch.arange(1000, 2500)  # 4.5M pairs
    with pytest.warns(turbine.TurbineFallbackWarning, match="isin"):
        found = torch.isin(elements.to(D), tests.to(D)).cpu()
    assert torch.equal(found, torch.isin(elements, tests))
    assert stats()["fallbacks"] == {"aten.isin.Tensor_Tensor": 1}


@pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter", "ignore:index_reduce")
def test_scatters_written_with_scatter_reduce_and_index_put():
    x = torch.randn(10, 5)
    index, src = torch.randint(0, 10, (5, 5)), torch.randn(5, 5)
    narrow_index = torch.randint(0, 5, (10, 2))
    check_on_iree(lambda s, i, r: s.scatter_add(0, i, r), x, index, src)
    check_on_iree(lambda s, i, r: s.scatter_add(-1, i, r), x, narrow_index, torch.randn(10, 5))
    check_on_iree(lambda s, i, r: s.scatter(0, i, r, reduce="multiply"), x, index, src)
    check_on_iree(lambda s, i: s.scatter(0, i, 2.5, reduce="add"), x, index)
    unique = torch.argsort(torch.rand(4, 5), -1)[:, :3]  # no two entries of a row at one place
    check_on_iree(lambda s, i, r: s.scatter(-1, i, r), x[:4], unique, torch.randn(4, 4))  # IREE's compiler crashed on it
    check_on_iree(lambda s, i: s.scatter(1, i, -1.5), x[:4], unique)
    grad_of_topk = lambda s: torch.autograd.grad(s.topk(2, -1).values.sum(), s)[0]  # noqa: E731  (a scatter)
    check_on_iree(grad_of_topk, x.clone().requires_grad_())
    for reduce in ("amax", "amin", "prod", "mean"):
        check_on_iree(lambda s, i, r: s.index_reduce(0, i, r, reduce), x, torch.tensor([0, 2, 2, 7]), torch.randn(4, 5))
    check_on_iree(lambda s, i, r: s.index_reduce(1, i, r, "mean", include_self=False), x, torch.tensor([0, 2, 2]), torch.randn(10, 3))
    check_on_iree(lambda s, i, r: s.put(i, r), x, torch.tensor([0, -1, 13]), torch.randn(3))
    check_on_iree(lambda s, i, r: s.put(i, r, accumulate=True), x, torch.tensor([0, -1, 0]), torch.randn(3))
    check_on_iree(lambda s, m, r: s.masked_scatter(m, r), x, torch.rand(5) > 0.5, torch.randn(50))
    check_on_iree(lambda s, r: torch.diagonal_scatter(s, r, -2), x, torch.randn(5))
    check_on_iree(lambda s, r: torch.diagonal_scatter(s, r, 1, 2, 0), torch.randn(3, 4, 5), torch.randn(4, 2))
    check_on_iree(lambda s, r: torch.as_strided_scatter(s, r, (2, 3), (5, 2), 1), x, torch.randn(2, 3))


def test_scatter_written_as_index_put_takes_a_0d_index():
    """torch takes a 0-d index (one entry) on a tensor of any rank: so does the decomposition
    (traced where IREE cannot compile a scatter as it is)."""
    from turbine.eager.decompositions.scatter import scatter, scatter_value

    for tensor, index, src in [(torch.zeros(5), torch.tensor(2), torch.tensor([7.0, 8.0])), (torch.zeros(()), torch.tensor(0), torch.tensor(3.0))]:
        torch.testing.assert_close(scatter(tensor, 0, index, src), tensor.scatter(0, index, src))
        torch.testing.assert_close(scatter_value(tensor, 0, index, 2.5), tensor.scatter(0, index, 2.5))


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize(
    "options",
    [
        dict(kernel_size=2),
        dict(kernel_size=3, stride=2, padding=1),
        dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
        dict(kernel_size=2, stride=1, ceil_mode=True, divisor_override=3),
    ],
    ids=["plain", "padded", "ceil without pad counted", "divisor_override"],
)
def test_average_pooling_gradients(dims, options):
    """avg_pool2d/3d_backward: torch has no decomposition and IREE 3.13 could not lower them, so
    every CNN with average pooling sent its backward to the fallback (timm's nfnet, DenseNet)."""
    pool = torch.nn.functional.avg_pool2d if dims == 2 else torch.nn.functional.avg_pool3d
    backward = torch.ops.aten.avg_pool2d_backward.default if dims == 2 else torch.ops.aten.avg_pool3d_backward.default
    torch.manual_seed(0)
    x = torch.randn((2, 3) + (5,) * dims)
    grad = torch.randn(pool(x, **options).shape)
    size, stride = [options["kernel_size"]] * dims, [options.get("stride", options["kernel_size"])] * dims
    arguments = (size, stride, [options.get("padding", 0)] * dims, options.get("ceil_mode", False),
                 options.get("count_include_pad", True), options.get("divisor_override"))
    check_on_iree(lambda g, t: backward(g, t, *arguments), grad, x)


@pytest.mark.parametrize(
    "pad",
    [(0, -1), (-1, 2), (2, -3, -1, 1), (-2, -2), (0, -5)],
    ids=["crop the end", "crop and pad", "two dims", "crop both sides", "crop it all"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_padding_with_negative_widths(pad, dtype):
    """constant_pad_nd with a negative width crops: IREE 3.13's lowering sliced out of bounds, and
    autograd gives every F.pad's backward negative widths (timm's EfficientViT, TinyViT, CoaT)."""
    x = torch.arange(30).reshape(2, 3, 5).to(dtype)
    check_on_iree(lambda t: torch.nn.functional.pad(t, pad, value=7), x)
    x = torch.randn(2, 3, 5, requires_grad=True)
    check_on_iree(lambda t: torch.autograd.grad(torch.nn.functional.pad(t, (1, 2, 0, 1)).square().sum(), t)[0], x.detach().requires_grad_())


def _gradient(resize):
    """fn(x, g): the gradient of ``resize`` at x, for an output gradient g."""

    def fn(x, g):
        x = x.detach().requires_grad_()
        return torch.autograd.grad(resize(x), x, g)[0]

    return fn


RESIZES = {
    "nearest 1d": (3, dict(mode="nearest", scale_factor=1.6)),
    "nearest 2d by 1.6": (4, dict(mode="nearest", scale_factor=1.6)),
    "nearest 2d by 0.6": (4, dict(mode="nearest", scale_factor=0.6)),
    "nearest 3d": (5, dict(mode="nearest", scale_factor=2)),
    "nearest-exact 2d": (4, dict(mode="nearest-exact", size=(7, 3))),
    "linear 1d": (3, dict(mode="linear", scale_factor=1.6)),
    "bilinear": (4, dict(mode="bilinear", size=(11, 4))),
    "bilinear aligned": (4, dict(mode="bilinear", scale_factor=2, align_corners=True)),
    "bicubic": (4, dict(mode="bicubic", scale_factor=1.6)),
    "trilinear": (5, dict(mode="trilinear", scale_factor=1.5)),
    "adaptive average 2d": (4, dict(mode="area", size=(3, 4))),
    "adaptive average 3d": (5, dict(mode="area", size=(2, 3, 4))),
}


@pytest.mark.parametrize("name", sorted(RESIZES))
def test_resizing_gradients(name):
    """Upsampling's gradients (and adaptive average pooling's, area mode): torch has no
    decompositions and IREE 3.13 lowered only nearest2d's, wrongly for a scale that is not a whole
    number, so segmentation heads, U-Nets and FPNs trained with fallbacks, or wrong gradients."""
    dims, options = RESIZES[name]
    torch.manual_seed(0)
    x = torch.randn((2, 3) + (5,) * (dims - 2))
    resize = lambda t: torch.nn.functional.interpolate(t, **options)  # noqa: E731
    check_on_iree(_gradient(resize), x, torch.randn(resize(x).shape))


@pytest.mark.parametrize(
    "mode, options",
    [
        ("bilinear", dict(size=(7, 9))),
        ("bilinear", dict(scale_factor=0.3)),
        ("bilinear", dict(size=(4, 4), align_corners=True)),
        ("bilinear", dict(size=(20, 5))),
        ("bicubic", dict(size=(20, 5))),
    ],
    ids=["bilinear-shrink", "bilinear-by 0.3", "bilinear-aligned", "bilinear-grow and shrink", "bicubic-grow and shrink"],
)
def test_antialiased_resizing_and_its_gradient(mode, options):
    """antialias=True (torchvision's Resize on tensors): torch has no decompositions and IREE
    3.13 lowers neither the resize nor its gradient, so both fell back. Sizes, scale and corner
    alignment take the same code in both modes, so bicubic runs one case: its other three took
    2 minutes of CI's time on two cores."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 16, 13)

    def resized_and_gradient(t, up):
        t = t.detach().requires_grad_()
        out = torch.nn.functional.interpolate(t, mode=mode, antialias=True, **options)
        return out, torch.autograd.grad(out, t, up)[0]

    up = torch.randn(torch.nn.functional.interpolate(x, mode=mode, antialias=True, **options).shape)
    check_on_iree(resized_and_gradient, x, up)


@pytest.mark.filterwarnings("ignore::turbine.TurbineFallbackWarning")
def test_antialiased_resizing_of_integer_images_is_torchs():
    """torch resizes uint8 images in fixed point, which rounds otherwise: its kernel runs them."""
    image = torch.randint(0, 256, (1, 3, 16, 13), dtype=torch.uint8)
    check(lambda t: torch.nn.functional.interpolate(t, size=(7, 9), mode="bilinear", antialias=True), image, executor="fallback")


GRADIENTS = {
    "replication pad 1d": (3, lambda t: torch.nn.functional.pad(t, (2, 3), mode="replicate")),
    "replication pad 2d": (4, lambda t: torch.nn.functional.pad(t, (1, 2, 3, 0), mode="replicate")),
    "replication pad 3d": (5, lambda t: torch.nn.functional.pad(t, (1, 1, 0, 2, 2, 1), mode="replicate")),
    "adaptive max pool 2d": (4, lambda t: torch.nn.functional.adaptive_max_pool2d(t, (3, 2))),
    "adaptive max pool 3d": (5, lambda t: torch.nn.functional.adaptive_max_pool3d(t, (2, 3, 2))),
    "max pool 3d": (5, lambda t: torch.nn.functional.max_pool3d(t, 3, stride=2, padding=1)),
    "max pool 3d dilated": (5, lambda t: torch.nn.functional.max_pool3d(t, 2, dilation=2, ceil_mode=True)),
}


@pytest.mark.parametrize("name", sorted(GRADIENTS))
def test_padding_and_max_pooling_gradients(name):
    """Replication padding's gradient and max pooling's (at the forward's indices): IREE 3.13
    lowers neither adaptive max pooling's nor max_pool3d's and torch has no decompositions, so they
    fell back (convolutions with padding_mode="replicate", CNN heads that pool adaptively, 3D CNNs)."""
    dims, fn = GRADIENTS[name]
    torch.manual_seed(0)
    x = torch.randn((2, 3) + (5,) * (dims - 2))
    check_on_iree(_gradient(fn), x, torch.randn(fn(x).shape))


def test_max_pooling_gradient_of_a_large_bfloat16_batch():
    """A bfloat16 MNIST batch's max_pool2d gradient did not compile as a scatter (as it is or
    as turbine's scatter to the indices: 2.3 MB of stack, past IREE's CPU limit) and fell
    back; it is a gather of the windows that cover each input place, summed in float32."""
    torch.manual_seed(0)
    x = torch.randn(64, 64, 24, 24).to(torch.bfloat16)
    upstream = torch.randn(64, 64, 12, 12).to(torch.bfloat16)
    check_on_iree(_gradient(lambda t: torch.nn.functional.max_pool2d(t, 2)), x, upstream)


@pytest.mark.parametrize(
    "dims, shape, kernel, size",
    [(2, (2, 3, 9, 11), [2, 3], [4, 5]), (2, (3, 8, 8), [3, 3], [1, 3]), (3, (1, 2, 6, 7, 8), [2, 2, 3], [3, 4, 2])],
    ids=["2d", "2d unbatched, one row", "3d"],
)
def test_fractional_max_pooling_and_its_gradient(dims, shape, kernel, size):
    """IREE 3.13 lowers neither: windows at torch's intervals from each plane's samples (indices
    too), and the gradient at the indices."""
    torch.manual_seed(0)
    x = torch.randn(shape)
    samples = torch.rand(shape[0] if len(shape) == dims + 2 else 1, shape[-dims - 1], dims)
    pool = getattr(torch.ops.aten, f"fractional_max_pool{dims}d")
    backward = getattr(torch.ops.aten, f"fractional_max_pool{dims}d_backward")
    check_on_iree(lambda t, r: pool(t, kernel, size, r), x, samples)
    out, indices = pool(x, kernel, size, samples)
    check_on_iree(lambda g, t, i: backward(g, t, kernel, size, i), torch.randn(out.shape), x, indices)


INTEGERS = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8]


@pytest.mark.parametrize("dtype", INTEGERS, ids=str)
def test_gcd_and_lcm_run_euclid_on_iree_as_torch_does(dtype):
    """torch-mlir lowers no gcd or lcm (eager/decompositions/integers.py): Euclid's steps, as
    many as the dtype can need (consecutive Fibonacci numbers need the most), signs and the
    dtype's most negative value as torch's kernel treats them."""
    info = torch.iinfo(dtype)
    x, y = torch.randint(info.min, info.max, (2, 300), dtype=dtype)
    fibonacci = [1, 2]
    while fibonacci[-1] + fibonacci[-2] <= info.max:
        fibonacci.append(fibonacci[-1] + fibonacci[-2])
    x[: len(fibonacci) - 1] = torch.tensor(fibonacci[:-1], dtype=dtype)
    y[: len(fibonacci) - 1] = torch.tensor(fibonacci[1:], dtype=dtype)
    edges = torch.tensor(sorted({info.min, info.min + 1, -1, 0, 1, 6, info.max}), dtype=dtype)
    ex, ey = torch.meshgrid(edges, edges, indexing="ij")
    x, y = torch.cat([x, ex.flatten()]), torch.cat([y, ey.flatten()])
    check(torch.gcd, x, y)
    check(lambda a, b: a.clone().gcd_(b), x, y)
    small = (x % 1000, y % 1000) if dtype in (torch.int64, torch.int32) else (x, y)
    defined = torch.gcd(*small) != -1  # torch's CPU kernel divides the most negative value by -1 there (a trap)
    check(torch.lcm, small[0][defined], small[1][defined])


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16], ids=str)
def test_gcd_and_lcm_cast_a_wider_zero_dim_operand_first(dtype):
    """torch casts both operands to their common dtype first: -200 as int8 is 56."""
    x = torch.tensor([12, 34, 7, 56], dtype=dtype)
    for value in (-200, -1, 40000):
        other = torch.tensor(value)
        check(torch.gcd, x, other)
        check(torch.lcm, x, other)
        check(lambda a, b: a.clone().gcd_(b), x, other)


def test_integer_matrix_products_refuse_what_torch_refuses():
    a, b = torch.randint(-9, 9, (3, 4)), torch.randint(-9, 9, (4, 2))
    for c, m1, m2 in ((torch.zeros(3, 2, dtype=torch.int32), a, b), (torch.ones(3, 2).bool(), a.bool(), b.bool())):
        with pytest.raises((RuntimeError, NotImplementedError)) as expected:
            torch.addmm(c, m1, m2)
        with pytest.raises(Exception) as actual, turbine.fallback("device"):
            torch.addmm(c.to(D), m1.to(D), m2.to(D)).cpu()  # raised when the kernel it waits for is known
        assert str(expected.value) in str(actual.value)  # torch's error, or turbine's quoting it


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32], ids=str)
def test_integer_matrix_products_that_scale_and_add_run_on_iree(dtype):
    """torch-mlir's integer addmm and addbmm did not legalize their factors, so integer
    ``linear`` with a bias fell back; they are mm and bmm, scaled and added."""
    a, b, c = (torch.randint(-9, 9, shape, dtype=dtype) for shape in ((3, 4), (4, 2), (3, 2)))
    b1, b2 = torch.randint(-9, 9, (2, 3, 4), dtype=dtype), torch.randint(-9, 9, (2, 4, 2), dtype=dtype)
    for factors in ({}, {"beta": 0}, {"beta": 2, "alpha": 3}, {"alpha": 0}):
        check(lambda c, a, b: torch.addmm(c, a, b, **factors), c, a, b)
        check(lambda c, a, b: torch.addmm(c, a, b, **factors), c[0], a, b)
        check(lambda c, a, b: torch.addbmm(c, a, b, **factors), c, b1, b2)
    check(lambda c, a, b: c.clone().addmm_(a, b, beta=-1), c, a, b)
    check(torch.nn.functional.linear, a, b.mT, c[0])


@pytest.mark.parametrize("options", [{}, {"right": True}, {"side": "right", "out_int32": True}])
def test_searchsorted_runs_torchs_binary_search_on_iree(options):
    """IREE 3.13 does not compile searchsorted (it fell back); turbine runs torch's search,
    NaNs in the sequence included (where counting the smaller elements would differ)."""
    sequence = torch.randn(10).sort().values
    values = torch.randn(4, 5)
    values[0, :3] = sequence[:3]  # ties
    check(lambda s, v: torch.searchsorted(s, v, **options), sequence, values)
    check(lambda s, v: torch.searchsorted(s, v, **options), torch.randn(4, 7).sort(-1).values, values)
    unsorted = torch.randn(4, 7)
    check(lambda s, v, o: torch.searchsorted(s, v, sorter=o, **options), unsorted, values, unsorted.argsort(-1))
    with_nans = torch.tensor([1.0, 2.0, float("nan"), float("nan"), float("nan")])
    check(lambda s, v: torch.searchsorted(s, v, **options), with_nans, torch.tensor([1.5, 0.5, 3.0, float("nan"), 2.0]))
    check(lambda s, v: torch.searchsorted(s, v, **options), torch.tensor([1, 3, 3, 3, 7, 9]), torch.tensor([0, 3, 4, 9, 10]))
    check(lambda s, v: torch.searchsorted(s, v, **options), sequence, torch.tensor(0.3))
    check(lambda s: torch.searchsorted(s, 0.25, **options), torch.tensor([0.0, 0.25, 0.5]))
    check(lambda s: torch.searchsorted(s, 2.5, **options), torch.tensor([1, 2, 3]))
