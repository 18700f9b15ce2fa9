"""turbine's own decompositions: ops IREE 3.13 cannot compile, written with ops it can.

torch's decomposition tables stop short for these: they either have no entry, or their entry
(a ``torch._refs`` function) traces into ``prims`` ops that IREE's importer does not take. Each
function here computes what torch's CPU kernel computes, to float precision, from elementwise
math, reductions and views that IREE lowers; the OpInfo suite (tests/opinfo) and
tests/test_decompositions.py compare them with torch.

The special functions use textbook methods (series, recurrences, asymptotic expansions,
Newton's method) rather than torch's fitted coefficients. They are evaluated in the input's
floating dtype, or float32 for integer inputs, as torch does.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

aten = torch.ops.aten

#: aten overload -> the function traced in its place.
TABLE: dict[torch._ops.OpOverload, Callable] = {}


def _registers(*ops: torch._ops.OpOverload) -> Callable[[Callable], Callable]:
    def register(fn: Callable) -> Callable:
        for op in ops:
            TABLE[op] = fn
        return fn

    return register


def _floating(x: torch.Tensor) -> torch.Tensor:
    """``x`` as torch's unary float ops see it: integers and bools become the default float."""
    return x if x.dtype.is_floating_point else x.to(torch.get_default_dtype())


def _bits_dtype(dtype: torch.dtype) -> torch.dtype:
    return {torch.float64: torch.int64, torch.float32: torch.int32}.get(dtype, torch.int16)


# --- sign, magnitude and neighbours -------------------------------------------------------


@_registers(aten.signbit.default)
def signbit(x: torch.Tensor) -> torch.Tensor:
    """The sign bit itself (set for -0.0 and negative NaNs), read by viewing the float as an int."""
    if not x.dtype.is_floating_point:
        return x < 0
    if x.dim() == 0:  # IREE 3.13 cannot reinterpret a 0-d tensor
        return signbit(x.reshape(1)).reshape(())
    return x.view(_bits_dtype(x.dtype)) < 0


