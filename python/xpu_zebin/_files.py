"""Reading a file that is input: a regular file only (a FIFO is never waited on), bounded."""

from __future__ import annotations

import os
import stat
from typing import Union


def read_regular(
    path: Union[str, os.PathLike[str]], limit: int, follow_links: bool = True
) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them; an ``OSError``
    that says why not (not a regular file, larger than the limit, a link when
    ``follow_links`` is false, or the system's own reason)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{os.fspath(path)} is not a regular file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise OSError(f"{os.fspath(path)} is larger than {limit} bytes")
    return data
