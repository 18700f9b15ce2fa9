"""Dense linear algebra for small matrices: LU with partial pivoting, triangular solves and
Cholesky, and what is built on them (det, slogdet, solve, inv, lu, lu_solve, lu_unpack).

IREE has no LAPACK. Kernels are compiled per shape, so these algorithms are unrolled over the
matrix size: one step per column, each a few whole-tensor ops over the batch. That keeps a
kernel small for the matrices these ops mostly see; above ``MAX_UNROLLED`` rows the trace is
refused, and the op goes to the fallback policy like any op IREE cannot compile.

The pivoting follows LAPACK's getrf (the first row of largest magnitude; a zero pivot sets
``info`` and leaves its column), so LU, pivots and info match torch's CPU results.
"""

from __future__ import annotations

import torch

from turbine.eager.decompositions._common import registers

aten = torch.ops.aten

#: The largest matrix dimension unrolled into a kernel.
MAX_UNROLLED = 32


def _eye(m: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """The identity, built from aranges: a traced ``torch.eye`` crashed IREE 3.13's compiler."""
    return (torch.arange(m).unsqueeze(-1) == torch.arange(n)).to(dtype)


def _check_size(*sizes: int) -> None:
    if max(sizes, default=0) > MAX_UNROLLED:
        raise NotImplementedError(f"turbine unrolls linear algebra up to {MAX_UNROLLED} rows, not {max(sizes)}")


def _lu(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(LU, pivots, info) of a [..., m, n] batch, as LAPACK's getrf gives them (pivots 1-based)."""
    m, n = a.shape[-2], a.shape[-1]
    _check_size(m, n)
    batch = a.shape[:-2]
    rows = torch.arange(m)
    pivots, info = [], torch.zeros(batch, dtype=torch.int32)
    for j in range(min(m, n)):
        p = torch.argmax(a[..., j:, j].abs(), -1) + j
        pivots.append(p.to(torch.int32) + 1)
        swapped = torch.where(rows == j, p.unsqueeze(-1), torch.where(rows == p.unsqueeze(-1), j, rows))
        a = torch.gather(a, -2, swapped.unsqueeze(-1).expand(a.shape))
        pivot = a[..., j, j]
        zero = pivot == 0
        info = torch.where((info == 0) & zero, j + 1, info)
        if j + 1 == m:
            continue
        below = a[..., j + 1 :, j]
        multipliers = torch.where(zero.unsqueeze(-1), below, below / torch.where(zero, 1, pivot).unsqueeze(-1))
        trailing = a[..., j + 1 :, j + 1 :] - multipliers.unsqueeze(-1) * a[..., j, j + 1 :].unsqueeze(-2)
        bottom = torch.cat([a[..., j + 1 :, :j], multipliers.unsqueeze(-1), trailing], -1)
        a = torch.cat([a[..., : j + 1, :], bottom], -2)
    pivots = torch.stack(pivots, -1) if pivots else torch.zeros(batch + (0,), dtype=torch.int32)
    return a, pivots, info


def _permutation(pivots: torch.Tensor, m: int) -> torch.Tensor:
    """The row order LAPACK's pivots describe: row i of P^T A is row perm[i] of A."""
    perm = torch.arange(m).expand(pivots.shape[:-1] + (m,))
    positions = torch.arange(m)
    for j in range(pivots.shape[-1]):
        p = (pivots[..., j] - 1).to(torch.int64).unsqueeze(-1)
        at_j = perm[..., j : j + 1]
        at_p = torch.gather(perm, -1, p)
        perm = torch.where(positions == j, at_p, torch.where(positions == p, at_j, perm))
    return perm


def _rows(b: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """b's rows in the order perm gives (perm broadcast over b's batch)."""
    perm = perm.unsqueeze(-1).expand(perm.shape + (b.shape[-1],))
    batch = torch.broadcast_shapes(perm.shape[:-2], b.shape[:-2])
    return torch.gather(b.expand(batch + b.shape[-2:]), -2, perm.expand(batch + perm.shape[-2:]))


def _solve_triangular(t: torch.Tensor, b: torch.Tensor, upper: bool, unit: bool = False) -> torch.Tensor:
    """X with T X = B, T [..., n, n] triangular, B [..., n, k]: substitution, one row a step."""
    n = t.shape[-1]
    _check_size(n)
    batch = torch.broadcast_shapes(t.shape[:-2], b.shape[:-2])
    t, b = t.expand(batch + t.shape[-2:]), b.expand(batch + b.shape[-2:])
    order = range(n - 1, -1, -1) if upper else range(n)
    solved: dict[int, torch.Tensor] = {}
    for i in order:
        row = b[..., i, :]
        for j, x in solved.items():
            row = row - t[..., i, j].unsqueeze(-1) * x
        solved[i] = row if unit else row / t[..., i, i].unsqueeze(-1)
    return torch.stack([solved[i] for i in range(n)], -2) if n else b.clone()


def _lu_solve(lu: torch.Tensor, pivots: torch.Tensor, b: torch.Tensor, adjoint: bool = False) -> torch.Tensor:
    """X with A X = B (A^H X = B when adjoint) from A's LU factors: A = P L U."""
    perm = _permutation(pivots, lu.shape[-1])
    if not adjoint:
        y = _solve_triangular(lu, _rows(b, perm), upper=False, unit=True)
        return _solve_triangular(lu, y, upper=True)
    lu_h = lu.mH
    y = _solve_triangular(lu_h, b, upper=False)
    x = _solve_triangular(lu_h, y, upper=True, unit=True)
    return _rows(x, torch.argsort(perm, -1))  # P X: undo the row order


def _as_matrix_rhs(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """torch's rule for solve's B: a vector when it is 1-d or A's batch of vectors."""
    vector = b.dim() == 1 or (b.dim() == a.dim() - 1 and b.shape == a.shape[:-1])
    return (b.unsqueeze(-1) if vector else b), vector


@registers(aten.linalg_lu_factor_ex.default)
def lu_factor_ex(a: torch.Tensor, *, pivot: bool = True, check_errors: bool = False):
    if not pivot:
        raise NotImplementedError("LU without pivoting (torch's CPU kernel refuses it too)")
    return _lu(a)


@registers(aten.linalg_lu.default)
def lu(a: torch.Tensor, *, pivot: bool = True):
    """(P, L, U) with A = P L U."""
    factors, pivots, _ = lu_factor_ex(a, pivot=pivot)
    return lu_unpack(factors, pivots)


@registers(aten.lu_unpack.default)
def lu_unpack(lu_data: torch.Tensor, lu_pivots: torch.Tensor, unpack_data: bool = True, unpack_pivots: bool = True):
    m, n = lu_data.shape[-2], lu_data.shape[-1]
    k = min(m, n)
    if unpack_data:
        lower = torch.tril(lu_data[..., :, :k], -1) + _eye(m, k, lu_data.dtype)
        upper = torch.triu(lu_data[..., :k, :])
    else:
        lower = lu_data.new_zeros(0)
        upper = lu_data.new_zeros(0)
    if unpack_pivots:
        perm = _permutation(lu_pivots, m)
        # P[perm[i], i] = 1: A = P (P^T A) and row i of P^T A is row perm[i] of A.
        permutation = (torch.arange(m).unsqueeze(-1) == perm.unsqueeze(-2)).to(lu_data.dtype)
    else:
        permutation = lu_data.new_zeros(0)
    return permutation, lower, upper


@registers(aten.linalg_lu_solve.default)
def lu_solve(lu_data: torch.Tensor, pivots: torch.Tensor, b: torch.Tensor, *, left: bool = True, adjoint: bool = False):
    if left:
        return _lu_solve(lu_data, pivots, b, adjoint)
    # X A = B  <=>  A^H X^H = B^H (and X A^H = B <=> A X^H = B^H)
    return _lu_solve(lu_data, pivots, b.mH, not adjoint).mH


@registers(aten._linalg_det.default)
def det(a: torch.Tensor):
    """det and the LU factors torch's backward reads: those of A^T, as torch takes for a
    contiguous A (turbine's dispatch sends other layouts to the fallback)."""
    factors, pivots, _ = _lu(a.mT)
    swaps = (pivots != torch.arange(1, pivots.shape[-1] + 1, dtype=torch.int32)).sum(-1)
    sign = 1 - 2 * torch.remainder(swaps, 2).to(a.dtype)
    return sign * torch.diagonal(factors, 0, -2, -1).prod(-1), factors, pivots


@registers(aten._linalg_slogdet.default)
def slogdet(a: torch.Tensor):
    """As det: the factors are those of A^T."""
    factors, pivots, _ = _lu(a.mT)
    swaps = (pivots != torch.arange(1, pivots.shape[-1] + 1, dtype=torch.int32)).sum(-1)
    diagonal = torch.diagonal(factors, 0, -2, -1)
    sign = (1 - 2 * torch.remainder(swaps, 2).to(a.dtype)) * torch.sign(diagonal).prod(-1)
    return sign, torch.log(diagonal.abs()).sum(-1), factors, pivots


@registers(aten._linalg_solve_ex.default)
def solve_ex(a: torch.Tensor, b: torch.Tensor, *, left: bool = True, check_errors: bool = False):
    factors, pivots, info = _lu(a)
    rhs, vector = _as_matrix_rhs(a, b)
    result = lu_solve(factors, pivots, rhs, left=left)
    return (result.squeeze(-1) if vector else result), factors, pivots, info


@registers(aten.linalg_inv_ex.default)
def inv_ex(a: torch.Tensor, *, check_errors: bool = False):
    factors, pivots, info = _lu(a)
    identity = _eye(a.shape[-1], a.shape[-1], a.dtype).expand(a.shape)
    return _lu_solve(factors, pivots, identity), info


@registers(aten.linalg_solve_triangular.default)
def solve_triangular(a: torch.Tensor, b: torch.Tensor, *, upper: bool, left: bool = True, unitriangular: bool = False):
    if left:
        return _solve_triangular(a, b, upper, unitriangular)
    return _solve_triangular(a.mT, b.mT, not upper, unitriangular).mT


@registers(aten.triangular_solve.default)
def triangular_solve(b: torch.Tensor, a: torch.Tensor, upper: bool = True, transpose: bool = False, unitriangular: bool = False):
    t = a.mT if transpose else a
    return _solve_triangular(t, b, upper != transpose, unitriangular), a.clone()


def _cholesky(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(L, info) with A = L L^H, column by column; info is the first column whose pivot is not
    positive (LAPACK's potrf), whose L then holds NaNs from there, as nothing reads it."""
    n = a.shape[-1]
    _check_size(n)
    info = torch.zeros(a.shape[:-2], dtype=torch.int32)
    columns = []
    for j in range(n):
        column = a[..., :, j]
        for k, done in enumerate(columns):
            column = column - done * done[..., j : j + 1]
        pivot = column[..., j]
        info = torch.where((info == 0) & ~(pivot > 0), j + 1, info)
        scaled = column / torch.sqrt(pivot).unsqueeze(-1)
        columns.append(torch.where(torch.arange(n) < j, torch.zeros_like(scaled), scaled))
    lower = torch.stack(columns, -1) if columns else a.clone()
    return lower, info


@registers(aten.linalg_cholesky_ex.default)
def cholesky_ex(a: torch.Tensor, *, upper: bool = False, check_errors: bool = False):
    lower, info = _cholesky(a)
    return (lower.mH if upper else lower), info


@registers(aten.cholesky_solve.default)
def cholesky_solve(b: torch.Tensor, factor: torch.Tensor, upper: bool = False):
    """X with A X = B, A = L L^H given L (or U = L^H when upper)."""
    lower = factor.mH if upper else factor
    return _solve_triangular(lower.mH, _solve_triangular(lower, b, upper=False), upper=True)


@registers(aten.cholesky_inverse.default)
def cholesky_inverse(factor: torch.Tensor, upper: bool = False):
    identity = _eye(factor.shape[-1], factor.shape[-1], factor.dtype).expand(factor.shape)
    return cholesky_solve(identity, factor, upper)
