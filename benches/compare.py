#!/usr/bin/env python3
"""Compile latency of xpu-zebin beside the upstream approach, measured in one run.

The baseline does what upstream Triton's ``make_zebin`` does: one ``ocloc`` process per
attempt, the GRF ladder (default, then large) tried one after the other, no cache, the same
retry rule (a failure, or any spill). Both sides use the same compiler and the same inputs:
real Triton SPIR-V (compiled on the CPU by triton-xpu) and a generated kernel that overflows
per-thread scratch space at default GRF. Every number is a ratio against the baseline from
this run, from interleaved pairs (``pairs.py``): each row's median ratio, the 99% interval
where another run's median should fall (the lower bound is the claim), how many pairs it
took and what the ratio is made of.
Prints a table and, with ``--json``, one JSON object as its last line (``bounds`` and
``made_of`` beside the ratios).

    python benches/compare.py --ocloc ~/.cache/xpu-zebin/toolchain/modern/bin/ocloc --json

``--rows offline,dask,level-zero,sweep,memory`` runs those groups of rows only (default:
all but dask, which ``--dask`` adds).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

# Level Zero on Intel's real driver with a simulated PVC device (no GPU on CI machines).
os.environ.setdefault("XPU_ZEBIN_SIMULATED_DEVICE", "pvc")

import pairs
import record
import triton
import triton.language as tl
from triton.backends import backends
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import xpu_zebin
from xpu_zebin import _core, samples

GRF256 = "-cl-intel-256-GRF-per-thread"


# --- inputs --------------------------------------------------------------------------------


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(
        out_ptr + offs,
        tl.load(x_ptr + offs, mask=mask) * 2 + tl.load(y_ptr + offs, mask=mask),
        mask=mask,
    )


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):  # fmt: skip
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a = a_ptr + rm[:, None] * sam + rk[None, :] * sak
    b = b_ptr + rk[:, None] * sbk + rn[None, :] * sbn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(0, K, BK):
        acc += tl.dot(tl.load(a), tl.load(b))
        a += BK * sak
        b += BK * sbk
    tl.store(c_ptr + rm[:, None] * scm + rn[None, :] * scn, acc)


@triton.jit
def live_kernel(x_ptr, y_ptr, z_ptr, out_ptr, BLOCK: tl.constexpr):
    """Three fp64 tiles live across a reduction: one warp overflows PTSS, more warps spill."""
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    y = tl.load(y_ptr + offs)
    z = tl.load(z_ptr + offs)
    s = tl.sum(x * y + z, axis=0)
    tl.store(out_ptr + offs, x * s + y * s + z)


ARCH = {
    "architecture": 0, "name": "pvc", "max_work_group_size": 1024, "max_num_sub_groups": 64,
    "sub_group_sizes": [16, 32], "has_fp64": True,
    "has_subgroup_matrix_multiply_accumulate": False,
    "has_subgroup_matrix_multiply_accumulate_tensor_float32": False,
    "has_subgroup_2d_block_io": False,
}  # fmt: skip


def scratch_dir(prefix: str) -> str:
    """A new temporary directory, removed when this process ends (a run makes hundreds of
    fresh caches: none is left behind in the temp directory)."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def triton_spirv(smallest: bool = False) -> Dict[str, bytes]:
    """Real Triton SPIR-V for a few kernels, compiled on the CPU with triton-xpu
    (``smallest``: one add kernel for every add, the small matmul for both matmuls)."""

    class ArchParser:  # Triton's parser needs SYCL headers; the device is named instead.
        @staticmethod
        def parse_device_arch(_architecture: int) -> str:
            return "pvc"

    backends["intel"].compiler.__init__.__globals__["compile_module_from_src"] = lambda *a, **k: (
        ArchParser()
    )
    if "TRITON_CACHE_DIR" not in os.environ:  # a cache of this run's, removed at its end
        os.environ["TRITON_CACHE_DIR"] = scratch_dir("xpu-zebin-bench-")

    target = GPUTarget("xpu", ARCH, 16)

    def build(fn, signature, constants, num_warps=4) -> bytes:
        names = list(signature)
        src = ASTSource(fn, signature, {(names.index(k),): v for k, v in constants.items()})
        return triton.compile(src, target=target, options={"num_warps": num_warps}).asm["spv"]

    add_sig = {
        "x_ptr": "*fp32",
        "y_ptr": "*fp32",
        "out_ptr": "*fp32",
        "n": "i32",
        "BLOCK": "constexpr",
    }
    mm_sig = {
        **{p: "*fp32" for p in ("a_ptr", "b_ptr", "c_ptr")},
        **{p: "i32" for p in ("M", "N", "K", "sam", "sak", "sbk", "sbn", "scm", "scn")},
        **{p: "constexpr" for p in ("BM", "BN", "BK")},
    }
    if smallest:
        add = build(add_kernel, add_sig, {"BLOCK": 256})
        kernels = {f"add{b}": add for b in (256, 512, 1024, 2048)}
        kernels["matmul64"] = build(matmul_kernel, mm_sig, {"BM": 64, "BN": 64, "BK": 32})
        kernels["matmul128"] = kernels["matmul64"]
        return kernels
    kernels = {f"add{b}": build(add_kernel, add_sig, {"BLOCK": b}) for b in (256, 512, 1024, 2048)}
    kernels["matmul64"] = build(matmul_kernel, mm_sig, {"BM": 64, "BN": 64, "BK": 32})
    kernels["matmul128"] = build(matmul_kernel, mm_sig, {"BM": 128, "BN": 128, "BK": 32})
    return kernels


