"""Chebyshev polynomials of the four kinds, shifted or not."""

from __future__ import annotations

from typing import Callable

import torch

from turbine.eager.decompositions._common import as_float64, registers, result_dtype

aten = torch.ops.aten

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
        trigonometric, hyperbolic = cos(n * angle), cosh(n * f)
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
        dtype = result_dtype(reference) if isinstance(x, torch.Tensor) else torch.get_default_dtype()
        x = as_float64(x) if isinstance(x, torch.Tensor) else torch.full_like(as_float64(n), x)
        n = as_float64(n) if isinstance(n, torch.Tensor) else torch.full_like(x, n)
        x, n = torch.broadcast_tensors(x, n)
        return _chebyshev(kind, 2 * x - 1 if shifted else x, n).to(dtype)

    op.__name__ = f"{'shifted_' if shifted else ''}chebyshev_polynomial_{kind}"
    op.__doc__ = f"torch.special.{op.__name__}, by _chebyshev."
    return op


for _kind in "tuvw":
    for _shifted in (False, True):
        _packet = getattr(aten, f"special_{'shifted_' if _shifted else ''}chebyshev_polynomial_{_kind}")
        registers(_packet.default, _packet.x_scalar, _packet.n_scalar)(_chebyshev_op(_kind, _shifted))
