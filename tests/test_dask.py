"""Batches on a real Dask cluster (distributed.LocalCluster, worker processes) with the real
compilers: order, classified failures, the GRF fallback, a worker lost mid-batch, the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import dask
import distributed
import pytest
from distributed import Client, LocalCluster
from triton_helpers import MM_SIG, compile_triton, matmul_kernel, triton_on_cpu

import xpu_zebin
import xpu_zebin.dask
import xpu_zebin.errors

GRF256 = "-cl-intel-256-GRF-per-thread"


@pytest.fixture(scope="module")
def client():
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as c,
    ):
        yield c


@pytest.fixture(scope="module")
def matmul_spirv(tmp_path_factory) -> bytes:
    """Real Triton SPIR-V that spills at default GRF."""
    with triton_on_cpu(str(tmp_path_factory.mktemp("triton-cache"))):
        return compile_triton(matmul_kernel, MM_SIG, {"BM": 64, "BN": 64, "BK": 32}).asm["spv"]


def _mixed(add_spirv, matmul_spirv, ptss_spirv, modern_ocloc) -> list:
    base = dict(device="pvc", ocloc=modern_ocloc, cache=False)
    return [
        dict(spirv=add_spirv, **base),
        dict(spirv=matmul_spirv, **base),
        dict(spirv=b"\x03\x02\x23\x07 not really", **base),
        dict(spirv=ptss_spirv, **base),
        dict(spirv=add_spirv, kernel_name="nope", **base),
    ]


@pytest.mark.slow
def test_mixed_batch_on_a_local_cluster(client, add_spirv, matmul_spirv, ptss_spirv, modern_ocloc):
    requests = _mixed(add_spirv, matmul_spirv, ptss_spirv, modern_ocloc)
    done: list = []
    remote = xpu_zebin.compile_many(requests, client=client, progress=done.append)
    assert sorted(done) == list(range(len(requests)))
    add, matmul, garbage, ptss, missing = remote
    assert isinstance(add, xpu_zebin.CompileResult) and add.kernel == "add"
    assert isinstance(matmul, xpu_zebin.CompileResult) and matmul.build_flags == GRF256
    assert isinstance(garbage, xpu_zebin.InvalidSpirvError)
    assert isinstance(ptss, xpu_zebin.CompileResult) and ptss.recovered
    assert ptss.build_flags == GRF256 and ptss.attempts[0].error.kind == "scratch_overflow"
    assert isinstance(missing, xpu_zebin.KernelNotFoundError)
    # The same batch here: the same native binaries, byte for byte.
    local = xpu_zebin.compile_many(requests)
    for there, here in zip(remote, local):
        assert type(there) is type(here)
        if isinstance(there, xpu_zebin.CompileResult):
            assert there.binary == here.binary and there.build_flags == here.build_flags
    # The tasks ran on the cluster's workers, not here.
    assert all(os.getpid() != pid for pid in client.run(os.getpid).values())


def _batch_losing_a_worker(client, requests: list) -> list:
    """Run the batch on ``client``; once every worker is busy with a compile (waited for
    generously), SIGKILL one of them. The batch's results."""
    out: dict = {}
    batch = threading.Thread(
        target=lambda: out.update(results=xpu_zebin.compile_many(requests, client=client))
    )
    batch.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        busy = {w: keys for w, keys in client.processing().items() if keys}
        if len(busy) == 2:
            break
        time.sleep(0.1)
    assert len(busy) == 2, "the batch never reached both workers"
    victim = next(iter(busy))
    os.kill(client.run(os.getpid, workers=[victim])[victim], signal.SIGKILL)
    batch.join(600)
    return out["results"]


