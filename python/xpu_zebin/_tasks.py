"""One request of a batch as a task, for an executor's or Dask's worker processes: a module
of its own, so that the package and its Dask side both use it and neither imports the
other for it."""

from __future__ import annotations

import os
from typing import Union

from . import _core
from ._core import CompileResult
from .errors import BuildError


def batch_task(req: dict, caller: int) -> Union[CompileResult, BuildError]:
    """One request of a batch run by an executor or by Dask, its failure in its slot. In a
    process other than the caller's (a process pool's, a Dask worker's), processes start
    tasks at the same moment: its speculative builds let the others' take their cores."""
    if os.getpid() != caller:
        _core.join_multiprocess_batch()
    try:
        return _core.compile(**req)  # a key this version does not know is a TypeError
    except BuildError as e:
        return e
