"""Running PyTorch's OpInfo database (``op_db``) on a turbine device, one case at a time.

A case is (op_db entry, variant, dtype, direction):

- variants: ``function`` (``torch.add``), ``method`` (``x.add``) and ``inplace`` (``x.add_``);
- dtypes: float32 and int64;
- directions: ``forward`` for every variant, ``backward`` (gradients) for the function variant
  on float32, for entries that support autograd.

Each sample input OpInfo gives is run on the CPU by torch and on the turbine device, and the
results are compared with ``torch.testing.assert_close`` at OpInfo's tolerances. Ops whose
results differ between two CPU runs with different seeds (random ops, ``empty``) are compared on
shape and dtype only. A case ends as ``pass``, ``fail`` (with the first line of the first error),
``skip`` (listed in opinfo_skips.py, with its reason) or ``n/a`` (torch itself has no such
variant or dtype for the entry). Each case also records what ran it: IREE kernels, the device
fallback, or torch on the host.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Any, Callable, Iterator

import torch
from torch.testing._internal.common_device_type import toleranceOverride
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.opinfo.core import DecorateInfo, OpInfo, SampleInput
from torch.utils._pytree import tree_flatten, tree_map

import turbine
from turbine.device import open_device
from turbine.eager import deferred
from opinfo_skips import skip_reason

DTYPES = {"float32": torch.float32, "int64": torch.int64}
VARIANTS = ("function", "method", "inplace")
#: Samples run per case; OpInfo gives 1 to 100+, mostly variations of shape and arguments.
DEFAULT_MAX_SAMPLES = 4


@dataclasses.dataclass
class Result:
    """The outcome of one case."""

    op: str
    variant: str
    dtype: str
    direction: str
    status: str  # pass | fail | skip | n/a
    detail: str = ""
    samples: int = 0
    executors: list[str] = dataclasses.field(default_factory=list)  # of "iree", "fallback", "host"
    fallback_ops: list[str] = dataclasses.field(default_factory=list)  # the aten ops that fell back
    seconds: float = 0.0


def entry_name(op: OpInfo) -> str:
    """An op_db entry's unique name: ``max.reduction_with_dim``, ``add``."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def entries() -> dict[str, OpInfo]:
    """Every op_db entry by name."""
    return {entry_name(op): op for op in op_db}


def cases(op: OpInfo) -> Iterator[tuple[str, str, str]]:
    """The (variant, dtype, direction) cases of an entry, applicable or not."""
    for dtype in DTYPES:
        for variant in VARIANTS:
            yield variant, dtype, "forward"
    yield "function", "float32", "backward"


def run_entry(op: OpInfo, device: str, max_samples: int = DEFAULT_MAX_SAMPLES) -> Iterator[Result]:
    """Every case of an entry, in ``cases`` order."""
    for variant, dtype, direction in cases(op):
        yield run_case(op, variant, dtype, direction, device, max_samples)


def run_case(op: OpInfo, variant: str, dtype: str, direction: str, device: str, max_samples: int) -> Result:
    """One case: pass, fail, skip or n/a, with what ran it."""
    result = Result(entry_name(op), variant, dtype, direction, "pass")
    reason = _not_applicable(op, variant, DTYPES[dtype], direction)
    if reason is None:
        skip = skip_reason(result.op, variant, dtype, direction)
        if skip is not None:
            result.status, result.detail = "skip", skip
            return result
    else:
        result.status, result.detail = "n/a", reason
        return result
    start = time.perf_counter()
    executors: set[str] = set()
    fallbacks_before = dict(turbine.stats()["fallbacks"])
    check = _forward_sample if direction == "forward" else _backward_sample
    function = _variant(op, variant)
    try:
        for sample in _samples(op, DTYPES[dtype], direction, max_samples):
            ran = check(op, function, sample, DTYPES[dtype], device, variant == "inplace")
            if ran is not None:
                result.samples += 1
                executors |= ran
        if result.samples == 0:
            result.status, result.detail = "n/a", "torch on the CPU rejects every sample of this case"
    except Exception as error:  # the case fails; the run goes on
        result.status, result.detail = "fail", _first_line(error)
    result.executors = sorted(executors)
    fallbacks = turbine.stats()["fallbacks"]
    result.fallback_ops = sorted(op for op, count in fallbacks.items() if count > fallbacks_before.get(op, 0))
    result.seconds = round(time.perf_counter() - start, 3)
    return result


