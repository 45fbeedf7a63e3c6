"""Cold start with and without an ahead-of-time bundle, and the farm that builds it.

A model-sized set of real Triton kernels (``model_kernels.py``: attention forward and
backward, layer norm, matmul, softmax, reductions; 43 kernel-config pairs) is loaded in a
fresh process on the simulated PVC through the drop-in ``load_binary``: from SPIR-V (the
driver's JIT in the process, upstream's way) against from a bundle (no compile); and the
model's whole start (Triton's front end and the load) from nothing against after ``bundle
import`` (Triton cache hits: no front end, no IGC). The farm
builds the set for three targets (pvc, bmg, dg2) one at a time, with ``jobs`` = cores, and
on a local Dask cluster. Every ratio is measured in this run; the two starts in
interleaved pairs (``pairs.py``: JIT and bundle alternate, AB then BA, each pair one ratio,
the median and its 99% interval in ``bounds``, what it is made of in ``made_of``), each
side a fresh process timing itself. The farm's ratio is one run of each side.

    python benches/cold_start.py --ocloc <modern ocloc> [--repeat 3] [--budget 60] [--dask]
        [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

os.environ.setdefault("XPU_ZEBIN_SIMULATED_DEVICE", "pvc")

import pairs
import record

import xpu_zebin
from xpu_zebin import bundle, targets


def child(mode: str, kernels_file: str) -> None:
    """One fresh process: load every kernel through the drop-in, print the timings."""
    import xpu_zebin.triton as xt

    kernels = pickle.loads(Path(kernels_file).read_bytes())
    started = time.perf_counter()
    xpu_zebin.devices()  # the driver's start-up, paid alike by both
    init = time.perf_counter() - started
    loads, modules = [], []
    for k in kernels:
        t = time.perf_counter()
        module, *_ = xt.load_binary(k["name"], k["spirv"], 0, k["build_flags"], True, 0)
        loads.append(time.perf_counter() - t)
        modules.append(module)
    native = []
    if mode == "bundle":  # what a plain native load of the same binaries costs here
        for k, m in zip(kernels, modules):
            t = time.perf_counter()
            xpu_zebin.compile_and_load(
                m.native_binary, k["name"], is_spv=False, isolated=False, cache=False,
                build_flags=m.build_flags,
            ).close()  # fmt: skip
            native.append(time.perf_counter() - t)
    for m in modules:
        m.close()
    print(json.dumps({"init": init, "loads": loads, "native": native}))


def child_model(mode: str) -> None:
    """One fresh process starting the model: Triton compiles each kernel-config pair (its
    cache is empty, or holds a bundle's imported entries) and the drop-in loads it."""
    import model_kernels
    import triton

    import xpu_zebin.triton as xt

    model_kernels.stub_arch_parser()
    target = targets.local().gpu_target()  # the driver's start-up, paid alike by both
    started = time.perf_counter()
    modules = []
    for fn, constants, warps in model_kernels._configs():
        compiled = triton.compile(model_kernels.source(fn, constants), target=target,
                                  options={"num_warps": warps})  # fmt: skip
        m = compiled.metadata
        module, *_ = xt.load_binary(m.name, compiled.asm["spv"], 0, m.build_flags or "", True, 0)
        modules.append(module)
    total = time.perf_counter() - started
    for module in modules:
        module.close()
    print(json.dumps({"mode": mode, "start": total}))


def _paired(jit: Any, fast: Any, repeat: int, budget: float) -> pairs.Ratio:
    return pairs.measure(jit, fast, floor=max(1, repeat), budget_s=budget)


def model_start(
    work: Path, profiles: list, ocloc: str, repeat: int, budget: float
) -> Dict[str, Any]:
    """Model start in fresh processes: from nothing (Triton's front end, then the driver's
    JIT) against after ``bundle import`` (Triton cache hits, native loads)."""
    import model_kernels

    import xpu_zebin.triton as xt

    cores = xpu_zebin._core.default_jobs()
    os.environ["TRITON_CACHE_DIR"] = str(work / "farm-triton")
    started = time.perf_counter()
    xt.precompile(model_kernels.specs(), profiles[:1], work / "model.bundle", jobs=cores,
                  ocloc=ocloc)  # fmt: skip
    farm_s = time.perf_counter() - started
    os.environ["TRITON_CACHE_DIR"] = str(work / "user-triton")
    installed = xt.import_bundle(work / "model.bundle", work / "user-bundles")
    env = {**os.environ, "XPU_ZEBIN_BUNDLE": str(installed)}
    starts: Dict[str, list] = {"jit": [], "bundle": []}

    def start(mode: str) -> Any:
        def one() -> pairs.Took:
            i = len(starts[mode])  # each JIT start from nothing: its own caches
            e = env if mode == "bundle" else {
                **{k: v for k, v in os.environ.items() if k != "XPU_ZEBIN_BUNDLE"},
                "XPU_ZEBIN_ISOLATED": "0", "TRITON_CACHE_DIR": str(work / f"jit-triton-{i}"),
                "XPU_ZEBIN_CACHE_DIR": str(work / f"jit-model-cache-{i}")}  # fmt: skip
            out = subprocess.run([sys.executable, __file__, "--child-model", mode], env=e,
                                 capture_output=True, text=True, check=True)  # fmt: skip
            starts[mode].append(json.loads(out.stdout.strip().splitlines()[-1])["start"])
            return pairs.Took(starts[mode][-1])

        return one

    ratio = _paired(start("jit"), start("bundle"), repeat, budget)
    jit, fast = statistics.median(starts["jit"]), statistics.median(starts["bundle"])
    return {"model_farm_s": round(farm_s, 1), "model_start_jit_s": round(jit, 2),
            "model_start_bundle_s": round(fast, 3),
            "model_start_speedup": round(ratio.median, 1),
            "model_start_bounds": ratio.bounds()}  # fmt: skip


def fresh_process(mode: str, kernels_file: Path, env: Dict[str, str]) -> Dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, str(kernels_file)],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def farm(
    kernels: List[Dict[str, Any]], profiles: list, ocloc: str, jobs: int, client=None
) -> float:
    """Seconds to build the set for every profile into a new bundle, with no cache."""
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["XPU_ZEBIN_CACHE_DIR"] = str(Path(tmp) / "cache")
        started = time.perf_counter()
        bundle.precompile(kernels, profiles, Path(tmp) / "b", jobs=jobs, client=client, ocloc=ocloc)
        return time.perf_counter() - started


