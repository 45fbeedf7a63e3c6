"""The local cache at scale and its accounts (issue 38): ``xpu-zebin stats`` counts what
every process sharing a cache directory did, exactly; a cache of the last release's layout
is still served. Real compiles with Debian's ocloc, real processes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import xpu_zebin
from xpu_zebin import samples

#: A small kernel per constant: distinct SPIR-V, distinct cache keys.
KERNEL = """__kernel void scale{n}(__global float* a, __global const float* b) {{
    int i = get_global_id(0);
    a[i] = b[i] * {n}.0f + a[i];
}}
"""

WORKER = """
import json, sys, xpu_zebin
ocloc, cache_dir, hits = sys.argv[1], sys.argv[2], int(sys.argv[3])
spirvs = [open(p, "rb").read() for p in sys.argv[4:]]
sources = {}
for round in range(1 + hits):
    for s in spirvs:
        r = xpu_zebin.compile(s, device="pvc", ocloc=ocloc, cache_dir=cache_dir)
        sources[r.source] = sources.get(r.source, 0) + 1
print(json.dumps(sources))
"""


def _spirvs(tmp_path: Path, ocloc: str, first: int, count: int) -> list:
    paths = []
    for n in range(first, first + count):
        path = tmp_path / f"scale{n}.spv"
        path.write_bytes(xpu_zebin.opencl_to_spirv(KERNEL.format(n=n), device="pvc", ocloc=ocloc))
        paths.append(str(path))
    return paths


@pytest.mark.slow
def test_counts_are_exact_across_processes(system_ocloc, tmp_path):
    """Two processes share one cache directory, at once: each compiles its own kernels
    and hits them again and again. Every count is exact: requests, compiles, local hits,
    entries; the compiler's time is counted and the hits' saving is counted."""
    cache = tmp_path / "shared-cache"
    kernels, hits = 24, 4
    mine = [_spirvs(tmp_path, system_ocloc, w * 100, kernels) for w in range(2)]
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, system_ocloc, str(cache), str(hits), *paths],
            stdout=subprocess.PIPE,
            text=True,
        )
        for paths in mine
    ]
    outs = [json.loads(w.communicate(timeout=900)[0]) for w in workers]
    assert all(w.returncode == 0 for w in workers)
    assert outs == [{"compiled": kernels, "cache": kernels * hits}] * 2
    s = xpu_zebin.stats(cache)
    c = s["counters"]
    assert c["requests"] == 2 * kernels * (1 + hits)
    assert (c["compiles"], c["hits_local"]) == (2 * kernels, 2 * kernels * hits)
    assert c["compiler_microseconds"] > 0 and c["saved_microseconds"] > 0
    # The accounts of what is stored: a write racing the first recount of a new directory
    # may be counted twice until its shard is recounted; recounted, they are exact.
    assert abs(s["entries"] - 2 * kernels) <= 4
    s = xpu_zebin.stats(cache, recount=True)
    assert s["entries"] == 2 * kernels and s["counters"] == c
    assert s["bytes"] == sum(p.stat().st_size for p in cache.glob("zebin-v3/*/*.zeentry"))
    cli = subprocess.run([sys.executable, "-m", "xpu_zebin.cli", "stats", "--cache-dir",
                          str(cache), "--json", "--zero"], capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert json.loads(cli.stdout)["counters"] == c
    after = xpu_zebin.stats(cache)
    assert set(after["counters"].values()) == {0} and after["entries"] == 2 * kernels


@pytest.mark.slow
def test_a_ptss_retry_is_counted_by_its_trigger(modern_ocloc, tmp_path):
    """The kernel that needs large GRF (the real PTSS error of the modern compiler): one
    compile, one large-GRF retry triggered by PTSS; the same request again is a hit that
    saved both attempts' time."""
    source = samples.ptss_overflow_kernel()
    spirv = xpu_zebin.opencl_to_spirv(source, device="pvc", ocloc=modern_ocloc)
    cache = tmp_path / "cache"
    first = xpu_zebin.compile(spirv, device="pvc", ocloc=modern_ocloc, cache_dir=cache)
    assert first.recovered
    again = xpu_zebin.compile(spirv, device="pvc", ocloc=modern_ocloc, cache_dir=cache)
    assert again.cached
    c = xpu_zebin.stats(cache)["counters"]
    assert (c["compiles"], c["large_grf_retries_ptss"], c["hits_local"]) == (1, 1, 1)
    spent = sum(a.seconds for a in first.attempts)
    assert abs(c["saved_microseconds"] / 1e6 - spent) < 0.01


@pytest.mark.parametrize("layout", ["zebin-v2", "zebin-v1"])
def test_a_cache_of_the_last_layouts_is_still_served(system_ocloc, add_spirv, tmp_path, layout):
    """An entry a last release wrote (16 shards ``zebin-v2/<first hex digit>``, or one flat
    ``zebin-v1`` directory) is moved into its shard and answers, never lost."""
    cache = tmp_path / "cache"
    built = xpu_zebin.compile(add_spirv, device="pvc", ocloc=system_ocloc, cache_dir=cache)
    (entry,) = cache.glob("zebin-v3/*/*.zeentry")
    old = cache / layout / (entry.name[:1] if layout == "zebin-v2" else "")
    old.mkdir(mode=0o700, parents=True)
    shutil.move(str(entry), old / entry.name)
    shutil.rmtree(cache / "zebin-v3")
    env = {**os.environ, "XPU_ZEBIN_OCLOC": system_ocloc}
    code = ("import sys, xpu_zebin\n"
            "r = xpu_zebin.compile(sys.stdin.buffer.read(), device='pvc', cache_dir=sys.argv[1])\n"
            "sys.stdout.buffer.write(r.source.encode() + b' ' + r.binary)\n")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code, str(cache)], input=add_spirv,
                         capture_output=True, env=env, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout == b"cache " + built.binary
    assert not (cache / layout).exists() and xpu_zebin.stats(cache)["entries"] == 1
