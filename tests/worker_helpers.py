"""Finding a compile worker mid-build, for the tests that kill or stop one; the host's cores
all taken, for the tests of who may start a compiler."""

from __future__ import annotations

import contextlib
import fcntl
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional

import xpu_zebin


def compiling(pid: int) -> bool:
    """IGC is mapped into the worker: it has started compiling (its main thread serves
    requests, so being alive says nothing)."""
    try:
        return "libigc" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def first_compiling(workers: Callable[[], Iterable[int]], within: float = 60) -> Optional[int]:
    """The first of ``workers()`` seen compiling, looked for (generously) for ``within``
    seconds; None when none started."""
    deadline = time.monotonic() + within
    victim = None
    while victim is None and time.monotonic() < deadline:
        victim = next((p for p in workers() if compiling(p)), None)
        # Polling /proc under the deadline; also after one is found: IGC mapped comes a
        # moment before the build is under way (a worker killed sooner has its request
        # served again by another, and the build succeeds).
        time.sleep(0.05)
    return victim


@contextlib.contextmanager
def every_core_taken(slots_dir, leave: int = 0) -> Iterator[None]:
    """What compilers running in other processes on every core (but `leave`) look like:
    each of those slots locked."""
    held = []
    try:
        # As many as the host's slots (the cores this process may use, as the engine counts).
        for i in range(xpu_zebin._core.default_jobs() - leave):
            f = open(slots_dir / f"core-{i}", "a")
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held.append(f)
        yield
    finally:
        for f in held:
            f.close()
