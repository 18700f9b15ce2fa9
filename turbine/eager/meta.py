"""Checking an op call on meta tensors: torch's shape rules, and torch's own error messages.

Every plan starts here (eager/planning.py): the meta call gives the results' shapes and dtypes
and raises what torch raises for a bad call, worded as torch's CPU kernel words it.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from turbine.eager.schema import OpSchema
from turbine.eager.signature import rebuild
from turbine.eager.tensor import DeviceTensor
from turbine.eager.views import meta_like
from turbine.errors import UnsupportedOpError


def off_device(value: Any, replacement: str) -> Any:
    """Replace turbine torch.device arguments: traces and meta runs happen off the device."""
    if isinstance(value, torch.device) and value.type == "turbine":
        return torch.device(replacement)
    return value


def meta_call(func: Any, schema: OpSchema, args: tuple, kwargs: dict) -> Any:
    """The op on meta tensors of its arguments' geometry: torch's shape rule and its checks,
    with torch's CPU error message for a call torch rejects."""
    meta_args, meta_kwargs = rebuild(schema, args, kwargs, meta_like, lambda value: value)
    meta_kwargs = {name: off_device(value, "meta") for name, value in meta_kwargs.items()}
    try:
        with warnings.catch_warnings():
            # resize_out warns on every call that resizes; the meta run happens once per plan.
            warnings.filterwarnings("ignore", "An output with one or more elements was resized")
            out = func(*meta_args, **meta_kwargs)
        if func in _CONVOLUTIONS:
            return _in_torchs_conv_layout(func, args, out)
        if func in _CPU_LAYOUTS and not all(t.is_contiguous() for t in args if isinstance(t, DeviceTensor)):
            return _in_torchs_cpu_layout(func, schema, args, kwargs, out)
        return out
    except NotImplementedError as error:
        raise UnsupportedOpError(
            f"{func} has no shape rule in torch (its output shape may depend on the data)"
        ) from error
    except Exception as error:
        if "data-dependent" in str(error) or type(error).__name__ == "DynamicOutputShapeException":
            raise UnsupportedOpError(f"{func} has an output shape that depends on the data") from error
        raise_as_torch_cpu(func, schema, args, kwargs)
        # torch's CPU kernel takes the call: only the meta rule cannot (it reads values, say).
        raise UnsupportedOpError(f"{func} has no shape rule turbine can use ({error})") from error


#: Ops whose meta kernels leave results row-major where torch's CPU kernels lay them out as
#: their input or weight (channels-last): the position of their input and weight arguments.
_CONVOLUTIONS = {torch.ops.aten.convolution.default: 0, torch.ops.aten.convolution_backward.default: 1}


_aten = torch.ops.aten

#: Ops whose meta kernels lay results of inputs in another order out otherwise than torch's CPU
#: kernels (batch norm keeps a transposed input's order where the CPU's result is row-major;
#: group norm, reflection and replication padding, roll and pixel shuffles give a channels-last
#: input a row-major result where the CPU's is channels-last).
_CPU_LAYOUTS = {
    _aten.native_batch_norm.default, _aten._native_batch_norm_legit.default, _aten._native_batch_norm_legit.no_stats,
    _aten._native_batch_norm_legit_no_training.default, _aten._native_batch_norm_legit_functional.default,
    _aten.native_group_norm.default, _aten.roll.default, _aten.pixel_shuffle.default, _aten.pixel_unshuffle.default,
    _aten.reflection_pad1d.default, _aten.reflection_pad2d.default, _aten.reflection_pad3d.default,
    _aten.replication_pad1d.default, _aten.replication_pad2d.default, _aten.replication_pad3d.default,
}


def _in_torchs_cpu_layout(func: Any, schema: OpSchema, args: tuple, kwargs: dict, out: Any) -> Any:
    """Meta results with the strides of torch's CPU results: the op run once on zero-filled CPU
    stand-ins of its inputs (when its plan is built)."""
    cpu = on_cpu_zeros(func, schema, args, kwargs)

    def restrided(meta: Any, real: Any) -> Any:
        if not isinstance(meta, torch.Tensor) or not isinstance(real, torch.Tensor) or meta.stride() == real.stride():
            return meta
        return torch.empty_strided(tuple(real.shape), tuple(real.stride()), dtype=meta.dtype, device="meta")

    if isinstance(out, torch.Tensor):
        return restrided(out, cpu)
    return type(out)(restrided(m, r) for m, r in zip(out, cpu))


def _in_torchs_conv_layout(func: Any, args: tuple, out: Any) -> Any:
    """A convolution's meta results in the memory format torch's CPU kernel gives them: its meta
    kernel has no device to choose a backend by, and leaves them row-major (torch's fake tensors
    ask the backend the way this does). The backend is chosen on empty CPU stand-ins of the
    input and weight (nothing is written to them); a gradient of the bias stays as it is."""
    first = _CONVOLUTIONS[func]
    if args[first].is_contiguous() and args[first + 1].is_contiguous():
        return out  # row-major in, row-major out
    input, weight = (torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="cpu") for t in args[first:first + 2])
    if func is torch.ops.aten.convolution.default:
        bias = None if args[2] is None else torch.empty(tuple(args[2].shape), dtype=args[2].dtype, device="cpu")
        backend = torch._C._select_conv_backend(input, weight, bias, *args[3:9])
    else:
        backend = torch._C._select_conv_backend(input, weight, None, *args[4:10], args[3])
    unsqueeze = weight.dim() == 3  # torch decides a 1-D one as a 2-D one
    if unsqueeze:
        input, weight = input.contiguous().unsqueeze(2), weight.unsqueeze(2)
    layout = torch._C._conv_determine_backend_memory_format(input, weight, backend)
    if layout is torch.contiguous_format:
        return out

    def laid_out(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:
            return None
        if unsqueeze:
            return t.unsqueeze(2).contiguous(memory_format=layout).squeeze(2)
        return t.contiguous(memory_format=layout)

    if isinstance(out, torch.Tensor):
        return laid_out(out)
    return (laid_out(out[0]), laid_out(out[1]), out[2])


def raise_as_torch_cpu(func: Any, schema: OpSchema, args: tuple, kwargs: dict) -> None:
    """Re-raise a rejected call with torch's CPU wording (meta kernels word some checks differently).

    Runs the call on zero-filled CPU stand-ins of the same shapes; returns if the CPU accepts it.
    """
    try:
        on_cpu_zeros(func, schema, args, kwargs)
    except Exception as cpu_error:
        raise cpu_error.with_traceback(None) from None


def on_cpu_zeros(func: Any, schema: OpSchema, args: tuple, kwargs: dict) -> Any:
    """The op's result on zero-filled CPU stand-ins of its tensors (same shapes and strides):
    the shapes of a call whose op has no shape rule, where the zeros make no difference to them."""

    def stand_in(tensor: DeviceTensor) -> torch.Tensor:
        return torch.zeros(tensor._storage.numel, dtype=tensor.dtype).as_strided(
            tensor.shape, tensor.stride(), tensor.storage_offset()
        )

    cpu_args, cpu_kwargs = rebuild(schema, args, kwargs, stand_in, lambda value: value)
    cpu_kwargs = {name: off_device(value, "cpu") for name, value in cpu_kwargs.items()}
    return func(*cpu_args, **cpu_kwargs)
