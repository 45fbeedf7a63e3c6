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
from typing import Any, Callable, Iterator, List, Optional, Sequence, Union

from . import _batch_task
from ._core import CompileResult
from .errors import BuildError, CompilerCrashError

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
    task = functools.partial(_batch_task, caller=os.getpid())
    futures = client.map(task, [requests[i] for i in order], pure=False)
    index = {f.key: i for i, f in zip(order, futures)}
    for done in as_completed(futures):
        if progress is not None:
            progress(index[done.key])
    results: list = [None] * len(requests)
    finished = [f for f in futures if f.status != "error"]
    for f, result in zip(finished, client.gather(finished)):
        results[index[f.key]] = result
    for f in futures:
        if f.status == "error":
            results[index[f.key]] = _lost(f.exception())
    return results


def _lost(error: BaseException) -> BuildError:
    """A task Dask gave up on: its worker died every time it ran it (``KilledWorker``, after
    ``distributed.scheduler.allowed-failures`` retries). A compile cannot do that itself
    (the compilers run in their own processes), so something killed the worker: the OOM
    killer, a node lost. An error in its slot; the rest of the batch is unaffected. Any
    other task error is a bug and is raised."""
    if type(error).__name__ != "KilledWorker":
        raise error
    return CompilerCrashError(
        f"the Dask worker running this compile died each time it was tried ({error})"
    )


@contextlib.contextmanager
def cluster_client(scheduler: Optional[str] = None, local_workers: int = 0) -> Iterator[Any]:
    """A client for the scheduler at ``scheduler`` (``tcp://host:port``), or for a local
    cluster of ``local_workers`` single-threaded worker processes; closed on exit."""
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
