"""Exception types users can catch. Messages name the problem and the way out."""

from __future__ import annotations


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


class UnsupportedOpError(TurbineError):
    """An op that no executor can run on a turbine device."""
