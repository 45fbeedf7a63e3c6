"""Lean entries (issue 66): what compressing the levels' entries saves and costs, on the
shipped samples and real Triton kernels (``model_kernels.py``, SPIR-V from triton-xpu's
front end), built with one compiler.

Reported:

- per kernel, the entry's bytes on disk (compressed, as every level keeps it) against the
  bytes it holds uncompressed (what the last format stored); ``triton_ratio``: the Triton
  kernels' uncompressed bytes over their stored bytes, together (goal: at least 3.5);
- ``bundle``: the same kernels' zebins as one bundle, its files' and its packed archive's
  bytes as this package writes bundles (every file compressed) against the last format
  (files as built); ``ratio``: plain over lean (goal: at least 3);
- ``hit_cost_ratio``: a warm local hit (the entry in the page cache) of the largest Triton
  kernel's compressed entry against the same entry in the last, uncompressed format
  (still read as it is), in interleaved pairs (``pairs.py``), each side the median of 11
  hits: compressed / uncompressed (goal: at most 1.25).

    python benches/lean.py --ocloc <ocloc> [--kernels N] [--budget S] [--json] [--output F]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List

import blake3
import zstandard

import xpu_zebin
from xpu_zebin import bundle, samples

# No GPU here: Triton's target is the simulated PVC's (the real driver's).
os.environ.setdefault("XPU_ZEBIN_SIMULATED_DEVICE", "pvc")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import pairs  # noqa: E402  (benches/, beside this file)
import record  # noqa: E402

HITS_PER_SIDE = 11


def _entry(cache: Path) -> Path:
    (path,) = (cache / "zebin-v3").glob("*/*.zeentry")
    return path


def uncompressed(path: Path) -> bytes:
    """The entry at ``path`` in the last format (``XZCACHE2``): the same meta and binary,
    stored as built, its checksum over its key."""
    entry = path.read_bytes()
    plain = zstandard.ZstdDecompressor().decompress(entry[16:-32])
    (meta_len,) = struct.unpack("<I", plain[-4:])
    meta, binary = plain[-4 - meta_len : -4], plain[: -4 - meta_len]
    key = path.name.removesuffix(".zeentry")
    body = b"XZCACHE2" + struct.pack("<I", len(meta)) + meta + binary
    return body + blake3.blake3(key.encode() + body).digest()


def kernels(ocloc: str, limit: int) -> List[Dict[str, Any]]:
    """The shipped samples, then ``limit`` real Triton kernels."""
    import model_kernels

    from xpu_zebin import targets

    made = [
        {"name": "sample: add", "triton": False,
         "spirv": xpu_zebin.opencl_to_spirv(samples.ADD_KERNEL, device="pvc", ocloc=ocloc)},
        {"name": "sample: PTSS overflow", "triton": False,
         "spirv": xpu_zebin.opencl_to_spirv(samples.ptss_overflow_kernel(), device="pvc",
                                            ocloc=ocloc)},
    ]  # fmt: skip
    for k in model_kernels.model_spirv(targets.local().gpu_target(), limit):
        made.append({"name": k["config"], "triton": True, "spirv": k["spirv"]})
    return made


def sizes(ocloc: str, made: List[Dict[str, Any]], root: Path) -> List[Dict[str, Any]]:
    """Each kernel built into a cache of its own: its entry's stored and held bytes."""
    rows = []
    for i, k in enumerate(made):
        cache = root / f"k{i}"
        xpu_zebin.compile(k["spirv"], device="pvc", ocloc=ocloc, cache_dir=cache)
        path = _entry(cache)
        stored = path.stat().st_size
        held = len(uncompressed(path))
        k.update(cache=cache, path=path)
        rows.append({"kernel": k["name"], "triton": k["triton"], "stored_bytes": stored,
                     "uncompressed_bytes": held, "ratio": round(held / stored, 2)})  # fmt: skip
        print(f"  {k['name'][:60]:60s} {held:9,d} -> {stored:8,d} B  {held / stored:5.2f}x",
              file=sys.stderr)  # fmt: skip
    return rows


def hit_cost(ocloc: str, k: Dict[str, Any], root: Path, budget: float) -> pairs.Ratio:
    """Warm hits of ``k``'s compressed entry against its uncompressed twin."""
    plain = root / "plain"
    xpu_zebin.compile(k["spirv"], device="pvc", ocloc=ocloc, cache_dir=plain)
    twin = _entry(plain)
    twin.write_bytes(uncompressed(k["path"]))

    def hit(cache: Path, compress: str):
        def one() -> None:
            # Uncompressed, the twin stays so (a hit keeps an old entry compressed).
            os.environ["XPU_ZEBIN_CACHE_COMPRESS"] = compress
            r = xpu_zebin.compile(k["spirv"], device="pvc", ocloc=ocloc, cache_dir=cache)
            assert r.source == "cache", r.source

        return pairs.median_of(one, HITS_PER_SIDE)

    before = os.environ.get("XPU_ZEBIN_CACHE_COMPRESS")
    try:
        baseline, lean = hit(plain, "0"), hit(k["cache"], "1")
        baseline()  # both in the page cache
        lean()
        measured = pairs.measure(baseline, lean, floor=6, budget_s=budget)
        assert twin.read_bytes().startswith(b"XZCACHE2")  # the baseline: the last format's
        return measured
    finally:
        os.environ.pop("XPU_ZEBIN_CACHE_COMPRESS", None)
        if before is not None:
            os.environ["XPU_ZEBIN_CACHE_COMPRESS"] = before


