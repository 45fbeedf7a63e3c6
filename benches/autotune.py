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
(distinct native builds compiled ahead that the environment's runs benchmarked, the
fewest of any run; it builds as many at once as the package's default, two on one core:
``jobs``), ``bounds`` and ``made_of`` beside each ratio, and each side's median seconds.
The sides run in rounds (``pairs.rounds``: forward one round and back the next, an even
number of rounds, ``--repeat`` and ``--budget``), each ratio against its round's run of
Triton's own autotuner.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List

import pairs
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
    # Count the native builds compiled ahead that the benchmark took (a failed build is
    # not counted), so a run where none were (the concurrent path not taken) cannot pass
    # for one that compared it.
    taken = ahead.take

    def counted(key):
        built = taken(key)
        if built is not None and built.error is None:
            precompiled.append(key)
        return built

    ahead.take = counted
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
                  "configs": len(configs), "precompiled": precompiled}))
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


#: What each ratio is made of: what Triton's own run pays that the drop-in's does not.
MADE_OF = {
    "autotune_speedup": "Triton's run builds every config in the driver, one after another, "
    "each GRF mode in sequence; the drop-in builds each distinct SPIR-V once (configs that "
    "differ only in num_stages share it), configs at once on every core, and overlaps "
    "Triton's front ends with IGC",
    "sequential_dropin_speedup": "one config at a time, each distinct SPIR-V built once, "
    "both GRF modes at once: what remains without configs at once",
    "dask_speedup": "the environment's run with the native builds on a 2-worker local Dask "
    "cluster (its scheduling and transfers added)",
}


def same_runs(runs: List[dict], against: List[dict], cache_too: bool = True) -> bool:
    """Every run chose as every run of ``against`` did (and left the same Triton cache)."""
    keys = ("best", "triton_cache") if cache_too else ("best",)
    return all(r[k] == a[k] for r in runs for a in against for k in keys)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ocloc", default=None, help="the drop-in's ocloc (else PATH)")
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--quick", action="store_true", help="8 configs")
    sizes.add_argument(
        "--smallest", action="store_true",
        help="2 configs, one round whatever --repeat and --budget say (the tests' run): "
        "checks the script, not the figures",
    )  # fmt: skip
    parser.add_argument("--no-dask", action="store_true", help="skip the Dask row")
    parser.add_argument("--repeat", type=int, default=3, help="rounds, at least")
    parser.add_argument(
        "--budget", type=pairs.seconds, default=600.0,
        help="seconds the rounds may go on for until every ratio is settled (default 600)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="one line of JSON last")
    record.add_output_argument(parser)
    args = parser.parse_args()
    size = "smallest" if args.smallest else "quick" if args.quick else "full"
    # As many builds at once as the package's default (the cores this process may use,
    # a CPU quota too), and two on one core: the run compares the concurrent path.
    from xpu_zebin import _core

    width = max(2, _core.default_jobs())
    on = {"XPU_ZEBIN_TRITON": "1", "XPU_ZEBIN_AUTOTUNE_JOBS": str(width)}
    if args.ocloc:
        on["XPU_ZEBIN_OCLOC"] = args.ocloc
    work = Path(tempfile.mkdtemp(prefix="xpu-zebin-autotune-"))
    cluster = None
    runs: Dict[str, List[dict]] = {}

    def side(name: str, env: dict) -> Callable[[], pairs.Took]:
        def one() -> pairs.Took:
            kept = runs.setdefault(name, [])
            kept.append(run(f"{name} {len(kept)}", env, size, work))
            return pairs.Took(kept[-1]["seconds"])  # the child's own clock: Triton's call

        return one

    try:
        one_by_one = {**on, "XPU_ZEBIN_AUTOTUNE_JOBS": "1"}
        packages = {"environment": side("environment", on),
                    "environment, jobs=1": side("environment, jobs=1", one_by_one)}  # fmt: skip
        if not args.no_dask:
            from distributed import LocalCluster

            cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                   dashboard_address=None)  # fmt: skip
            packages["environment, 2 Dask workers"] = side(
                "environment, 2 Dask workers",
                {**on, "XPU_ZEBIN_AUTOTUNE_SCHEDULER": cluster.scheduler_address},
            )  # fmt: skip
        floor, budget = (1, 0.0) if args.smallest else (max(1, args.repeat), args.budget)
        ratios = pairs.rounds(side("none", {}), packages, floor=floor, budget_s=budget)
    finally:
        if cluster is not None:
            cluster.close()
        if not os.environ.get("XPU_ZEBIN_BENCH_KEEP"):
            shutil.rmtree(work, ignore_errors=True)
    report = summary(runs, ratios, width)
    for key, value in report.items():
        if key != "bounds":
            print(f"{key}: {value:.3f}" if isinstance(value, float) else f"{key}: {value}")
    for key, ratio in ratios.items():
        print(f"{key}: {ratio.said()}")
    record.write(args.output, "autotune", report, args.ocloc)
    if args.json:
        print(json.dumps(report))


def summary(runs: Dict[str, List[dict]], ratios: Dict[str, pairs.Ratio], width: int) -> dict:
    """The report: each ratio (none / that run, the median of the rounds') with its
    interval under ``bounds``, whether every run chose alike, and each side's seconds."""
    none, env = runs["none"], runs["environment"]
    sequential = runs["environment, jobs=1"]
    keys = {"environment": "autotune_speedup", "environment, jobs=1": "sequential_dropin_speedup",
            "environment, 2 Dask workers": "dask_speedup"}  # fmt: skip
    report = {
        "configs": none[0]["configs"],
        "rounds": len(none),
        "none_seconds": statistics.median(r["seconds"] for r in none),
        "environment_seconds": statistics.median(r["seconds"] for r in env),
        "sequential_dropin_seconds": statistics.median(r["seconds"] for r in sequential),
        **{keys[name]: round(r.median, 3) for name, r in ratios.items()},
        "bounds": {keys[name]: r.bounds() for name, r in ratios.items()},
        "made_of": {keys[name]: MADE_OF[keys[name]] for name in ratios},
        # Against Triton's own sequential runs: the choice and Triton's cache contents.
        "same_choice": same_runs(env, none),
        # Native builds compiled ahead that the environment's runs benchmarked (one per
        # config whose kernel differs, the fewest of any run); Triton's own compiles none.
        "precompiled": min(len(set(r["precompiled"])) for r in env),
        "sequential_dropin_same_choice": same_runs(sequential, none, cache_too=False),
        "jobs": width,
        "cores": os.cpu_count(),
    }
    if "environment, 2 Dask workers" in runs:
        dask = runs["environment, 2 Dask workers"]
        report.update(dask_seconds=statistics.median(r["seconds"] for r in dask),
                      dask_same_choice=same_runs(dask, none))  # fmt: skip
    return report


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"total {time.perf_counter() - started:.1f} s", file=sys.stderr)
