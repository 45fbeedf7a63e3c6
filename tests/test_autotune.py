"""Autotuning at full width: with the drop-in active, an autotuner's first call for a key
compiles every pruned config at once, then benchmarks them in Triton's order, with the
same answer as compiling them one by one. Real Triton (triton-xpu 3.3 on the CPU), real
compilers, the real Level Zero driver on the simulated PVC; Triton's driver object and the
benchmarker are stand-ins (``triton_helpers.CpuDriver``: no SYCL device or launch here)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import triton
import triton.language as tl
from triton.runtime.driver import driver
from triton_helpers import (
    LIVE_BLOCK,
    LIVE_SIG,
    TARGET_SIMD32,
    CpuDriver,
    HostBuffer,
    deterministic_bench,
    live_kernel,
    triton_on_cpu,
)

import xpu_zebin
import xpu_zebin.triton as xt
from xpu_zebin.triton import autotune

TESTS = Path(__file__).resolve().parent
BENCH = TESTS.parent / "benches" / "autotune.py"


@pytest.fixture
def cpu(tmp_path, system_ocloc, monkeypatch):
    """The drop-in installed on a stand-in Triton driver, Triton compiling on the CPU into
    a fresh cache, and a spy on the package's compiles (the real ones, counted)."""
    monkeypatch.setenv("XPU_ZEBIN_OCLOC", system_ocloc)
    monkeypatch.setenv("TRITON_INTEL_DEVICE_ARCH", "pvc")
    # Recorded as unset: the 3.3 loader's switch the drop-in turns on is removed after.
    monkeypatch.setenv("TRITON_XPU_GEN_NATIVE_CODE", "")
    stand_in = CpuDriver()
    driver.set_active(stand_in)
    xt.install(stand_in.utils)
    stand_in.compiles = []
    real_compile = xpu_zebin.compile

    def counted(spirv, **kwargs):
        stand_in.compiles.append(kwargs.get("options"))
        return real_compile(spirv, **kwargs)

    monkeypatch.setattr(xpu_zebin, "compile", counted)
    stand_in.taken = []
    real_take = autotune.take

    def taken(key):
        found = real_take(key)
        if found is not None:
            stand_in.taken.append(key)
        return found

    monkeypatch.setattr(autotune, "take", taken)
    autotune._pending.clear()
    try:
        with triton_on_cpu(str(tmp_path / "triton-cache")):
            yield stand_in
    finally:
        xt.uninstall()
        driver.reset_active()
    assert not autotune._pending  # every build made for a benchmark was taken or dropped


def _live_tuner(stand_in: CpuDriver):
    # One warp overflows PTSS; 4 and 8 spill, then build in large GRF (2 warps would too,
    # at the cost of 4 and 8 together).
    configs = [triton.Config({}, num_warps=w) for w in (1, 4, 8)]
    fresh = triton.jit(live_kernel.fn)  # nothing compiled in this process yet
    return triton.autotune(configs=configs, key=[], do_bench=deterministic_bench(stand_in))(fresh)


def _tune_live(stand_in: CpuDriver, jobs: str, monkeypatch):
    monkeypatch.setenv("XPU_ZEBIN_AUTOTUNE_JOBS", jobs)
    tuner = _live_tuner(stand_in)
    args = [HostBuffer("float64") for _ in LIVE_SIG]
    tuner[(1,)](*args, BLOCK=LIVE_BLOCK)
    return tuner


