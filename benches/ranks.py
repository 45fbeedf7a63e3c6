"""One build per kernel, however many processes ask (issue 64): N ranks of a job started
together (a barrier) on a cold cache directory, each compiling the same real Triton
kernels (``model_kernels.py``, SPIR-V from triton-xpu's front end), with builds shared
(the default) against ``XPU_ZEBIN_SHARE_BUILDS=0`` (every rank builds for itself, as
Triton's and Inductor's caches do), in interleaved pairs (``pairs.py``).

Three shapes of a rank's first step:

- ``sequence``: each kernel in turn (``xpu_zebin.compile``), as a rank's first forward does;
- ``batch``: the kernels as one batch (``xpu_zebin.compile_many``, as a user calls it: its
  default jobs, the host's cores, in every rank; ``--batch-jobs 1`` gives each rank one);
- ``autotune``: the first call of an ``@triton.autotune`` kernel through the Triton
  drop-in at full width (``XPU_ZEBIN_TRITON=1``; ``benches/autotune.py``'s child, its
  ``--autotune-size`` configs), timed from the ranks' start (their imports alike on both
  sides). The ranks share Triton's cache directory, as every process of a user shares
  ``~/.triton/cache`` by default: shared, each config's front end runs once
  (``xpu_zebin.triton.front_ends``); off, every rank runs every one, as Triton does.

Reported per shape and N: ``builds`` (the cache's ``compiles``, from ``xpu-zebin stats``:
shared, exactly the distinct kernels), ``ranks_speedup`` (wall time off / on: the first
barrier to the last rank's end), ``cpu_ratio`` (CPU seconds of every process of the run,
ranks and their compilers, off / on), and ``vs_alone`` (the shared run's wall time over one
rank's alone, measured in the same run).

    python benches/ranks.py --ocloc <ocloc> [--ranks 1,2,4,8] [--kernels N] [--pairs P]
        [--shapes sequence,batch,autotune] [--batch-jobs J] [--autotune-size SIZE] [--json]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

HERE = Path(__file__).resolve().parent
import pairs  # noqa: E402  (benches/, beside this file)
import record  # noqa: E402

RANK = """
import os, sys, time, xpu_zebin
ocloc, shape, start = sys.argv[1:4]
spirvs = [open(p, "rb").read() for p in sys.argv[4:]]
print("ready", flush=True)
deadline = time.monotonic() + 600
while not os.path.exists(start) and time.monotonic() < deadline:
    time.sleep(0.002)
if shape == "sequence":
    for s in spirvs:
        xpu_zebin.compile(s, device="pvc", ocloc=ocloc)
else:
    reqs = [dict(spirv=s, device="pvc", ocloc=ocloc) for s in spirvs]
    jobs = int(shape.partition(":")[2]) if ":" in shape else None
    for r in xpu_zebin.compile_many(reqs, jobs=jobs):
        if isinstance(r, Exception):
            raise r
"""


def _subreaper() -> None:
    """Compile workers a rank leaves behind come to this process, so their CPU counts."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def _reap(deadline: float) -> None:
    """Wait for every child of this process (ranks' workers end with their ranks)."""
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.01)


def _ranks_tmpdir(work: str) -> str:
    """One TMPDIR for a run's ranks, as a job's ranks on a host share theirs (the host's
    core slots and record of safe loads live there), new for each run: no other process's
    compilers count."""
    tmp = Path(work) / "tmp"
    tmp.mkdir()
    return str(tmp)


def _children_cpu() -> float:
    import resource

    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


def one_run(
    ocloc: str, spirvs: List[Path], shape: str, ranks: int, shared: bool
) -> Dict[str, float]:
    """One run of `shape` (``autotune``'s configs ride in `shape`: ``autotune:SIZE``)."""
    if shape.startswith("autotune"):
        return autotune_run(shape.partition(":")[2] or "smallest", ranks, shared)
    return run(ocloc, spirvs, shape, ranks, shared)


def run(ocloc: str, spirvs: List[Path], shape: str, ranks: int, shared: bool) -> Dict[str, float]:
    """One run: `ranks` processes on a fresh cache, started together; wall, CPU, builds."""
    import xpu_zebin

    with tempfile.TemporaryDirectory(prefix="xpu-zebin-ranks-") as work:
        cache, start = Path(work) / "cache", Path(work) / "start"
        env = {**os.environ, "XPU_ZEBIN_CACHE_DIR": str(cache), "TMPDIR": _ranks_tmpdir(work),
               "XPU_ZEBIN_SHARE_BUILDS": "1" if shared else "0"}  # fmt: skip
        cpu = _children_cpu()
        procs = [subprocess.Popen([sys.executable, "-c", RANK, ocloc, shape, str(start),
                                   *map(str, spirvs)], stdout=subprocess.PIPE, text=True,
                                  env=env) for _ in range(ranks)]  # fmt: skip
        for p in procs:
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError("a rank did not start")
        began = time.perf_counter()
        start.touch()
        for p in procs:
            if p.wait(timeout=3600) != 0:
                raise RuntimeError(f"a rank failed ({p.returncode})")
        wall = time.perf_counter() - began
        _reap(time.monotonic() + 60)
        builds = xpu_zebin.stats(cache)["counters"]["compiles"]
        return {"wall_s": wall, "cpu_s": _children_cpu() - cpu, "builds": builds}


