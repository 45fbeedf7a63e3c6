"""Autotuning at full width, measured: the first call of a ``@triton.autotune`` kernel (an
attention-forward-like kernel with 24 configs: block sizes x num_warps x num_stages) in a
fresh process with empty caches, with the drop-in activated by the environment
(``XPU_ZEBIN_TRITON=1``: every config compiled at once before benchmarking) against none
(Triton's own autotuner: each config compiled in turn inside its benchmark).

No GPU here: Triton's driver object is a stand-in (``tests/triton_helpers.CpuDriver``) that
loads each kernel through the real Level Zero driver on the simulated PVC (upstream's
path: the driver's JIT; with the drop-in: the package's native build) and records launches
instead of running them; the benchmarker is a deterministic stand-in (a config's time is a
hash of what it launches), so both runs must choose the same config. Triton compiles for
real (triton-xpu 3.3 on the CPU).

    python benches/autotune.py [--ocloc OCLOC] [--quick | --smallest] [--no-dask] [--json]

JSON keys: ``autotune_speedup`` (none / environment), ``same_choice`` (the chosen config and
Triton's cache contents equal to Triton's own sequential run's), ``configs``,
``sequential_dropin_speedup`` (none / the drop-in with ``XPU_ZEBIN_AUTOTUNE_JOBS=1``: one
config at a time, each with both GRF modes at once on an idle core; triton-xpu 3.3's
loader switch makes Triton's own later compiles native there, so its cache differs),
``dask_speedup`` (none / configs built on a 2-worker local Dask cluster), ``precompiled``
(native builds the environment's run compiled before benchmarking), and each run's
seconds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import record

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"

CHILD = r"""
import json, os, sys, time
import _xpu_zebin_hook
_xpu_zebin_hook.activate()  # what the wheel's .pth line runs (a source checkout has none)
sys.path.insert(0, sys.argv[1])
import triton
import triton.language as tl
from triton.runtime.driver import driver
from triton_helpers import CpuDriver, HostBuffer, deterministic_bench, triton_on_cpu

cpu = CpuDriver()
driver.set_active(cpu)
precompiled = []
if _xpu_zebin_hook.parse_setting(os.environ.get("XPU_ZEBIN_TRITON")):
    # What the hook does to every XPUUtils object Triton's XPU driver makes.
    import xpu_zebin.triton
    import xpu_zebin.triton.autotune as ahead
    xpu_zebin.triton.install(cpu.utils, backend=False)
    # Count the native builds compiled before the benchmark, so a run where none were
    # (the concurrent path not taken) cannot pass for one that compared it.
    compile_ahead = ahead.precompile

    def counted(*args):
        keys = compile_ahead(*args)
        precompiled.extend(keys)
        return keys

    ahead.precompile = counted
size = sys.argv[3]
blocks_m, blocks_n, warps, stages = {
    "smallest": ((16,), (16, 32), (4,), (3,)),
    "quick": ((16, 32), (16, 32), (2, 4), (3,)),
    "full": ((16, 32), (16, 32, 64), (2, 4), (2, 3)),
}[size]
configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
           for m in blocks_m for n in blocks_n for w in warps for s in stages]


@triton.autotune(configs=configs, key=["N_CTX"], do_bench=deterministic_bench(cpu))
@triton.jit
def attn_fwd(Q, K, V, Out, sm_scale, stride_qm, stride_kn, stride_vn, stride_om, N_CTX,
             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :])
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(0, N_CTX, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = tl.load(K + offs_n[None, :] * stride_kn + offs_d[:, None])
        qk = tl.dot(q, k) * sm_scale
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_ij[:, None])
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + offs_n[:, None] * stride_vn + offs_d[None, :])
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
        m_i = m_ij
    acc = acc / l_i[:, None]
    tl.store(Out + offs_m[:, None] * stride_om + offs_d[None, :], acc.to(tl.float16))


with triton_on_cpu(sys.argv[2]):
    q, k, v, o = (HostBuffer("float16") for _ in range(4))
    started = time.perf_counter()
    attn_fwd[(1,)](q, k, v, o, 0.125, 64, 64, 64, 64, 1024, HEAD_DIM=64)
    seconds = time.perf_counter() - started
print(json.dumps({"seconds": seconds, "best": str(attn_fwd.best_config),
                  "configs": len(configs), "precompiled": len(precompiled)}))