@_registers(aten.copysign.Tensor)
def copysign(x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    dtype = torch.result_type(x, other)
    dtype = dtype if dtype.is_floating_point else torch.get_default_dtype()
    magnitude = x.to(dtype).abs()
    return torch.where(signbit(other.to(dtype)), -magnitude, magnitude)


@_registers(aten.copysign.Scalar)
def copysign_scalar(x: torch.Tensor, other: float) -> torch.Tensor:
    magnitude = _floating(x).abs()
    return -magnitude if math.copysign(1.0, other) < 0 else magnitude


@_registers(aten.hypot.default)
def hypot(x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """sqrt(x² + y²) scaled by the larger magnitude, so it neither overflows nor underflows early."""
    a, b = x.abs(), other.abs()
    big, small = torch.maximum(a, b), torch.minimum(a, b)
    ratio = torch.where(big == 0, torch.zeros_like(big), small / big)
    result = big * torch.sqrt(1 + ratio * ratio)
    result = torch.where(torch.isnan(a) | torch.isnan(b), a + b, result)  # IREE's maximum drops NaN
    infinite = torch.isinf(a) | torch.isinf(b)  # inf even when the other one is NaN, as C's hypot
    return torch.where(infinite, torch.full_like(result, math.inf), result)


@_registers(aten.fmax.default)
def fmax(x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """max ignoring NaN: the other operand wins over a NaN."""
    return _ignoring_nan(torch.maximum, x, other)


@_registers(aten.fmin.default)
def fmin(x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    return _ignoring_nan(torch.minimum, x, other)


def _ignoring_nan(pick: Callable, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    dtype = torch.result_type(x, other)
    x, other = x.to(dtype), other.to(dtype)
    if not dtype.is_floating_point:
        return pick(x, other)
    return torch.where(torch.isnan(x), other, torch.where(torch.isnan(other), x, pick(x, other)))


@_registers(aten.nextafter.default)
def nextafter(x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """The next float after x towards other: one step of the integer bit pattern."""
    bits_dtype = _bits_dtype(x.dtype)
    bits = x.view(bits_dtype)
    away_from_zero = (x < other) == (x > 0)
    stepped = torch.where(away_from_zero, bits + 1, bits - 1).view(x.dtype)
    tiniest = torch.ones_like(bits).view(x.dtype)  # the smallest subnormal
    from_zero = torch.where(other > 0, tiniest, -tiniest)
    result = torch.where(x == 0, from_zero, stepped)
    result = torch.where(x == other, other, result)
    return torch.where(torch.isnan(x) | torch.isnan(other), x + other, result)


@_registers(aten.frexp.Tensor)
def frexp(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x = mantissa * 2**exponent with 0.5 <= |mantissa| < 1; zero, inf and NaN keep exponent 0."""
    # isnan, not isfinite: IREE folded isfinite's x == x to true inside this kernel.
    regular = ~torch.isnan(x) & ~torch.isinf(x) & (x != 0)
    magnitude = torch.where(regular, x.abs(), torch.ones_like(x))
    exponent = torch.floor(torch.log2(magnitude)) + 1
    mantissa = _times_power_of_two(x, -exponent)
    # log2 rounds near powers of two: one step either way puts the mantissa in [0.5, 1).
    low = mantissa.abs() < 0.5
    mantissa, exponent = torch.where(low, mantissa * 2, mantissa), torch.where(low, exponent - 1, exponent)
    high = mantissa.abs() >= 1
    mantissa, exponent = torch.where(high, mantissa / 2, mantissa), torch.where(high, exponent + 1, exponent)
    mantissa = torch.where(regular, mantissa, x)
    exponent = torch.where(regular, exponent, torch.zeros_like(exponent))
    return mantissa, exponent.to(torch.int32)


def _times_power_of_two(x: torch.Tensor, exponent: torch.Tensor) -> torch.Tensor:
    """x * 2**exponent, exact; in two steps so that neither factor overflows for subnormal x."""
    half = torch.floor(exponent / 2)
    return x * torch.exp2(half) * torch.exp2(exponent - half)


@_registers(aten.angle.default)
def angle(x: torch.Tensor) -> torch.Tensor:
    """The argument of a real number: pi for negatives, 0 otherwise, NaN kept."""
    x = _floating(x)
    result = torch.where(x < 0, torch.full_like(x, math.pi), torch.zeros_like(x))
    return torch.where(torch.isnan(x), x, result)


@_registers(aten.log10.default)
def log10(x: torch.Tensor) -> torch.Tensor:
    return torch.log(_floating(x)) * (1 / math.log(10))


# --- pooling ---------------------------------------------------------------------------------


def _adaptive_windows(size: int, out: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Per output position, the first input index of its window and the last one, and the
    widest window: torch's windows run from floor(i*size/out) to ceil((i+1)*size/out)."""
    position = torch.arange(out)
    start = torch.div(position * size, out, rounding_mode="floor")
    stop = torch.div((position + 1) * size + out - 1, out, rounding_mode="floor")
    widest = max(-(-(i + 1) * size // out) - (i * size // out) for i in range(out))
    return start, stop - 1, widest


def adaptive_max_pool(input: torch.Tensor, output_size: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Adaptive max pooling over the last len(output_size) dims, for any sizes.

    Each window is read at the widest window's length, the narrower ones repeating their last
    element (which changes neither the max nor where it first occurs). Indices count into the
    flattened spatial dims, as torch's do.
    """
    n = len(output_size)
    spatial = list(input.shape[-n:])
    batch = list(input.shape[:-n])
    windows = [_adaptive_windows(size, out) for size, out in zip(spatial, output_size)]
    x = input
    for d, ((start, last, widest), out) in enumerate(zip(windows, output_size)):
        dim = len(batch) + 2 * d  # each earlier dim is now (out, widest)
        index = torch.minimum(start.unsqueeze(1) + torch.arange(widest).unsqueeze(0), last.unsqueeze(1))
        x = x.index_select(dim, index.reshape(-1))
        x = x.reshape(list(x.shape[:dim]) + [out, widest] + list(x.shape[dim + 1 :]))
    order = list(range(len(batch)))
    order += [len(batch) + 2 * d for d in range(n)] + [len(batch) + 2 * d + 1 for d in range(n)]
    x = x.permute(order).reshape(batch + list(output_size) + [-1])
    values, flat = torch.max(x, -1)
    indices = torch.zeros_like(flat)
    remaining = flat
    for d in reversed(range(n)):
        start, last, widest = windows[d]
        shape = [1] * len(batch) + [1] * n
        shape[len(batch) + d] = output_size[d]
        offset = torch.remainder(remaining, widest)
        remaining = torch.div(remaining, widest, rounding_mode="floor")
        position = torch.minimum(start.reshape(shape) + offset, last.reshape(shape))
        indices = indices + position * math.prod(spatial[d + 1 :])
    return values, indices


@_registers(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default)
def adaptive_max_pool_nd(input: torch.Tensor, output_size: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    return adaptive_max_pool(input, list(output_size))


# --- gamma and zeta functions -------------------------------------------------------------
# Evaluated in float64 (IREE lowers its +, *, /, exp, log and sqrt, not its sin or erf), then
# rounded to the input's dtype, so that float32 results keep float32 precision.

_HALF_LOG_TWO_PI = 0.5 * math.log(2 * math.pi)
_SHIFT = 10  # arguments are moved above this by recurrence before an asymptotic series


def _wide(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float64)


def _result_dtype(x: torch.Tensor) -> torch.dtype:
    return x.dtype if x.dtype.is_floating_point else torch.get_default_dtype()


def _sin_pi(x: torch.Tensor) -> torch.Tensor:
    """sin(pi * x) for float64 x, exact at the integers (where gamma has its poles).

    x is reduced to [-1/2, 1/2] and the sine summed as its Taylor series (to t**21, error below
    1e-15): IREE has no float64 sine, and its float32 one lost relative precision near 0.
    """
    whole = torch.round(x)
    t = math.pi * (x - whole)
    t2 = t * t
    series = torch.ones_like(t)
    for k in range(21, 1, -2):  # Horner: 1 - t²/3! (1 - t²/(4*5) (1 - ...))
        series = 1 - t2 / (k * (k - 1)) * series
    value = t * series
    return torch.where(torch.remainder(whole, 2) == 1, -value, value)


def _lgamma_positive(x: torch.Tensor) -> torch.Tensor:
    """log Gamma(x) for x > 0: recurrence up to x + 10, then Stirling's series."""
    small = x < _SHIFT
    z = torch.where(small, x + _SHIFT, x)
    product = torch.ones_like(x)
    for k in range(_SHIFT):
        product = product * torch.where(small, x + k, torch.ones_like(x))
    inverse = 1 / z
    inverse2 = inverse * inverse
    series = inverse * (1 / 12 + inverse2 * (-1 / 360 + inverse2 * (1 / 1260 + inverse2 * (-1 / 1680 + inverse2 / 1188))))
    return (z - 0.5) * torch.log(z) - z + _HALF_LOG_TWO_PI + series - torch.log(product)


def _lgamma_wide(x: torch.Tensor) -> torch.Tensor:
    """log|Gamma(x)| for float64 x; negative x by the reflection formula, inf at the poles."""
    positive = torch.where(x > 0, x, 1 - x)
    value = _lgamma_positive(positive)
    reflected = math.log(math.pi) - torch.log(torch.abs(_sin_pi(x))) - value
    result = torch.where(x > 0, value, reflected)
    pole = (x <= 0) & (x == torch.floor(x))
    result = torch.where(pole | torch.isinf(x), torch.full_like(x, math.inf), result)
    return torch.where(torch.isnan(x), x, result)


@_registers(aten.lgamma.default)
def lgamma(x: torch.Tensor) -> torch.Tensor:
    return _lgamma_wide(_wide(x)).to(_result_dtype(x))


@_registers(aten.mvlgamma.default)
def mvlgamma(x: torch.Tensor, p: int) -> torch.Tensor:
    """The multivariate log-gamma: a sum of p shifted lgammas plus a constant."""
    wide = _wide(x)
    total = torch.full_like(wide, p * (p - 1) / 4 * math.log(math.pi))
    for j in range(p):
        total = total + _lgamma_wide(wide - j / 2)
    return total.to(_result_dtype(x))


def _digamma_wide(x: torch.Tensor) -> torch.Tensor:
    """psi(x) for float64 x: reflection below 0.5, recurrence up to 10, asymptotic series."""
    reflect = x < 0.5
    y = torch.where(reflect, 1 - x, x)
    small = y < _SHIFT
    z = torch.where(small, y + _SHIFT, y)
    shift_sum = torch.zeros_like(y)
    for k in range(_SHIFT):
        shift_sum = shift_sum + torch.where(small, 1 / (y + k), torch.zeros_like(y))
    inverse2 = 1 / (z * z)
    series = inverse2 * (1 / 12 - inverse2 * (1 / 120 - inverse2 * (1 / 252 - inverse2 * (1 / 240 - inverse2 / 132))))
    value = torch.log(z) - 0.5 / z - series - shift_sum
    # psi(1 - x) - psi(x) = pi cot(pi x); cos(pi x) = sin(pi (x + 1/2)).
    cotangent = _sin_pi(x + 0.5) / _sin_pi(x)
    result = torch.where(reflect, value - math.pi * cotangent, value)
    integer = (x <= 0) & (x == torch.floor(x))
    result = torch.where(integer, torch.full_like(x, math.nan), result)
    zero = torch.where(signbit(x), torch.full_like(x, math.inf), torch.full_like(x, -math.inf))
    result = torch.where(x == 0, zero, result)  # torch: -inf at 0.0, inf at -0.0, NaN below
    result = torch.where(x == math.inf, x, result)
    return torch.where(torch.isnan(x) | (x == -math.inf), torch.full_like(x, math.nan), result)


@_registers(aten.digamma.default)
def digamma(x: torch.Tensor) -> torch.Tensor:
    return _digamma_wide(_wide(x)).to(_result_dtype(x))


#: B_2j / (2j)! for j = 1..7: the Euler-Maclaurin tail of the Hurwitz zeta function.
_BERNOULLI_OVER_FACTORIAL = [
    1 / 6 / 2, -1 / 30 / 24, 1 / 42 / 720, -1 / 30 / 40320, 5 / 66 / 3628800,
    -691 / 2730 / 479001600, 7 / 6 / 87178291200,
]
#: Terms summed before the Euler-Maclaurin tail, which needs q + terms well above 0: 40 covers
#: q >= -30 (polygamma of negative arguments), at 40 exp/log pairs an element.
_ZETA_TERMS = 40


def _power(base: torch.Tensor, exponent: torch.Tensor | float) -> torch.Tensor:
    """base ** exponent for float64 base, right for negative bases and integral exponents."""
    magnitude = torch.exp(exponent * torch.log(torch.abs(base)))
    odd = exponent % 2 == 1 if isinstance(exponent, float) else torch.remainder(exponent, 2) == 1
    return torch.where((base < 0) & odd, -magnitude, magnitude)


def _zeta_wide(s: torch.Tensor | float, q: torch.Tensor) -> torch.Tensor:
    """The Hurwitz zeta function sum_k (q + k) ** -s, for float64 q (and s), by Euler-Maclaurin.

    polygamma passes s as a Python float: IREE 3.13 miscompiled comparisons of a constant
    tensor (full_like(q, 2.0) < 1 came out true inside a kernel).
    """
    total = torch.zeros_like(q + s)
    for k in range(_ZETA_TERMS):
        total = total + _power(q + k, -s)
    a = q + _ZETA_TERMS
    tail = a * _power(a, -s) / (s - 1) + 0.5 * _power(a, -s)
    rising = s  # s (s + 1) ... (s + 2j - 2)
    term = _power(a, -s - 1)
    for j, coefficient in enumerate(_BERNOULLI_OVER_FACTORIAL):
        tail = tail + coefficient * rising * term
        rising = rising * (s + 2 * j + 1) * (s + 2 * j + 2)
        term = term / (a * a)
    if isinstance(s, torch.Tensor):
        tail = torch.where(s == math.inf, torch.zeros_like(tail), tail)  # the terms alone are exact
    total = total + tail
    # Where the sum is undefined, torch (after Cephes) gives inf at s == 1 and at the poles
    # q = 0, -1, ..., and NaN for s < 1 or a negative non-integral q with non-integral s.
    # Below q = -30 the tail is wrong: torch's Cephes code sums as many terms as it takes.
    pole = (q <= 0) & (q == torch.floor(q)) & (q != -math.inf)
    if isinstance(s, float):  # decided here: IREE 3.13 has no bitwise op of a tensor and a bool
        if s < 1:
            return torch.full_like(total, math.nan)
        if s == 1:
            return torch.full_like(total, math.inf)
        undefined = (q < 0) if s != math.floor(s) else torch.zeros_like(pole)
    else:
        pole = pole | (s == 1)
        undefined = ((q < 0) & (s != torch.floor(s))) | (s < 1)
    total = torch.where(undefined, torch.full_like(total, math.nan), total)
    total = torch.where(pole | (q == -math.inf), torch.full_like(total, math.inf), total)
    return torch.where(q == math.inf, torch.full_like(total, math.nan), total)  # as torch gives


@_registers(aten.special_zeta.default)
def zeta(x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    dtype = torch.result_type(x, other)
    dtype = dtype if dtype.is_floating_point else torch.get_default_dtype()
    return _zeta_wide(_wide(x), _wide(other)).to(dtype)


@_registers(aten.polygamma.default)
def polygamma(n: int, x: torch.Tensor) -> torch.Tensor:
    """psi^(n)(x) = (-1)**(n+1) n! zeta(n + 1, x) for n >= 1; digamma for n == 0."""
    wide = _wide(x)
    if n == 0:
        return _digamma_wide(wide).to(_result_dtype(x))
    value = (-1) ** (n + 1) * math.factorial(n) * _zeta_wide(float(n + 1), wide)
    # The limits at infinity: 0 at +inf; none at -inf (zeta's own conventions differ).
    value = torch.where(wide == math.inf, torch.zeros_like(value), value)
    value = torch.where(wide == -math.inf, torch.full_like(value, math.nan), value)
    return value.to(_result_dtype(x))


# --- the error function family ------------------------------------------------------------
# float64 throughout: erf by its series with positive terms below 2.5, erfc by Laplace's
# continued fraction above; inverses by Halley's method from a rough start.

_TWO_OVER_SQRT_PI = 2 / math.sqrt(math.pi)
_SERIES_LIMIT = 2.5  # |x| below: the series; above: the continued fraction
_ERF_TERMS = 50  # series terms: enough for |x| < 2.5 to float64 precision
_CF_DEPTH = 60  # continued fraction depth: enough for |x| >= 2.5 to 1e-12


def _erf_series(x: torch.Tensor) -> torch.Tensor:
    """erf(x) = 2/sqrt(pi) exp(-x²) sum 2**n x**(2n+1) / (2n+1)!!, for |x| < 2.5."""
    x = torch.where(x.abs() < _SERIES_LIMIT, x, torch.zeros_like(x))
    x2 = x * x
    term = x
    total = x
    for n in range(1, _ERF_TERMS):
        term = term * 2 * x2 / (2 * n + 1)
        total = total + term
    return _TWO_OVER_SQRT_PI * torch.exp(-x2) * total


def _erfcx_fraction(x: torch.Tensor) -> torch.Tensor:
    """exp(x²) erfc(x) for x >= 2.5: 1/sqrt(pi) / (x + (1/2)/(x + 1/(x + (3/2)/(x + ...))))."""
    x = torch.where(x >= _SERIES_LIMIT, x, torch.full_like(x, _SERIES_LIMIT))
    fraction = x
    for k in range(_CF_DEPTH, 0, -1):
        fraction = x + (k / 2) / fraction
    return 1 / (math.sqrt(math.pi) * fraction)


def _erfc_wide(x: torch.Tensor) -> torch.Tensor:
    """erfc for float64 x, to full relative precision in both tails."""
    magnitude = x.abs()
    upper = torch.where(
        magnitude < _SERIES_LIMIT, 1 - _erf_series(magnitude), torch.exp(-magnitude * magnitude) * _erfcx_fraction(magnitude)
    )
    result = torch.where(x < 0, 2 - upper, upper)
    return torch.where(torch.isnan(x), x, result)


def _erfcx_wide(x: torch.Tensor) -> torch.Tensor:
    magnitude = x.abs()
    series = torch.exp(magnitude * magnitude) * (1 - _erf_series(magnitude))
    upper = torch.where(magnitude < _SERIES_LIMIT, series, _erfcx_fraction(magnitude))
    result = torch.where(x < 0, 2 * torch.exp(x * x) - upper, upper)
    return torch.where(torch.isnan(x), x, result)


def _erf_wide(x: torch.Tensor) -> torch.Tensor:
    tail = 1 - _erfc_wide(x.abs())
    result = torch.where(x.abs() < _SERIES_LIMIT, _erf_series(x), torch.where(x < 0, -tail, tail))
    return torch.where(torch.isnan(x), x, result)


@_registers(aten.erfc.default)
def erfc(x: torch.Tensor) -> torch.Tensor:
    return _erfc_wide(_wide(x)).to(_result_dtype(x))


@_registers(aten.special_erfcx.default)
def erfcx(x: torch.Tensor) -> torch.Tensor:
    return _erfcx_wide(_wide(x)).to(_result_dtype(x))


def _ndtr_lower(x: torch.Tensor) -> torch.Tensor:
    """Phi(x) for x <= 0, the normal distribution's lower tail, to full relative precision."""
    return _erfc_wide(-x / math.sqrt(2)) / 2


def _ndtri_lower(p: torch.Tensor) -> torch.Tensor:
    """Phi^-1(p) for 0 < p <= 1/2: Abramowitz & Stegun 26.2.23 (error 4.5e-4), then three steps
    of Halley's method, each of which cubes the relative error."""
    p = torch.where((p > 0) & (p <= 0.5), p, torch.full_like(p, 0.25))
    t = torch.sqrt(-2 * torch.log(p))
    x = -(t - (2.515517 + t * (0.802853 + t * 0.010328)) / (1 + t * (1.432788 + t * (0.189269 + t * 0.001308))))
    for _ in range(3):
        error = _ndtr_lower(x) - p
        u = error * math.sqrt(2 * math.pi) * torch.exp(x * x / 2)
        x = x - u / (1 + x * u / 2)
    return x


def _ndtri_wide(p: torch.Tensor) -> torch.Tensor:
    lower = p <= 0.5
    x = torch.where(lower, _ndtri_lower(p), -_ndtri_lower(1 - p))  # 1 - p is exact for p >= 1/2
    x = torch.where(p == 0, torch.full_like(p, -math.inf), torch.where(p == 1, torch.full_like(p, math.inf), x))
    return torch.where((p < 0) | (p > 1) | torch.isnan(p), torch.full_like(p, math.nan), x)


@_registers(aten.special_ndtri.default)
def ndtri(p: torch.Tensor) -> torch.Tensor:
    return _ndtri_wide(_wide(p)).to(_result_dtype(p))


@_registers(aten.erfinv.default)
def erfinv(y: torch.Tensor) -> torch.Tensor:
    """erf^-1(y) = Phi^-1((1 + y) / 2) / sqrt(2), from the tail nearer y; small |y| by Halley
    steps on erf itself, where (1 + y) / 2 would round y away."""
    wide = _wide(y)
    magnitude = wide.abs()
    tail = -_ndtri_wide((1 - magnitude) / 2) / math.sqrt(2)
    x = torch.where(magnitude < 0.5, wide * (math.sqrt(math.pi) / 2), torch.where(wide < 0, -tail, tail))
    for _ in range(3):
        error = _erf_series(x) - wide
        u = error / (_TWO_OVER_SQRT_PI * torch.exp(-x * x))
        x = torch.where(magnitude < 0.5, x - u / (1 + x * u), x)
    return x.to(_result_dtype(y))


@_registers(aten.special_log_ndtr.default)
def log_ndtr(x: torch.Tensor) -> torch.Tensor:
    """log Phi(x): through erfcx in the lower tail (Phi underflows below -37), log1p above."""
    wide = _wide(x)
    t = -wide / math.sqrt(2)
    lower = torch.log(_erfcx_wide(torch.where(wide < -1, t, torch.ones_like(t))) / 2) - t * t
    upper = torch.log1p(-_erfc_wide(-t) / 2)
    return torch.where(wide < -1, lower, upper).to(_result_dtype(x))


# --- modified Bessel functions ------------------------------------------------------------
# float64: the power series below |x| = 30 (all terms positive), the asymptotic expansion
# e^x / sqrt(2 pi x) sum_k (-1)^k a_k(nu) / x^k above it.

_BESSEL_SWITCH = 30.0
_BESSEL_TERMS = 60  # series terms: the largest is near k = |x|/2, the tail negligible by k = 60
_ASYMPTOTIC_TERMS = 12


def _bessel_i_series(x: torch.Tensor, order: int) -> torch.Tensor:
    """I_order(x) = sum_k (x/2)**(2k+order) / (k! (k+order)!) for |x| < 30."""
    x = torch.where(x.abs() < _BESSEL_SWITCH, x, torch.zeros_like(x))
    quarter = x * x / 4
    term = (x / 2) ** order / math.factorial(order) if order else torch.ones_like(x)
    total = term
    for k in range(1, _BESSEL_TERMS):
        term = term * quarter / (k * (k + order))
        total = total + term
    return total


def _bessel_i_scaled_asymptotic(x: torch.Tensor, order: int) -> torch.Tensor:
    """e^-|x| I_order(|x|) for |x| >= 30: sqrt(1/(2 pi x)) sum_k (-1)^k a_k / x^k with
    a_k = (4 nu² - 1²)(4 nu² - 3²) ... (4 nu² - (2k-1)²) / (k! 8^k)."""
    x = torch.where(x.abs() >= _BESSEL_SWITCH, x.abs(), torch.full_like(x, _BESSEL_SWITCH))
    mu = 4 * order * order
    term = torch.ones_like(x)
    total = term
    for k in range(1, _ASYMPTOTIC_TERMS):
        term = -term * (mu - (2 * k - 1) ** 2) / (k * 8 * x)
        total = total + term
    return total / torch.sqrt(2 * math.pi * x)


def _bessel_i_scaled(x: torch.Tensor, order: int) -> torch.Tensor:
    """e^-|x| I_order(x) for float64 x; I_1 is odd, I_0 even."""
    series = _bessel_i_series(x, order) * torch.exp(-x.abs())
    asymptotic = _bessel_i_scaled_asymptotic(x, order)
    if order % 2:
        asymptotic = torch.where(x < 0, -asymptotic, asymptotic)
    result = torch.where(x.abs() < _BESSEL_SWITCH, series, asymptotic)
    return torch.where(torch.isnan(x), x, result)


def _bessel_i(x: torch.Tensor, order: int) -> torch.Tensor:
    """I_order(x): the scaled value times e^|x| (inf beyond float64's range, as in torch)."""
    series = _bessel_i_series(x, order)
    large = _bessel_i_scaled(x, order) * torch.exp(x.abs())
    return torch.where(x.abs() < _BESSEL_SWITCH, series, large)


@_registers(aten.i0.default, aten.special_modified_bessel_i0.default)
def i0(x: torch.Tensor) -> torch.Tensor:
    return _bessel_i(_wide(x), 0).to(_result_dtype(x))


@_registers(aten.special_i0e.default)
def i0e(x: torch.Tensor) -> torch.Tensor:
    return _bessel_i_scaled(_wide(x), 0).to(_result_dtype(x))


@_registers(aten.special_i1.default, aten.special_modified_bessel_i1.default)
def i1(x: torch.Tensor) -> torch.Tensor:
    return _bessel_i(_wide(x), 1).to(_result_dtype(x))


@_registers(aten.special_i1e.default)
def i1e(x: torch.Tensor) -> torch.Tensor:
    return _bessel_i_scaled(_wide(x), 1).to(_result_dtype(x))


# --- Bessel functions of the first and second kind, and K ----------------------------------
# float64: power series below a switch point, Hankel's asymptotic expansions above it (where
# their smallest term, about e^(-2x), is below float32 precision). Sines and cosines come
# from _sin_pi, which is float64.

_EULER_GAMMA = 0.5772156649015329
_HANKEL_SWITCH = 12.0  # J and Y: series below, asymptotic above
_K_SWITCH = 9.0  # K: series below (it cancels like e^(2x)), asymptotic above
_SMALL_SERIES_TERMS = 45
_HANKEL_TERMS = 20


def _hankel_coefficients(order: int, count: int) -> list[float]:
    """a_k(nu) = (4 nu² - 1²)(4 nu² - 3²) ... (4 nu² - (2k-1)²) / (k! 8^k), k = 0 .. count-1."""
    mu = 4 * order * order
    coefficients = [1.0]
    for k in range(1, count):
        coefficients.append(coefficients[-1] * (mu - (2 * k - 1) ** 2) / (k * 8))
    return coefficients


def _j_y_asymptotic(x: torch.Tensor, order: int) -> tuple[torch.Tensor, torch.Tensor]:
    """J_order and Y_order for x >= 12: sqrt(2/(pi x)) (P cos chi - Q sin chi) and
    (P sin chi + Q cos chi), chi = x - (order/2 + 1/4) pi."""
    x = torch.where(x >= _HANKEL_SWITCH, x, torch.full_like(x, _HANKEL_SWITCH))
    coefficients = _hankel_coefficients(order, 2 * _HANKEL_TERMS)
    p, q = torch.zeros_like(x), torch.zeros_like(x)
    power = torch.ones_like(x)
    for k, coefficient in enumerate(coefficients):
        sign = (-1) ** (k // 2)
        if k % 2 == 0:
            p = p + sign * coefficient * power
        else:
            q = q + sign * coefficient * power
        power = power / x
    phase = x / math.pi - (order / 2 + 0.25)  # chi / pi
    sine, cosine = _sin_pi(phase), _sin_pi(phase + 0.5)
    scale = torch.sqrt(2 / (math.pi * x))
    return scale * (p * cosine - q * sine), scale * (p * sine + q * cosine)


def _j_series(x: torch.Tensor, order: int) -> torch.Tensor:
    """J_order(x) = sum_k (-1)^k (x/2)^(2k+order) / (k! (k+order)!)."""
    x = torch.where(x.abs() < _HANKEL_SWITCH, x, torch.zeros_like(x))
    quarter = x * x / 4
    term = x / 2 if order else torch.ones_like(x)
    total = term
    for k in range(1, _SMALL_SERIES_TERMS):
        term = -term * quarter / (k * (k + order))
        total = total + term
    return total


def _y_series(x: torch.Tensor, order: int) -> torch.Tensor:
    """Y_0 and Y_1 for 0 < x < 12 from their series with harmonic numbers H_k:
    Y0 = (2/pi) ((ln(x/2) + gamma) J0 + sum_k>=1 (-1)^(k+1) H_k (x²/4)^k / (k!)²),
    Y1 = (2/pi) (ln(x/2) J1 - 1/x) - (1/pi) sum_k>=0 (-1)^k (psi(k+1) + psi(k+2)) (x/2)^(2k+1) / (k! (k+1)!)."""
    x = torch.where((x > 0) & (x < _HANKEL_SWITCH), x, torch.ones_like(x))
    quarter = x * x / 4
    log_half = torch.log(x / 2)
    if order == 0:
        total, term, harmonic = torch.zeros_like(x), torch.ones_like(x), 0.0
        for k in range(1, _SMALL_SERIES_TERMS):
            term = -term * quarter / (k * k)
            harmonic += 1 / k
            total = total - harmonic * term
        return 2 / math.pi * ((log_half + _EULER_GAMMA) * _j_series(x, 0) + total)
    total, term = torch.zeros_like(x), x / 2
    psi_k1, psi_k2 = -_EULER_GAMMA, 1 - _EULER_GAMMA  # psi(1), psi(2)
    for k in range(_SMALL_SERIES_TERMS):
        total = total + (psi_k1 + psi_k2) * term
        term = -term * quarter / ((k + 1) * (k + 2))
        psi_k1, psi_k2 = psi_k2, psi_k2 + 1 / (k + 2)
    return 2 / math.pi * (log_half * _j_series(x, 1) - 1 / x) - total / math.pi


def _bessel_j(x: torch.Tensor, order: int) -> torch.Tensor:
    magnitude = x.abs()
    large, _ = _j_y_asymptotic(magnitude, order)
    if order % 2:
        large = torch.where(x < 0, -large, large)
    result = torch.where(magnitude < _HANKEL_SWITCH, _j_series(x, order), large)
    return torch.where(torch.isnan(x) | torch.isinf(x), torch.full_like(x, math.nan), result)  # torch: NaN at inf


def _bessel_y(x: torch.Tensor, order: int) -> torch.Tensor:
    _, large = _j_y_asymptotic(x, order)
    result = torch.where(x < _HANKEL_SWITCH, _y_series(x, order), large)
    result = torch.where(x == 0, torch.full_like(x, -math.inf), result)
    return torch.where((x < 0) | torch.isnan(x) | torch.isinf(x), torch.full_like(x, math.nan), result)


@_registers(aten.special_bessel_j0.default)
def bessel_j0(x: torch.Tensor) -> torch.Tensor:
    return _bessel_j(_wide(x), 0).to(_result_dtype(x))


@_registers(aten.special_bessel_j1.default)
def bessel_j1(x: torch.Tensor) -> torch.Tensor:
    return _bessel_j(_wide(x), 1).to(_result_dtype(x))


@_registers(aten.special_bessel_y0.default)
def bessel_y0(x: torch.Tensor) -> torch.Tensor:
    return _bessel_y(_wide(x), 0).to(_result_dtype(x))


@_registers(aten.special_bessel_y1.default)
def bessel_y1(x: torch.Tensor) -> torch.Tensor:
    return _bessel_y(_wide(x), 1).to(_result_dtype(x))


@_registers(aten.special_spherical_bessel_j0.default)
def spherical_bessel_j0(x: torch.Tensor) -> torch.Tensor:
    """sin(x) / x, with 1 at 0 and 0 at the infinities."""
    wide = _wide(x)
    safe = torch.where((wide == 0) | torch.isinf(wide), torch.ones_like(wide), wide)
    result = _sin_pi(safe / math.pi) / safe
    result = torch.where(wide == 0, torch.ones_like(wide), torch.where(torch.isinf(wide), torch.zeros_like(wide), result))
    return torch.where(torch.isnan(wide), wide, result).to(_result_dtype(x))


def _k_scaled(x: torch.Tensor, order: int) -> torch.Tensor:
    """e^x K_order(x) for float64 x > 0.

    Below 9 the series K0 = -(ln(x/2) + gamma) I0 + sum_k>=1 H_k (x²/4)^k / (k!)² and
    K1 = 1/x + ln(x/2) I1 - (x/4) sum_k>=0 (psi(k+1) + psi(k+2)) (x²/4)^k / (k! (k+1)!);
    above it sqrt(pi/(2x)) sum_k a_k(order) / x^k.
    """
    small = torch.where((x > 0) & (x < _K_SWITCH), x, torch.ones_like(x))
    quarter = small * small / 4
    log_half = torch.log(small / 2)
    if order == 0:
        total, term, harmonic = torch.zeros_like(small), torch.ones_like(small), 0.0
        for k in range(1, _SMALL_SERIES_TERMS):
            term = term * quarter / (k * k)
            harmonic += 1 / k
            total = total + harmonic * term
        series = -(log_half + _EULER_GAMMA) * _bessel_i_series(small, 0) + total
    else:
        total, term = torch.zeros_like(small), torch.ones_like(small)
        psi_k1, psi_k2 = -_EULER_GAMMA, 1 - _EULER_GAMMA
        for k in range(_SMALL_SERIES_TERMS):
            total = total + (psi_k1 + psi_k2) * term
            term = term * quarter / ((k + 1) * (k + 2))
            psi_k1, psi_k2 = psi_k2, psi_k2 + 1 / (k + 2)
        series = 1 / small + log_half * _bessel_i_series(small, 1) - small / 4 * total
    series = series * torch.exp(small)
    large = torch.where(x >= _K_SWITCH, x, torch.full_like(x, _K_SWITCH))
    expansion, power = torch.zeros_like(x), torch.ones_like(x)
    for coefficient in _hankel_coefficients(order, _HANKEL_TERMS):
        expansion = expansion + coefficient * power
        power = power / large
    asymptotic = torch.sqrt(math.pi / (2 * large)) * expansion
    result = torch.where(x < _K_SWITCH, series, asymptotic)
    result = torch.where(x == 0, torch.full_like(x, math.inf), result)
    return torch.where((x < 0) | torch.isnan(x), torch.full_like(x, math.nan), result)


def _k(x: torch.Tensor, order: int) -> torch.Tensor:
    result = _k_scaled(x, order) * torch.exp(-x)
    return torch.where(x == 0, torch.full_like(x, math.inf), torch.where(x == math.inf, torch.zeros_like(x), result))


@_registers(aten.special_modified_bessel_k0.default)
def modified_bessel_k0(x: torch.Tensor) -> torch.Tensor:
    return _k(_wide(x), 0).to(_result_dtype(x))


@_registers(aten.special_modified_bessel_k1.default)
def modified_bessel_k1(x: torch.Tensor) -> torch.Tensor:
    return _k(_wide(x), 1).to(_result_dtype(x))


@_registers(aten.special_scaled_modified_bessel_k0.default)
def scaled_modified_bessel_k0(x: torch.Tensor) -> torch.Tensor:
    return _k_scaled(_wide(x), 0).to(_result_dtype(x))


@_registers(aten.special_scaled_modified_bessel_k1.default)
def scaled_modified_bessel_k1(x: torch.Tensor) -> torch.Tensor:
    return _k_scaled(_wide(x), 1).to(_result_dtype(x))


# --- scans ---------------------------------------------------------------------------------


def _scan(values: tuple[torch.Tensor, ...], dim: int, combine: Callable) -> tuple[torch.Tensor, ...]:
    """An inclusive scan along ``dim`` in log2(n) steps (Hillis and Steele): at step k each
    element combines with the running result 2**k places before it. ``combine(earlier, later)``
    takes and returns tuples of tensors and must be associative."""
    size = values[0].shape[dim]
    offset = 1
    while offset < size:
        earlier = tuple(v.narrow(dim, 0, size - offset) for v in values)
        later = tuple(v.narrow(dim, offset, size - offset) for v in values)
        combined = combine(earlier, later)
        values = tuple(torch.cat([v.narrow(dim, 0, offset), c], dim) for v, c in zip(values, combined))
        offset *= 2
    return values


def _cumulative_extreme(input: torch.Tensor, dim: int, later_wins: Callable) -> tuple[torch.Tensor, torch.Tensor]:
    """cummax/cummin: the running extreme and where it is; ties and NaNs point at the latest
    one, and a NaN, once seen, stays (torch's CPU rule)."""
    if input.dim() == 0:
        return input.clone(), torch.zeros((), dtype=torch.int64)
    shape = [1] * input.dim()
    shape[dim] = input.shape[dim]
    positions = torch.arange(input.shape[dim]).reshape(shape).expand(input.shape).contiguous()

    def combine(earlier, later):
        (value_a, index_a), (value_b, index_b) = earlier, later
        take_later = later_wins(value_b, value_a)
        if input.dtype.is_floating_point:
            take_later = torch.isnan(value_b) | (~torch.isnan(value_a) & take_later)
        return torch.where(take_later, value_b, value_a), torch.where(take_later, index_b, index_a)

    return _scan((input, positions), dim, combine)


@_registers(aten.cummax.default)
def cummax(input: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _cumulative_extreme(input, dim, lambda later, earlier: later >= earlier)


@_registers(aten.cummin.default)
def cummin(input: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _cumulative_extreme(input, dim, lambda later, earlier: later <= earlier)


def _log_add_exp(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """log(exp(a) + exp(b)) without overflow; exact for equal infinities; NaN kept."""
    larger = torch.where(a > b, a, b)
    result = larger + torch.log1p(torch.exp(-(a - b).abs()))
    result = torch.where(a == b, a + math.log(2), result)
    return torch.where(torch.isnan(a) | torch.isnan(b), a + b, result)


@_registers(aten.logcumsumexp.default)
def logcumsumexp(input: torch.Tensor, dim: int) -> torch.Tensor:
    """A scan of log-add-exp (IREE 3.13's own kernel gave inf for ordinary inputs)."""
    x = _floating(input)
    if x.dim() == 0:
        return x.clone()
    return _scan((x,), dim, lambda earlier, later: (_log_add_exp(earlier[0], later[0]),))[0]


# --- Chebyshev polynomials ----------------------------------------------------------------
# T, U, V and W of degree n = trunc(n) (0 for negative n), as torch computes them: the
# three-term recurrence for small degrees, closed forms above (torch switches to cos/acos too).
# float64, except that cos, sin and acos are float32 (all IREE has): degrees above 16 with
# |x| < 1 carry float32 phase error, as torch's own float32 kernels do.

_RECURRENCE_DEGREES = 16


def _chebyshev(kind: str, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """The Chebyshev polynomial of the given kind ('t', 'u', 'v', 'w') for float64 x and n."""
    n = torch.trunc(n)
    first = {"t": x, "u": 2 * x, "v": 2 * x - 1, "w": 2 * x + 1}[kind]
    previous, current = torch.ones_like(x), first
    result = torch.where(n == 0, previous, torch.where(n == 1, current, torch.zeros_like(x)))
    for degree in range(2, _RECURRENCE_DEGREES + 1):
        previous, current = current, 2 * x * current - previous
        result = torch.where(n == degree, current, result)
    closed = _chebyshev_closed_form(kind, x, n)
    result = torch.where(n > _RECURRENCE_DEGREES, closed, result)
    return torch.where(n < 0, torch.zeros_like(result), result)


def _chebyshev_closed_form(kind: str, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """The closed forms: trigonometric inside [-1, 1], hyperbolic outside, exact values at +-1.

    With x = cos(t): T = cos(n t), U = sin((n+1) t) / sin t, V = cos((n+1/2) t) / cos(t/2),
    W = sin((n+1/2) t) / sin(t/2). With |x| = cosh(f) the same with cosh and sinh; for x < -1,
    T and U take the sign (-1)**n, and V and W swap (times (-1)**n).
    """
    sign = torch.where(torch.remainder(n, 2) == 1, -torch.ones_like(x), torch.ones_like(x))
    inside = x.abs() < 1
    angle = torch.acos(torch.where(inside, x, torch.zeros_like(x)).to(torch.float32)).to(torch.float64)

    def cos(t):
        return torch.cos(t.to(torch.float32)).to(torch.float64)

    def sin(t):
        return torch.sin(t.to(torch.float32)).to(torch.float64)

    magnitude = torch.where(inside, torch.full_like(x, 2.0), x.abs())
    f = torch.log(magnitude + torch.sqrt(magnitude * magnitude - 1))

    def cosh(t):
        return (torch.exp(t) + torch.exp(-t)) / 2

    def sinh(t):
        return (torch.exp(t) - torch.exp(-t)) / 2

    if kind == "t":
        trigonometric, hyperbolic, at_minus_one_hyperbolic = cos(n * angle), cosh(n * f), None
        at_one, at_minus_one = torch.ones_like(x), sign
    elif kind == "u":
        trigonometric, hyperbolic = sin((n + 1) * angle) / sin(angle), sinh((n + 1) * f) / sinh(f)
        at_one, at_minus_one = n + 1, sign * (n + 1)
    elif kind == "v":
        trigonometric, hyperbolic = cos((n + 0.5) * angle) / cos(angle / 2), cosh((n + 0.5) * f) / cosh(f / 2)
        at_one, at_minus_one = torch.ones_like(x), sign * (2 * n + 1)
    else:
        trigonometric, hyperbolic = sin((n + 0.5) * angle) / sin(angle / 2), sinh((n + 0.5) * f) / sinh(f / 2)
        at_one, at_minus_one = 2 * n + 1, sign
    if kind == "v":
        outside_negative = sign * sinh((n + 0.5) * f) / sinh(f / 2)
    elif kind == "w":
        outside_negative = sign * cosh((n + 0.5) * f) / cosh(f / 2)
    else:
        outside_negative = sign * hyperbolic
    outside = torch.where(x > 0, hyperbolic, outside_negative)
    result = torch.where(inside, trigonometric, outside)
    result = torch.where(x == 1, at_one, torch.where(x == -1, at_minus_one, result))
    return torch.where(torch.isnan(x), x, result)


def _chebyshev_op(kind: str, shifted: bool) -> Callable:
    def op(x, n) -> torch.Tensor:
        reference = x if isinstance(x, torch.Tensor) else n
        dtype = _result_dtype(reference) if isinstance(x, torch.Tensor) else torch.get_default_dtype()
        x = _wide(x) if isinstance(x, torch.Tensor) else torch.full_like(_wide(n), x)
        n = _wide(n) if isinstance(n, torch.Tensor) else torch.full_like(x, n)
        x, n = torch.broadcast_tensors(x, n)
        return _chebyshev(kind, 2 * x - 1 if shifted else x, n).to(dtype)

    op.__name__ = f"{'shifted_' if shifted else ''}chebyshev_polynomial_{kind}"
    op.__doc__ = f"torch.special.{op.__name__}, by _chebyshev."
    return op


for _kind in "tuvw":
    for _shifted in (False, True):
        _packet = getattr(aten, f"special_{'shifted_' if _shifted else ''}chebyshev_polynomial_{_kind}")
        _registers(_packet.default, _packet.x_scalar, _packet.n_scalar)(_chebyshev_op(_kind, _shifted))