def autotune_run(size: str, ranks: int, shared: bool) -> Dict[str, float]:
    """One run of the autotune shape: `ranks` processes, each an autotuner's first call
    through the drop-in (``autotune.CHILD``), sharing one cache directory."""
    import autotune

    import xpu_zebin

    with tempfile.TemporaryDirectory(prefix="xpu-zebin-ranks-") as work:
        cache, script = Path(work) / "cache", Path(work) / "child.py"
        script.write_text(autotune.CHILD)
        tmp = _ranks_tmpdir(work)
        cpu, procs = _children_cpu(), []
        began = time.perf_counter()
        for i in range(ranks):
            here = Path(work) / f"rank-{i}"
            here.mkdir()
            env = {**os.environ, "XPU_ZEBIN_CACHE_DIR": str(cache), "XPU_ZEBIN_TRITON": "1",
                   "XPU_ZEBIN_SHARE_BUILDS": "1" if shared else "0",
                   "XPU_ZEBIN_SIMULATED_DEVICE": "pvc", "TRITON_INTEL_DEVICE_ARCH": "pvc",
                   "TMPDIR": tmp}  # fmt: skip
            # What a rank says goes to a file: a pipe read one rank at a time could fill.
            with open(here / "stderr", "w") as err:
                command = [sys.executable, str(script), str(autotune.TESTS),
                           str(Path(work) / "triton-cache"), size]  # fmt: skip
                procs.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err,
                                              env=env))  # fmt: skip
        for i, p in enumerate(procs):
            if p.wait(timeout=3600) != 0:
                said = (Path(work) / f"rank-{i}" / "stderr").read_text()[-2000:]
                raise RuntimeError(f"an autotuning rank failed ({p.returncode}): {said}")
        wall = time.perf_counter() - began
        _reap(time.monotonic() + 60)
        builds = xpu_zebin.stats(cache)["counters"]["compiles"]
        return {"wall_s": wall, "cpu_s": _children_cpu() - cpu, "builds": builds}


def row(ocloc: str, spirvs: List[Path], shape: str, ranks: int, n_pairs: int,
        alone_s: float) -> Dict[str, Any]:  # fmt: skip
    """Sharing off against on, in interleaved pairs (off-on, on-off, ...)."""
    on: List[Dict[str, float]] = []
    off: List[Dict[str, float]] = []
    for i in range(max(1, n_pairs)):
        order = [(True, on), (False, off)] if i % 2 else [(False, off), (True, on)]
        for shared, into in order:
            into.append(one_run(ocloc, spirvs, shape, ranks, shared))
    speed = pairs.summarize([r["wall_s"] for r in off], [r["wall_s"] for r in on])
    cpu = pairs.summarize([r["cpu_s"] for r in off], [r["cpu_s"] for r in on])
    wall_on = statistics.median(r["wall_s"] for r in on)
    return {
        "shape": shape, "ranks": ranks, "kernels": len(spirvs),
        "builds": sorted({r["builds"] for r in on}),
        "builds_unshared": sorted({r["builds"] for r in off}),
        "ranks_speedup": round(speed.median, 3), "ranks_speedup_bounds": speed.bounds(),
        "cpu_ratio": round(cpu.median, 3), "cpu_ratio_bounds": cpu.bounds(),
        "wall_on_s": round(wall_on, 3), "vs_alone": round(wall_on / max(alone_s, 1e-9), 3),
    }  # fmt: skip


def kernels(count: int, into: Path) -> List[Path]:
    """The first `count` model kernels' SPIR-V, written to files."""
    import model_kernels

    from xpu_zebin import targets

    made = model_kernels.model_spirv(targets.local().gpu_target(), limit=count)
    paths = []
    for i, k in enumerate(made):
        path = into / f"{i:02d}.spv"
        path.write_bytes(k["spirv"])
        paths.append(path)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ocloc", required=True)
    parser.add_argument("--ranks", default="1,2,4,8", help="comma-separated rank counts")
    parser.add_argument("--kernels", type=int, default=6)
    parser.add_argument("--pairs", type=int, default=2, help="pairs per row (off-on)")
    parser.add_argument("--shapes", default="sequence,batch,autotune")
    parser.add_argument("--batch-jobs", type=int, default=0,
                        help="jobs of each rank's batch (0: compile_many's default)")  # fmt: skip
    parser.add_argument("--autotune-size", default="quick", choices=("smallest", "quick", "full"))
    parser.add_argument("--json", action="store_true")
    record.add_output_argument(parser)
    args = parser.parse_args()
    os.environ.setdefault("XPU_ZEBIN_SIMULATED_DEVICE", "pvc")
    _subreaper()
    counts = [int(n) for n in args.ranks.split(",") if n.strip()]
    if not counts or min(counts) < 1 or args.kernels < 1 or args.batch_jobs < 0:
        parser.error("--ranks and --kernels: positive numbers; --batch-jobs: 0 or more")
    with tempfile.TemporaryDirectory(prefix="xpu-zebin-ranks-spv-") as spv:
        spirvs = kernels(args.kernels, Path(spv))
        rows = []
        for shape in [s.strip() for s in args.shapes.split(",") if s.strip()]:
            if shape not in ("sequence", "batch", "autotune"):
                parser.error(f"--shapes: {shape!r} is not sequence, batch or autotune")
            if shape == "autotune":
                shape = f"autotune:{args.autotune_size}"
            elif shape == "batch" and args.batch_jobs:
                shape = f"batch:{args.batch_jobs}"
            alone = one_run(args.ocloc, spirvs, shape, 1, True)["wall_s"]
            for n in counts:
                rows.append(row(args.ocloc, spirvs, shape, n, args.pairs, alone))
                if not args.json:
                    print(json.dumps(rows[-1]), flush=True)
    results = {"rows": rows}
    record.write(args.output, "ranks", results, args.ocloc)
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