# --- the baseline: upstream make_zebin's approach ------------------------------------------


def baseline_compile(ocloc: str, spirv: bytes, device: str = "pvc") -> str:
    """One ocloc process per attempt, the ladder in sequence, no cache. Returns the flags."""
    env = dict(os.environ, IGC_EnableZEBinary="1")
    chosen = None
    with tempfile.TemporaryDirectory(prefix="xpu-zebin-baseline-") as tmp:
        src = Path(tmp) / "kernel.spv"
        src.write_bytes(spirv)
        for flags in ("", GRF256):
            out = Path(tmp) / f"out{len(flags)}"
            out.mkdir()
            cmd = [
                ocloc, "compile", "-file", str(src), "-spirv_input", "-device", device,
                "-output", "kernel", "-output_no_suffix", "-out_dir", str(out),
            ]  # fmt: skip
            if flags:
                cmd += ["-options", flags]
            run = subprocess.run(cmd, capture_output=True, env=env)
            if run.returncode != 0:
                continue  # a failed attempt: on to the next GRF mode
            chosen = flags
            spills = xpu_zebin.zebin_info(next(out.iterdir()).read_bytes())["kernels"][0]
            spilled = spills["spill_size"] if spills["spill_size"] is not None else (
                b"spilled" in run.stdout)  # fmt: skip
            if not spilled:
                break
    if chosen is None:
        raise RuntimeError("baseline: every attempt failed")
    return chosen


# --- measuring -----------------------------------------------------------------------------


def summary(times: List[float]) -> str:
    med = statistics.median(times)
    return f"{med:8.3f} s  [{min(times):.3f}-{max(times):.3f}]"