def bundle_sizes(made: List[Dict[str, Any]], root: Path) -> Dict[str, Any]:
    """The same kernels' zebins as one bundle, as this package writes it (every file
    compressed) and as the last format stored it (files as built): bytes on disk, the
    directory's files and the packed archive."""
    built = []
    for i, k in enumerate(made):
        binary = entries_of(k["path"])[1]
        kernel = xpu_zebin.zebin_info(binary)["kernels"][0]["name"]
        entry = {"key": f"{i:064x}", "kernel": kernel, "target": "t" * 64, "build_flags": "",
                 "spill_bytes": 0, "n_spills": 0, "compiler": "c", "file": "", "blake3": "",
                 "size": 0}  # fmt: skip
        built.append((entry, binary))
    lean = root / "bundle-lean"
    header = {"format": "", "package": xpu_zebin.__version__}
    manifest = xpu_zebin._core.bundle_write(str(lean), header, built, [], [])
    plain = root / "bundle-plain"
    (plain / "native").mkdir(parents=True)
    for entry, (_, binary) in zip(manifest["entries"], built):
        (plain / entry["file"]).write_bytes(binary)
        entry.pop("stored")
    (plain / "manifest.json").write_text(json.dumps({**manifest, "format": "xpu-zebin-bundle/1"}))
    sizes = {}
    for name, d in (("lean", lean), ("plain", plain)):
        files = sum(p.stat().st_size for p in d.rglob("*") if p.is_file())
        bundle.pack(d, root / f"{name}.tar")
        sizes[name] = {"files_bytes": files, "archive_bytes": (root / f"{name}.tar").stat().st_size}
    assert bundle.verify(lean)["bad"] == []
    ratio = {k: round(sizes["plain"][k] / sizes["lean"][k], 2) for k in sizes["lean"]}
    return {**sizes, "ratio": ratio["files_bytes"], "archive_ratio": ratio["archive_bytes"]}


def entries_of(path: Path):
    """(meta, binary) of a cache entry of the current format."""
    plain = zstandard.ZstdDecompressor().decompress(path.read_bytes()[16:-32])
    (meta_len,) = struct.unpack("<I", plain[-4:])
    return plain[-4 - meta_len : -4], plain[: -4 - meta_len]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ocloc", default=None)
    parser.add_argument("--kernels", type=int, default=8, help="real Triton kernels (default 8)")
    parser.add_argument("--budget", type=pairs.seconds, default=60.0)
    parser.add_argument("--json", action="store_true")
    record.add_output_argument(parser)
    args = parser.parse_args()
    ocloc = str(xpu_zebin.find_ocloc(args.ocloc))
    print(f"compiler: {ocloc}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="xpu-zebin-lean-") as root:
        made = kernels(ocloc, max(1, args.kernels))
        rows = sizes(ocloc, made, Path(root))
        triton = [r for r in rows if r["triton"]]
        held = sum(r["uncompressed_bytes"] for r in triton)
        ratio = held / sum(r["stored_bytes"] for r in triton)
        largest = max((k for k in made if k["triton"]), key=lambda k: k["path"].stat().st_size)
        bundled = bundle_sizes(made, Path(root))
        cost = hit_cost(ocloc, largest, Path(root), args.budget)
    # The ratio is baseline / package: uncompressed hit seconds over compressed; its
    # inverse is what a compressed hit costs against today's.
    bounds = {"low": round(1 / cost.high, 3), "high": round(1 / cost.low, 3),
              "pairs": cost.pairs, "interval": pairs.INTERVAL}  # fmt: skip
    results = {
        "rows": rows,
        "triton_ratio": round(ratio, 2),
        "bundle": bundled,
        "hit_kernel": largest["name"],
        "hit_cost_ratio": round(1 / cost.median, 3),
        "hit_cost_bounds": bounds,
        "hit_microseconds": {
            "uncompressed": round(statistics.median(cost.baseline_s) * 1e6, 1),
            "compressed": round(statistics.median(cost.package_s) * 1e6, 1),
        },
    }
    print(
        f"a bundle of them: {bundled['ratio']}x smaller (archive {bundled['archive_ratio']}x); "
        f"Triton kernels: {ratio:.2f}x smaller on disk; a warm hit of {largest['name']} costs "
        f"{results['hit_cost_ratio']}x [{bounds['low']}-{bounds['high']}] ({cost.pairs} pairs)",
        file=sys.stderr,
    )
    record.write(args.output, "lean", results, ocloc)
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
