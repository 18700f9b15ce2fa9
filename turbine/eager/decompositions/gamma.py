"""Gamma-function family: lgamma, mvlgamma, digamma, polygamma, the Hurwitz zeta function.

Evaluated in float64 (IREE lowers its +, *, /, exp, log and sqrt, not its sin or erf), then
rounded to the input's dtype, so that float32 results keep float32 precision."""

from __future__ import annotations

import math

import torch

from turbine.eager.decompositions._common import as_float64, registers, result_dtype
from turbine.eager.decompositions.bits import signbit

aten = torch.ops.aten

_HALF_LOG_TWO_PI = 0.5 * math.log(2 * math.pi)
_SHIFT = 10  # arguments are moved above this by recurrence before an asymptotic series


def sin_pi(x: torch.Tensor) -> torch.Tensor:
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
    reflected = math.log(math.pi) - torch.log(torch.abs(sin_pi(x))) - value
    result = torch.where(x > 0, value, reflected)
    pole = (x <= 0) & (x == torch.floor(x))
    result = torch.where(pole | torch.isinf(x), torch.full_like(x, math.inf), result)
    return torch.where(torch.isnan(x), x, result)


@registers(aten.lgamma.default)
def lgamma(x: torch.Tensor) -> torch.Tensor:
    return _lgamma_wide(as_float64(x)).to(result_dtype(x))


def float64_lgamma(x: torch.Tensor) -> torch.Tensor:
    """lgamma, float64 from the series above (IREE's float64 lgamma was 3.3e-8 off below 0)."""
    return lgamma(x) if x.dtype == torch.float64 else aten.lgamma.default(x)


@registers(aten.mvlgamma.default)
def mvlgamma(x: torch.Tensor, p: int) -> torch.Tensor:
    """The multivariate log-gamma: a sum of p shifted lgammas plus a constant."""
    wide = as_float64(x)
    total = torch.full_like(wide, p * (p - 1) / 4 * math.log(math.pi))
    for j in range(p):
        total = total + _lgamma_wide(wide - j / 2)
    return total.to(result_dtype(x))


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
    cotangent = sin_pi(x + 0.5) / sin_pi(x)
    result = torch.where(reflect, value - math.pi * cotangent, value)
    integer = (x <= 0) & (x == torch.floor(x))
    result = torch.where(integer, torch.full_like(x, math.nan), result)
    zero = torch.where(signbit(x), torch.full_like(x, math.inf), torch.full_like(x, -math.inf))
    result = torch.where(x == 0, zero, result)  # torch: -inf at 0.0, inf at -0.0, NaN below
    result = torch.where(x == math.inf, x, result)
    return torch.where(torch.isnan(x) | (x == -math.inf), torch.full_like(x, math.nan), result)


@registers(aten.digamma.default)
def digamma(x: torch.Tensor) -> torch.Tensor:
    return _digamma_wide(as_float64(x)).to(result_dtype(x))


def float64_digamma(x: torch.Tensor) -> torch.Tensor:
    """digamma, float64 from the series above (IREE's float64 digamma was 2e-11 off)."""
    return digamma(x) if x.dtype == torch.float64 else aten.digamma.default(x)


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


@registers(aten.special_zeta.default)
def zeta(x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    dtype = torch.result_type(x, other)
    dtype = dtype if dtype.is_floating_point else torch.get_default_dtype()
    return _zeta_wide(as_float64(x), as_float64(other)).to(dtype)


@registers(aten.polygamma.default)
def polygamma(n: int, x: torch.Tensor) -> torch.Tensor:
    """psi^(n)(x) = (-1)**(n+1) n! zeta(n + 1, x) for n >= 1; digamma for n == 0."""
    wide = as_float64(x)
    if n == 0:
        return _digamma_wide(wide).to(result_dtype(x))
    value = (-1) ** (n + 1) * math.factorial(n) * _zeta_wide(float(n + 1), wide)
    # The limits at infinity: 0 at +inf; none at -inf (zeta's own conventions differ).
    value = torch.where(wide == math.inf, torch.zeros_like(value), value)
    value = torch.where(wide == -math.inf, torch.full_like(value, math.nan), value)
    return value.to(result_dtype(x))
