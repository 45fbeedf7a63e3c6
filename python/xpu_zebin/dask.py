"""Batches on a Dask cluster (``pip install xpu-zebin[dask]``).

A batch that outgrows one machine runs on Dask's distributed scheduler: each request is one
task, run on a worker as :func:`xpu_zebin.compile` (with that worker's own persistent
compiler processes and its own binary cache, or a cache directory every node mounts);
results, native binaries included, come back in input order with failures in their slot.
A worker that dies mid-batch costs only its tasks, which the scheduler runs again
elsewhere. Nothing here is imported unless a batch uses Dask.
"""

from __future__ import annotations

import contextlib
import functools
import os
import traceback
from typing import Any, Callable, Iterator, List, Optional, Sequence, Union

from ._core import CompileResult
from ._tasks import batch_task
from .errors import BuildError, CancelledError, CompilerCrashError, InvalidArgumentError

__all__ = ["cluster_client", "compile_many"]


def compile_many(
    requests: Sequence[dict],
    client: Any,
    progress: Optional[Callable[[int], None]] = None,
) -> List[Union[CompileResult, BuildError]]:
    """Run complete requests (see :func:`xpu_zebin._request`) as tasks on ``client``, a
    ``distributed.Client``. ``progress(index)`` is called as each one finishes."""
    from distributed import as_completed

    # Largest first (SPIR-V size as the cost estimate), as the local batch does: the long
    # builds start at once and the short ones fill in, instead of one trailing at the end.
    order = sorted(range(len(requests)), key=lambda i: -len(requests[i]["spirv"]))
    # pure=False: two identical requests are two compiles (each reports its own timing).
    task = functools.partial(batch_task, caller=os.getpid())
    futures = client.map(task, [requests[i] for i in order], pure=False)
    index = {f.key: i for i, f in zip(order, futures)}
    for done in as_completed(futures):
        if progress is not None:
            progress(index[done.key])
    # errors="skip": a task that failed or was cancelled is left out (None) instead of
    # raising; its slot gets a classified error below, and the others still arrive.
    by_index = {index[f.key]: f for f in futures}
    gathered = client.gather(by_index, errors="skip")
    results: list = [None] * len(requests)
    for i, f in by_index.items():
        value = gathered.get(i)
        results[i] = value if isinstance(value, (CompileResult, BuildError)) else _failed(f)
    return results


def _failed(future: Any) -> BuildError:
    """The error in the slot of a task that brought no result back. A compile's own failures
    come back as results; this is everything else:

    - Dask gave up on the task because its worker died every time it ran it
      (``KilledWorker``, after ``distributed.scheduler.allowed-failures`` retries). A
      compile cannot do that itself (the compilers run in their own processes), so something
      killed the worker: the OOM killer, a node lost. A :class:`CompilerCrashError`.
    - The task was cancelled (``client.cancel``, a lost connection to the scheduler): a
      :class:`~xpu_zebin.errors.CancelledError`.
    - It raised something else on its worker: a worker whose xpu_zebin cannot be imported,
      or another version of it than the caller's. A :class:`CompilerCrashError` whose
      message names the exception and whose log holds the worker's traceback.
    """
    if future.cancelled():
        try:
            future.result()
            why = "no reason given"
        except Exception as e:  # distributed's FutureCancelledError says why
            why = _one_line(e)
        return CancelledError(f"the Dask task running this compile was cancelled ({why})")
    if future.status != "error":  # not seen: gather waits for every task to end
        return CompilerCrashError(
            f"the Dask task running this compile ended without a result ({future.status})"
        )
    error = future.exception()
    if type(error).__name__ == "KilledWorker":
        return CompilerCrashError(
            f"the Dask worker running this compile died each time it was tried ({error})"
        )
    log = "".join(traceback.format_exception(type(error), error, future.traceback()))
    return CompilerCrashError(
        f"the Dask task running this compile failed on its worker: "
        f"{type(error).__name__}: {_one_line(error)}",
        log=log,
    )


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


@contextlib.contextmanager
def cluster_client(scheduler: Optional[str] = None, local_workers: int = 0) -> Iterator[Any]:
    """A client for the scheduler at ``scheduler`` (``tcp://host:port``), or for a local
    cluster of ``local_workers`` single-threaded worker processes; closed on exit. Without a
    scheduler, ``local_workers`` below 1 is an :class:`InvalidArgumentError` (a cluster with
    no workers would never run a task)."""
    if not scheduler and not (isinstance(local_workers, int) and local_workers >= 1):
        raise InvalidArgumentError(
            f"local_workers must be a whole number >= 1 without a scheduler, not {local_workers!r}"
        )
    from distributed import Client, LocalCluster

    if scheduler:
        with Client(scheduler) as client:
            yield client
        return
    # One compile per worker process at a time: a compile is itself a process (or two,
    # when both GRF modes run at once), and the cores are the workers.
    cluster = LocalCluster(
        n_workers=local_workers, threads_per_worker=1, processes=True, dashboard_address=":0"
    )
    with cluster, Client(cluster) as client:
        yield client
