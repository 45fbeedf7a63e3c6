#!/usr/bin/env python3
"""Soak: thousands of compiles mixing good, failing, crashing and timing-out inputs through
both backends and ``compile_many``, and what the process holds before and after.

Reports open file descriptors, live child processes (everything the package started:
workers, ocloc), the package's temp files and RSS at the start (after a warm-up) and at the
end, every result's kind, and lost results (a request with neither a result nor a
classified ``BuildError``: must be zero). Not a test: run it by hand; its figures are in
docs/benchmarks.md.

    python benches/soak.py --ocloc ~/.cache/xpu-zebin/toolchain/modern/bin/ocloc --count 2000
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("XPU_ZEBIN_SIMULATED_DEVICE", "pvc")

import xpu_zebin
from xpu_zebin import _core, samples

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from spirv_mutations import mutants


def snapshot() -> dict:
    """What this process holds now."""
    me = os.getpid()
    children = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            # Descendants: our children, and theirs (they carry our mark).
            if int(fields[1]) == me or SOAK_MARK in (proc / "environ").read_bytes():
                children += 1
        except OSError:
            continue
    tmp = Path(tempfile.gettempdir())
    temp_files = sum(1 for p in tmp.iterdir() if p.name.startswith("xpu-zebin-job-"))
    rss_kib = int(
        next(
            line.split()[1]
            for line in Path("/proc/self/status").read_text().splitlines()
            if line.startswith("VmRSS:")
        )
    )
    return {
        "fds": len(os.listdir("/proc/self/fd")),
        "children": children,
        "temp_files": temp_files,
        "rss_mib": round(rss_kib / 1024, 1),
    }


SOAK_MARK = f"XPU_ZEBIN_SOAK={os.getpid()}".encode()


def inputs(ocloc: str) -> dict:
    add = xpu_zebin.opencl_to_spirv(samples.ADD_KERNEL, device="pvc", ocloc=ocloc)
    spill = xpu_zebin.opencl_to_spirv(
        samples.register_pressure_kernel(300, name="spill"), device="pvc", ocloc=ocloc
    )
    big = xpu_zebin.opencl_to_spirv(samples.ptss_overflow_kernel(), device="pvc", ocloc=ocloc)
    crashy = [blob for _, blob in mutants(add, 8, seed=1)]
    garbage = [random.Random(i).randbytes(64 + 4 * i) for i in range(8)]
    cut = add[: len(add) // 2 // 4 * 4]
    return {
        "add": add,
        "spill": spill,
        "big": big,
        "crashy": crashy,
        "garbage": garbage,
        "cut": cut,
    }


def request(rng: random.Random, data: dict, timeout: float) -> tuple:
    """(backend, kind of input, call arguments)."""
    backend = rng.choice(["ocloc", "ze"])
    roll = rng.random()
    if roll < 0.55:
        kind, spirv, name = "good", data["add"], "add"
    elif roll < 0.65:
        kind, spirv, name = "spills", data["spill"], "spill"
    elif roll < 0.75:
        kind, spirv, name = "invalid", rng.choice(data["garbage"] + [data["cut"]]), "add"
    elif roll < 0.82:
        kind, spirv, name = "unknown_kernel", data["add"], "nope"
    elif roll < 0.90:
        kind, spirv, name = "crashy", rng.choice(data["crashy"]), "add"
    elif roll < 0.95:
        kind, spirv, name = "bad_flags", data["add"], "add"
    else:
        kind, spirv, name = "timeout", data["big"], "pressure"
    # Some mutants make IGC spin rather than crash: every compile has a deadline.
    args = {"cache": rng.random() < 0.3, "timeout": timeout}
    if kind == "bad_flags":
        args["build_flags"] = "-cl-no-such-option"
    if kind == "timeout":
        args["timeout"] = 0.05
    return backend, kind, spirv, name, args


def run_one(backend: str, spirv: bytes, name: str, args: dict, ocloc: str):
    try:
        if backend == "ocloc":
            return xpu_zebin.compile(spirv, device="pvc", ocloc=ocloc, kernel_name=name, **args)
        with xpu_zebin.compile_and_load(spirv, name, **args) as k:
            return k
    except xpu_zebin.BuildError as e:
        return e


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ocloc", default=None, help="the ocloc to use (default: PATH)")
    p.add_argument("--count", type=int, default=2000)
    p.add_argument("--batch", type=int, default=50, help="every Nth group runs as a batch")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=5.0, help="seconds per compiler run")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    os.environ["XPU_ZEBIN_SOAK"] = str(os.getpid())  # inherited: marks our descendants
    ocloc = xpu_zebin.find_ocloc(args.ocloc)
    cache = tempfile.TemporaryDirectory(prefix="xpu-zebin-soak-")
    os.environ["XPU_ZEBIN_CACHE_DIR"] = cache.name
    data = inputs(ocloc)
    rng = random.Random(args.seed)
    # Warm-up: both backends' workers started once.
    run_one("ocloc", data["add"], "add", {}, ocloc)
    run_one("ze", data["add"], "add", {}, ocloc)
    start = snapshot()
    started = time.monotonic()
    outcomes: collections.Counter = collections.Counter()
    lost = 0
    done = 0
    rss_trace = [(0, start["rss_mib"])]
    while done < args.count:
        group = [
            request(rng, data, args.timeout) for _ in range(min(args.batch, args.count - done))
        ]
        if (done // args.batch) % 4 == 3:  # every fourth group: one compile_many batch
            reqs = [
                {"spirv": s, "device": "pvc", "ocloc": ocloc, "kernel_name": n, **a}
                for _, _, s, n, a in group
            ]
            results = xpu_zebin.compile_many(reqs)
            pairs = [(("batch", g[1]), r) for g, r in zip(group, results)]
        else:
            pairs = [((b, k), run_one(b, s, n, a, ocloc)) for b, k, s, n, a in group]
        for (backend, kind), r in pairs:
            if isinstance(r, xpu_zebin.BuildError):
                outcomes[f"{backend}/{kind}: {r.kind}"] += 1
            elif r is None:
                lost += 1
            else:
                outcomes[f"{backend}/{kind}: ok"] += 1
        done += len(group)
        if done % 250 == 0:
            rss_trace.append((done, snapshot()["rss_mib"]))
        print(f"\r{done}/{args.count}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    seconds = time.monotonic() - started
    with_idle = snapshot()
    _core.shutdown_workers()  # the idle cap's workers, for the final count below
    time.sleep(0.5)
    end = snapshot()
    report = {
        "compiles": args.count,
        "seconds": round(seconds, 1),
        "lost": lost,
        "start": start,
        "end_with_idle_workers": with_idle,
        "end": end,
        "rss_mib_by_compiles": rss_trace,
        # (modules created, destroyed, kernels created, destroyed) in this process.
        "ze_handles": _core.ze_handle_counts(),
        "outcomes": dict(sorted(outcomes.items())),
    }
    print(f"{args.count} compiles in {seconds:.1f} s, lost results: {lost}")
    print(f"{'':14}{'start':>10}{'end':>10}{'idle gone':>10}")
    for key in ("fds", "children", "temp_files", "rss_mib"):
        print(f"{key:14}{start[key]:>10}{with_idle[key]:>10}{end[key]:>10}")
    print("RSS (MiB) after N compiles:", ", ".join(f"{n}: {r}" for n, r in rss_trace))
    print("Level Zero handles (modules made/freed, kernels made/freed):", _core.ze_handle_counts())
    for k, n in sorted(outcomes.items()):
        print(f"  {n:5}  {k}")
    if args.json:
        print(json.dumps(report))
    return 0 if lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