@pytest.mark.slow
def test_a_worker_killed_mid_batch_costs_only_a_rerun(client, ptss_spirv, modern_ocloc):
    # One build for each worker: the worker killed loses one (the scheduler places the
    # second task on the idle worker; the helper waits until both are busy).
    requests = [
        dict(spirv=ptss_spirv, device="pvc", ocloc=modern_ocloc, cache=False, speculative=False)
        for _ in range(2)
    ]
    results = _batch_losing_a_worker(client, requests)
    assert len(results) == 2
    for r in results:
        assert isinstance(r, xpu_zebin.CompileResult), r
        assert r.recovered and r.build_flags == GRF256


@pytest.mark.slow
def test_a_shared_cache_directory_across_workers(client, add_spirv, matmul_spirv, tmp_path):
    shared = str(tmp_path / "shared-cache")
    requests = [
        dict(spirv=s, device="pvc", cache_dir=shared) for s in (add_spirv, matmul_spirv) * 4
    ]
    first = xpu_zebin.compile_many(requests, client=client)
    again = xpu_zebin.compile_many(requests, client=client)
    assert all(isinstance(r, xpu_zebin.CompileResult) for r in first + again)
    assert all(r.cached for r in again)
    assert not any("corrupt" in n for r in first + again for n in r.notes)
    for a, b in zip(first, again):
        assert a.binary == b.binary


@pytest.mark.slow
def test_the_executor_interface_gives_the_same_results(
    client, add_spirv, matmul_spirv, modern_ocloc
):
    """``executor=client.get_executor()`` (any concurrent.futures interface) runs the same
    tasks on the cluster as ``client=``."""
    requests = [
        dict(spirv=s, device="pvc", ocloc=modern_ocloc, cache=False)
        for s in (add_spirv, b"\x03\x02\x23\x07 not really", matmul_spirv)
    ]
    via_executor = xpu_zebin.compile_many(requests, executor=client.get_executor())
    via_client = xpu_zebin.compile_many(requests, client=client)
    assert [type(r) for r in via_executor] == [type(r) for r in via_client] == [
        xpu_zebin.CompileResult, xpu_zebin.InvalidSpirvError, xpu_zebin.CompileResult
    ]  # fmt: skip
    for a, b in zip(via_executor, via_client):
        if isinstance(a, xpu_zebin.CompileResult):
            assert a.binary == b.binary and a.build_flags == b.build_flags


