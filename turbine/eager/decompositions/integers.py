"""Integer arithmetic that IREE 3.13 computed through floats or could not compile: negation,
floor division, gcd and lcm, and the matrix products that scale and add (addmm, addbmm).

IREE 3.13 negated int32 and int64 tensors through float32 (-(2**30 + 1) gave -2**30, and
order_key's negation put close negative floats out of order), and floor-divided int64 through
float64 (wrong above 2**53 and for about one pair in four of large numbers of mixed signs); its
floor division of int8 and int16 did not compile. Subtraction and truncating division are exact,
so these are written with them. torch-mlir lowers no gcd or lcm, and its integer addmm and addbmm
failed to legalize their scalar factors, while integer mm, bmm, multiplication and remainder
compile exactly (addmm's correction also keeps a float term whose factor is 0 out, as torch does).
"""

from __future__ import annotations

import torch

from turbine.eager.decompositions._common import registers

aten = torch.ops.aten

#: Narrow integers are negated and floor-divided in int32, which IREE 3.13 compiles exactly (uint8
#: never reaches a kernel: the traced call widens it to int16).
_NARROW = (torch.int8, torch.int16)


def _exact(dtype: torch.dtype) -> bool:
    """Whether IREE's own lowering is right for results of this dtype (floats and booleans)."""
    return dtype.is_floating_point or dtype.is_complex or dtype == torch.bool


def neg(x: torch.Tensor) -> torch.Tensor:
    """-x, as 0 - x for integers, wrapping as torch's does (-(-2**63) is -2**63); int8 and int16
    in int32 (IREE 3.13 cannot compile 0 - x for int8, and its float32 negation of int16 -32768
    came back clamped to 32767 on CUDA)."""
    if _exact(x.dtype):
        return aten.neg.default(x)
    if x.dtype in _NARROW:
        return (0 - x.to(torch.int32)).to(x.dtype)
    return 0 - x


