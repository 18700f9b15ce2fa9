"""The error function family: erf, erfc, erfcx, log_ndtr, ndtri, erfinv."""

from __future__ import annotations

import math

import torch

from turbine.eager.decompositions._common import as_float64, registers, result_dtype
from turbine.eager.decompositions.logarithms import log1p

aten = torch.ops.aten

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


@registers(aten.erf.default)
def erf(x: torch.Tensor) -> torch.Tensor:
    """float64 erf on llvm-cpu, which has no vector math.erf of that width (IREE 3.13)."""
    return _erf_wide(as_float64(x)).to(result_dtype(x))


@registers(aten.erfc.default)
def erfc(x: torch.Tensor) -> torch.Tensor:
    return _erfc_wide(as_float64(x)).to(result_dtype(x))


@registers(aten.special_erfcx.default)
def erfcx(x: torch.Tensor) -> torch.Tensor:
    return _erfcx_wide(as_float64(x)).to(result_dtype(x))


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


@registers(aten.special_ndtri.default)
def ndtri(p: torch.Tensor) -> torch.Tensor:
    return _ndtri_wide(as_float64(p)).to(result_dtype(p))


@registers(aten.erfinv.default)
def erfinv(y: torch.Tensor) -> torch.Tensor:
    """erf^-1(y) = Phi^-1((1 + y) / 2) / sqrt(2), from the tail nearer y; small |y| by Halley
    steps on erf itself, where (1 + y) / 2 would round y away."""
    wide = as_float64(y)
    magnitude = wide.abs()
    tail = -_ndtri_wide((1 - magnitude) / 2) / math.sqrt(2)
    x = torch.where(magnitude < 0.5, wide * (math.sqrt(math.pi) / 2), torch.where(wide < 0, -tail, tail))
    for _ in range(3):
        error = _erf_series(x) - wide
        u = error / (_TWO_OVER_SQRT_PI * torch.exp(-x * x))
        x = torch.where(magnitude < 0.5, x - u / (1 + x * u), x)
    return x.to(result_dtype(y))


@registers(aten.special_log_ndtr.default)
def log_ndtr(x: torch.Tensor) -> torch.Tensor:
    """log Phi(x): through erfcx in the lower tail (Phi underflows below -37), log1p above."""
    wide = as_float64(x)
    t = -wide / math.sqrt(2)
    lower = torch.log(_erfcx_wide(torch.where(wide < -1, t, torch.ones_like(t))) / 2) - t * t
    upper = log1p(-_erfc_wide(-t) / 2)
    return torch.where(wide < -1, lower, upper).to(result_dtype(x))
