"""The local cache at scale: what a write, a hit and a store entry's adoption cost with 0,
10^4, 10^5 and 10^6 entries already in the cache.

A cache directory per size is filled with synthesized entries of the real format
(``zebin-v3`` shards, a header, metadata, a body, a blake3 checksum over key and body). In
each of ``--rounds`` rounds (4) a fresh node process (the first run on a node) measures
each size in turn (the sizes forward one round and back the next, so that the file
system's moods fall on every size alike), after one warm-up write:

- ``write``: a compile that ends in a cache write (small OpenCL kernels, each distinct);
- ``hit``: the same request again, answered by the cache;
- ``adopt``: another node's entry taken into this cache (what a fleet's store hit writes);
- ``evict`` (the last round): the cache's bound set to what it holds, one more entry
  adopted, then again until the cleaning that write set off is over (least recently used
  entries removed until the cache holds nine tenths of its bound, a slice per write), per
  entry removed; ``evict_stall``, the most one write paid for it. The entries this node
  adopted last must still be there afterwards (``lru_kept``): the least recently used go
  first;
- ``lost`` and ``kept`` (the last round, first): compiles while a lost ledger is rebuilt
  (a fresh boot, a restored directory: the ledger put aside, so the next write makes a
  new one and begins the walk that rebuilds it, a slice per write) against compiles with
  the ledger, in interleaved pairs (the kept ledger swapped back in for its side, the
  order alternated): each side's median and slowest, and the first write after the loss;
- ``rebuild`` (the last round, before ``evict``): the ledger removed again, then 50
  adoptions; ``rebuild_stall``, the most one of them paid (less an adoption's own cost)
  while the accounts were rebuilt a slice per write.

Reported, each a ratio measured in this run: ``write_ratio``, ``hit_ratio`` and
``adopt_ratio``, the cost at the largest size over that at 0 (each a round's pair: the
largest size's node median over the smallest's in the same round; the median of the
rounds' ratios, with its 99% interval under ``bounds`` as ``pairs.py`` gives it), and
``evict_ratio``, the cost per evicted entry at the largest size over that at the smallest
size that evicts a thousand or more (at most 1.25 is flat), and
``evict_stall_ratio``, the most one write paid at the largest size over the same, and
``rebuild_stall_ratio`` the same for a lost ledger's rebuild; ``lost_ledger_ratio``, at
the largest size, the slowest compile while the lost ledger was rebuilt over the slowest
of as many with it (the compiler's own spread falls on both sides; the goal is at most
1.25), and ``lost_ledger_pair_ratio``, the median of the pairs' ratios; the costs at every
size, each node's peak memory, the cache's size against its bound after each cleaning
(``held``), and the file system the caches were on (``--xfs``: a new XFS in a loop
device, made and mounted here, which needs root).

    python benches/scale.py --ocloc <ocloc> [--sizes 0,10000,100000,1000000] [--xfs] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

HERE = Path(__file__).resolve().parent
import pairs  # noqa: E402  (benches/, beside this file)
import record  # noqa: E402

TIMED = ("write", "hit", "adopt", "evict")
REBUILD_WRITES = 50
KERNEL = """__kernel void scale{n}(__global float* a, __global const float* b) {{
    int i = get_global_id(0);
    a[i] = b[i] * {n}.0f + a[i];
}}
"""


def synthesize(cache: Path, first: int, count: int) -> None:
    """``count`` entries of the real format, ``first`` onwards, in their shards."""
    import blake3

    layout = cache / "zebin-v3"
    layout.mkdir(mode=0o700, parents=True, exist_ok=True)
    for shard in range(256):
        (layout / f"{shard:02x}").mkdir(mode=0o700, exist_ok=True)
    meta = json.dumps({"build_flags": "", "synthesized": True}).encode()
    for i in range(first, first + count):
        key = blake3.blake3(b"synthesized %d" % i).hexdigest()
        body = b"XZCACHE2" + len(meta).to_bytes(4, "little") + meta + os.urandom(256)
        data = body + blake3.blake3(key.encode() + body).digest()
        path = layout / key[:2] / f"{key}.zeentry"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, data)
        os.close(fd)
    # Entries written behind the ledger's back: counted again (setup, not a node's cost).
    (layout / "ledger2").unlink(missing_ok=True)
    import xpu_zebin

    xpu_zebin.stats(cache, recount=True)


def child(cache: str, ocloc: str, spirv_dir: str, tag: str, n: int, adopts: int,
          evicts: bool) -> None:  # fmt: skip
    """A fresh node: one warm-up write, then ``n`` writes, hits of each (as many rounds as
    make ``adopts`` hits) and ``adopts`` adoptions, timed (the cheap operations, many
    times: a millisecond's file system noise is not their cost); then, if ``evicts``, a
    cleaning."""
    import xpu_zebin

    spirvs = sorted(Path(spirv_dir).glob(f"{tag}-*.spv"))
    donors = sorted(Path(spirv_dir).glob(f"d{tag}-*.spv"))  # new entries at every size
    compile_ = lambda s, d=cache: xpu_zebin.compile(s.read_bytes(), device="pvc",  # noqa: E731
                                                    ocloc=ocloc, cache_dir=d)  # fmt: skip
    compile_(spirvs[0])  # warm-up: the ledger counts the directory once
    times: Dict[str, List[float]] = {"write": [], "hit": [], "adopt": []}
    for s in spirvs[1 : n + 1]:
        t = time.perf_counter()
        assert not compile_(s).cached
        times["write"].append(time.perf_counter() - t)
    for s in spirvs[1 : n + 1] * -(-adopts // n):
        t = time.perf_counter()
        assert compile_(s).cached
        times["hit"].append(time.perf_counter() - t)
    options = xpu_zebin.Options(ocloc=ocloc, cache_dir=cache)
    donor = options.replace(cache_dir=str(Path(spirv_dir) / "donor-cache"))
    for d in donors[:adopts]:
        entry = xpu_zebin._core.cache_slot(d.read_bytes(), "pvc", donor).local()
        slot = xpu_zebin._core.cache_slot(d.read_bytes(), "pvc", options)
        t = time.perf_counter()
        slot.adopt(entry)
        times["adopt"].append(time.perf_counter() - t)
    medians: Dict[str, Any] = {k: statistics.median(v) for k, v in times.items()}
    if evicts:
        lost = sorted(Path(spirv_dir).glob(f"l{tag}-*.spv"))
        medians.update(lost_ledger(cache, compile_, lost, spirvs[0]))
        # Its own entry: the cleaning after it must find the cache grown by a new one.
        medians.update(rebuild(cache, options, donor, donors[adopts + 1], medians["adopt"]))
        medians.update(evict(cache, options, donor, donors[adopts], medians["adopt"]))
        # The oldest go first: the entries this node adopted last are all still there,
        # when older entries than its own (a warm-up, n writes, 2n while the ledger was
        # lost, the adoptions and the rebuild's) were enough to clean (mtimes of the last
        # few ms tie).
        medians["lru_kept"] = None
        if medians["evicted"] <= medians["entries_before"] - (3 * n + adopts + 2):
            medians["lru_kept"] = all(
                xpu_zebin._core.cache_slot(d.read_bytes(), "pvc", options).local() is not None
                for d in donors[: adopts + 1]
            )
    # This process image's own peak (ru_maxrss keeps the forking parent's).
    status = Path("/proc/self/status").read_text().splitlines()
    rss = next(int(x.split()[1]) for x in status if x.startswith("VmHWM:")) / 1024
    print(json.dumps({**medians, "rss_mib": round(rss, 1), "stats": xpu_zebin.stats(cache)}))


def ledger_file(cache: str) -> Path:
    """Where the cache's ledger is: beside the entries on ext4 and tmpfs, else in /dev/shm
    (ledger.rs)."""
    layout = Path(cache) / "zebin-v3"
    st = layout.stat()
    beside = layout / "ledger2"
    shm = Path(f"/dev/shm/xpu-zebin-{os.getuid()}-{st.st_dev}-{st.st_ino}.ledger2")
    return shm if shm.exists() and not beside.exists() else beside


def lose_ledger(cache: str) -> None:
    """What a fresh boot or a restored directory does: the cache's ledger is gone."""
    ledger_file(cache).unlink(missing_ok=True)


def lost_ledger(cache: str, compile_: Any, spirvs: List[Path], warm: Path) -> Dict[str, Any]:
    """What a compile pays while a lost ledger is rebuilt, against one with its ledger,
    in interleaved pairs (the order alternated, so that the compiler's and the host's
    drift falls on both sides): the ledger is put aside (lost: the next write makes a new
    one and begins the walk that rebuilds it, a slice per write), then each pair compiles
    one new kernel with the walking ledger and one with the kept ledger swapped back in
    (a hit first maps it again, untimed). The median and the slowest of each side, the
    first write after the loss, and the median of the pairs' ratios."""
    path = ledger_file(cache)
    kept = path.with_name(path.name + ".kept")
    walking = path.with_name(path.name + ".walking")
    os.rename(path, kept)  # lost, for the cache; the first walking write makes a new one
    now = "walking"

    def swap(to: str) -> None:
        nonlocal now
        if now != to:
            os.rename(path, walking if now == "walking" else kept)
            os.rename(walking if to == "walking" else kept, path)
            now = to
            assert compile_(warm).cached  # maps it, untimed

    took: Dict[str, List[float]] = {"walking": [], "kept": []}
    for i, (a, b) in enumerate(zip(spirvs[::2], spirvs[1::2])):
        for side, s in (("walking", a), ("kept", b))[:: 1 if i % 2 == 0 else -1]:
            swap(side)
            t = time.perf_counter()
            assert not compile_(s).cached
            took[side].append(time.perf_counter() - t)
    swap("walking")
    kept.unlink()
    ratios = [w / k for w, k in zip(took["walking"], took["kept"])]
    return {"kept": statistics.median(took["kept"]), "kept_slowest": max(took["kept"]),
            "lost": statistics.median(took["walking"]),
            "lost_slowest": max(took["walking"]), "lost_first": took["walking"][0],
            "lost_pair_ratio": statistics.median(ratios)}  # fmt: skip


def rebuild(cache: str, options: Any, donor: Any, spirv: Path, adopt: float) -> Dict[str, Any]:
    """The ledger lost again, then ``REBUILD_WRITES`` writes (the same entry adopted
    again), each timed less an adoption's own cost: the accounts are rebuilt a slice per
    write, so the most one write pays is a slice's, at any size."""
    import xpu_zebin

    lose_ledger(cache)
    entry = xpu_zebin._core.cache_slot(spirv.read_bytes(), "pvc", donor).local()
    slot = xpu_zebin._core.cache_slot(spirv.read_bytes(), "pvc", options)
    took: List[float] = []
    for _ in range(REBUILD_WRITES):
        t = time.perf_counter()
        slot.adopt(entry)
        took.append(max(time.perf_counter() - t - adopt, 0.0))
    return {"rebuild": statistics.median(took), "rebuild_stall": max(took)}


def evict(cache: str, options: Any, donor: Any, spirv: Path, adopt: float) -> Dict[str, Any]:
    """Bound the cache at what it holds and adopt one more entry, then the same entry again
    until the cleaning that first write set off is over (a slice per write): each write
    timed, less an adoption's own cost; per entry removed, and the most one write paid."""
    import xpu_zebin

    before = xpu_zebin.stats(cache)
    os.environ["XPU_ZEBIN_CACHE_MAX_BYTES"] = str(before["bytes"])
    entry = xpu_zebin._core.cache_slot(spirv.read_bytes(), "pvc", donor).local()
    slot = xpu_zebin._core.cache_slot(spirv.read_bytes(), "pvc", options)
    took: List[float] = []
    while not took or (xpu_zebin.stats(cache)["cleaning"] and len(took) < 4096):
        t = time.perf_counter()
        slot.adopt(entry)
        took.append(max(time.perf_counter() - t - adopt, 0.0))
    after = xpu_zebin.stats(cache)
    removed = after["counters"]["evictions"] - before["counters"]["evictions"]
    held = after["bytes"] <= after["max_bytes"] and not after["cleaning"]
    return {"evicted": removed, "evict": sum(took) / max(removed, 1),
            "evict_writes": len(took), "evict_stall": max(took),
            "entries_before": before["entries"], "evict_held": held}  # fmt: skip


def _spirvs(out: Path, ocloc: str, tag: str, count: int, start: int) -> None:
    import xpu_zebin

    for i in range(count):
        src = KERNEL.format(n=start + i)
        (out / f"{tag}-{i:04d}.spv").write_bytes(
            xpu_zebin.opencl_to_spirv(src, device="pvc", ocloc=ocloc)
        )


def prepare(work: Path, ocloc: str, sizes: List[int], rounds: int, n: int, adopts: int) -> None:
    """Each size's cache, filled; the kernels of every node (each its own) and the other
    node's cache they adopt from."""
    import xpu_zebin

    spirv_dir = work / "spirv"
    spirv_dir.mkdir()
    for level, _ in enumerate(sizes):
        for r in range(rounds):
            at = 1000 * (level + 1) + 100 * r
            _spirvs(spirv_dir, ocloc, f"w{level}r{r}", n + 1, at)
            _spirvs(spirv_dir, ocloc, f"dw{level}r{r}", adopts + 2, 100 * at + 50_000)
        at = 1000 * (level + 1) + 100 * (rounds - 1) + 50  # the last round's lost ledger
        _spirvs(spirv_dir, ocloc, f"lw{level}r{rounds - 1}", 2 * n, 1000 * at + 7_000_000)
    for d in sorted(spirv_dir.glob("dw*-*.spv")):  # another node's cache, to adopt from
        xpu_zebin.compile(d.read_bytes(), device="pvc", ocloc=ocloc,
                          cache_dir=spirv_dir / "donor-cache")  # fmt: skip
    for level, size in enumerate(sizes):
        started = time.perf_counter()
        synthesize(work / f"cache{level}", level * 10_000_000, size)
        print(f"{size} entries synthesized in {time.perf_counter() - started:.1f} s",
              file=sys.stderr)  # fmt: skip
    os.sync()  # the fill's writeback is setup: it would slow the nodes' own writes


def fs_type(path: Path) -> str:
    """The type of the file system ``path`` is on, as /proc/self/mounts says."""
    best, kind = "", "unknown"
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        at = fields[1]
        if len(at) > len(best) and (path == Path(at) or Path(at) in path.parents):
            best, kind = at, fields[2]
    return kind


@contextlib.contextmanager
def place(xfs: bool, sizes: List[int]) -> Iterator[Path]:
    """Where the caches go: a new directory in TMPDIR, or on a fresh XFS in a loop device
    (a sparse image in TMPDIR, room for the largest sizes' entries at a block each)."""
    work = Path(tempfile.mkdtemp(prefix="xpu-zebin-scale-"))
    mnt = work / "xfs"
    try:
        if xfs:
            image = work / "xfs.img"
            with open(image, "wb") as f:
                f.truncate((sum(sizes) * 8192 + (4 << 30)) // 4096 * 4096)
            mnt.mkdir()
            for cmd in (["mkfs.xfs", "-q", "-f", image], ["mount", "-o", "loop", image, mnt]):
                subprocess.run([str(c) for c in cmd], check=True, timeout=600)
        yield mnt if xfs else work
    finally:
        if xfs:
            subprocess.run(["umount", str(mnt)], check=False, timeout=600)
        subprocess.run(["rm", "-rf", str(work)], check=False)


def node(work: Path, ocloc: str, level: int, r: int, n: int, adopts: int, evicts: bool) -> Dict:
    bound = 1 << 40  # no eviction but the one the last round's node sets off at its end
    env = {**os.environ, "XPU_ZEBIN_CACHE_MAX_BYTES": str(bound)}
    out = subprocess.run([sys.executable, __file__, "--child", str(work / f"cache{level}"),
                          ocloc, str(work / "spirv"), f"w{level}r{r}", str(n), str(adopts),
                          str(int(evicts))], env=env, capture_output=True, text=True)  # fmt: skip
    if out.returncode != 0:
        raise SystemExit(f"node of cache {level} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


SIZE_COSTS = ("write", "hit", "adopt")


def size_ratios(got: Dict[int, List[Dict[str, Any]]]) -> Dict[str, pairs.Ratio]:
    """Each cost at the largest size over the same at the smallest, a ratio per round (the
    sizes go forward one round and back the next: a drift of the host falls on both
    sides of the ratio alike over an even number of rounds)."""
    first, last = got[min(got)], got[max(got)]
    return {k: pairs.summarize([g[k] for g in last], [g[k] for g in first]) for k in SIZE_COSTS}


def measure(work: Path, ocloc: str, sizes: List[int], rounds: int, n: int,
            adopts: int) -> Tuple[Dict[str, Any], Dict[str, pairs.Ratio]]:  # fmt: skip
    """Every size's nodes, the sizes in order one round and in reverse the next; per size
    the median over rounds of each cost, and the last round's cleaning; the size ratios."""
    got: Dict[int, List[Dict[str, Any]]] = {level: [] for level, _ in enumerate(sizes)}
    for r in range(rounds):
        order = list(range(len(sizes)))[:: -1 if r % 2 else 1]  # forward, then back
        for level in order:
            got[level].append(node(work, ocloc, level, r, n, adopts, r == rounds - 1))
            print(f"round {r}, {sizes[level]} entries: adopt "
                  f"{got[level][-1]['adopt'] * 1e3:.4f} ms", file=sys.stderr)  # fmt: skip
    rows: Dict[str, Any] = {}
    for level, size in enumerate(sizes):
        last = got[level][-1]
        med = {k: statistics.median(g[k] for g in got[level]) for k in SIZE_COSTS}
        rows[str(size)] = {**{k: round(v * 1e3, 4) for k, v in med.items()},
                           **{f"{k}_rounds": [round(g[k] * 1e3, 4) for g in got[level]]
                              for k in SIZE_COSTS},
                           "evict": round(last["evict"] * 1e3, 4), "evicted": last["evicted"],
                           "evict_writes": last["evict_writes"],
                           "evict_stall": round(last["evict_stall"] * 1e3, 1),
                           "rebuild": round(last["rebuild"] * 1e3, 4),
                           "rebuild_stall": round(last["rebuild_stall"] * 1e3, 1),
                           **{f"{k}_write": round(last[k] * 1e3, 1)
                              for k in ("kept", "kept_slowest", "lost", "lost_slowest",
                                        "lost_first")},
                           "lost_pair_ratio": round(last["lost_pair_ratio"], 3),
                           "lru_kept": last["lru_kept"], "held": last["evict_held"],
                           "rss_mib": max(g["rss_mib"] for g in got[level]),
                           "entries": last["stats"]["entries"],
                           "bytes": last["stats"]["bytes"],
                           "max_bytes": last["stats"]["max_bytes"]}  # fmt: skip
    return rows, size_ratios(got)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ocloc", default=None)
    p.add_argument("--sizes", default="0,10000,100000,1000000")
    p.add_argument("--ops", type=int, default=25, help="timed writes per node")
    p.add_argument("--adopts", type=int, default=100, help="timed hits and adoptions per node")
    p.add_argument(
        "--rounds",
        type=int,
        default=4,
        help="nodes per size, the sizes forward one round, back the next",
    )
    p.add_argument("--json", action="store_true")
    p.add_argument("--xfs", action="store_true",
                   help="the caches on a new XFS in a loop device (root), not TMPDIR")  # fmt: skip
    p.add_argument("--child", nargs=7, help=argparse.SUPPRESS)
    record.add_output_argument(p)
    args = p.parse_args()
    if args.child:
        c = args.child
        child(*c[:4], int(c[4]), int(c[5]), c[6] == "1")
        return 0
    import xpu_zebin

    ocloc = os.fspath(xpu_zebin.find_ocloc(args.ocloc))
    sizes = sorted(int(s) for s in args.sizes.split(","))
    n, adopts, rounds = max(1, args.ops), max(1, args.adopts), max(1, args.rounds)
    with place(args.xfs, sizes) as work:
        prepare(work, ocloc, sizes, rounds, n, adopts)
        rows, ratios = measure(work, ocloc, sizes, rounds, n, adopts)
    last = rows[str(sizes[-1])]
    # Evictions per entry against the first size that evicts enough to time per entry.
    base = next((v for v in rows.values() if v["evicted"] >= 1000), last)
    r: Dict[str, Any] = {
        "sizes": sizes,
        "rounds": rounds,
        "ms": rows,
        **{f"{k}_ratio": round(ratio.median, 2) for k, ratio in ratios.items()},
        "bounds": {f"{k}_ratio": ratio.bounds() for k, ratio in ratios.items()},
        "evict_ratio": round(last["evict"] / base["evict"], 2) if base["evict"] else None,
        # The most one write paid for a cleaning, at the largest size over that at the first
        # size that evicts a thousand.
        "evict_stall_ratio": round(last["evict_stall"] / base["evict_stall"], 2)
        if base["evict_stall"]
        else None,
        # The slowest compile while a lost ledger was rebuilt, at the largest size, over
        # the slowest of as many with the ledger, interleaved (at most 1.25 is the goal).
        "lost_ledger_ratio": round(last["lost_slowest_write"] / last["kept_slowest_write"], 2),
        "lost_ledger_pair_ratio": last["lost_pair_ratio"],
        # The most one write paid while a lost ledger was rebuilt, the same way.
        "rebuild_stall_ratio": round(last["rebuild_stall"] / base["rebuild_stall"], 2)
        if base["rebuild_stall"]
        else None,
        "lru_kept": all(v["lru_kept"] is not False for v in rows.values()),
        "peak_rss_mib": max(v["rss_mib"] for v in rows.values()),
        "size_bytes": last["bytes"],
        "bound_bytes": last["max_bytes"],
        "held": all(v["held"] and v["bytes"] <= v["max_bytes"] for v in rows.values()),
    }
    r["file_system"] = "xfs" if args.xfs else fs_type(Path(tempfile.gettempdir()))
    record.write(args.output, "scale_xfs" if args.xfs else "scale", r, ocloc)
    if args.json:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
