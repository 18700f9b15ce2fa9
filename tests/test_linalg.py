"""Small-matrix linear algebra as IREE kernels (eager/decompositions/linalg.py): each op
matches torch on the CPU with no fallback; errors of singular inputs are torch's; larger
matrices go to the fallback policy."""


import pytest
import torch

import turbine
import checks
from checks import D

TOLERANCE = dict(rtol=1e-4, atol=1e-4)


def check(fn, *inputs):
    """fn on turbine, with no op falling back (not even to compile), against torch on the CPU."""
    with turbine.fallback("error"):
        checks.check(fn, *inputs, **TOLERANCE)


@pytest.fixture
def batch():
    return torch.randn(3, 5, 5)


def test_lu_factorization_matches_lapack_pivots_and_info(batch):
    singular = batch.clone()
    singular[1, :, 2] = 0  # a zero column: info names it, LAPACK-style
    check(lambda a: tuple(torch.linalg.lu_factor_ex(a)), batch)
    check(lambda a: tuple(torch.linalg.lu_factor_ex(a)), singular)
    check(lambda a: tuple(torch.linalg.lu_factor_ex(a)), torch.randn(4, 6))
    check(lambda a: tuple(torch.linalg.lu_factor_ex(a)), torch.randn(6, 4))
    check(lambda a: tuple(torch.linalg.lu(a)), batch)
    check(lambda a: tuple(torch.lu_unpack(*torch.linalg.lu_factor(a))), batch)


def test_determinants(batch):
    singular = batch.clone()
    singular[2, 3] = singular[2, 1]
    check(torch.linalg.det, batch)
    check(torch.linalg.det, singular)
    check(lambda a: tuple(torch.linalg.slogdet(a)), batch)
    check(torch.logdet, batch @ batch.mT)


def test_solves_and_inverse(batch):
    b = torch.randn(3, 5, 2)
    check(torch.linalg.solve, batch, b)
    check(torch.linalg.solve, batch, b[..., 0])  # a batch of vectors
    check(lambda a, b: torch.linalg.solve(a, b, left=False), batch, b.mT)
    check(torch.linalg.inv, batch)
    check(lambda a, b: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b), batch, b)
    check(lambda a, b: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b, adjoint=True), batch, b)
    check(lambda a, b: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b.mT, left=False), batch, b)


@pytest.mark.filterwarnings("ignore:torch.triangular_solve is deprecated")
def test_triangular_solves(batch):
    upper = batch.triu() + 3 * torch.eye(5)
    b = torch.randn(3, 5, 2)
    check(lambda t, b: torch.linalg.solve_triangular(t, b, upper=True), upper, b)
    check(lambda t, b: torch.linalg.solve_triangular(t, b, upper=False, left=False, unitriangular=True), upper.mT, b.mT)
    check(lambda b, t: tuple(torch.triangular_solve(b, t, upper=True, transpose=True)), b, upper)


def test_cholesky_family(batch):
    spd = batch @ batch.mT + torch.eye(5)
    b = torch.randn(3, 5, 2)
    check(lambda a: tuple(torch.linalg.cholesky_ex(a)), spd)
    check(lambda a: torch.linalg.cholesky(a, upper=True), spd)
    lower = torch.linalg.cholesky(spd)
    check(torch.cholesky_solve, b, lower)
    check(torch.cholesky_inverse, lower)
    check(lambda a: torch.linalg.cholesky_ex(a).info, batch)  # not positive-definite: info > 0


@pytest.mark.filterwarnings("ignore:torch.cholesky is deprecated")
def test_the_deprecated_cholesky_runs_on_iree_with_torchs_errors(batch):
    """``torch.cholesky`` (still in older code) is its own aten op: it fell back, every call."""
    spd = batch @ batch.mT + torch.eye(5)
    check(torch.cholesky, spd)
    check(lambda a: torch.cholesky(a, upper=True), spd[0])
    check(lambda a: torch.autograd.grad(torch.cholesky(a).sum(), a)[0], spd.clone().requires_grad_())
    assert torch.cholesky(torch.ones(0, 3).to(D)).shape == (0, 3)  # no elements: no checks, as in torch
    with pytest.raises(NotImplementedError, match="not implemented for 'Half'"), turbine.fallback("device"):
        torch.cholesky(spd[0].half().to(D))
    for bad in (-torch.eye(3), -torch.eye(3).expand(2, 3, 3), torch.ones(2, 3), torch.ones(3)):
        with pytest.raises(RuntimeError) as expected:
            torch.cholesky(bad)
        with pytest.raises(RuntimeError) as actual:
            torch.cholesky(bad.to(D))
        assert type(actual.value) is type(expected.value) and str(actual.value) == str(expected.value)


def test_singular_inputs_raise_torchs_errors():
    singular = torch.ones(4, 4)
    with pytest.raises(RuntimeError, match="singular") as expected:
        torch.linalg.inv(singular)
    with pytest.raises(RuntimeError) as actual:
        torch.linalg.inv(singular.to(D))
    assert str(actual.value) == str(expected.value)
    with pytest.raises(RuntimeError, match="positive-definite"):
        torch.linalg.cholesky(-torch.eye(3).to(D))


@pytest.mark.filterwarnings("ignore::turbine.TurbineFallbackWarning")
def test_matrices_above_the_unrolled_size_go_to_the_fallback(stats):
    from turbine.eager.decompositions.linalg import MAX_UNROLLED

    a = torch.randn(MAX_UNROLLED + 1, MAX_UNROLLED + 1)
    torch.testing.assert_close(torch.linalg.det(a.to(D)).cpu(), torch.linalg.det(a), rtol=1e-3, atol=1e-3)
    assert stats()["fallbacks"]["aten._linalg_det.default"] == 1


@pytest.mark.filterwarnings("ignore::turbine.TurbineFallbackWarning")
@pytest.mark.parametrize("transposed", [False, True], ids=["contiguous", "transposed"])
def test_determinant_gradients(batch, transposed):
    """torch's det backward reads the LU factors of A^T for a contiguous A and of A otherwise;
    turbine's kernel gives the former, and sends the other layout to the fallback."""
    grad = torch.randn(3)
    for fn in (torch.linalg.det, lambda a: torch.linalg.slogdet(a).logabsdet):
        x = batch.clone().requires_grad_()
        expected = torch.autograd.grad(fn(x.mT if transposed else x), x, grad)[0]
        xd = batch.to(D).requires_grad_()
        actual = torch.autograd.grad(fn(xd.mT if transposed else xd), xd, grad.to(D))[0]
        torch.testing.assert_close(actual.cpu(), expected, **TOLERANCE)
