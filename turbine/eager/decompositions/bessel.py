"""Bessel functions: I0, I1 (and scaled), J0, J1, Y0, Y1, K0, K1 (and scaled), spherical j0."""

from __future__ import annotations

import functools
import math

import torch

from turbine.eager.decompositions._common import as_float64, in_float64, registers, result_dtype
from turbine.eager.decompositions.gamma import sin_pi

aten = torch.ops.aten

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


# float64: power series below a switch point, Hankel's asymptotic expansions above it (where
# their smallest term, about e^(-2x), is below float32 precision). Sines and cosines come
# from sin_pi, which is float64.

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
    sine, cosine = sin_pi(phase), sin_pi(phase + 0.5)
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


def _harmonic_series(z: torch.Tensor) -> torch.Tensor:
    """sum_k>=1 H_k z^k / (k!)², H_k the harmonic numbers: the log-free part of Y0 (z = -x²/4)
    and K0 (z = x²/4)."""
    total, term, harmonic = torch.zeros_like(z), torch.ones_like(z), 0.0
    for k in range(1, _SMALL_SERIES_TERMS):
        term = term * z / (k * k)
        harmonic += 1 / k
        total = total + harmonic * term
    return total


def _digamma_pair_series(z: torch.Tensor) -> torch.Tensor:
    """sum_k>=0 (psi(k+1) + psi(k+2)) z^k / (k! (k+1)!): the log-free part of Y1 and K1."""
    total, term = torch.zeros_like(z), torch.ones_like(z)
    psi_k1, psi_k2 = -_EULER_GAMMA, 1 - _EULER_GAMMA  # psi(1), psi(2)
    for k in range(_SMALL_SERIES_TERMS):
        total = total + (psi_k1 + psi_k2) * term
        term = term * z / ((k + 1) * (k + 2))
        psi_k1, psi_k2 = psi_k2, psi_k2 + 1 / (k + 2)
    return total


def _y_series(x: torch.Tensor, order: int) -> torch.Tensor:
    """Y_0 and Y_1 for 0 < x < 12 from their series with harmonic numbers H_k:
    Y0 = (2/pi) ((ln(x/2) + gamma) J0 + sum_k>=1 (-1)^(k+1) H_k (x²/4)^k / (k!)²),
    Y1 = (2/pi) (ln(x/2) J1 - 1/x) - (1/pi) sum_k>=0 (-1)^k (psi(k+1) + psi(k+2)) (x/2)^(2k+1) / (k! (k+1)!)."""
    x = torch.where((x > 0) & (x < _HANKEL_SWITCH), x, torch.ones_like(x))
    quarter = x * x / 4
    log_half = torch.log(x / 2)
    if order == 0:
        return 2 / math.pi * ((log_half + _EULER_GAMMA) * _j_series(x, 0) - _harmonic_series(-quarter))
    return 2 / math.pi * (log_half * _j_series(x, 1) - 1 / x) - x / 2 * _digamma_pair_series(-quarter) / math.pi


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


@registers(aten.special_spherical_bessel_j0.default)
def spherical_bessel_j0(x: torch.Tensor) -> torch.Tensor:
    """sin(x) / x, with 1 at 0 and 0 at the infinities."""
    wide = as_float64(x)
    safe = torch.where((wide == 0) | torch.isinf(wide), torch.ones_like(wide), wide)
    result = sin_pi(safe / math.pi) / safe
    result = torch.where(wide == 0, torch.ones_like(wide), torch.where(torch.isinf(wide), torch.zeros_like(wide), result))
    return torch.where(torch.isnan(wide), wide, result).to(result_dtype(x))


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
        series = -(log_half + _EULER_GAMMA) * _bessel_i_series(small, 0) + _harmonic_series(quarter)
    else:
        series = 1 / small + log_half * _bessel_i_series(small, 1) - small / 4 * _digamma_pair_series(quarter)
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


#: Each op with its float64 function and order.
_REGISTERED = {
    aten.i0.default: (_bessel_i, 0),
    aten.special_modified_bessel_i0.default: (_bessel_i, 0),
    aten.special_i0e.default: (_bessel_i_scaled, 0),
    aten.special_i1.default: (_bessel_i, 1),
    aten.special_modified_bessel_i1.default: (_bessel_i, 1),
    aten.special_i1e.default: (_bessel_i_scaled, 1),
    aten.special_bessel_j0.default: (_bessel_j, 0),
    aten.special_bessel_j1.default: (_bessel_j, 1),
    aten.special_bessel_y0.default: (_bessel_y, 0),
    aten.special_bessel_y1.default: (_bessel_y, 1),
    aten.special_modified_bessel_k0.default: (_k, 0),
    aten.special_modified_bessel_k1.default: (_k, 1),
    aten.special_scaled_modified_bessel_k0.default: (_k_scaled, 0),
    aten.special_scaled_modified_bessel_k1.default: (_k_scaled, 1),
}
for _op, (_function, _order) in _REGISTERED.items():
    registers(_op)(in_float64(functools.partial(_function, order=_order)))