def cold_loads(
    work: Path, kernels_file: Path, env: Dict[str, str], bundle_env: Dict[str, str],
    repeat: int, budget: float,
) -> Dict[str, Any]:  # fmt: skip
    """Every kernel loaded in a fresh process: the driver's JIT from an empty package cache
    against the bundle, in interleaved pairs."""
    jit_env = {**env, "XPU_ZEBIN_ISOLATED": "0", "XPU_ZEBIN_CACHE_DIR": str(work / "jit-cache")}
    jit_env.pop("XPU_ZEBIN_BUNDLE", None)
    runs: Dict[str, list] = {"jit": [], "bundle": []}

    def load(mode: str, e: Dict[str, str]) -> Any:
        def one() -> pairs.Took:
            if mode == "jit":  # every JIT run starts from an empty package cache
                subprocess.run(["rm", "-rf", jit_env["XPU_ZEBIN_CACHE_DIR"]], check=True)
            runs[mode].append(fresh_process(mode, kernels_file, e))
            return pairs.Took(sum(runs[mode][-1]["loads"]))

        return one

    cold = _paired(load("jit", jit_env), load("bundle", bundle_env), repeat, budget)
    total = {m: statistics.median(sum(r["loads"]) for r in rs) for m, rs in runs.items()}
    per_bundle = statistics.median(x for r in runs["bundle"] for x in r["loads"])
    per_native = statistics.median(x for r in runs["bundle"] for x in r["native"])
    return dict(
        jit_load_s=round(total["jit"], 2), bundle_load_s=round(total["bundle"], 3),
        cold_start_speedup=round(cold.median, 1), bounds={"cold_start_speedup": cold.bounds()},
        made_of={"cold_start_speedup": "the driver's JIT of every kernel in the process, "
                 "one after another (upstream's load_binary), against loads of the "
                 "bundle's native binaries (no compiler runs)"},
        per_kernel_bundle_ms=round(1000 * per_bundle, 2),
        per_kernel_native_ms=round(1000 * per_native, 2),
        driver_init_s=round(statistics.median(r["init"] for rs in runs.values() for r in rs), 2),
    )  # fmt: skip


