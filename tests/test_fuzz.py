"""A differential fuzz test (issue 20, item 5): short random programs of ops run on turbine and on
torch's CPU, compared value by value.

Hypothesis draws each program: a few starting tensors (float and integer, 0-d and empty ones
among them), then steps that apply elementwise ops, reductions, views, in-place writes through
views, broadcasting and mixed-dtype arithmetic to tensors made so far. A step that torch refuses
(shapes that do not broadcast, say) must be refused by turbine with the same kind of error. CI
runs a bounded number of programs; ``TURBINE_FUZZ_EXAMPLES=500`` runs more. Each bug found here
becomes a regression test in the file of its mechanism.
"""

from __future__ import annotations

import contextlib
import os
import warnings

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import turbine
from checks import D

#: The starting tensors: (sizes, dtype).
STARTS = [((3, 4), torch.float32), ((4,), torch.float32), ((), torch.float32), ((0, 4), torch.float32),
          ((3, 4), torch.int64), ((3, 1), torch.float32)]


def _unary(name):
    return {
        "neg": torch.neg, "abs": torch.abs, "tanh": torch.tanh, "exp": lambda t: torch.exp(t.clamp(max=4)),
        "sqrt": lambda t: torch.sqrt(t.abs()), "float": lambda t: t.float(), "relu": torch.relu,
        "sum": lambda t: t.sum(), "mean0": lambda t: t.float().mean(0) if t.dim() else t.float(),
        "amax-1": lambda t: t.amax(-1, keepdim=True) if t.dim() and t.numel() else t,
        "transpose": lambda t: t.T if t.dim() == 2 else t, "slice": lambda t: t[1:] if t.dim() else t,
        "unsqueeze-expand": lambda t: t.unsqueeze(0).expand(2, *t.shape), "contiguous": lambda t: t.contiguous(),
        "reshape": lambda t: t.reshape(-1), "cumsum": lambda t: t.cumsum(0) if t.dim() else t,
        "double-round-trip": lambda t: t.double().float() if t.is_floating_point() else t,
    }[name]


def _binary(name):
    return {
        "add": torch.add, "sub": torch.sub, "mul": torch.mul, "maximum": torch.maximum,
        "div": lambda a, b: a / (b.abs() + 1), "add-scalar": lambda a, b: a + 2, "mul-float": lambda a, b: a * 0.5,
        "where": lambda a, b: torch.where(a > 0, a, b), "eq": lambda a, b: a == b,
    }[name]


def _in_place(name):
    def through_view(t, u):
        view = t[:1] if t.dim() else t
        view.add_(u.sum().to(t.dtype))  # a write through a view changes its base
        return t

    def transposed(t, u):
        (t.T if t.dim() == 2 else t).mul_(2)
        return t

    def fill_slice(t, u):
        if t.dim():
            t[..., :1] = 7
        return t

    return {"add_-view": through_view, "mul_-transposed": transposed, "setitem": fill_slice}[name]


UNARY = ["neg", "abs", "tanh", "exp", "sqrt", "float", "relu", "sum", "mean0", "amax-1", "transpose", "slice",
         "unsqueeze-expand", "contiguous", "reshape", "cumsum", "double-round-trip"]
BINARY = ["add", "sub", "mul", "maximum", "div", "add-scalar", "mul-float", "where", "eq"]
IN_PLACE = ["add_-view", "mul_-transposed", "setitem"]

step = st.one_of(
    st.tuples(st.just("unary"), st.sampled_from(UNARY), st.integers(0, 63), st.just(0)),
    st.tuples(st.just("binary"), st.sampled_from(BINARY), st.integers(0, 63), st.integers(0, 63)),
    st.tuples(st.just("in-place"), st.sampled_from(IN_PLACE), st.integers(0, 63), st.integers(0, 63)),
)


def _run(kind, name, a, b):
    if kind == "unary":
        return _unary(name)(a)
    if kind == "binary":
        return _binary(name)(a, b)
    return _in_place(name)(a, b)


def _attempt(kind, name, a, b):
    try:
        return "ok", _run(kind, name, a, b)
    except NotImplementedError as error:  # torch's CPU kernel has no such dtype ("abs" of a bool)
        return "no kernel", error
    except (RuntimeError, TypeError, IndexError) as error:
        return type(error).__name__, error


@settings(max_examples=int(os.environ.get("TURBINE_FUZZ_EXAMPLES", "25")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(seed=st.integers(0, 2**16), steps=st.lists(step, min_size=1, max_size=6))
def test_a_random_program_matches_torch(seed, steps):
    generator = torch.Generator().manual_seed(seed)
    theirs = []
    for sizes, dtype in STARTS:
        values = torch.randn(sizes, generator=generator) * 3
        theirs.append(values.round().to(dtype) if dtype == torch.int64 else values)
    ours = [t.to(D) for t in theirs]
    with contextlib.suppress(IndexError, RuntimeError):
        turbine.synchronize(D)
    for kind, name, i, j in steps:
        i, j = i % len(theirs), j % len(theirs)
        expected = _attempt(kind, name, theirs[i], theirs[j])
        if expected[0] == "no kernel":
            continue  # nothing to compare with (turbine may run it: its kernels are generated)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = _attempt(kind, name, ours[i], ours[j])
        where = f"{kind} {name} on {tuple(theirs[i].shape)} {theirs[i].dtype} and {tuple(theirs[j].shape)} {theirs[j].dtype}"
        assert got[0] == expected[0], f"{where}: torch {expected}, turbine {got}"
        if expected[0] == "ok":
            theirs.append(expected[1])
            ours.append(got[1])
    for n, (mine, reference) in enumerate(zip(ours, theirs)):
        assert isinstance(mine, turbine.DeviceTensor), f"tensor {n} left the device: {type(mine)}"
        torch.testing.assert_close(mine.cpu(), reference, rtol=1e-5, atol=1e-5, equal_nan=True, msg=lambda m: f"tensor {n} of {steps}: {m}")
