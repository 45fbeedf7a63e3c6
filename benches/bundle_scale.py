"""Bundles at scale: importing a bundle of 10^3, 10^4 and 10^5 entries, and looking
kernels up in it, each timed and measured per entry.

A signed bundle is synthesized in the real format at each size, for this machine's
device (the simulated PVC here): native entries (real zebins of a few small kernels, as
many configs as it takes), each with a Triton cache entry (its metadata, and its binary
that native entry: every Triton entry is checked against the bundle's native entries).
Fresh processes, with the signer's key trusted (``XPU_ZEBIN_TRUSTED_KEYS``), measure:

- ``import``: ``xpu_zebin.triton.import_bundle`` (every entry and Triton file checked,
  copied, the signature verified, every native entry tried here in a worker, 64 at a
  time, and every Triton entry put into Triton's cache with its cache manager), per
  entry, and the process's peak memory above what it held before, per entry (without
  Triton installed: ``xpu_zebin.bundle.import_bundle``, the native entries alone);
- ``index``: a process's first lookup, which reads the manifest and checks its signature
  (once per process and change), per entry, and the memory the index holds, per entry;
- ``lookup``: every lookup after it (is the bundle usable here, then the entry by key,
  its bytes read and checked), the median.

Every cost per entry is what the bundle's size adds: above the same measure with a
bundle of ten entries in the same round, divided by the entries past ten. Each bundle is
made once and imported ``--rounds`` times (4), the sizes forward one round and back the
next.
Reported, each a ratio measured in this run (largest size over ``reference``, the
smallest of 10^4 entries or more, else the smallest; at most 1.25 is flat), one per round
and their median, with its 99% interval under ``bounds`` (``pairs.py``): ``import_ratio``,
``import_memory_ratio``, ``index_ratio``, ``index_memory_ratio`` and ``lookup_ratio``,
with the values at every size (medians of the rounds).

    python benches/bundle_scale.py --ocloc <ocloc> [--sizes 1000,10000,100000] [--rounds 4]
        [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
import pairs  # noqa: E402  (benches/, beside this file)
import record  # noqa: E402

KERNELS = 4
KERNEL = """__kernel void bundled{n}(__global float* a, __global const float* b) {{
    int i = get_global_id(0);
    a[i] = b[i] * {n}.0f + a[i];
}}
"""
#: The bundle whose costs every size's are measured above: what a process pays whatever
#: the bundle's size (imports, the driver, the engine) is not a cost per entry.
BASE = 10
#: Ratios are the largest size's cost over this size's (or the smallest's, below it).
REFERENCE = 10_000
#: Hard links to one file, at most (ext4 allows 65,000).
LINKS_PER_FILE = 20_000


def _peak_mib() -> float:
    """This process image's own peak (ru_maxrss keeps the forking parent's)."""
    status = Path("/proc/self/status").read_text().splitlines()
    return next(int(x.split()[1]) for x in status if x.startswith("VmHWM:")) / 1024


class Files:
    """Files of the same bytes, as hard links to a few copies (a bundle of 10^5 entries
    in seconds, at the disk cost of a few)."""

    def __init__(self, where: Path) -> None:
        self.where, self.copies, self.uses = where, {}, {}

    def put(self, path: Path, name: str, data: bytes) -> None:
        n = self.uses.get(name, 0)
        self.uses[name] = n + 1
        copy = self.where / f"{name}.{n // LINKS_PER_FILE}"
        if n % LINKS_PER_FILE == 0:
            copy.write_bytes(data)
        os.link(copy, path)


def synthesize(out: Path, size: int, natives: List[bytes], target: Any, files: Files) -> list:
    """A bundle of ``size`` native entries (and as many Triton entries) for the profile
    ``target`` at ``out``; returns its (key, kernel) pairs."""
    import blake3

    from xpu_zebin.triton.cache_entries import key_digest

    (out / "native").mkdir(parents=True)
    sums = [blake3.blake3(b).hexdigest() for b in natives]
    entries, tritons, keys = [], [], []
    for i in range(size):
        k = i % len(natives)
        name = f"bundled{k}"
        key = blake3.blake3(b"bundle entry %d" % i).hexdigest()
        tri = blake3.blake3(b"triton entry %d" % i).hexdigest()
        entries.append({
            "key": key, "kernel": name, "config": f"config {i}", "target": target.id,
            "build_flags": "", "spill_bytes": 0, "n_spills": 0, "compiler": "bench",
            "file": f"native/{key}.zebin", "blake3": sums[k], "size": len(natives[k]),
        })  # fmt: skip
        files.put(out / "native" / f"{key}.zebin", f"native{k}", natives[k])
        here = out / "triton" / target.id / tri
        here.mkdir(parents=True)
        meta = json.dumps({
            "hash": tri, "name": name, "num_warps": 4, "threads_per_warp": 16, "shared": 0,
            "build_flags": "", "generate_native_code": True,
        }).encode()  # fmt: skip
        (here / f"{name}.json").write_bytes(meta)
        files.put(here / f"{name}.spv", f"native{k}", natives[k])
        tritons.append({
            "hash": tri, "kernel": name, "config": f"config {i}", "target": target.id,
            "native": True, "native_key": key, "files": [
                {"name": f"{name}.json", "size": len(meta),
                 "blake3": blake3.blake3(meta).hexdigest()},
                {"name": f"{name}.spv", "size": len(natives[k]), "blake3": sums[k]},
            ],
        })  # fmt: skip
        keys.append((key, name))
    manifest = {
        "format": "xpu-zebin-bundle/1", "package": "bench", "triton": None,
        "triton_key": key_digest(), "targets": {target.id: target.to_json()},
        "entries": entries, "failures": [], "triton_cache": tritons,
    }  # fmt: skip
    (out / "manifest.json").write_text(json.dumps(manifest))
    return keys


def child_import(src: str, into: str) -> None:
    import xpu_zebin.bundle
    import xpu_zebin.triton
    from xpu_zebin.triton.cache_entries import key_digest

    triton = key_digest() is not None
    before = _peak_mib()
    t = time.perf_counter()
    (xpu_zebin.triton if triton else xpu_zebin.bundle).import_bundle(src, into)
    took = time.perf_counter() - t
    # Every Triton entry is in Triton's cache (a directory per key).
    cache = Path(os.environ["TRITON_CACHE_DIR"])
    put = (sum(1 for _ in cache.iterdir()) if cache.is_dir() else 0) if triton else None
    print(json.dumps({"s": took, "mib": _peak_mib() - before, "triton_put": put}))


def child_lookup(bundle: str, keys_file: str, target: str, n: int) -> None:
    from xpu_zebin import _core

    keys = json.loads(Path(keys_file).read_text())
    before = _peak_mib()
    t = time.perf_counter()
    assert _core.bundle_usable(bundle, None) is None
    first = time.perf_counter() - t
    held = _peak_mib() - before
    times = []
    for key, kernel in random.Random(7).sample(keys, min(n, len(keys))):
        t = time.perf_counter()
        assert _core.bundle_usable(bundle, None) is None
        status = _core.bundle_lookup([bundle], key, kernel, target, None)[0]
        times.append(time.perf_counter() - t)
        assert status == "native", status
    print(json.dumps({"index_s": first, "index_mib": held, "lookup": statistics.median(times)}))


def _run(env: dict, *args: str) -> dict:
    out = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True,
                         text=True)  # fmt: skip
    if out.returncode != 0:
        raise SystemExit(f"{args[0]} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def prepare(work: Path, size: int, natives: List[bytes], target: Any) -> None:
    """A signed bundle of ``size`` entries (and its keys beside it), made once for every
    round."""
    from xpu_zebin import _core

    src = work / f"src-{size}"
    keys = synthesize(src, size, natives, target, Files(work))
    os.environ["XPU_ZEBIN_SIGNING_KEY"] = str(work / "farm.key")
    _core.bundle_sign(str(src))
    del os.environ["XPU_ZEBIN_SIGNING_KEY"]
    (work / f"keys-{size}.json").write_text(json.dumps(keys))


def measure(work: Path, size: int, r: int, target: Any, env: dict,
            lookups: int) -> Tuple[Dict[str, float], Dict[str, Any]]:  # fmt: skip
    """Round ``r``'s import of the bundle of ``size`` entries and its lookups, in fresh
    processes: the totals (ms, KiB) and what is per lookup."""
    src, into = work / f"src-{size}", work / f"into-{size}-{r}"
    triton_cache = work / f"triton-cache-{size}-{r}"
    os.sync()  # the earlier writes' writeback is not this import's
    imported = _run({**env, "TRITON_CACHE_DIR": str(triton_cache)}, "--child", "import",
                    str(src), str(into))  # fmt: skip
    os.sync()  # the import's writeback is its own, not the lookups'
    looked = _run(env, "--child", "lookup", str(into / src.name),
                  str(work / f"keys-{size}.json"), target.id, str(lookups))  # fmt: skip
    if imported["triton_put"] not in (None, size):
        raise SystemExit(f"{size} entries: {imported['triton_put']} put into Triton's cache")
    got = {
        "import_ms": imported["s"] * 1e3,
        "import_kib": imported["mib"] * 1024,
        "index_ms": looked["index_s"] * 1e3,
        "index_kib": looked["index_mib"] * 1024,
        "lookup_ms": looked["lookup"] * 1e3,
    }
    extra = {"import_s": round(imported["s"], 2), "triton": imported["triton_put"] is not None}
    return got, extra


def per_entry(got: Dict[str, float], base: Dict[str, float], size: int) -> Dict[str, float]:
    """What the bundle's size adds, per entry: above the same with a bundle of BASE (the
    lookup, a median per lookup, as it is)."""
    added = {k: (v - base[k]) / (size - BASE) for k, v in got.items() if k != "lookup_ms"}
    return {**added, "lookup_ms": got["lookup_ms"]}


#: Each cost measured per entry, and the name of its ratio in the report.
RATIO_NAMES = {"import_ms": "import_ratio", "import_kib": "import_memory_ratio",
               "index_ms": "index_ratio", "index_kib": "index_memory_ratio",
               "lookup_ms": "lookup_ratio"}  # fmt: skip
COSTS = tuple(RATIO_NAMES)


def ratios(rounds: List[Dict[int, Dict[str, float]]], reference: int, largest: int) -> dict:
    """Each cost per entry at the largest size over the same at ``reference``, a ratio per
    round (the sizes forward one round and back the next), as ``pairs.py`` gives it; a
    round whose reference cost is not above 0 (within the noise) gives none."""
    got: Dict[str, Optional[pairs.Ratio]] = {}
    for k in COSTS:
        kept = [(r[largest][k], r[reference][k]) for r in rounds if r[reference][k] > 0]
        got[k] = pairs.summarize(*map(list, zip(*kept))) if kept else None
    return got


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ocloc", default=None)
    p.add_argument("--sizes", default="1000,10000,100000")
    p.add_argument("--lookups", type=int, default=2000)
    p.add_argument(
        "--rounds",
        type=int,
        default=4,
        help="imports per size, the sizes forward one round, back the next",
    )
    p.add_argument("--json", action="store_true")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    record.add_output_argument(p)
    args = p.parse_args()
    if args.child:
        if args.child[0] == "import":
            child_import(*args.child[1:3])
        else:
            child_lookup(*args.child[1:4], int(args.child[4]))
        return 0

    import xpu_zebin

    ocloc = os.fspath(xpu_zebin.find_ocloc(args.ocloc))
    natives = [
        xpu_zebin.compile(xpu_zebin.opencl_to_spirv(KERNEL.format(n=k), device="pvc",
                                                    ocloc=ocloc),
                          device="pvc", ocloc=ocloc, cache=False).binary
        for k in range(KERNELS)
    ]  # fmt: skip
    from xpu_zebin import _core, targets

    target = targets.local()
    sizes = sorted({int(s) for s in args.sizes.split(",")} - {BASE})
    if not sizes or sizes[0] < BASE:
        raise SystemExit(f"--sizes: each more than {BASE} (what is measured is above {BASE})")
    work = Path(tempfile.mkdtemp(prefix="xpu-zebin-bundle-scale-"))
    public = _core.key_generate(str(work / "farm.key"), "farm")
    env = {**os.environ, "XPU_ZEBIN_TRUSTED_KEYS": public}
    every = [BASE, *sizes]
    for size in every:
        prepare(work, size, natives, target)
    rounds: List[Dict[int, Dict[str, float]]] = []
    extra: Dict[int, List[Dict[str, Any]]] = {z: [] for z in every}
    for r in range(max(1, args.rounds)):
        order = every[:: -1 if r % 2 else 1]  # forward, then back: drift falls on both
        got = {}
        for size in order:
            got[size], said = measure(work, size, r, target, env, args.lookups)
            extra[size].append(said)
        rounds.append({z: per_entry(got[z], got[BASE], z) for z in sizes})
        print(f"round {r}: {rounds[-1]}", file=sys.stderr)
    rows: Dict[str, Any] = {
        str(z): {**{k: round(statistics.median(r[z][k] for r in rounds), 5) for k in COSTS},
                 "import_s": round(statistics.median(e["import_s"] for e in extra[z]), 2),
                 "triton": all(e["triton"] for e in extra[z])}
        for z in sizes
    }  # fmt: skip
    # Against the smallest size of 10^4 or more when there is one: at 10^3, a cost per entry
    # is within the noise of the fixed costs subtracted (1.2 to 6.4 ms an import, four runs).
    reference = min((z for z in sizes if z >= REFERENCE), default=sizes[0])
    got_ratios = ratios(rounds, reference, sizes[-1])
    r: Dict[str, Any] = {
        "sizes": sizes,
        "reference": reference,
        "rounds": len(rounds),
        "per_entry": rows,
        **{RATIO_NAMES[k]: round(v.median, 2) if v else None for k, v in got_ratios.items()},
        "bounds": {RATIO_NAMES[k]: v.bounds() for k, v in got_ratios.items() if v},
    }
    record.write(args.output, "bundle_scale", r, ocloc)
    # Removed at the end: a large removal's discards would slow the next size's writes.
    subprocess.run(["rm", "-rf", str(work)], check=False)
    if args.json:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
