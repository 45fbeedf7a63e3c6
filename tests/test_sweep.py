"""Autotune sweeps compiled concurrently through Triton's own pipeline and cache, with the
GRF fallback per config: real triton-xpu, the modern compiler (the one with the PTSS check)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import triton
from triton.runtime.errors import OutOfResources
from triton_helpers import LIVE_BLOCK, LIVE_SIG, TARGET_SIMD32, live_kernel, triton_on_cpu

import xpu_zebin.triton as xt
from xpu_zebin.triton import dropin

GRF256 = "-cl-intel-256-GRF-per-thread"
# Not 2 warps: its spilling build costs as much as 4 to 32 together (77 KB of SPIR-V).
WARPS = (1, 4, 8, 16, 32)


@pytest.fixture
def native_triton(tmp_path, modern_ocloc, monkeypatch):
    """Triton on the CPU with native code on, so its pipeline ends in the zebin stage."""
    monkeypatch.setenv("XPU_ZEBIN_OCLOC", modern_ocloc)
    monkeypatch.setenv("TRITON_XPU_GEN_NATIVE_CODE", "1")
    monkeypatch.setenv("TRITON_INTEL_DEVICE_ARCH", "pvc")
    with triton_on_cpu(str(tmp_path / "triton-cache")):
        yield
    xt.uninstall()


@pytest.mark.slow
def test_sweep_reports_overflow_in_its_slot_and_fills_tritons_cache(native_triton, monkeypatch):
    configs = [triton.Config({"BLOCK": LIVE_BLOCK}, num_warps=w) for w in WARPS]
    done: list = []
    results = xt.compile_configs(
        live_kernel, LIVE_SIG, configs, target=TARGET_SIMD32, progress=done.append
    )
    assert sorted(done) == list(range(len(WARPS)))
    assert [r.config for r in results] == configs  # input order
    by_warps = {r.config.num_warps: r for r in results}
    # The kernel still sits where it should: one warp overflows PTSS in both GRF modes.
    one = by_warps[1]
    assert isinstance(one.error, OutOfResources), one.error
    assert one.error.required > one.error.limit == 262144
    for w in WARPS[1:]:
        r = by_warps[w]
        assert r.ok, (w, r.error)
        assert r.build_flags == r.kernel.metadata.build_flags == GRF256  # it spills at 128
        assert r.kernel.asm["spv"][:4] == b"\x7fELF"

    # The autotuner's own compiles of the same configs are Triton cache hits: no stage runs.
    native_builds: list = []
    real_make_zebin = dropin.make_zebin
    monkeypatch.setattr(
        dropin, "make_zebin", lambda *a, **k: native_builds.append(1) or real_make_zebin(*a, **k)
    )
    for w in WARPS[1:]:
        again = _compile(w)
        assert again.metadata.build_flags == GRF256
        assert again.hash == by_warps[w].kernel.hash
    assert native_builds == []
    # The spy sees a stage that runs: another Triton key (num_stages), the same SPIR-V.
    assert _compile(WARPS[1], num_stages=2).metadata.build_flags == GRF256
    assert native_builds == [1]


def test_sweep_of_an_autotuned_kernel_uses_its_configs(native_triton):
    # do_bench would time launches on a GPU; none runs here (nothing is launched anyway).
    tuned = triton.autotune(
        configs=[triton.Config({"BLOCK": 1024}, num_warps=w) for w in (4, 8)],
        key=[],
        do_bench=lambda *args, **kwargs: [0.0],
    )(live_kernel)
    results = xt.compile_configs(tuned, LIVE_SIG, target=TARGET_SIMD32)
    assert [r.config.num_warps for r in results] == [4, 8]
    assert all(r.ok and r.kernel.asm["spv"][:4] == b"\x7fELF" for r in results)


def _compile(num_warps: int, num_stages: int = 3):
    from triton.compiler import ASTSource

    names = live_kernel.arg_names
    sig = {n: "constexpr" if n == "BLOCK" else LIVE_SIG[n] for n in names}
    src = ASTSource(live_kernel, sig, {(names.index("BLOCK"),): LIVE_BLOCK})
    options = {"num_warps": num_warps, "num_stages": num_stages}  # what a triton.Config holds
    return triton.compile(src, target=TARGET_SIMD32, options=options)


AST_RACE = """
import ast, gc, json, sys, threading, time
from xpu_zebin.triton import frontend

gc.set_threshold(10, 1, 1)  # collections inside parses


class Cycle:
    def __del__(self):  # run by a collection inside a parse: the GIL changes hands
        time.sleep(0)


SOURCE = "\\n".join(f"def f{i}(x):\\n    return [x + {i} for _ in range(3) if x]"
                   for i in range(100))  # fmt: skip


def parses(depth, errors):  # threads parse from different stack depths, as Triton's do
    if depth:
        return parses(depth - 1, errors)
    for _ in range(100):
        for _ in range(5):
            cycle = Cycle()
            cycle.me = cycle
        try:
            ast.parse(SOURCE)
        except Exception as e:  # every failure, the race's and any other
            errors.append(f"{type(e).__name__}: {e}")


def round_of_parses():
    errors = []
    threads = [threading.Thread(target=parses, args=(d, errors)) for d in (0, 40, 80)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


unguarded = []
for _ in range(5 if frontend.AST_PARSE_RACES else 1):  # until the race shows
    unguarded = round_of_parses()
    if unguarded:
        break
original = ast.parse
frontend.reparse_racing_parses()
frontend.reparse_racing_parses()  # once and for good: not wrapped twice
guarded = [e for _ in range(2) for e in round_of_parses()]  # each round shows the race unguarded
print(json.dumps({"unguarded": unguarded[:1], "guarded": guarded,
                  "wrapped": ast.parse is not original,
                  "once": getattr(ast.parse, "__wrapped__", None) is original}))
"""


def test_threads_parse_kernels_despite_cpythons_race(tmp_path):
    """CPython 3.11 before 3.11.8 (3.12 before 3.12.2) fails a thread's ``ast.parse`` when
    another parses at once (python/cpython#106905); Triton parses a kernel at each compile,
    so configs compiled on threads (sweeps, autotuning, AOT) failed with ``SystemError``
    where Triton's one-at-a-time autotuner does not. The stress shows the race on such a
    CPython (each round does, measured here), then none once the package has made a spoilt
    parse parse again."""
    script = tmp_path / "race.py"
    script.write_text(AST_RACE)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    from xpu_zebin.triton.frontend import AST_PARSE_RACES

    assert report["guarded"] == []
    assert report["wrapped"] is AST_PARSE_RACES
    if AST_PARSE_RACES:  # the stress finds the race it guards against
        assert report["once"] is True
        assert "AST constructor recursion depth mismatch" in report["unguarded"][0]
    else:
        assert report["unguarded"] == []