# --- which cases exist --------------------------------------------------------------------


def _not_applicable(op: OpInfo, variant: str, dtype: torch.dtype, direction: str) -> str | None:
    if _variant(op, variant) is None:
        return f"op_db has no {variant} variant"
    if dtype not in op.supported_dtypes("cpu"):
        return f"torch's CPU kernel does not take {dtype}"
    if direction == "backward" and (not op.supports_autograd or dtype not in op.supported_backward_dtypes("cpu")):
        return "op_db lists no CPU gradient"
    return None


def _variant(op: OpInfo, variant: str) -> Callable | None:
    return {"function": op.op, "method": op.method_variant, "inplace": op.inplace_variant}[variant]


def _samples(op: OpInfo, dtype: torch.dtype, direction: str, max_samples: int) -> Iterator[SampleInput]:
    torch.manual_seed(0)
    samples = op.sample_inputs("cpu", dtype, requires_grad=direction == "backward")
    return itertools.islice(samples, max_samples)


# --- one sample ---------------------------------------------------------------------------


def _call(function: Callable, sample: SampleInput) -> Any:
    return function(sample.input, *sample.args, **sample.kwargs)


def _on_cpu(function: Callable, sample: SampleInput, inplace: bool, seed: int) -> Any:
    if inplace:
        sample = sample.transform(lambda t: t.clone() if isinstance(t, torch.Tensor) else t)
    torch.manual_seed(seed)
    return _call(function, sample)


