"""Exceptions raised by xpu-zebin.

Every failure is a :class:`BuildError` with a ``kind`` (one of :func:`error_kinds`), a
message that names the cause, and the compiler's ``log``. Subclasses let callers catch the
kinds they handle; ``ScratchOverflowError`` adds the PTSS ``required`` and ``limit`` bytes.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

#: Driver answers to a native binary that mean "not this compiler's code": its format (the
#: zebin's ``.ze_info`` major) is one the driver does not know, or it imports symbols
#: nothing provides. The driver's own compiler builds such a kernel (upstream's path).
REFUSAL_KINDS = ("unsupported_device", "link_failure")


class BuildError(Exception):
    """A compile or load failed; ``kind`` says why and ``log`` holds the compiler's output."""

    kind: str = "build_failure"

    def __init__(
        self,
        message: str,
        *,
        kind: Optional[str] = None,
        log: str = "",
        attempts: Sequence[Any] = (),
        notes: Sequence[str] = (),
    ) -> None:
        super().__init__(message)
        self.message = message
        if kind is not None:
            self.kind = kind
        self.log = log
        self.attempts = list(attempts)
        self.notes = list(notes)

    def __str__(self) -> str:
        return f"[{self.kind}] {self.message}"

    def __reduce__(self):
        # Keyword-only fields survive pickling (process pools, Ray, Dask).
        return (_rebuild, (type(self), self.message, self.__dict__.copy()))


class ScratchOverflowError(BuildError):
    """Per-thread scratch space (PTSS) exceeds the hardware limit."""

    kind = "scratch_overflow"

    def __init__(
        self,
        message: str,
        *,
        required: Optional[int] = None,
        limit: Optional[int] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(message, **kwargs)
        self.required = required
        self.limit = limit


class InvalidSpirvError(BuildError, ValueError):
    kind = "invalid_spirv"


class KernelNotFoundError(BuildError, LookupError):
    kind = "kernel_not_found"


class UnsupportedDeviceError(BuildError):
    kind = "unsupported_device"


class CompilerCrashError(BuildError):
    kind = "compiler_crash"


class CompileTimeoutError(BuildError, TimeoutError):
    kind = "timeout"


class ToolchainNotFound(BuildError, FileNotFoundError):
    kind = "toolchain_missing"


class DegenerateBinaryError(BuildError):
    kind = "degenerate_binary"


class InvalidArgumentError(BuildError, ValueError):
    kind = "invalid_argument"


class CancelledError(BuildError):
    kind = "cancelled"


class NoDeviceError(BuildError):
    """No Level Zero driver or GPU (``XPU_ZEBIN_SIMULATED_DEVICE=pvc`` simulates one)."""

    kind = "no_device"


class LinkFailureError(BuildError):
    """The module imports symbols nothing provides."""

    kind = "link_failure"


class InternalError(BuildError, RuntimeError):
    """A bug in xpu-zebin itself (a panic in the engine, caught): please report it."""

    kind = "internal_error"


_BY_KIND = {
    cls.kind: cls
    for cls in (
        ScratchOverflowError,
        InvalidSpirvError,
        KernelNotFoundError,
        UnsupportedDeviceError,
        CompilerCrashError,
        CompileTimeoutError,
        ToolchainNotFound,
        DegenerateBinaryError,
        InvalidArgumentError,
        CancelledError,
        NoDeviceError,
        LinkFailureError,
        InternalError,
    )
}


def _rebuild(cls: type, message: str, state: dict) -> BuildError:
    error = cls.__new__(cls, message)
    Exception.__init__(error, message)
    error.__dict__.update(state)
    return error


def _from_core(
    kind: str,
    message: str,
    log: str,
    required: Optional[int],
    limit: Optional[int],
    attempts: Sequence[Any],
    notes: Sequence[str],
) -> BuildError:
    """Called by the native module to build the exception for a failure."""
    cls = _BY_KIND.get(kind, BuildError)
    kwargs: dict = dict(kind=kind, log=log, attempts=attempts, notes=notes)
    if cls is ScratchOverflowError:
        kwargs.update(required=required, limit=limit)
    return cls(message, **kwargs)
