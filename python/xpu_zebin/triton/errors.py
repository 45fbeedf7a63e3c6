"""The errors Triton's callers expect: a PTSS overflow as Triton's ``OutOfResources`` (the
autotuner skips the config), other build errors as ``IntelGPUError`` where Triton has it,
else the package's own; each carries the compiler's log and, as ``__cause__``, the
package's error."""

from __future__ import annotations

from typing import Optional

from ..errors import BuildError, ScratchOverflowError


def triton_error(error: BuildError) -> Exception:
    """The exception Triton's callers expect for ``error``, carrying its log."""
    try:
        from triton.runtime import errors as triton_errors
    except ImportError:
        return error
    converted: Optional[Exception] = None
    if isinstance(error, ScratchOverflowError):
        # Upstream raises OutOfResources whenever a PTSS marker matches, with 0/0 when the
        # log gives no numbers (compiler.py's PTSS_OVERFLOW_RE, driver.c's
        # tryRaisePTSSOutOfResources, #7285), so the autotuner skips the config either way.
        converted = triton_errors.OutOfResources(
            error.required or 0, error.limit or 0, "per-thread scratch space (PTSS)"
        )
    elif hasattr(triton_errors, "IntelGPUError"):
        converted = triton_errors.IntelGPUError(f"{error}\n{error.log}")
    if converted is None:
        return error
    converted.log = error.log  # type: ignore[attr-defined]
    converted.kind = error.kind  # type: ignore[attr-defined]
    converted.attempts = error.attempts  # type: ignore[attr-defined]
    return converted


def package_error(e: BaseException) -> Optional[BuildError]:
    """The package's error behind ``e`` (itself, or what a Triton error was made from)."""
    if isinstance(e, BuildError):
        return e
    cause = e.__cause__
    return cause if isinstance(cause, BuildError) else None