def floor_quotient(x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """x // other for integer tensors: the truncated quotient, one less where the division was
    inexact and the signs differ. Division by zero gives what IREE's truncated one gives (no
    error, as on torch's CUDA)."""
    dtype = torch.result_type(x, other)
    work = torch.int32 if dtype in _NARROW else dtype
    x, other = x.to(work), other.to(work)
    quotient = truncated_quotient(x, other)
    rounded_up = (quotient * other != x) & ((x < 0) != (other < 0)) & (other != 0)
    return (quotient - rounded_up.to(work)).to(dtype)


def truncated_quotient(x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """x / other truncated, for integer tensors, without the divisions that trap on the CPU (a
    SIGFPE that killed the process): by 0 (x is given; ops/bounds.py reports torch's error at the
    next read) and the most negative value by -1 (-x, wrapping to itself as torch's kernel does)."""
    quotient = aten.div.Tensor_mode(x, safe_divisor(other), rounding_mode="trunc")
    return torch.where(other == -1, 0 - x, quotient)


def remainder(x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """Integer remainder without the divisions that trap (see ``truncated_quotient``): x % -1 is
    x % 1, and a 0 divisor gives 0 (reported at the next read)."""
    if _exact(torch.result_type(x, other)):
        return aten.remainder.Tensor(x, other)
    return aten.remainder.Tensor(x, safe_divisor(other))


def floor_divide(x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    if _exact(torch.result_type(x, other)):
        return aten.floor_divide.default(x, other)
    return floor_quotient(x, other)


def div_mode(x: torch.Tensor, other: torch.Tensor, *, rounding_mode: str | None = None) -> torch.Tensor:
    """``div`` with a rounding mode: floor division of integers exactly, the rest as IREE does it."""
    if rounding_mode is None or _exact(torch.result_type(x, other)):
        return aten.div.Tensor_mode(x, other, rounding_mode=rounding_mode)
    if rounding_mode == "trunc":  # narrow integers in int32, which IREE 3.13 compiles exactly
        dtype = torch.result_type(x, other)
        work = torch.int32 if dtype in _NARROW else dtype
        return truncated_quotient(x.to(work), other.to(work)).to(dtype)
    return floor_quotient(x, other)


def _euclid_steps(dtype: torch.dtype) -> int:
    """How many of Euclid's steps the largest magnitudes of ``dtype`` can need: by Lame's theorem a
    gcd that takes n steps has operands of at least the Fibonacci numbers F(n + 1) and F(n + 2),
    plus one step that swaps operands given smaller first."""
    largest = 2 ** (torch.iinfo(dtype).bits - (0 if dtype == torch.uint8 else 1))
    steps, fibonacci = 0, (1, 2)  # F(2), F(3)
    while fibonacci[0] <= largest:
        steps, fibonacci = steps + 1, (fibonacci[1], fibonacci[0] + fibonacci[1])
    return steps + 1


def safe_divisor(divisor: torch.Tensor) -> torch.Tensor:
    """``divisor`` with 1 for 0 and -1, whose divisions trap on the CPU (by zero, and the most
    negative value by -1); the caller takes those results from elsewhere (x % -1 is x % 1)."""
    return torch.where((divisor == 0) | (divisor == -1), 1, divisor)


def _wrapped_abs(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """|x| as torch's kernel takes it in ``dtype``: the most negative value stays itself. Written
    with a subtraction: IREE's CUDA abs of int32 let the compiler take its result as never
    negative, so that the remainder after it read -2**31 as 2**31 (gcd(6, -2**31) gave 2, not
    torch's -2)."""
    return torch.where(x < 0, 0 - x, x).to(dtype).to(x.dtype)


@registers(aten.gcd.default)
def gcd(x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """Euclid's algorithm unrolled over the steps the dtype's magnitudes can need, as torch's
    kernel runs it (on magnitudes, with C's truncating remainder, so that gcd(-2**63, 0) is
    -2**63 as in torch). Narrow integers work in int32, which IREE compiles exactly."""
    dtype = torch.result_type(x, other)
    if _exact(dtype):  # the trace fails, and the fallback raises torch's error for these dtypes
        raise NotImplementedError(f"gcd is not implemented for {dtype}")
    work = torch.int32 if dtype in (*_NARROW, torch.uint8) else dtype
    a, b = _wrapped_abs(x.to(work), dtype), _wrapped_abs(other.to(work), dtype)
    for _ in range(_euclid_steps(dtype)):
        going = a != 0
        a, b = torch.where(going, aten.fmod.Tensor(b, safe_divisor(a)), a), torch.where(going, a, b)
    return b.to(dtype)


@registers(aten.lcm.default)
def lcm(x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """|x / gcd * other| (0 where the gcd is 0), wrapping in the dtype as torch's kernel does;
    narrow integers compute in int32 and wrap on the way back, as C's promotion does there."""
    dtype = torch.result_type(x, other)
    divisor = gcd(x, other)
    work = torch.int32 if dtype in (*_NARROW, torch.uint8) else dtype
    x, other, divisor = x.to(work), other.to(work), divisor.to(work)
    quotient = truncated_quotient(x, divisor)
    return torch.where(divisor == 0, 0, _wrapped_abs(quotient * other, work)).to(dtype)


def addmm(input: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, *, beta: float = 1, alpha: float = 1) -> torch.Tensor:
    """addmm as torch's kernel computes it (the op's correction): IREE's own for floats whose
    factors are not 0; else beta * input + alpha * (mat1 @ mat2) from mm. torch-mlir's integer
    addmm did not legalize its factors, and IREE multiplied a term whose factor is 0 by 0 (NaN
    for a NaN or an infinity in it), a term torch's kernel does not read."""
    if not _exact(mat1.dtype) or mat1.dtype == torch.bool or beta == 0 or alpha == 0:
        return _scaled_sum(input, aten.mm.default(mat1, mat2), beta, alpha)
    return aten.addmm.default(input, mat1, mat2, beta=beta, alpha=alpha)


@registers(aten.addbmm.default)
def addbmm(input: torch.Tensor, batch1: torch.Tensor, batch2: torch.Tensor, *, beta: float = 1, alpha: float = 1) -> torch.Tensor:
    """beta * input + alpha * (the sum of batch1[i] @ batch2[i]) from bmm, for integers."""
    return _scaled_sum(input, aten.bmm.default(batch1, batch2).sum(0, dtype=batch1.dtype), beta, alpha)


def _scaled_sum(input: torch.Tensor, product: torch.Tensor, beta: float, alpha: float) -> torch.Tensor:
    """beta * input + alpha * product, broadcast to the product's shape (integers take int
    factors, as torch's kernels do). Booleans and an input of another dtype, which torch's
    kernels refuse, make the trace fail, so that the fallback raises torch's error."""
    if product.dtype == torch.bool or input.dtype != product.dtype:
        raise NotImplementedError(f"addmm of {input.dtype} onto {product.dtype} products: torch's kernel refuses it")
    if not _exact(product.dtype):
        beta, alpha = int(beta), int(alpha)
    if alpha == 0:
        product = torch.zeros_like(product)  # not read, as torch's kernel does not read it
    elif alpha != 1:
        product = product * alpha
    if beta == 0:
        return product
    return product + (input if beta == 1 else input * beta)
