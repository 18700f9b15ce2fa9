"""Elementwise functions whose IREE 3.13 kernels are imprecise: rad2deg (its constant is
180 / 3.14159) and deg2rad, sin, cos and tan (tan 3% off
near pi/2, sin(100) 5e-6 off: poor argument reduction), gelu's tanh form (5e-5 off: IREE lowers it with its own approximation), and functions
near 0 that IREE computes by cancelling terms (exp(x) - 1 in elu, log(x + sqrt(x*x + 1)) in
asinh, log((1 + x) / (1 - x)) in atanh, exp(x) - exp(-x) in sinh: 5-30% off for small x, where
torch is exact to float32): here with expm1 and log1p."""

from __future__ import annotations

import math

import torch

from turbine.eager.decompositions._common import as_float64, floating, result_dtype
from turbine.eager.decompositions.erf import erf
from turbine.eager.decompositions.gamma import sin_pi
from turbine.eager.decompositions.logarithms import expm1, log1p


# float64 sin, cos and tan are the ops themselves. The reduction below (x / pi in
# float64) rounds by 1e-16 of x, which near a multiple of pi is a large part of a float64 sine
# (1e-10 relative error); IREE's own float64 kernel (on the GPU), or on the CPU one linked
# against the C library's (kernels_cache/compiler.py), is exact.


def rad2deg(x: torch.Tensor) -> torch.Tensor:
    """x * (180 / pi), as torch: IREE 3.13 multiplied by 180 / 3.14159, 8.4e-7 relative off (7
    float32 ulps; float64 results wrong from their 7th digit)."""
    return x.to(result_dtype(x)) * (180 / math.pi)


def deg2rad(x: torch.Tensor) -> torch.Tensor:
    """x * (pi / 180), as torch, rounded once (IREE 3.13's was an ulp off for half its results)."""
    return x.to(result_dtype(x)) * (math.pi / 180)


def tan(x: torch.Tensor) -> torch.Tensor:
    """sin/cos in float64 from the argument reduced by pi: exact to float32 for |x| < 1e8."""
    if x.dtype == torch.float64:
        return torch.ops.aten.tan.default(x)  # the op itself: see above
    turns = as_float64(x) / math.pi
    return (sin_pi(turns) / sin_pi(turns + 0.5)).to(result_dtype(x))


def sin(x: torch.Tensor) -> torch.Tensor:
    """sin from the argument reduced by pi in float64: IREE's float32 sine reduced it badly
    (sin(100) 5e-6 off, sin(-1e-30) 6e-8: rotary position embeddings take sines of thousands)."""
    if x.dtype == torch.float64:
        return torch.ops.aten.sin.default(x)  # the op itself: see above
    return sin_pi(as_float64(x) / math.pi).to(result_dtype(x))


def cos(x: torch.Tensor) -> torch.Tensor:
    """cos as sin(pi * (x / pi + 1/2)), the same way."""
    if x.dtype == torch.float64:
        return torch.ops.aten.cos.default(x)  # the op itself: see above
    return sin_pi(as_float64(x) / math.pi + 0.5).to(result_dtype(x))


def gelu(x: torch.Tensor, *, approximate: str = "none") -> torch.Tensor:
    """gelu; its tanh form written out, with tanh from float64 exponentials; float64's erf form
    written out too, as torch's (llvm-cpu has no float64 vector erf)."""
    if approximate != "tanh" and x.dtype == torch.float64:
        return 0.5 * x * (1 + erf(x * math.sqrt(0.5)))
    if approximate != "tanh":
        return torch.ops.aten.gelu.default(x)
    wide = as_float64(x)
    inner = math.sqrt(2 / math.pi) * (wide + 0.044715 * wide * wide * wide)
    decay = torch.exp(-2 * inner.abs())
    tanh = torch.where(inner < 0, -1, 1) * (1 - decay) / (1 + decay)
    return (0.5 * wide * (1 + tanh)).to(x.dtype)


def elu(x: torch.Tensor, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0) -> torch.Tensor:
    """elu (and selu, celu, which torch writes with it), its negative side as expm1."""
    return torch.where(x > 0, x * scale, expm1(x * input_scale) * (alpha * scale))


def celu(x: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """celu as elu with its input scaled by 1 / alpha."""
    return elu(x, alpha, 1.0, 1.0 / alpha)


def asinh(x: torch.Tensor) -> torch.Tensor:
    """asinh as log1p(a + a * a / (1 + sqrt(1 + a * a))) of a = |x|, signed; log(a) + log(2)
    past 1e8, where a * a would overflow."""
    x = x.to(result_dtype(x))
    a = x.abs()
    near = log1p(a + a * a / (1 + torch.sqrt(1 + a * a)))
    far = torch.log(a) + math.log(2)
    magnitude = torch.where(a > 1e8, far, near)
    return torch.where(x < 0, -magnitude, magnitude)


def acosh(x: torch.Tensor) -> torch.Tensor:
    """acosh as log1p(t + sqrt(t * (x + 1))) of t = x - 1 (exact near 1, where x * x - 1 would
    cancel: IREE's was 7e-5 off at 1 + 2e-7); log(x) + log(2) past 1e8, where t * (x + 1) would
    overflow. Below 1 (and for NaN) it is NaN."""
    x = x.to(result_dtype(x))
    t = x - 1
    near = log1p(t + torch.sqrt(t * (x + 1)))
    far = torch.log(x) + math.log(2)
    return torch.where(x < 1, math.nan, torch.where(x > 1e8, far, near))  # log1p gave -inf at -26195


def sinc(x: torch.Tensor) -> torch.Tensor:
    """sin(pi x) / (pi x), 1 at 0, with pi x rounded to x's dtype as torch's kernel rounds it and
    its sine taken by :func:`sin` (IREE's own sinc took IREE's sine: 1e-4 off at 1415.7).
    float64 goes to the op itself, as :func:`sin` does."""
    x = floating(x)
    if x.dtype == torch.float64:
        return torch.ops.aten.sinc.default(x)
    product = x * math.pi
    return torch.where(x == 0, torch.ones_like(x), sin(product) / product)


def atanh(x: torch.Tensor) -> torch.Tensor:
    """atanh as log1p(2a / (1 - a)) / 2 of a = |x|, signed (for x near -1, 1 + 2x / (1 - x)
    would cancel)."""
    x = x.to(result_dtype(x))
    a = x.abs()
    magnitude = 0.5 * log1p(2 * a / (1 - a))
    return torch.where(x < 0, -magnitude, magnitude)


def sinh(x: torch.Tensor) -> torch.Tensor:
    """sinh from expm1 where |x| < 1; beyond, from float64 exponentials (float32's largest sinh,
    2.2e38 at 89, stays finite)."""
    x = x.to(result_dtype(x))
    near = (expm1(x) - expm1(-x)) / 2
    wide = as_float64(x)
    far = ((torch.exp(wide) - torch.exp(-wide)) / 2).to(x.dtype)
    return torch.where(x.abs() < 1, near, far)


def cosh(x: torch.Tensor) -> torch.Tensor:
    """cosh from float64 exponentials: IREE's float32 one overflowed before float32's largest
    cosh (2.2e38 at 89), which sinh's gradient reads."""
    wide = as_float64(x)
    return ((torch.exp(wide) + torch.exp(-wide)) / 2).to(result_dtype(x))
