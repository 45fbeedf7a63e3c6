"""Autotune sweeps compiled concurrently through Triton's own pipeline and cache, with the
GRF fallback per config: real triton-xpu, the modern compiler (the one with the PTSS check)."""

from __future__ import annotations

import pytest
import triton
from triton.runtime.errors import OutOfResources
from triton_helpers import LIVE_BLOCK, LIVE_SIG, TARGET_SIMD32, live_kernel, triton_on_cpu

import xpu_zebin.triton as xt
from xpu_zebin.triton import dropin

GRF256 = "-cl-intel-256-GRF-per-thread"
WARPS = (1, 2, 4, 8, 16, 32)


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