def peak_rss_mb(side: str, ocloc: str, spirv_path: Path) -> float:
    """Peak RSS (MiB) of the compiler processes one side starts for one kernel, measured
    in a fresh Python so nothing else this run started is counted."""
    out = subprocess.run(
        [sys.executable, __file__, "--rss-probe", side, "--ocloc", ocloc, str(spirv_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip().splitlines()[-1]) / 1024


def rss_probe(side: str, ocloc: str, spirv_path: str) -> int:
    spirv = Path(spirv_path).read_bytes()
    if side == "baseline":
        baseline_compile(ocloc, spirv)
    else:
        xpu_zebin.compile(spirv, device="pvc", ocloc=ocloc, cache=False, speculative=False)
        _core.shutdown_workers()  # reaped workers count in RUSAGE_CHILDREN
    print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    return 0


def dask_batch(ocloc: str, batch: List[bytes], bench: Bench) -> None:
    """The mixed batch on a 2-worker Dask LocalCluster (workers warm, as a standing cluster
    has them) against the local compile_many and the sequential baseline, same run."""
    from xpu_zebin.dask import cluster_client

    reqs = [{"spirv": s, "device": "pvc", "ocloc": ocloc, "cache": False} for s in batch]
    with cluster_client(local_workers=2) as client:
        xpu_zebin.compile_many(reqs[:2], client=client)  # start each worker's compilers
        bench.compare(
            "dask_batch_speedup", f"batch of {len(batch)} on 2 Dask workers",
            lambda: [baseline_compile(ocloc, s) for s in batch],
            lambda: xpu_zebin.compile_many(reqs, client=client),
            "the batch's compile work on 2 cores; Dask adds its scheduling",
        )  # fmt: skip
        local = bench.compare(
            "dask_overhead", "the same batch: local compile_many / on Dask",
            lambda: xpu_zebin.compile_many(reqs),
            lambda: xpu_zebin.compile_many(reqs, client=client),
            "the cost of Dask's scheduling and transfers (below 1: Dask is slower)",
        )  # fmt: skip
    bench.results["dask_overhead_percent"] = round(100 * (1 / local.median - 1), 1)


@contextlib.contextmanager
def restored(*names: str):
    """The named environment variables as they were before the block, also when it fails;
    the others untouched (clearing all of os.environ to restore it would leave a native
    thread a moment with no PATH)."""
    saved = {name: os.environ.get(name) for name in names}
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@restored(
    "XPU_ZEBIN_OCLOC",
    "TRITON_INTEL_DEVICE_ARCH",
    "TRITON_CACHE_DIR",
    "XPU_ZEBIN_CACHE_DIR",
    "TRITON_XPU_GEN_NATIVE_CODE",
)  # the row's settings are its own, also when it fails
def sweep(ocloc: str, bench: Bench) -> None:
    """An autotune sweep of 6 configs (num_warps 1..32) of a register-heavy kernel: as
    Triton's autotuner compiles it (one config after another, upstream make_zebin: one
    ocloc per attempt, the ladder in sequence) against compile_configs, each from a cold
    Triton cache and a cold binary cache."""
    import xpu_zebin.triton as xt

    results = bench.results
    sig = {name: "*fp64" for name in ("x_ptr", "y_ptr", "z_ptr", "out_ptr")}
    # Smallest: two configs of a block that neither overflows nor spills.
    block, warps = (1024, (4, 8)) if bench.smallest else (16384, (1, 2, 4, 8, 16, 32))
    configs = [triton.Config({"BLOCK": block}, num_warps=w) for w in warps]
    target = GPUTarget("xpu", ARCH, 32)
    names = live_kernel.arg_names
    full_sig = {n: "constexpr" if n == "BLOCK" else sig[n] for n in names}
    os.environ["XPU_ZEBIN_OCLOC"] = ocloc
    os.environ["TRITON_INTEL_DEVICE_ARCH"] = "pvc"
    split = {"front_end_s": [], "igc_s": []}

    root = scratch_dir("xpu-zebin-sweep-")  # every pair's cold caches, removed at the end

    def fresh_caches() -> None:
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-", dir=root)
        os.environ["XPU_ZEBIN_CACHE_DIR"] = tempfile.mkdtemp(prefix="bins-", dir=root)

    def baseline() -> None:
        fresh_caches()
        os.environ.pop("TRITON_XPU_GEN_NATIVE_CODE", None)  # Triton stops at SPIR-V
        front = igc = 0.0
        for c in configs:
            t = time.perf_counter()
            src = ASTSource(live_kernel, full_sig, {(names.index("BLOCK"),): block})
            spirv = triton.compile(src, target=target, options={"num_warps": c.num_warps})
            front += time.perf_counter() - t
            t = time.perf_counter()
            try:
                baseline_compile(ocloc, spirv.asm["spv"])
            except RuntimeError:
                pass  # the overflowing config: the autotuner skips it
            igc += time.perf_counter() - t
        split["front_end_s"].append(front)
        split["igc_s"].append(igc)

    def package() -> None:
        fresh_caches()
        os.environ["TRITON_XPU_GEN_NATIVE_CODE"] = "1"
        try:
            xt.compile_configs(live_kernel, sig, configs, target=target)
        finally:
            os.environ.pop("TRITON_XPU_GEN_NATIVE_CODE", None)
            xt.uninstall()

    bench.compare(
        "sweep_speedup", f"autotune sweep of {len(configs)} configs", baseline, package,
        "the baseline runs Triton's front end and each config's ladder one after another; "
        "the package runs configs on 2 cores, both GRF modes at once",
    )  # fmt: skip
    results["sweep_baseline_split_s"] = {
        k: round(statistics.median(v), 2) for k, v in split.items()
    }


class Bench:
    """One run's table rows and JSON results; every ratio is measured in this run, from
    interleaved pairs (`pairs.py`): its median, the 99% interval where another run's
    median should fall, and what it is made of."""

    def __init__(self, repeat: int, smallest: bool = False, budget_s: float = 60.0) -> None:
        self.repeat = repeat
        #: Every row on its smallest input, once: the script checked, not the figures.
        self.smallest = smallest
        #: A row adds pairs until settled or this many seconds are spent (none: smallest).
        self.budget_s = 0.0 if smallest else budget_s
        self.rows: list = []
        self.results: Dict[str, Any] = {"bounds": {}, "made_of": {}}
        self.times: list = []  # each row's measured seconds, both columns

    def at_least(self, repeat: int) -> int:
        """`repeat` samples for a row that needs that many, one on the smallest input."""
        return 1 if self.smallest else max(self.repeat, repeat)

    def compare(
        self, metric: str, label: str, base: Callable, pkg: Callable, made_of: str,
        floor: int = 0, budgets: float = 1.0,
    ) -> pairs.Ratio:  # fmt: skip
        """One row: `base` and `pkg` in interleaved pairs, at least `floor` (else
        `repeat`), for up to `budgets` times the run's budget; `made_of` says what the
        baseline pays that the package does not."""
        floor = 1 if self.smallest else max(floor, self.repeat)
        ratio = pairs.measure(base, pkg, floor=floor, budget_s=self.budget_s * budgets)
        return self.record(metric, label, ratio, made_of)

    def record(self, metric: str, label: str, ratio: pairs.Ratio, made_of: str) -> pairs.Ratio:
        """A row measured: its ratio, bounds and what it is made of, in the table and JSON."""
        self.results[metric] = round(ratio.median, 2)
        self.results["bounds"][metric] = ratio.bounds()
        self.results["made_of"][metric] = made_of
        self.add(label, ratio)
        print(f"  {label}: {ratio.said()}", file=sys.stderr)
        return ratio

    def add(self, label: str, ratio: pairs.Ratio) -> None:
        """One row of the table and of the JSON (each side's seconds, and the ratio)."""
        base, pkg = ratio.baseline_s, ratio.package_s
        self.rows.append((label, summary(base), summary(pkg), ratio))
        self.times.append(
            {"label": label, "baseline_s": base, "package_s": pkg, "ratio": ratio.median,
             **ratio.bounds()}
        )  # fmt: skip


#: Rows whose sides build one kernel each (both GRF modes) vary by about 9% from one pair
#: to the next (the VM's speed): with the 4 pairs of one budget their medians moved 11%
#: from run to run (PTSS), 8% with 8 (Level Zero retry). Four budgets give the PTSS row 12
#: to 16 pairs (its median's error about halves), two the retry row about 16 (30% less).
PTSS_BUDGETS = 4.0
RETRY_BUDGETS = 2.0


#: A side of a few milliseconds (a cache hit, a native load) is the median of this many
#: calls a pair: one call's noise is of its own size (758-1,000 and 1,300-2,150 between
#: runs of one row when it was a single call).
FAST_SIDE_CALLS = 11


def offline_cases(bench: Bench, ocloc: str, kernels: dict, batch: list) -> None:
    """ocloc: the PTSS fallback, a batch, small kernels, the warm cache."""
    ptss = xpu_zebin.opencl_to_spirv(samples.ptss_overflow_kernel(), ocloc=ocloc)
    small = [kernels[f"add{b}"] for b in (256, 512, 1024, 2048)] * 5  # 20 small kernels
    small = small[:1] if bench.smallest else small

    def package(spirv: bytes, **kw) -> xpu_zebin.CompileResult:
        return xpu_zebin.compile(spirv, device="pvc", ocloc=ocloc, **{"cache": False, **kw})

    package(kernels["add256"])  # warm the persistent worker once, as a long-lived process has it
    bench.compare(
        "fallback_speedup", "PTSS kernel, needs large GRF",
        lambda: baseline_compile(ocloc, ptss), lambda: package(ptss),
        "the baseline runs the two GRF modes one after the other, each in a new ocloc "
        "process; the package starts the large-GRF build beside the default one on an idle "
        "core once the default has run XPU_ZEBIN_SPECULATE_AFTER (0.2 s; src/ladder.rs): at "
        "most (t_128 + t_256) / max(t_128, t_256), less what two builds at once cost each other",
        budgets=PTSS_BUDGETS,
    )  # fmt: skip
    bench.compare(
        "batch_speedup", f"mixed batch of {len(batch)} Triton kernels",
        lambda: [baseline_compile(ocloc, s) for s in batch],
        lambda: xpu_zebin.compile_many(
            [{"spirv": s, "device": "pvc", "ocloc": ocloc, "cache": False} for s in batch]
        ),
        "compile work on 1 core against 2, plus an ocloc process start per attempt",
    )  # fmt: skip
    bench.compare(
        "small_kernel_speedup", f"{len(small)} small Triton kernels, one after another",
        lambda: [baseline_compile(ocloc, s) for s in small],
        lambda: [package(s) for s in small],
        "mostly an ocloc process start per kernel (IGC loaded each time), against a warm "
        "worker; one core each",
    )  # fmt: skip
    heavy = kernels["matmul128"]
    with tempfile.TemporaryDirectory() as root:
        made: List[str] = []  # each pair's cold cache, which its warm side reads

        def cold() -> None:
            made.append(tempfile.mkdtemp(dir=root))
            package(heavy, cache=True, cache_dir=made[-1])

        bench.compare(
            "warm_cache_speedup", "register-heavy matmul: cold / warm cache",
            cold, pairs.median_of(lambda: package(heavy, cache=True, cache_dir=made[-1]),
                                  FAST_SIDE_CALLS),
            f"a compile against a cache hit (no compiler runs; the median of {FAST_SIDE_CALLS} "
            "hits a pair)",
        )  # fmt: skip


def ze(spirv: bytes, kernel: Optional[str] = None, **kw) -> None:
    """One Level Zero load of ``spirv``'s ``kernel`` (default: its first), no cache unless
    asked, closed."""
    kernel = kernel or _core.validate_spirv(spirv)[0]
    with xpu_zebin.compile_and_load(spirv, kernel, **{"cache": False, **kw}):
        pass


def level_zero_cases(bench: Bench, kernels: dict, batch: list) -> None:
    """Level Zero on the simulated device: upstream's load_binary builds in-process, one GRF
    mode after the other; the package builds in crash-isolated workers, concurrently."""
    heavy = kernels["matmul128"]
    with tempfile.TemporaryDirectory() as cache_dir:

        def ze_load(cache: bool):
            with xpu_zebin.compile_and_load(
                heavy, "matmul_kernel", cache=cache, cache_dir=cache_dir
            ):
                pass

        ze_load(True)  # store the native binary
        bench.compare(
            "ze_warm_load_speedup", "Level Zero: JIT load / warm native load",
            lambda: ze_load(False), pairs.median_of(lambda: ze_load(True), FAST_SIDE_CALLS),
            "the driver's JIT of the SPIR-V against a load of the cached native binary (the "
            f"median of {FAST_SIDE_CALLS} loads a pair)",
        )  # fmt: skip
        with xpu_zebin.compile_and_load(heavy, "matmul_kernel", cache=False) as built:
            native, flags = built.native_binary, built.build_flags

        def native_load() -> None:
            with xpu_zebin.compile_and_load(
                native, "matmul_kernel", is_spv=False, build_flags=flags
            ):
                pass

        # What Triton's load_binary hands over (its cached zebin): loaded, nothing kept
        # (no entry is encoded for it: a level-15 frame cost 2-25 ms a load before).
        bench.compare(
            "ze_native_load_speedup", "Level Zero: JIT load / native binary handed over",
            lambda: ze_load(False), pairs.median_of(native_load, FAST_SIDE_CALLS),
            "the driver's JIT of the SPIR-V against a load of the native binary Triton hands "
            f"over (the median of {FAST_SIDE_CALLS} loads a pair)",
        )  # fmt: skip

    def ze_many(spirvs: List[bytes]) -> None:
        reqs = [
            {"binary": s, "kernel_name": _core.validate_spirv(s)[0], "cache": False} for s in spirvs
        ]
        for r in xpu_zebin.compile_and_load_many(reqs):
            if isinstance(r, Exception):
                raise r
            r.close()

    ze_many([kernels["add256"]] * 2)  # two warm workers, as a long-lived process has them
    # A real Triton matmul (64x64x32, 4 warps) that spills at 128 GRF (over 1024 bytes per
    # hardware thread) and is retried; its two builds take about as long each, the case
    # speculation is for. The gain is bounded by (t_128 + t_256) / max(t_128, t_256).
    bench.compare(
        "ze_fallback_speedup", "Level Zero: kernel retried in large GRF",
        lambda: ze(kernels["matmul64"], isolated=False), lambda: ze(kernels["matmul64"]),
        "the two GRF modes one after the other in this process, against both at once in "
        "warm workers; at most (t_128 + t_256) / max(t_128, t_256)",
        budgets=RETRY_BUDGETS,
    )  # fmt: skip
    bench.compare(
        "ze_batch_speedup", f"Level Zero: batch of {len(batch)} Triton kernels",
        lambda: [ze(s, isolated=False) for s in batch], lambda: ze_many(batch),
        "above 2 on 2 cores: the baseline JITs one kernel after another and each kernel's "
        "GRF modes in sequence in one thread (the driver's compiler is serial in a "
        "process); the package's workers build kernels and modes at once",
    )  # fmt: skip
    isolation = bench.record(
        "ze_isolation_ratio", "Level Zero small kernel: in-process/isolated",
        isolation_ratio(bench, kernels["add1024"]),
        "no compile work saved: what crash isolation costs (a worker's round trip); "
        f"pairs made in {ISOLATION_PROCESSES} fresh processes or more",
    )  # fmt: skip
    bench.results["ze_isolation_overhead_percent"] = round(100 * (1 / isolation.median - 1), 1)


#: The isolation row's pairs are made in at least this many fresh processes, each making
#: ISOLATION_PAIRS: the in-process side moved by 9-20% from one run to the next (a run's
#: process state) while the pairs within each run agreed to 2%.
ISOLATION_PROCESSES = 6
ISOLATION_PAIRS = 30


def isolation_ratio(bench: Bench, spirv: bytes) -> pairs.Ratio:
    """The isolation row from fresh processes (``--isolation-pairs``), more of them until
    the row is settled or its budget is spent; one pair in one on the smallest input."""
    processes = 1 if bench.smallest else ISOLATION_PROCESSES
    count = 1 if bench.smallest else ISOLATION_PAIRS
    made: List[tuple] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        spirv_path = Path(tmp) / "small.spv"
        spirv_path.write_bytes(spirv)
        while True:
            argv = [sys.executable, __file__, "--isolation-pairs", str(count), str(spirv_path)]
            Path(isolation_reply(str(spirv_path))).unlink(missing_ok=True)
            try:
                run = subprocess.run(argv, capture_output=True, text=True, timeout=900)
            except subprocess.TimeoutExpired as e:
                raise RuntimeError(f"isolation pairs: no pairs in {e.timeout} s") from e
            if run.returncode != 0:
                raise RuntimeError(f"isolation pairs failed: {run.stderr[-2000:]}")
            # A file, not stdout: a C library's late write to stdout cannot garble it.
            try:
                said = json.loads(Path(isolation_reply(str(spirv_path))).read_text())
            except (OSError, ValueError) as e:
                raise RuntimeError(f"isolation pairs: no reply ({e}): {run.stderr[-2000:]}") from e
            made.append((said["baseline_s"], said["package_s"]))
            ratio = pairs.pooled(made)
            spent = time.perf_counter() - started >= bench.budget_s
            if len(made) >= processes and (ratio.settled or spent):
                return ratio


def isolation_reply(spirv_path: str) -> str:
    """Where a process of the isolation row writes its pairs (JSON), beside its SPIR-V."""
    return spirv_path + ".pairs.json"


def isolation_pairs(spirv_path: str, count: int) -> int:
    """One process's pairs for the isolation row (JSON, :func:`isolation_reply`): the
    driver's in-process JIT against the same build in a worker, both warm first."""
    spirv = Path(spirv_path).read_bytes()
    kernel = _core.validate_spirv(spirv)[0]
    in_process = lambda: ze(spirv, kernel, isolated=False)  # noqa: E731
    isolated = lambda: ze(spirv, kernel, isolated=True)  # noqa: E731
    in_process()  # the driver loaded in this process
    isolated()  # a worker started
    ratio = pairs.measure(in_process, isolated, floor=count, budget_s=0)
    said = {"baseline_s": ratio.baseline_s, "package_s": ratio.package_s}
    Path(isolation_reply(spirv_path)).write_text(json.dumps(said))
    _core.shutdown_workers()
    return 0


def print_report(bench: Bench, ocloc: str, machine: str) -> None:
    results = bench.results
    print(f"\nxpu-zebin {xpu_zebin.__version__} vs upstream make_zebin approach ({machine})")
    print(f"compiler: {ocloc}\n")
    print(f"| {'case':44} | {'baseline (median [min-max])':28} | {'xpu-zebin':28} | ratio "
          "| lower bound | pairs |")  # fmt: skip
    print(f"|{'-' * 46}|{'-' * 30}|{'-' * 30}|-------|-------------|-------|")
    for label, b, p, r in bench.rows:
        pairs_said = f"{r.pairs}" + ("" if r.settled else " (budget)")
        print(f"| {label:44} | {b:28} | {p:28} | {r.median:5.1f} | {r.low:11.2f} "
              f"| {pairs_said:5} |")  # fmt: skip
    print("\nWhat each ratio is made of:")
    for metric, made_of in results["made_of"].items():
        print(f"  {metric}: {made_of}")
    if "peak_rss_mb" in results:
        rss = results["peak_rss_mb"]
        print(f"\npeak RSS: baseline ocloc {rss['baseline_ocloc']} MiB, "
              f"package worker {rss['package_workers']} MiB")  # fmt: skip
    if "dask_overhead_percent" in results:
        print(f"Dask: {results['dask_overhead_percent']}% over the local compile_many, same batch")
    if "sweep_baseline_split_s" in results:
        split = results["sweep_baseline_split_s"]
        print(f"autotune sweep, sequential baseline: Triton front-end {split['front_end_s']} s, "
              f"ocloc/IGC {split['igc_s']} s")  # fmt: skip
    if "ze_isolation_overhead_percent" in results:
        print("Level Zero isolation overhead on a small kernel (warm worker): "
              f"{results['ze_isolation_overhead_percent']}%")  # fmt: skip


#: The rows by group (``--rows``): ocloc's rows, the batch on Dask (only when asked: by
#: name or ``--dask``), Level Zero's, the autotune sweep, and the compilers' peak memory.
ROW_GROUPS = ("offline", "dask", "level-zero", "sweep", "memory")


def row_groups(text: str) -> tuple:
    """``--rows``: a comma-separated subset of :data:`ROW_GROUPS`, run in their order."""
    asked = {g.strip() for g in text.split(",") if g.strip()}
    unknown = asked - set(ROW_GROUPS)
    if not asked or unknown:
        raise argparse.ArgumentTypeError(f"expected some of {','.join(ROW_GROUPS)}, not {text!r}")
    return tuple(g for g in ROW_GROUPS if g in asked)


def selected_rows(rows: Any, dask: bool) -> List[str]:
    """The groups a run makes, in :data:`ROW_GROUPS`' order: ``--rows``' (default: all but
    dask), and dask with ``--dask``."""
    asked = set(rows or [g for g in ROW_GROUPS if g != "dask"]) | ({"dask"} if dask else set())
    return [g for g in ROW_GROUPS if g in asked]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--ocloc", default=None, help="compiler for both sides (default: discovery)"
    )
    parser.add_argument("--repeat", type=int, default=3, help="pairs per row, at least")
    parser.add_argument(
        "--budget", type=pairs.seconds, default=60.0,
        help="seconds a row may add pairs for until its ratio is settled (default 60; the "
        "PTSS row 4 times that, the Level Zero retry row twice)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    parser.add_argument(
        "--dask",
        action="store_true",
        help="also run the batch on a 2-worker Dask LocalCluster (the dask rows)",
    )
    parser.add_argument(
        "--smallest", action="store_true",
        help="every row on its smallest input, once: checks the script, not the figures",
    )  # fmt: skip
    record.add_output_argument(parser)
    parser.add_argument(
        "--rows", type=row_groups, default=None,
        help=f"which groups of rows, comma-separated, of {','.join(ROW_GROUPS)} (default: "
        "all but dask)",
    )  # fmt: skip
    parser.add_argument("--rss-probe", choices=["baseline", "package"], help=argparse.SUPPRESS)
    parser.add_argument("--isolation-pairs", type=int, help=argparse.SUPPRESS)
    parser.add_argument("spirv", nargs="?", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_probe:
        return rss_probe(args.rss_probe, args.ocloc, args.spirv)
    if args.isolation_pairs is not None:
        return isolation_pairs(args.spirv, max(1, args.isolation_pairs))
    ocloc = os.fspath(xpu_zebin.find_ocloc(args.ocloc))
    bench = Bench(max(1, args.repeat), args.smallest, max(0.0, args.budget))
    print(f"compiler: {ocloc}", file=sys.stderr)
    kernels = triton_spirv(args.smallest)
    batch = [kernels[k] for k in ("add256", "add512", "add1024", "add2048")]
    batch += [kernels["matmul64"], kernels["matmul128"], kernels["matmul64"], kernels["matmul128"]]
    batch = [kernels["add256"], kernels["matmul64"]] if args.smallest else batch
    rows = selected_rows(args.rows, args.dask)
    if "offline" in rows:
        offline_cases(bench, ocloc, kernels, batch)
    if "dask" in rows:
        dask_batch(ocloc, batch, bench)
    if "level-zero" in rows:
        level_zero_cases(bench, kernels, batch)
    if "sweep" in rows:
        sweep(ocloc, bench)
    if "memory" in rows:
        spv_path = Path(scratch_dir("xpu-zebin-memory-")) / "heavy.spv"
        spv_path.write_bytes(kernels["matmul128"])
        bench.results["peak_rss_mb"] = {
            "baseline_ocloc": round(peak_rss_mb("baseline", ocloc, spv_path), 1),
            "package_workers": round(peak_rss_mb("package", ocloc, spv_path), 1),
        }
    _core.shutdown_workers()
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    print_report(bench, ocloc, machine)
    bench.results.update(compiler=ocloc, machine=machine, repeat=bench.repeat,
                         smallest=bench.smallest, row_groups=rows)  # fmt: skip
    record.write(args.output, "compare", {**bench.results, "rows": bench.times}, ocloc)
    if args.json:
        print(json.dumps(bench.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