"""


def _cache_digest(cache: Path) -> str:
    """What Triton's cache holds: every file's path and contents (but its group files,
    which name the cache directory itself)."""
    h = hashlib.sha256()
    for p in sorted(cache.rglob("*")):
        if p.is_file() and not p.name.startswith("__grp__"):
            h.update(str(p.relative_to(cache)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def run(name: str, env: dict, size: str, work: Path) -> dict:
    """One autotuner's first call in a fresh process with empty caches."""
    here = work / name
    here.mkdir()
    (here / "tmp").mkdir()
    child_env = {k: v for k, v in os.environ.items()
                 if not k.startswith(("XPU_ZEBIN_TRITON", "XPU_ZEBIN_AUTOTUNE",
                                      "TRITON_AUTOTUNING"))}  # fmt: skip
    child_env.update(
        XPU_ZEBIN_CACHE_DIR=str(here / "cache"),
        TMPDIR=str(here / "tmp"),
        XPU_ZEBIN_SIMULATED_DEVICE="pvc",
        TRITON_INTEL_DEVICE_ARCH="pvc",
    )
    child_env.update(env)
    # Triton reads a kernel's source from its file, and its IRs name that file: one file
    # for every run.
    script = work / "child.py"
    script.write_text(CHILD)
    out = subprocess.run(
        [sys.executable, str(script), str(TESTS), str(here / "triton-cache"),
         size],
        capture_output=True, text=True, env=child_env, timeout=3600,
    )  # fmt: skip
    if out.returncode != 0:
        raise SystemExit(f"{name}: {out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["triton_cache"] = _cache_digest(here / "triton-cache")
    result["triton_cache_files"] = sum(1 for p in (here / "triton-cache").rglob("*") if p.is_file())
    print(
        f"{name}: {result['seconds']:.2f} s, chose {result['best']}, Triton's cache "
        f"{result['triton_cache_files']} files {result['triton_cache'][:12]}",
        file=sys.stderr,
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ocloc", default=None, help="the drop-in's ocloc (else PATH)")
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--quick", action="store_true", help="8 configs")
    sizes.add_argument(
        "--smallest", action="store_true",
        help="2 configs (the tests' run): checks the script, not the figures",
    )  # fmt: skip
    parser.add_argument("--no-dask", action="store_true", help="skip the Dask row")
    parser.add_argument("--json", action="store_true", help="one line of JSON last")
    record.add_output_argument(parser)
    args = parser.parse_args()
    size = "smallest" if args.smallest else "quick" if args.quick else "full"
    on = {"XPU_ZEBIN_TRITON": "1"}
    if args.ocloc:
        on["XPU_ZEBIN_OCLOC"] = args.ocloc
    work = Path(tempfile.mkdtemp(prefix="xpu-zebin-autotune-"))
    cluster = None
    try:
        none = run("none", {}, size, work)
        env = run("environment", on, size, work)
        sequential = run("environment, jobs=1", {**on, "XPU_ZEBIN_AUTOTUNE_JOBS": "1"},
                         size, work)  # fmt: skip
        report = {
            "configs": none["configs"],
            "none_seconds": none["seconds"],
            "environment_seconds": env["seconds"],
            "sequential_dropin_seconds": sequential["seconds"],
            "autotune_speedup": none["seconds"] / env["seconds"],
            "sequential_dropin_speedup": none["seconds"] / sequential["seconds"],
            # Against Triton's own sequential run: the choice and Triton's cache contents.
            "same_choice": none["best"] == env["best"]
            and none["triton_cache"] == env["triton_cache"],
            # Native builds the environment's run compiled before benchmarking (one per
            # config whose kernel differs); Triton's own run compiles none ahead.
            "precompiled": env["precompiled"],
            "sequential_dropin_same_choice": sequential["best"] == none["best"],
            "cores": os.cpu_count(),
        }
        if not args.no_dask:
            from distributed import LocalCluster

            cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                   dashboard_address=None)  # fmt: skip
            dask = run("environment, 2 Dask workers",
                       {**on, "XPU_ZEBIN_AUTOTUNE_SCHEDULER": cluster.scheduler_address},
                       size, work)  # fmt: skip
            report.update(dask_seconds=dask["seconds"],
                          dask_speedup=none["seconds"] / dask["seconds"],
                          dask_same_choice=dask["best"] == none["best"]
                          and dask["triton_cache"] == none["triton_cache"])  # fmt: skip
    finally:
        if cluster is not None:
            cluster.close()
        if not os.environ.get("XPU_ZEBIN_BENCH_KEEP"):
            shutil.rmtree(work, ignore_errors=True)
    for key, value in report.items():
        print(f"{key}: {value:.3f}" if isinstance(value, float) else f"{key}: {value}")
    record.write(args.output, "autotune", report, args.ocloc)
    if args.json:
        print(json.dumps(report))


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"total {time.perf_counter() - started:.1f} s", file=sys.stderr)
