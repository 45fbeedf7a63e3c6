"""What every command shares: exit codes, usage errors, reading an input, the argument
types the engine's limits decide, and printing untrusted text."""

from __future__ import annotations

import argparse
import math
import os
import stat
import sys
from typing import Optional

import xpu_zebin

from .._files import MAX_MODULE_BYTES, kind, read_at_most, read_regular

EXIT_OK, EXIT_BUILD_ERROR, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    pass


def read_file(path: str, stdin: bool = False) -> bytes:
    """A SPIR-V, OpenCL C or zebin input: a regular file of at most
    :data:`~xpu_zebin._files.MAX_MODULE_BYTES` (``-`` with ``stdin``: standard input,
    bounded the same); anything else (a FIFO, a device, a directory, a file that cannot be
    read or is too large) is a usage error of one line, never a wait or a traceback."""
    try:
        if stdin and path == "-":
            return _read_stdin()
        return read_regular(path, MAX_MODULE_BYTES)
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}" if e.strerror else str(e)) from None
    except MemoryError:
        raise UsageError(f"cannot read {path}: not enough memory") from None


def _read_stdin() -> bytes:
    """Standard input: a regular file, a pipe or a terminal, read to its end, bounded."""
    if sys.stdin is None:
        raise OSError("standard input is closed")
    fd = sys.stdin.fileno()
    st = os.fstat(fd)
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode)
            or os.isatty(fd)):  # fmt: skip
        raise OSError(f"standard input is {kind(st.st_mode)}, not a file or a pipe")
    size = st.st_size if stat.S_ISREG(st.st_mode) else 0
    return read_at_most(fd, MAX_MODULE_BYTES, "standard input", size)


def read_input(path: str, device: str, ocloc: Optional[str], stdin: bool = False) -> bytes:
    """SPIR-V from a file (``-`` with ``stdin``: standard input); OpenCL C (``.cl``) is
    first turned into SPIR-V by ocloc."""
    data = read_file(path, stdin)
    if path.endswith(".cl"):
        try:
            source = data.decode()
        except UnicodeDecodeError as e:
            raise UsageError(f"{path} is not UTF-8 OpenCL C text: {e}") from None
        return xpu_zebin.opencl_to_spirv(source, device=device, ocloc=ocloc)
    return data


def printable(text: str) -> str:
    """A bundle's strings are untrusted: no terminal control sequence reaches the screen."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


#: The longest ``--timeout`` the engine takes, in seconds.
MAX_TIMEOUT = 1e9


def timeout(text: str) -> float:
    """``--timeout``: seconds, a finite number from 0 (no limit) to :data:`MAX_TIMEOUT`, as
    the engine takes them; anything else (inf, nan, negative, not a number) is a usage
    error here, before any input is read."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= MAX_TIMEOUT:  # false for nan
        raise argparse.ArgumentTypeError(
            f"expected seconds, a finite number from 0 (no limit) to 1e9, not {text!r}"
        )
    return value


def jobs(text: str) -> int:
    """``--jobs``: a whole number of parallel compilers, at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 4096:
        raise argparse.ArgumentTypeError(f"expected a whole number from 1 to 4096, not {text!r}")
    return value
