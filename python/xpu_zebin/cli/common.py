"""What every command shares: exit codes, usage errors, reading an input, the argument
types the engine's limits decide, and printing untrusted text."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Optional

import xpu_zebin

EXIT_OK, EXIT_BUILD_ERROR, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    pass


def read_input(path: str, device: str, ocloc: Optional[str]) -> bytes:
    """SPIR-V from a file; OpenCL C (``.cl``) is first turned into SPIR-V by ocloc."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from e
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
