"""The native-binary cache and concurrent batches, on real compiles."""

from __future__ import annotations

import logging
import multiprocessing
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import xpu_zebin
from xpu_zebin import samples


def _entries(cache_dir: Path):
    return sorted(cache_dir.glob("zebin-v3/*/*.zeentry"))


def test_warm_compile_comes_from_cache(system_ocloc, spill_spirv, private_cache):
    cold = xpu_zebin.compile(spill_spirv, device="pvc", ocloc=system_ocloc)
    warm = xpu_zebin.compile(spill_spirv, device="pvc", ocloc=system_ocloc)
    assert not cold.cached and warm.cached
    assert warm.binary == cold.binary
    assert warm.build_flags == cold.build_flags and warm.spill_size == cold.spill_size
    assert [a.build_flags for a in warm.attempts] == [a.build_flags for a in cold.attempts]
    assert len(_entries(private_cache)) == 1
    off = xpu_zebin.compile(spill_spirv, device="pvc", ocloc=system_ocloc, cache=False)
    assert not off.cached


def test_cache_key_covers_compiler_flags_and_device(system_ocloc, modern_ocloc, add_spirv):
    xpu_zebin.compile(add_spirv, device="pvc", ocloc=system_ocloc)
    assert not xpu_zebin.compile(add_spirv, device="pvc", ocloc=modern_ocloc).cached
    assert not xpu_zebin.compile(
        add_spirv, device="pvc", ocloc=system_ocloc, build_flags="-cl-intel-256-GRF-per-thread"
    ).cached
    assert not xpu_zebin.compile(add_spirv, device="bmg", ocloc=modern_ocloc).cached
    assert xpu_zebin.compile(add_spirv, device="pvc", ocloc=system_ocloc).cached


def test_corrupt_entry_is_recompiled_and_logged(system_ocloc, add_spirv, private_cache, caplog):
    first = xpu_zebin.compile(add_spirv, device="pvc", ocloc=system_ocloc)
    (entry,) = _entries(private_cache)
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0xFF
    entry.write_bytes(bytes(data))
    with caplog.at_level(logging.INFO, logger="xpu_zebin"):
        again = xpu_zebin.compile(add_spirv, device="pvc", ocloc=system_ocloc)
    assert not again.cached and again.binary == first.binary
    assert any("corrupt" in r.getMessage() for r in caplog.records)
    assert xpu_zebin.compile(add_spirv, device="pvc", ocloc=system_ocloc).cached


