"""atan and atan2 from one float64 rational approximation (Cephes's: argument reduced to |z| <=
0.66, a degree 4/5 rational in z², good to 1 float64 ulp).

IREE 3.13's float32 atan was 40 ulps off (atan(0.66): 2.4e-6 relative, past torch's default
tolerance), its atan2 as much, with atan2(-3, -inf) of the wrong sign; on the CPU it has no float64
atan at all (the op fell back to torch). Evaluated in float64 and rounded once, float32 results
are torch's to half an ulp."""

from __future__ import annotations

import math

import torch

from turbine.eager.decompositions._common import as_float64, result_dtype
from turbine.eager.decompositions.bits import signbit

# atan(z) = z + z * z² P(z²) / Q(z²) for |z| <= 0.66; Q's leading coefficient is 1.
_P = (-8.750608600031904122785e-1, -1.615753718733365076637e1, -7.500855792314704667340e1, -1.228866684490136173410e2, -6.485021904942025371773e1)
_Q = (2.485846490142306297962e1, 1.650270098316988542046e2, 4.328810604912902668951e2, 4.853903996359136964868e2, 1.945506571482613964425e2)
_TAN_3PI_8 = 2.41421356237309504880
# pi / 2 - float64(pi / 2): added back where the reduction subtracted a multiple of pi / 4.
_PI_2_LOW = 6.123233995736765886130e-17


def _atan_of_magnitude(a: torch.Tensor) -> torch.Tensor:
    """atan(a) for float64 a >= 0 (inf and NaN included): reduced to |z| <= 0.66 by
    atan(a) = pi/2 + atan(-1/a) or pi/4 + atan((a - 1) / (a + 1))."""
    big = a > _TAN_3PI_8
    middle = (a > 0.66) & ~big
    z = torch.where(big, -1 / torch.where(big, a, torch.ones_like(a)), torch.where(middle, (a - 1) / (a + 1), a))
    zz = z * z
    p = (((_P[0] * zz + _P[1]) * zz + _P[2]) * zz + _P[3]) * zz + _P[4]
    q = ((((zz + _Q[0]) * zz + _Q[1]) * zz + _Q[2]) * zz + _Q[3]) * zz + _Q[4]
    reduced = z * (zz * p / q) + z
    zero = torch.zeros_like(a)  # a float64 tensor: a where() of two numbers would be float32
    offset = torch.where(big, math.pi / 2, torch.where(middle, math.pi / 4, zero))
    low = torch.where(big, _PI_2_LOW, torch.where(middle, _PI_2_LOW / 2, zero))
    return offset + (reduced + low)


def atan(x: torch.Tensor) -> torch.Tensor:
    """atan, odd: atan(-0.0) is -0.0."""
    wide = as_float64(x)
    magnitude = _atan_of_magnitude(wide.abs())
    return torch.where(signbit(wide), -magnitude, magnitude).to(result_dtype(x))


def atan2(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The angle of (x, y), as C's atan2: from atan of the smaller magnitude over the larger
    (so the quotient is in [0, 1]), then placed in its quadrant by the signs, signed zeros
    included (atan2(0.0, -0.0) is pi, atan2(-3, -inf) is -pi)."""
    dtype = torch.result_type(y, x)
    dtype = dtype if dtype.is_floating_point else torch.get_default_dtype()
    wide_y, wide_x = as_float64(y), as_float64(x)
    a, b = wide_y.abs(), wide_x.abs()
    steep = a > b
    small, large = torch.where(steep, b, a), torch.where(steep, a, b)
    ratio = torch.where(small == 0, torch.zeros_like(small), small / large)  # 0/0 and finite/inf: 0
    ratio = torch.where(torch.isinf(a) & torch.isinf(b), torch.ones_like(ratio), ratio)  # inf/inf: the diagonal
    angle = _atan_of_magnitude(ratio)
    angle = torch.where(steep, math.pi / 2 - angle, angle)
    angle = torch.where(signbit(wide_x), math.pi - angle, angle)
    angle = torch.where(signbit(wide_y), -angle, angle)
    angle = torch.where(torch.isnan(wide_x) | torch.isnan(wide_y), wide_x + wide_y, angle)
    return angle.to(dtype)
