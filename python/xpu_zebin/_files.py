"""Reading a file that is input: a regular file only (a FIFO is never waited on), bounded.

Every file the package reads from a path it was given goes through :func:`read_regular`
(``tests/test_structure.py`` checks that no module reads one another way)."""

from __future__ import annotations

import os
import stat
from typing import Union

#: The largest SPIR-V module, OpenCL C source or zebin read as an input: the engine's own
#: bound on one module or zebin (``MAX_PAYLOAD_BYTES``, a frame's payload, in
#: ``src/pool/mod.rs``; ocloc's output is bounded the same in ``src/ocloc/process.rs``).
MAX_MODULE_BYTES = 1 << 30

#: Bytes asked of the system at a time once a file's size is not what it said.
_CHUNK = 1 << 20

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def kind(mode: int) -> str:
    """What a file that is not a regular file is, in words."""
    return next((said for test, said in _KINDS if test(mode)), "not a regular file")


def read_regular(
    path: Union[str, os.PathLike[str]], limit: int, follow_links: bool = True
) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them; an ``OSError``
    that says why not (not a regular file, larger than the limit, a link when
    ``follow_links`` is false, or the system's own reason)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{os.fspath(path)} is {kind(st.st_mode)}, not a regular file")
        return read_at_most(fd, limit, os.fspath(path), st.st_size)
    finally:
        os.close(fd)


def read_at_most(fd: int, limit: int, name: str, size: int = 0) -> bytes:
    """At most ``limit`` bytes from ``fd`` up to its end, else an ``OSError``; ``size``:
    what the file says it holds (more than ``limit`` is refused before anything is read).
    Memory grows with what is read, never with the limit."""
    if size > limit:
        raise OSError(f"{name} is larger than {limit} bytes")
    parts, total, want = [], 0, size + 1  # a regular file: one read, then its end
    while total <= limit:
        part = os.read(fd, min(want, limit + 1 - total))
        if not part:
            break
        parts.append(part)
        total, want = total + len(part), _CHUNK
    if total > limit:
        raise OSError(f"{name} is larger than {limit} bytes")
    return b"".join(parts)


def same_regular_files(
    a: Union[str, os.PathLike[str]], b: Union[str, os.PathLike[str]], limit: int
) -> bool:
    """Do two regular files of at most ``limit`` bytes (no link followed) hold the same
    bytes? Compared a block at a time: neither is ever held whole. An ``OSError`` when
    either is not such a file."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW
    fds = []
    try:
        for path in (a, b):
            fds.append(os.open(path, flags))
            st = os.fstat(fds[-1])
            if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
                raise OSError(f"{os.fspath(path)} is not a regular file of at most {limit} bytes")
        if os.fstat(fds[0]).st_size != os.fstat(fds[1]).st_size:
            return False
        while True:
            block = _read_full(fds[0], _CHUNK)
            if block != _read_full(fds[1], _CHUNK):
                return False
            if not block:
                return True
    finally:
        for fd in fds:
            os.close(fd)


def _read_full(fd: int, n: int) -> bytes:
    """``n`` bytes from ``fd``, fewer only at its end (a read may return less)."""
    parts, got = [], 0
    while got < n:
        part = os.read(fd, n - got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)