def _to_device(sample: SampleInput, device: str) -> SampleInput:
    """The sample with its tensors copied to ``device``, and a ``device=`` argument naming it."""

    def move(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.detach().to(device).requires_grad_(value.requires_grad)
        return value

    def rename(value: Any) -> Any:
        # Factories (linspace, tril_indices) and Tensor.to name their device: make it the turbine one.
        if isinstance(value, torch.device) and value.type == "cpu" or isinstance(value, str) and value == "cpu":
            return device
        return value

    moved = sample.transform(move)
    moved.args = tuple(rename(a) for a in moved.args)
    moved.kwargs = {k: rename(v) for k, v in moved.kwargs.items()}
    return moved


#: Ops whose results are uninitialised memory: two runs may agree by chance, so never compare values.
_UNINITIALISED = {"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided"}


def _deterministic(function: Callable, sample: SampleInput, inplace: bool, expected: Any) -> bool:
    """Whether the op gives the same result for another seed (random ops and ``empty`` do not)."""
    try:
        again = _on_cpu(function, sample, inplace, seed=1)
        torch.testing.assert_close(again, expected, equal_nan=True, atol=0, rtol=0)
    except Exception:
        return False
    return True


def _forward_sample(
    op: OpInfo, function: Callable, sample: SampleInput, dtype: torch.dtype, device: str, inplace: bool
) -> set[str] | None:
    """Compare one sample's result with torch's CPU result; None when the CPU rejects the sample."""
    try:
        expected = _on_cpu(function, sample, inplace, seed=0)
    except Exception:
        return None  # e.g. an in-place op whose result dtype cannot be written back
    exact = op.name not in _UNINITIALISED and _deterministic(function, sample, inplace, expected)
    moved = _to_device(sample, device)
    before = _executions()
    torch.manual_seed(0)
    actual = _call(function, moved)
    executors = _executors_since(before)
    if op.name in _TIES:
        actual, expected = _values_of_ties(op.name, sample, actual, expected)
    if op.name in _BATCH_NORM:
        expected = _saved_statistics_off_the_cpu(sample, expected)
    tolerance = _tolerance(op, dtype, device)
    try:
        _compare(actual, expected, tolerance, exact, "result")
    except AssertionError:
        if not (
            _closer_to_float64(function, sample, dtype, actual, tolerance, exact, inplace)
            or _as_torch_on_the_gpu(op, function, sample, device, actual, tolerance, exact)
        ):
            raise
    return executors


def _closer_to_float64(
    function: Callable, sample: SampleInput, dtype: torch.dtype, actual: Any, tolerance: dict, exact: bool, inplace: bool
) -> bool:
    """Whether a float32 result that missed torch's float32 one matches torch's float64 result
    (rounded to float32) instead: some of torch's float32 CPU kernels are less precise than
    turbine's (polygamma of negative arguments is 2e-5 off; turbine's is 1e-7)."""
    if dtype != torch.float32 or not exact:
        return False
    wide = sample.transform(lambda t: t.double() if isinstance(t, torch.Tensor) and t.dtype == dtype else t)
    try:
        reference = _on_cpu(function, wide, inplace=inplace, seed=0)  # an in-place op writes a float64 copy
        narrow = tree_map(lambda t: t.float() if isinstance(t, torch.Tensor) and t.dtype == torch.float64 else t, reference)
        _compare(actual, narrow, tolerance, exact, "result")
    except Exception:
        return False
    return True


def _as_torch_on_the_gpu(
    op: OpInfo, function: Callable, sample: SampleInput, device: str, actual: Any, tolerance: dict, exact: bool
) -> bool:
    """On a turbine GPU device, whether a result that missed torch's CPU result matches torch's
    own CUDA result for the sample: a GPU user expects torch CUDA's answers (its fused attention,
    cuBLAS's float32 sums, its order of a reduction), which torch's CPU kernels do not always give
    within OpInfo's CPU tolerances."""
    opened = open_device(device)
    if not exact or opened.kind != "cuda" or not torch.cuda.is_available():
        return False
    try:
        moved = _to_device(sample, f"cuda:{opened.spec.ordinal}")
        torch.manual_seed(0)
        reference = tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, _call(function, moved))
        if op.name in _TIES:
            reference = reference[0]  # values alone, as ``actual`` is by now (_values_of_ties)
        _compare(actual, reference, tolerance, exact, "result")
    except Exception:
        return False
    return True


#: Ops that return the indices of equal values in an order torch leaves open (its CPU and CUDA
#: kernels differ too): the position of each ``dim`` argument.
_TIES = {"topk": 1, "sort": 0, "kthvalue": 1}


def _values_of_ties(name: str, sample: SampleInput, actual: Any, expected: Any) -> tuple[Any, Any]:
    """Check that the device's indices point at its values; then compare the values alone."""
    position = _TIES[name]
    args = sample.args
    dim = sample.kwargs.get("dim", args[position] if len(args) > position and type(args[position]) is int else -1)
    values, indices = actual[0].cpu(), actual[1].cpu()
    source = sample.input if sample.input.dim() else sample.input.reshape(1)
    if sample.input.dim() == 0:
        indices = indices.reshape(-1)
    elif indices.dim() < source.dim():  # a reduction without keepdim (kthvalue)
        indices = indices.unsqueeze(dim)
    picked = source.gather(dim, indices)
    torch.testing.assert_close(picked.reshape(values.shape), values, equal_nan=True, atol=0, rtol=0)
    return actual[0], expected[0]


#: Batch norm entries: in evaluation torch's CPU kernel returns empty saved statistics, while its
#: shape rule, its CUDA kernel and its own decomposition off the CPU return [C] ones, as turbine does.
_BATCH_NORM = {"native_batch_norm", "_native_batch_norm_legit"}