def report(results: Dict[str, Any], pairs: int, n_targets: int, cores: int) -> None:
    print(f"\ncold start, {pairs} Triton kernel-config pairs, fresh process, simulated PVC:")
    print(f"  JIT (driver, in-process, GRF ladder): {results['jit_load_s']} s")
    print(f"  from the bundle:                      {results['bundle_load_s']} s "
          f"({results['cold_start_speedup']}x)")  # fmt: skip
    print(f"  per kernel from the bundle {results['per_kernel_bundle_ms']} ms, plain native load "
          f"{results['per_kernel_native_ms']} ms (median)")  # fmt: skip
    print(f"model start (Triton compile + load of every pair): from nothing "
          f"{results['model_start_jit_s']} s, after bundle import {results['model_start_bundle_s']}"
          f" s ({results['model_start_speedup']}x); its bundle built in "
          f"{results['model_farm_s']} s")  # fmt: skip
    print(
        f"farm, {n_targets} targets: one at a time {results['farm_serial_s']} s, "
        f"jobs={cores} {results['farm_parallel_s']} s ({results['farm_speedup']}x)"
        + (f", Dask 2 workers {results['farm_dask_s']} s" if "farm_dask_s" in results else "")
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ocloc", default=None, help="the farm's compiler (default: discovery)")
    p.add_argument("--repeat", type=int, default=3, help="pairs per ratio, at least")
    p.add_argument("--budget", type=pairs.seconds, default=60.0,
                   help="seconds a ratio may add pairs for until its interval is within "
                        "5%% of its median (0: exactly --repeat pairs)")  # fmt: skip
    p.add_argument("--dask", action="store_true", help="also build on a 2-worker LocalCluster")
    p.add_argument("--json", action="store_true")
    record.add_output_argument(p)
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    p.add_argument("--child-model", help=argparse.SUPPRESS)
    args = p.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    if args.child or args.child_model:
        child(*args.child) if args.child else child_model(args.child_model)
        return 0
    import model_kernels

    ocloc = os.fspath(xpu_zebin.find_ocloc(args.ocloc))
    work = Path(tempfile.mkdtemp(prefix="xpu-zebin-cold-"))
    pvc = targets.local()
    profiles = [pvc] + [dataclasses.replace(pvc, ocloc_device=d, name=d, driver=None)
                        for d in ("bmg", "dg2")]  # fmt: skip
    started = time.perf_counter()
    kernels = model_kernels.model_spirv(pvc.gpu_target())
    front_end = time.perf_counter() - started
    kernels_file = work / "kernels.pkl"
    kernels_file.write_bytes(pickle.dumps(kernels))
    print(f"{len(kernels)} kernel-config pairs (Triton front end {front_end:.1f} s)",
          file=sys.stderr)  # fmt: skip

    results: Dict[str, Any] = {"pairs": len(kernels), "targets": len(profiles)}
    cores = xpu_zebin._core.default_jobs()
    results["farm_serial_s"] = round(farm(kernels, profiles, ocloc, 1), 1)
    results["farm_parallel_s"] = round(farm(kernels, profiles, ocloc, cores), 1)
    results["farm_speedup"] = round(results["farm_serial_s"] / results["farm_parallel_s"], 2)
    if args.dask:
        from distributed import Client, LocalCluster

        with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as c:
            results["farm_dask_s"] = round(farm(kernels, profiles, ocloc, cores, client=c), 1)
    print(f"  farm: {results}", file=sys.stderr)

    # The bundle a user installs (entries for this device tried once, at install).
    os.environ["XPU_ZEBIN_CACHE_DIR"] = str(work / "farm-cache")
    bundle.precompile(kernels, profiles, work / "bundle", jobs=cores, ocloc=ocloc)
    env = {**os.environ, "XPU_ZEBIN_CACHE_DIR": str(work / "user-cache")}
    os.environ.update(env)
    installed = bundle.import_bundle(work / "bundle")
    bundle_env = {**env, "XPU_ZEBIN_BUNDLE": str(installed)}
    results.update(cold_loads(work, kernels_file, env, bundle_env, args.repeat, args.budget))
    model = model_start(work, profiles, ocloc, args.repeat, args.budget)
    results["bounds"]["model_start_speedup"] = model.pop("model_start_bounds")
    results["made_of"]["model_start_speedup"] = (
        "Triton's front end and the driver's JIT for every kernel against Triton cache hits "
        "the bundle's import put there (no front end, no compiler)"
    )
    results["made_of"]["farm_speedup"] = (
        "one run each (not paired): the farm's builds one at a time against as many at "
        "once as cores"
    )
    results.update(model)
    report(results, len(kernels), len(profiles), cores)
    record.write(args.output, "cold_start", results, ocloc)
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