def test_cache_write_failure_never_fails_the_compile(system_ocloc, add_spirv, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory should be")
    result = xpu_zebin.compile(add_spirv, device="pvc", ocloc=system_ocloc, cache_dir=blocker)
    assert result.binary[:4] == b"\x7fELF"
    assert any("cache write" in n for n in result.notes)


def _compile_in_child(args):
    spirv, ocloc, cache_dir = args
    r = xpu_zebin.compile(spirv, device="pvc", ocloc=ocloc, cache_dir=cache_dir)
    return r.binary


def test_concurrent_processes_share_one_cache(system_ocloc, add_spirv, tmp_path):
    cache_dir = str(tmp_path / "shared")
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        binaries = pool.map(_compile_in_child, [(add_spirv, system_ocloc, cache_dir)] * 8)
    assert len(set(binaries)) == 1
    assert len(_entries(Path(cache_dir))) == 1
    assert not list(Path(cache_dir).glob("*/.tmp-*"))  # no torn temp files left
    warm = xpu_zebin.compile(add_spirv, device="pvc", ocloc=system_ocloc, cache_dir=cache_dir)
    assert warm.cached and warm.binary == binaries[0]


def test_compile_many_keeps_order_and_isolates_failures(ocloc, add_spirv, spill_spirv):
    base = dict(device="pvc", ocloc=ocloc, cache=False)
    requests = [
        dict(spirv=add_spirv, **base),
        dict(spirv=b"definitely not spir-v", **base),
        dict(spirv=spill_spirv, **base),
        dict(spirv=add_spirv, kernel_name="missing", **base),
        dict(spirv=add_spirv, **{**base, "device": "no-such-gpu"}),
    ]
    seen = []
    results = xpu_zebin.compile_many(requests, jobs=2, progress=seen.append)
    assert sorted(seen) == list(range(len(requests)))
    assert isinstance(results[0], xpu_zebin.CompileResult) and results[0].kernel == "add"
    assert isinstance(results[1], xpu_zebin.InvalidSpirvError)
    assert isinstance(results[2], xpu_zebin.CompileResult) and results[2].kernel == "spill"
    assert isinstance(results[3], xpu_zebin.KernelNotFoundError)
    assert isinstance(results[4], xpu_zebin.UnsupportedDeviceError)


def test_compile_many_on_an_executor(system_ocloc, add_spirv, spill_spirv):
    requests = [
        dict(spirv=s, device="pvc", ocloc=system_ocloc, cache=False)
        for s in (spill_spirv, b"", add_spirv)
    ]
    with ThreadPoolExecutor(2) as pool:
        results = xpu_zebin.compile_many(requests, executor=pool)
    assert [type(r).__name__ for r in results] == [
        "CompileResult",
        "InvalidSpirvError",
        "CompileResult",
    ]


def test_compile_many_on_a_process_pool(system_ocloc, add_spirv):
    """Results and errors pickle, so any executor (process pool, Ray, Dask) can run a batch."""
    from concurrent.futures import ProcessPoolExecutor

    requests = [
        dict(spirv=s, device="pvc", ocloc=system_ocloc, cache=False)
        for s in (add_spirv, b"\x03\x02\x23\x07")
    ]
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(2, mp_context=ctx) as pool:
        ok, bad = xpu_zebin.compile_many(requests, executor=pool)
    assert isinstance(ok, xpu_zebin.CompileResult) and ok.kernel == "add"
    assert ok.binary[:4] == b"\x7fELF" and ok.attempts[0].ok
    assert isinstance(bad, xpu_zebin.InvalidSpirvError) and bad.kind == "invalid_spirv"


def test_compile_many_rejects_zero_jobs(system_ocloc, add_spirv):
    with pytest.raises(ValueError):
        xpu_zebin.compile_many([dict(spirv=add_spirv, device="pvc")], jobs=0)


@pytest.fixture(scope="module")
def two_kernels(system_ocloc) -> bytes:
    """One module: `spill` spills heavily at 128 GRF, `add` does not spill at all."""
    source = samples.register_pressure_kernel(300, name="spill") + samples.ADD_KERNEL
    return xpu_zebin.opencl_to_spirv(source, device="pvc", ocloc=system_ocloc)


@pytest.mark.parametrize("order", [("spill", "add"), ("add", "spill")])
def test_each_kernel_of_a_module_gets_its_own_answer_in_any_cache_order(
    ocloc, two_kernels, tmp_path, order
):
    """Spills are the named kernel's own, and the cache key holds the kernel name: `add`
    is default GRF, whichever kernel the cache saw first."""
    got = {}
    for name in order:
        got[name] = xpu_zebin.compile(
            two_kernels, device="pvc", ocloc=ocloc, kernel_name=name, cache_dir=tmp_path
        )
    assert got["add"].build_flags == "" and got["add"].spill_size == 0
    assert not got["add"].cached and not got["spill"].cached
    assert got["spill"].build_flags == "-cl-intel-256-GRF-per-thread"
    again = xpu_zebin.compile(
        two_kernels, device="pvc", ocloc=ocloc, kernel_name="add", cache_dir=tmp_path
    )
    assert again.cached and again.build_flags == "" and again.kernel == "add"


@pytest.mark.parametrize("order", [("spill", "add"), ("add", "spill")])
def test_each_kernel_of_a_module_gets_its_own_answer_through_level_zero(
    two_kernels, tmp_path, order
):
    got = {}
    for name in order:
        with xpu_zebin.compile_and_load(two_kernels, name, cache_dir=tmp_path) as k:
            got[name] = (k.build_flags, k.spill_bytes, k.cached)
    assert got["add"] == ("", 0, False)
    assert got["spill"][0] == "-cl-intel-256-GRF-per-thread"
