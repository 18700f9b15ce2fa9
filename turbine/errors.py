"""Exception types users can catch. Messages name the problem and the way out."""

from __future__ import annotations

import torch


class TurbineError(RuntimeError):
    """Base class of every error turbine raises on its own account."""


class DeviceNotFoundError(TurbineError):
    """A device name was malformed or names a device that cannot be opened here."""


class UnsupportedDtypeError(TurbineError, TypeError):
    """A dtype the IREE device cannot hold (complex, for example)."""


class CompileError(TurbineError):
    """The IREE compiler rejected the kernel for an op signature."""

    def __init__(self, message: str, diagnostics: str = "") -> None:
        super().__init__(message)
        self.diagnostics = diagnostics


class CompileTimeout(CompileError):
    """The IREE compiler took longer than ``TURBINE_COMPILE_TIMEOUT`` on a kernel (IREE 3.13
    never finished some: a 3-D grid sampler's gradient for a single-point grid). Kept for the
    session only, not in the kernel cache on disk: a machine busy enough to slow a compile that
    much may not be next time."""


class CompilerCrash(CompileError):
    """The IREE compiler process died on a kernel (a signal). Kept for the session only, as a
    timeout is: a SIGSEGV seen once on a uint8 sum did not come back, yet a failure kept on disk
    had sent that op to the fallback in every later process."""


class UnsupportedOpError(TurbineError):
    """An op that no executor can run on a turbine device."""


class UnsupportedLayoutError(UnsupportedOpError):
    """An op whose result is not a dense (strided) tensor, which is all a turbine device holds:
    sparse ones (``to_sparse``, the gradient of ``nn.Embedding(sparse=True)``)."""

    def __init__(self, op: object, layout: torch.layout) -> None:
        super().__init__(
            f"{op} gives a {layout} tensor, and turbine devices hold dense (strided) tensors only: keep sparse "
            "tensors on the CPU, or stay dense (nn.Embedding and nn.EmbeddingBag with sparse=False)"
        )


class DeviceError(TurbineError):
    """A device could not do what an op asked of it (IREE's words are in the message)."""


class OutOfMemoryError(DeviceError, torch.OutOfMemoryError):
    """A device ran out of memory; ``except torch.OutOfMemoryError`` catches it as it catches CUDA's."""


class DeviceLostError(DeviceError):
    """The device faulted (a CUDA context that hit an illegal address cannot recover): every later
    use of it raises this at once, naming the first failure."""


def detached(error: BaseException) -> BaseException:
    """``error`` without tracebacks, on it and on the errors chained to it.

    A failure kept to be raised or reported again (a plan's, the kernel cache's) would otherwise
    keep alive every frame it passed through, with their tensors: their device memory was held
    until exit, then released after IREE's devices had gone, which crashed the process. Raise a
    copy of a kept error (``copy.copy``), so that the raise does not attach a new traceback to it.
    """
    seen = set()
    link: BaseException | None = error
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        link.__traceback__ = None
        link = link.__cause__ or link.__context__
    return error