def _batch_json(args: list, env: dict) -> list:
    out = subprocess.run(
        [sys.executable, "-m", "xpu_zebin", "batch", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 1, out.stderr[-2000:]  # one input is bad
    reports = [json.loads(line) for line in out.stdout.splitlines()]
    for r in reports:
        for a in r["attempts"]:
            a.pop("seconds")
            a.pop("started")  # a time too: when it began
    return reports


@pytest.mark.slow
def test_cli_on_a_local_cluster_gives_the_same_json(tmp_path, add_spirv, spill_spirv, system_ocloc):
    files = []
    for name, data in (("add", add_spirv), ("bad", b"garbage!"), ("spill", spill_spirv)):
        path = tmp_path / f"{name}.spv"
        path.write_bytes(data)
        files.append(str(path))
    args = [*files, "--device", "pvc", "--ocloc", system_ocloc, "--no-cache", "--json"]
    env = dict(os.environ)
    here = _batch_json(args, env)
    on_dask = _batch_json([*args, "--dask-local", "2"], env)
    assert on_dask == here
    assert [r["ok"] for r in here] == [True, False, True]


def test_cli_names_a_scheduler_it_cannot_reach(tmp_path, add_spirv):
    spv = tmp_path / "add.spv"
    spv.write_bytes(add_spirv)
    env = {**os.environ, "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "2s"}
    out = subprocess.run(
        [sys.executable, "-m", "xpu_zebin", "batch", str(spv), "--device", "pvc",
         "--scheduler", "tcp://127.0.0.1:1"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "cannot reach the Dask scheduler at tcp://127.0.0.1:1" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_a_task_whose_worker_keeps_dying_is_an_error_in_its_slot(
    add_spirv, ptss_spirv, modern_ocloc
):
    """Dask gives up on a task whose worker died each time (here: at once, allowed-failures
    0): that task is a CompilerCrashError in its slot, every other result arrives."""
    base = dict(device="pvc", ocloc=modern_ocloc, cache=False, speculative=False)
    requests = [dict(spirv=s, **base) for s in (ptss_spirv, add_spirv, ptss_spirv, add_spirv)]
    with (
        dask.config.set({"distributed.scheduler.allowed-failures": 0}),
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as c,
    ):
        results = _batch_losing_a_worker(c, requests)
    assert len(results) == 4
    lost = [r for r in results if isinstance(r, xpu_zebin.CompilerCrashError)]
    assert lost and all("Dask worker" in r.message for r in lost), results
    assert all(isinstance(r, xpu_zebin.CompileResult) for r in results if r not in lost), results


@pytest.mark.parametrize("workers", [0, -1])
def test_a_local_cluster_without_workers_is_an_argument_error(workers):
    """A cluster with no workers would take the batch and never run it."""
    with (
        pytest.raises(xpu_zebin.InvalidArgumentError, match="local_workers") as e,
        xpu_zebin.dask.cluster_client(None, workers),
    ):
        pass
    assert e.value.kind == "invalid_argument"


def test_cli_rejects_a_local_cluster_without_workers(tmp_path, add_spirv):
    spv = tmp_path / "add.spv"
    spv.write_bytes(add_spirv)
    out = subprocess.run(
        [sys.executable, "-m", "xpu_zebin", "batch", str(spv), "--device", "pvc",
         "--dask-local", "-1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "local_workers" in out.stderr and "Traceback" not in out.stderr


def test_a_task_that_raises_on_its_worker_is_an_error_in_its_slot(client, add_spirv, modern_ocloc):
    """A task that raises something other than a BuildError on its worker is a classified
    error in its slot naming the exception; the rest of the batch still comes back. Here the
    worker's real compile entry point rejects an option it does not know, as a worker with an
    older xpu-zebin than the caller's would (requests go to the Dask module as they are)."""
    good = xpu_zebin._request(add_spirv, "pvc", ocloc=modern_ocloc, cache=False)
    requests = [good, dict(good, newer_option=1), good]
    done: list = []
    first, skewed, last = xpu_zebin.dask.compile_many(requests, client, progress=done.append)
    assert sorted(done) == [0, 1, 2]
    assert isinstance(first, xpu_zebin.CompileResult) and isinstance(last, xpu_zebin.CompileResult)
    assert isinstance(skewed, xpu_zebin.CompilerCrashError), skewed
    assert skewed.kind == "compiler_crash"
    message = skewed.message
    assert "TypeError" in message and "unexpected keyword argument 'newer_option'" in message
    assert "Traceback" in skewed.log  # the worker's, for the curious


@pytest.mark.slow
def test_a_cancelled_task_is_a_cancelled_error_in_its_slot(client, spill_spirv):
    """A task cancelled mid-batch (here, from the progress callback, as soon as the first
    result arrives: two workers, five slow builds, so others are still to come) is a
    CancelledError in its slot; every other result arrives."""
    base = dict(device="pvc", cache=False, speculative=False)
    requests = [dict(spirv=spill_spirv, **base) for _ in range(5)]
    cancelled: list = []

    def cancel_one(index: int) -> None:
        if cancelled:
            return
        pending = [key for key, state in client.futures.items() if state.status == "pending"]
        assert pending, "every task finished at once"
        cancelled.append(pending[0])
        client.cancel([distributed.Future(pending[0], client)], reason="test")

    results = xpu_zebin.compile_many(requests, client=client, progress=cancel_one)
    assert len(results) == 5 and cancelled
    [lost] = [r for r in results if isinstance(r, xpu_zebin.errors.CancelledError)]
    assert lost.kind == "cancelled" and "cancelled" in lost.message and "test" in lost.message
    assert all(isinstance(r, xpu_zebin.CompileResult) for r in results if r is not lost), results