@pytest.mark.slow
def test_a_ptss_config_is_skipped_as_triton_skips_it(cpu, modern_ocloc, tmp_path, monkeypatch):
    """One warp of the register-heavy kernel overflows PTSS in every GRF mode (IGC 2.x):
    Triton's autotuner skips it (OutOfResources: infinite time), concurrently as in
    sequence; its failed build, made before the benchmark, is not paid again in it."""
    monkeypatch.setenv("XPU_ZEBIN_OCLOC", modern_ocloc)
    cpu.target = TARGET_SIMD32
    tuner = _tune_live(cpu, "2", monkeypatch)
    timings = {c.num_warps: t for c, t in tuner.configs_timings.items()}
    assert timings[1] == [float("inf")] * 3 and all(t[0] < float("inf") for t in timings.values()
                                                    if t != timings[1])  # fmt: skip
    assert tuner.best_config.num_warps != 1
    assert len(cpu.taken) == 3  # every load found its build made at once, the failure too
    chosen = (tuner.best_config.num_warps, sorted(timings.items()))
    loaded = sorted((n, flags) for n, _, flags, _, _ in cpu.utils.calls)
    # The same kernel tuned one config at a time (fresh caches): the same answer.
    monkeypatch.setenv("XPU_ZEBIN_CACHE_DIR", str(tmp_path / "cache-sequential"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-sequential"))
    tuner = _tune_live(cpu, "1", monkeypatch)
    timings = {c.num_warps: t for c, t in tuner.configs_timings.items()}
    assert (tuner.best_config.num_warps, sorted(timings.items())) == chosen
    assert len(cpu.taken) == 3 and len(cpu.compiles) == 6  # in turn, inside the benchmark
    again = sorted((n, flags) for n, _, flags, _, _ in cpu.utils.calls[len(loaded) :])
    assert again == loaded  # the same kernels loaded, with the same GRF flags


def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        tl.store(out_ptr + offs, tl.load(x_ptr + offs) * 2.0)
    else:
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2.0, mask=offs < n)


def _scale_tuner(stand_in: CpuDriver, seen: dict):
    configs = [triton.Config({"BLOCK": b}, num_warps=w) for b in (128, 256, 512) for w in (2, 4)]

    def early_prune(configs, nargs, **kwargs):
        seen["pruned"] = seen.get("pruned", 0) + 1
        return [c for c in configs if c.kwargs["BLOCK"] != 512]

    def pre_hook(nargs, reset_only=False):
        seen["pre"] = seen.get("pre", 0) + 1

    def post_hook(nargs, exception):
        seen["post"] = seen.get("post", 0) + 1

    return triton.autotune(
        configs=configs, key=["n"], prune_configs_by={"early_config_prune": early_prune},
        reset_to_zero=["out_ptr"], restore_value=["x_ptr"], pre_hook=pre_hook,
        post_hook=post_hook, do_bench=deterministic_bench(stand_in),
    )(triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})(
        triton.jit(scale_kernel)))  # fmt: skip


def timings_of(tuner) -> dict:
    return tuner.configs_timings


def _tune_scale(stand_in: CpuDriver, jobs: str, monkeypatch) -> tuple:
    monkeypatch.setenv("XPU_ZEBIN_AUTOTUNE_JOBS", jobs)
    seen: dict = {}
    tuner = _scale_tuner(stand_in, seen)
    x, out = HostBuffer(), HostBuffer()
    tuner[(1,)](x, out, 4096)
    compiles, launches = len(stand_in.taken), len(stand_in.launched)
    tuner[(1,)](x, out, 4096)  # the key again: Triton's cache, nothing compiled
    assert len(stand_in.taken) == compiles and len(stand_in.launched) == launches + 1
    assert len(stand_in.compiles) == len(timings_of(tuner))  # each config built once
    builds = len(stand_in.compiles)
    tuner[(1,)](x, out, 8192)  # a new key, the same kernels: they are Triton's already
    tuner.nargs = {"x_ptr": x, "out_ptr": out, "n": 4096}
    assert len(tuner.prune_configs({})) == 4  # asked from outside its run: nothing built
    assert len(stand_in.compiles) == builds and not autotune._pending
    timings = sorted((str(c), t) for c, t in tuner.configs_timings.items())
    return str(tuner.best_config), timings, seen, x.calls, out.calls, compiles