def _saved_statistics_off_the_cpu(sample: SampleInput, expected: Any) -> Any:
    """In evaluation, expect the saved mean and inverse std torch gives off the CPU: the running
    mean and ``rsqrt(running_var + eps)`` (the normalised output is compared as it is)."""
    output, mean, invstd = expected
    args = sample.args
    if len(args) < 7 or args[4] or args[2] is None or mean.numel():
        return expected  # training, or no running statistics: the CPU's statistics are the rule's
    running_mean, running_var, eps = args[2], args[3], args[6]
    wide = torch.float32 if sample.input.dtype in (torch.float16, torch.bfloat16) else sample.input.dtype
    return output, running_mean.to(wide, copy=True), torch.rsqrt(running_var.to(wide) + eps)


def _backward_sample(
    op: OpInfo, function: Callable, sample: SampleInput, dtype: torch.dtype, device: str, inplace: bool
) -> set[str] | None:
    """Compare one sample's input gradients with torch's CPU gradients; None when there are none."""
    outputs, inputs = _differentiable(sample, _on_cpu(function, sample, False, seed=0))
    if not outputs or not inputs:
        return None
    again = _on_cpu(function, sample, False, seed=0)
    exact = op.name not in _UNINITIALISED and _deterministic(function, sample, False, again)
    torch.manual_seed(2)
    upstream = [torch.randn_like(o) for o in outputs]
    expected = torch.autograd.grad(outputs, inputs, upstream, allow_unused=True)
    moved = _to_device(sample, device)
    before = _executions()
    torch.manual_seed(0)
    device_outputs, device_inputs = _differentiable(moved, _call(function, moved))
    actual = torch.autograd.grad(device_outputs, device_inputs, [u.to(device) for u in upstream], allow_unused=True)
    executors = _executors_since(before)
    tolerance = _tolerance(op, dtype, device)
    try:
        _compare(list(actual), list(expected), tolerance, exact, "gradient")
    except AssertionError:
        if not exact or not (
            _as_accurate_as_torch(list(actual), list(expected), function, sample, dtype, upstream, tolerance)
            or _as_torch_cuda_gradients(list(actual), function, sample, device, upstream, tolerance)
        ):
            raise
    return executors


def _as_accurate_as_torch(
    actual: list, expected: list, function: Callable, sample: SampleInput, dtype: torch.dtype, upstream: list, tolerance: dict
) -> bool:
    """Whether float32 gradients that missed torch's CPU ones are as close to torch's float64
    gradients as torch's float32 ones are, within the tolerance: where float32 cannot hold the
    answer (erfcx's gradient cancels to a few digits), torch's own gradient misses the truth too,
    and a turbine gradient nearer the truth is no failure."""
    if dtype != torch.float32:
        return False
    wide = sample.transform(
        lambda t: t.detach().double().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) and t.dtype == dtype else t
    )
    truth = _gradients(function, wide, [u.double() for u in upstream])
    atol, rtol = tolerance.get("atol", 1e-5), tolerance.get("rtol", 1.3e-6)
    for got, want, true in zip(actual, expected, truth):
        if got is None or want is None or true is None:
            if not (got is None and want is None):
                return False
            continue
        got, want = got.cpu().double(), want.detach().double()
        allowed = (want - true).abs() + atol + rtol * true.abs()
        close = ((got - true).abs() <= allowed) | (got.isnan() & true.isnan()) | (got == true)
        if not bool(close.all()):
            return False
    return True


def _as_torch_cuda_gradients(
    actual: list, function: Callable, sample: SampleInput, device: str, upstream: list, tolerance: dict
) -> bool:
    """On a turbine GPU device, whether gradients that missed torch's CPU ones match torch
    CUDA's own, as for results (_as_torch_on_the_gpu): its fused attention's and cuDNN's
    gradients, and its sums' order."""
    opened = open_device(device)
    if opened.kind != "cuda" or not torch.cuda.is_available():
        return False
    try:
        moved = _to_device(sample, f"cuda:{opened.spec.ordinal}")
        reference = [None if g is None else g.cpu() for g in _gradients(function, moved, upstream)]
        _compare(actual, reference, tolerance, True, "gradient")
    except Exception:
        return False
    return True


