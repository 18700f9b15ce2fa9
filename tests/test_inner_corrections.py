"""Corrections inside other ops' kernels (eager/lowering.py): an op with a wrong IREE lowering is
traced as its correction wherever a trace meets it, in another op's decomposition too, and a
kernel whose inner correction does not compile for its target compiles without it."""

import subprocess
import sys

import torch

import turbine
from checks import check
from turbine.eager import lowering, registry
from turbine.eager.op_trace import lowering_of
from turbine.kernels_cache import tracing

aten = torch.ops.aten


def test_a_correction_applies_inside_another_ops_kernel(stats):
    """torch's xlog1py is x * log1p(y): its kernel took IREE's float64 log1p, 6.7e-10 relative off
    for small y; log1p's correction is exact to an ulp or two."""
    x = torch.rand(1000, dtype=torch.float64) * 10
    y = torch.rand(1000, dtype=torch.float64) * 1e-3
    with turbine.fallback("error"):
        check(torch.special.xlog1py, x, y, rtol=1e-15, atol=0)
    assert stats()["executors"] == {"iree": 1}


def test_a_correction_that_calls_its_own_op_is_traced_once():
    """maximum's correction calls maximum, then puts NaN back where torch's keeps it: inside a
    trace, that inner call is the op itself (else the trace would recurse without end)."""
    inputs = [((5,), torch.float32), ((5,), torch.float32)]
    corrected = tracing.trace(lambda a, b: [aten.maximum.default(a, b)], inputs, lowering.trace_table())
    by_hand = tracing.trace(lambda a, b: [registry.correction(aten.maximum.default)(a, b)], inputs)
    assert str(corrected.code) == str(by_hand.code)
    assert str(corrected.code).count("aten.maximum") == 1 and "isnan" in str(corrected.code)
    assert lowering.trace_table(corrected=False) is None


def test_a_kernel_whose_inner_correction_does_not_compile_runs_without_it(monkeypatch, fresh_cache, stats):
    """Where a correction inside the kernel does not compile (here it makes complex numbers, which
    turbine refuses to compile), the op is compiled with the op inside as it is."""

    calls = []

    def refused(x: torch.Tensor) -> torch.Tensor:
        calls.append(x.dtype)
        return aten.log1p.default(x.to(torch.complex64)).real

    registry.corrections_digest()  # read from the corrections as they are (it is read once per process)
    monkeypatch.setattr(registry.entry(aten.log1p.default), "correction", refused)
    x, y = torch.rand(64), torch.rand(64)
    with turbine.fallback("error"):
        check(torch.special.xlog1py, x, y)
    assert calls, "the kernel's trace did not meet log1p's correction"
    assert stats()["compile_failures"] == 0 and stats()["kernels_compiled"] == 1


def test_every_kernel_is_keyed_by_the_code_of_the_corrections():
    """A kernel may hold any op's correction, so its signature ends with a digest of them all, the
    same in every process: a changed correction misses the kernels it may be part of."""
    digest = registry.corrections_digest()
    assert lowering_of(aten.add.Tensor) == (digest,) and lowering_of(aten.scatter.src)[-1] == digest
    code = "import turbine; from turbine.eager import registry; print(registry.corrections_digest())"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == digest


def test_pow_by_a_number_inside_a_kernel_keeps_torchs_special_values():
    """pow by a number that is not one of torch's special exponents, traced inside another op's
    kernel (cdist's p), decides the exponent's cases in Python: IREE 3.13 folded comparisons of a
    float64 constant to true, which made every such power 1, and IREE's own pow gave 0.0 ** -7 as
    -inf. Compiled by IREE for the CPU and run
    there, against torch."""
    import iree.compiler
    import iree.runtime

    exponents = [1.5, 2.5, -2.5, 7, -7, 4, -4, float("inf"), float("-inf"), float("nan")]
    base = torch.tensor([-2.0, -0.0, 0.0, 1.0, -1.0, float("inf"), float("-inf"), float("nan"), 0.5, 3.0, -0.5])
    text = lowering.lower(lambda t: [aten.pow.Tensor_Scalar(t, e) for e in exponents], [((11,), torch.float32)])
    module = iree.compiler.compile_str(text, target_backends=["llvm-cpu"], input_type="torch")
    results = iree.runtime.load_vm_flatbuffer(module, driver="local-sync").main(base.numpy())
    for e, result in zip(exponents, results):
        expected = torch.pow(base, e)
        actual = torch.from_numpy(result.to_host())
        torch.testing.assert_close(actual, expected, equal_nan=True, msg=lambda m: f"exponent {e}: {m}")
        assert torch.equal(actual.signbit()[~expected.isnan()], expected.signbit()[~expected.isnan()]), f"exponent {e}: signs"