def test_heuristics_prune_hooks_and_keys_seen_again(cpu, tmp_path, monkeypatch):
    concurrent = _tune_scale(cpu, "0", monkeypatch)
    assert concurrent[5] == 4  # all four pruned configs built at once, before the benchmark
    assert len(concurrent[1]) == 4 and concurrent[2]["pruned"] == 3  # keys 4096, 8192, asked
    cpu.compiles.clear()
    cpu.taken.clear()
    monkeypatch.setenv("XPU_ZEBIN_CACHE_DIR", str(tmp_path / "cache-sequential"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-sequential"))
    sequential = _tune_scale(cpu, "1", monkeypatch)
    assert sequential[5] == 0 and len(cpu.compiles) == 4  # in turn, inside the benchmark
    # The same choice, timings, hook calls and argument resets/restores.
    assert concurrent[:5] == sequential[:5]
    # Each config benchmarked as soon as it is built (the option): the same again.
    monkeypatch.setenv("XPU_ZEBIN_AUTOTUNE_PIPELINE", "1")
    monkeypatch.setenv("XPU_ZEBIN_CACHE_DIR", str(tmp_path / "cache-pipelined"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-pipelined"))
    monkeypatch.setenv("TRITON_XPU_GEN_NATIVE_CODE", "")
    cpu.compiles.clear()
    early: list = []
    real_early_bench = autotune._early_bench

    def counted_early_bench(tuner, args, kwargs):
        bench = real_early_bench(tuner, args, kwargs)
        return lambda config: (early.append(config), bench(config))

    monkeypatch.setattr(autotune, "_early_bench", counted_early_bench)
    pipelined = _tune_scale(cpu, "2", monkeypatch)
    assert pipelined[:5] == sequential[:5] and len(early) == 8  # two new keys, 4 configs
    assert not autotune._timed  # every early timing was taken by Triton's own loop


def test_silly_job_counts_compile_one_by_one(monkeypatch, caplog):
    for value in ("-1", "abc", "1e20", "nan", "inf", "2000", "²", "3.0"):
        autotune._warned.clear()
        monkeypatch.setenv("XPU_ZEBIN_AUTOTUNE_JOBS", value)
        assert autotune.jobs() == 1
    assert "not a whole number" in caplog.text
    monkeypatch.setenv("XPU_ZEBIN_AUTOTUNE_JOBS", "0")
    assert autotune.jobs() == xpu_zebin._core.default_jobs()
    monkeypatch.delenv("XPU_ZEBIN_AUTOTUNE_JOBS")
    monkeypatch.setenv("TRITON_AUTOTUNING_COMPILE_WORKERS", "3")  # upstream's knob
    assert autotune.jobs() == 3


@pytest.mark.slow
def test_benchmark_reports_the_same_choice(system_ocloc, tmp_path):
    """benches/autotune.py runs from a clean checkout: the environment's concurrent run
    chooses as the sequential ones and leaves the same Triton cache (no timing asserted)."""
    run = subprocess.run(
        [sys.executable, str(BENCH), "--ocloc", system_ocloc, "--smallest", "--no-dask", "--json"],
        capture_output=True, text=True, cwd=tmp_path, timeout=1800,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    # Both configs compiled ahead, at once: the choice compared is the concurrent path's.
    assert report["configs"] == 2 and report["precompiled"] == 2
    assert report["same_choice"] is True
    assert report["rounds"] == 1  # --smallest: one round, its ratios their own bounds
    for key in ("autotune_speedup", "sequential_dropin_speedup"):
        bounds = report["bounds"][key]
        assert bounds["pairs"] == 1 and report[key] > 0, key
        assert bounds["low"] == pytest.approx(report[key], abs=0.0011), key
        assert bounds["high"] == pytest.approx(report[key], abs=0.0011), key


CTRL_C_SCRIPT = """
import signal
signal.signal(signal.SIGINT, signal.default_int_handler)
import sys
sys.path.insert(0, sys.argv[1])
import triton
from triton.runtime.driver import driver
from triton_helpers import (LIVE_BLOCK, LIVE_SIG, TARGET_SIMD32, CpuDriver, HostBuffer,
                            deterministic_bench, live_kernel, triton_on_cpu)
import xpu_zebin.triton as xt
cpu = CpuDriver(TARGET_SIMD32)
driver.set_active(cpu)
xt.install(cpu.utils)
configs = [triton.Config({}, num_warps=w) for w in (1, 2, 4, 8)]
tuner = triton.autotune(configs=configs, key=[], do_bench=deterministic_bench(cpu))(live_kernel)
with triton_on_cpu(sys.argv[2]):
    print("tuning", flush=True)
    tuner[(1,)](*[HostBuffer("float64") for _ in LIVE_SIG], BLOCK=LIVE_BLOCK)
"""


@pytest.mark.slow
def test_ctrl_c_while_configs_compile_leaves_no_compiler(modern_ocloc, tmp_path, marker,
                                                         monkeypatch):  # fmt: skip
    monkeypatch.setenv("XPU_ZEBIN_OCLOC", modern_ocloc)
    monkeypatch.setenv("TRITON_INTEL_DEVICE_ARCH", "pvc")
    monkeypatch.setenv("XPU_ZEBIN_AUTOTUNE_JOBS", "2")
    script = tmp_path / "tune.py"  # Triton reads a kernel's source: a file, not -c
    script.write_text(CTRL_C_SCRIPT)
    child = subprocess.Popen(
        [sys.executable, str(script), str(TESTS), str(tmp_path / "triton-cache")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stdout.readline().strip() == "tuning"
    deadline = time.monotonic() + 120  # Triton's front end first, then the compilers

    def compiling() -> bool:  # a compile running: a compiler worker or an ocloc compile
        return any("_worker ocloc" in cmd or ("ocloc" in cmd and " compile " in cmd)
                   for _, cmd in marker.processes())  # fmt: skip

    while not compiling():
        assert child.poll() is None, child.communicate()
        assert time.monotonic() < deadline, "the child should have started compilers"
        time.sleep(0.05)
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=120)
    assert child.returncode != 0 and "KeyboardInterrupt" in err
    deadline = time.monotonic() + 30  # workers see their parent gone
    while marker.processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.processes() == []


def test_a_config_another_process_runs_is_compiled_last(cpu, monkeypatch):
    """The first front end asked steps aside (as when another process holds it): it is
    compiled after the others and benchmarked once (the pipelined benchmark skips it until
    then), each config built once."""
    from triton_helpers import add_kernel

    real = xpu_zebin._core.claim_triton_group
    stepped: list = []

    def held_elsewhere_once(key, filename, found, *args, step_aside=False, **kwargs):
        if step_aside and not stepped:
            stepped.append(filename)
            return None, True, "another process runs this front end: later"
        return real(key, filename, found, *args, step_aside=step_aside, **kwargs)

    monkeypatch.setattr(xpu_zebin._core, "claim_triton_group", held_elsewhere_once)
    monkeypatch.setenv("XPU_ZEBIN_AUTOTUNE_JOBS", "2")
    monkeypatch.setenv("XPU_ZEBIN_AUTOTUNE_PIPELINE", "1")
    early: list = []
    real_early_bench = autotune._early_bench

    def counted_early_bench(tuner, args, kwargs):
        bench = real_early_bench(tuner, args, kwargs)
        return lambda config: (early.append(config.kwargs["BLOCK"]), bench(config))

    monkeypatch.setattr(autotune, "_early_bench", counted_early_bench)
    configs = [triton.Config({"BLOCK": b}, num_warps=4) for b in (64, 128)]
    fresh = triton.jit(add_kernel.fn)
    tuner = triton.autotune(configs=configs, key=[], do_bench=deterministic_bench(cpu))(fresh)
    tuner[(1,)](*(HostBuffer("float32") for _ in range(3)), 1024)
    assert stepped, "no front end was asked to step aside"
    assert sorted(early) == [64, 128]  # each config benchmarked once, the later one too
    # One native build per config (the one built after the first load is made in Triton's
    # own native stage, as 3.3's loader asks once the drop-in turned it on).
    assert len(cpu.compiles) == 2
