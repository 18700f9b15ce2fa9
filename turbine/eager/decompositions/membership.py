"""Membership tests: ``isin`` as every element compared with every test element.

IREE 3.13 compiles neither ``isin`` nor torch's decomposition of it (which sorts the two inputs
together once the test elements outnumber a few), so it fell back, once per generated token where
transformers' stopping criteria look for the end-of-sequence tokens. The test elements there are
a handful, so comparing each element with each of them is both what IREE compiles and the cheaper
form; past ``MOST_COMPARISONS`` the op is left to the fallback policy rather than made into a
kernel with a comparison matrix too large to hold.

``_is_all_true`` and ``_is_any_true`` (whether a boolean tensor's elements are all, or any, true:
torch.distributions asks the first of every value it validates) are ``all`` and ``any``, which
IREE compiles where it did not compile them.
"""

from __future__ import annotations

import torch

from turbine.eager.decompositions._common import registers

aten = torch.ops.aten

#: The most element-by-test-element comparisons one kernel makes (a 4M-entry boolean matrix).
MOST_COMPARISONS = 1 << 22


def _found(elements: torch.Tensor, test_elements: torch.Tensor, invert: bool) -> torch.Tensor:
    """Whether each element equals some test element (NaN equals none, -0.0 equals 0.0, as in
    torch's kernel); the opposite with ``invert``."""
    tests = test_elements.reshape(-1)
    if elements.numel() * tests.numel() > MOST_COMPARISONS:
        raise NotImplementedError(
            f"turbine compares at most {MOST_COMPARISONS} element pairs in one isin kernel, not "
            f"{elements.numel()} x {tests.numel()}"
        )
    found = (elements.unsqueeze(-1) == tests).any(-1)
    return found.logical_not() if invert else found


@registers(aten.isin.Tensor_Tensor)
def isin(elements: torch.Tensor, test_elements: torch.Tensor, *, assume_unique: bool = False, invert: bool = False) -> torch.Tensor:
    """Each element compared with every test element (IREE 3.13 compiles neither the op nor torch's sorting form)."""
    return _found(elements, test_elements, invert)


@registers(aten.isin.Scalar_Tensor)
def isin_scalar(element: float, test_elements: torch.Tensor, *, assume_unique: bool = False, invert: bool = False) -> torch.Tensor:
    """One element compared with every test element (IREE 3.13 does not compile the op)."""
    return _found(torch.scalar_tensor(element, dtype=torch.result_type(element, test_elements)), test_elements, invert)


@registers(aten._is_all_true.default)
def is_all_true(x: torch.Tensor) -> torch.Tensor:
    """``all``: torch.distributions validated each value with it, and each fell back."""
    return aten.all.default(x)


@registers(aten._is_any_true.default)
def is_any_true(x: torch.Tensor) -> torch.Tensor:
    return aten.any.default(x)