def _gradients(function: Callable, sample: SampleInput, upstream: list) -> tuple:
    """The sample's input gradients for the upstream gradients, on the sample's device."""
    torch.manual_seed(0)
    outputs, inputs = _differentiable(sample, _call(function, sample))
    return torch.autograd.grad(outputs, inputs, [u.to(o.device, o.dtype) for u, o in zip(upstream, outputs)], allow_unused=True)


def _differentiable(sample: SampleInput, output: Any) -> tuple[list, list]:
    """The outputs that carry gradients and the inputs that want them."""
    output = sample.output_process_fn_grad(output)
    outputs = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
    leaves = tree_flatten((sample.input, sample.args, sample.kwargs))[0]
    inputs = [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]
    return outputs, inputs


# --- comparing ----------------------------------------------------------------------------


def _tolerance(op: OpInfo, dtype: torch.dtype, device: str) -> dict[str, float]:
    """The loosest tolerance OpInfo sets for this dtype on the CPU, else assert_close's defaults;
    on a GPU device, also those it sets for CUDA (what torch accepts between its CUDA and CPU
    results: where the vendor runs, the kernels are torch's CUDA kernels, TF32 convolutions included)."""
    kinds = (None, "cpu", "cuda") if open_device(device).kind in ("cuda", "hip") else (None, "cpu")
    atol = rtol = None
    for info in op.decorators:
        if isinstance(info, DecorateInfo):
            if info.device_type not in kinds:
                continue
            decorators = info.decorators
        else:
            decorators = [info]
        for decorator in decorators:
            if isinstance(decorator, toleranceOverride) and dtype in decorator.d:
                override = decorator.d[dtype]
                atol = max(atol or 0.0, override.atol)
                rtol = max(rtol or 0.0, override.rtol)
    return {} if atol is None else {"atol": atol, "rtol": rtol}


def _compare(actual: Any, expected: Any, tolerance: dict, exact: bool, what: str) -> None:
    actual_leaves, actual_spec = tree_flatten(actual)
    expected_leaves, expected_spec = tree_flatten(expected)
    if len(actual_leaves) != len(expected_leaves):
        raise AssertionError(f"{what} has {len(actual_leaves)} parts, torch's has {len(expected_leaves)}")
    for got, want in zip(actual_leaves, expected_leaves):
        if not isinstance(want, torch.Tensor):
            if isinstance(got, torch.Tensor):
                raise AssertionError(f"{what} is a tensor where torch gives {type(want).__name__}")
            torch.testing.assert_close(got, want, equal_nan=True, **tolerance)
            continue
        if not isinstance(got, torch.Tensor):
            raise AssertionError(f"{what} is {type(got).__name__} where torch gives a tensor")
        if got.device.type != "turbine":
            raise AssertionError(f"{what} is on {got.device}, not on the turbine device")
        got = got.cpu()
        if got.shape != want.shape or got.dtype != want.dtype:
            raise AssertionError(
                f"{what} is {got.dtype}{list(got.shape)}, torch gives {want.dtype}{list(want.shape)}"
            )
        if exact:
            torch.testing.assert_close(got, want.detach(), equal_nan=True, check_stride=False, **tolerance)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    first = next((line.strip() for line in text if line.strip()), "")
    return f"{type(error).__name__}: {first}"[:300]


# --- which executors ran ------------------------------------------------------------------


def _executions() -> tuple[int, int, int]:
    """Counts of what ran ops so far. Launches still waiting for their kernels run first: with
    background compiles, an op whose compile fails reaches the fallback only when it launches."""
    deferred.flush_all()
    stats = turbine.stats()
    return stats["dispatches"], sum(stats["fallbacks"].values()), sum(stats["host_ops"].values())


def _executors_since(before: tuple[int, int, int]) -> set[str]:
    now = _executions()
    names = ("iree", "fallback", "host")
    return {name for name, old, new in zip(names, before, now) if new > old}
