"""Upstream's GRF cases, one table per drop-in path, on the real compilers and driver.

Each row is an input, upstream's answer as its sources define it (the PR cited), and what
the drop-in must return: the flags tried, the flags chosen, ``n_regs``, and for the JIT
path ``n_spills`` in upstream's unit. The conformance table (docs/grf-rules.md) is this table.
``make_zebin`` runs the modern ocloc (IGC 2.x, which has the PTSS check); ``load_binary``
runs the Level Zero driver's JIT on the simulated PVC (IGC 1.x)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import List, Optional

import pytest
from triton.runtime.errors import OutOfResources

import xpu_zebin
import xpu_zebin.triton as xt
from xpu_zebin import samples

G128 = "-cl-intel-128-GRF-per-thread"
G256 = "-cl-intel-256-GRF-per-thread"
G512 = "-cl-intel-512-GRF-per-thread"
AUTO = "-cl-intel-enable-auto-large-GRF-mode"

SIMD8 = """
__attribute__((intel_reqd_sub_group_size(8)))
__kernel void simd8(__global float* p) { p[get_global_id(0)] *= 2.0f; }
"""


@pytest.fixture(scope="module")
def kernels(system_ocloc) -> dict:
    """name -> SPIR-V: no spills, a small spill (under 1024 bytes per hardware thread on
    both compilers: the rows below prove it), a large one, a PTSS overflow at 128 GRF on IGC 2.x,
    and a kernel that builds in no GRF mode (SIMD8 is not a PVC sub-group size)."""
    sources = {
        "add": samples.ADD_KERNEL,
        "small": samples.register_pressure_kernel(40, name="small"),
        "spill": samples.register_pressure_kernel(300, name="spill"),
        "pressure": samples.ptss_overflow_kernel(),
        "simd8": SIMD8,
    }
    return {
        name: xpu_zebin.opencl_to_spirv(src, device="pvc", ocloc=system_ocloc)
        for name, src in sources.items()
    }


@dataclass
class Row:
    case: str
    kernel: str
    upstream: str  # upstream's answer and the PR that defines it
    flags: str = ""
    grf_mode: str = "default"
    num_warps: int = 4
    lts: bool = True
    seventh: Optional[str] = None
    chosen: Optional[str] = None  # None: the build raises
    n_regs: Optional[int] = None
    raises: Optional[str] = None  # "out_of_resources" or an error kind
    tried: List[str] = field(default_factory=list)


MAKE_ZEBIN = [
    Row("explicit 128", "spill", "flags as given, no retry (#7623)", grf_mode="128",
        chosen=G128, n_regs=128),
    Row("explicit 256", "spill", "flags as given, no retry", grf_mode="256", chosen=G256,
        n_regs=256),
    Row("explicit 512 on pvc", "add", "IGC refuses 512 GRF on PVC: IntelGPUError",
        grf_mode="512", raises="build_failure"),
    Row("auto", "spill", "auto flag, no retry; n_regs 128 (#7416)", grf_mode="auto",
        chosen=AUTO, n_regs=128),
    Row("default, build fails (PTSS)", "pressure", "retry 256, recovered (#7623)",
        chosen=G256, n_regs=256),
    Row("default, spills under 1024 B, LTS", "small", "any spill rebuilds (#8147, #8115)",
        chosen=G256, n_regs=256),
    Row("default, spills under 1024 B, rolling", "small", "kept: under 1024 B (#8147)",
        lts=False, chosen="", n_regs=128),
    Row("default, spills 1024 B or more, rolling", "spill", "rebuild 256 (#8147)", lts=False,
        chosen=G256, n_regs=256),
    Row("default, num_warps > 32", "spill", "no retry: 256 GRF halves the work-group (#7623)",
        num_warps=64, chosen="", n_regs=128),
    Row("explicit 128, PTSS overflow", "pressure",
        "OutOfResources(required, limit, 'per-thread scratch space (PTSS)')", grf_mode="128",
        raises="out_of_resources"),
]  # fmt: skip

LOAD_BINARY = [
    Row("explicit 128", "spill", "flags as given, no retry", flags=G128, chosen=G128,
        n_regs=128, tried=[G128]),
    Row("explicit 256", "spill", "flags as given", flags=G256, chosen=G256, n_regs=256,
        tried=[G256]),
    Row("explicit 512", "add", "flags as given; n_regs from the flag: 512", flags=G512,
        chosen=G512, n_regs=512, tried=[G512]),
    Row("auto", "spill", "no retry; n_regs 128 (#7416)", flags=AUTO, chosen=AUTO,
        n_regs=128, tried=[AUTO]),
    Row("default, no spills", "add", "first build kept", chosen="", n_regs=128, tried=[""]),
    Row("default, spills under 1024 B", "small", "kept: rebuild from 1024 B (#8147)",
        chosen="", n_regs=128, tried=[""]),
    Row("default, spills 1024 B or more", "spill", "rebuild 256, rebuild kept (#8147)",
        chosen=G256, n_regs=256, tried=["", G256]),
    Row("7th arg '128' (max GRF)", "spill", "no larger mode: no retry (#8074)",
        seventh="128", chosen="", n_regs=128, tried=[""]),
    Row("7th arg '512' (max GRF)", "spill", "retry at 512 (#8074)", seventh="512",
        chosen=G512, n_regs=512, tried=["", G512]),
    Row("7th arg 'cri' (device arch)", "spill", "retry at 512 on cri (#7551)", seventh="cri",
        chosen=G512, n_regs=512, tried=["", G512]),
    Row("7th arg 'pvc' (device arch)", "spill", "retry at 256", seventh="pvc", chosen=G256,
        n_regs=256, tried=["", G256]),
    Row("default, both builds fail", "simd8", "the FIRST error is raised", raises="build_failure",
        tried=["", G256]),
]  # fmt: skip


@pytest.mark.parametrize("row", MAKE_ZEBIN, ids=[r.case for r in MAKE_ZEBIN])
def test_make_zebin_conformance(row, kernels, modern_ocloc, monkeypatch):
    monkeypatch.setenv("XPU_ZEBIN_OCLOC", modern_ocloc)
    metadata = {"name": row.kernel, "build_flags": row.flags}
    options = SimpleNamespace(grf_mode=row.grf_mode, num_warps=row.num_warps)
    spirv = kernels[row.kernel]
    if row.raises == "out_of_resources":
        with pytest.raises(OutOfResources) as e:
            xt.make_zebin(spirv, metadata, options, "pvc", lts=row.lts)
        assert e.value.required > e.value.limit == 262144
        return
    if row.raises:
        with pytest.raises(Exception) as e:
            xt.make_zebin(spirv, metadata, options, "pvc", lts=row.lts)
        assert getattr(e.value, "kind", None) == row.raises, e.value
        return
    zebin = xt.make_zebin(spirv, metadata, options, "pvc", lts=row.lts)
    assert metadata["build_flags"] == row.chosen
    info = xpu_zebin.zebin_info(zebin)["kernels"][0]
    assert info["grf_count"] == row.n_regs or row.chosen == AUTO
    if row.kernel == "small":  # the small spill is what the rows say it is
        first = xpu_zebin.compile(spirv, device="pvc", build_flags=G128, cache=False)
        assert 0 < first.spill_size < 1024, first


@pytest.mark.parametrize("row", LOAD_BINARY, ids=[r.case for r in LOAD_BINARY])
def test_load_binary_conformance(row, kernels, caplog):
    spirv = kernels[row.kernel]
    args = (row.kernel, spirv, 0, row.flags, True, 0) + (
        (row.seventh,) if row.seventh is not None else ()
    )
    if row.raises:
        with pytest.raises(Exception) as e:
            xt.load_binary(*args)
        cause = e.value.__cause__ or e.value
        assert cause.kind == row.raises
        assert [a.build_flags for a in cause.attempts] == row.tried
        assert not cause.attempts[0].ok and "subgroup size 8" in cause.log
        return
    with caplog.at_level(logging.INFO):
        module, function, n_regs, n_spills, _ = xt.load_binary(*args)
    with module:
        assert [a.build_flags for a in module.attempts] == row.tried
        assert module.build_flags == xt.get_last_selected_build_flags() == row.chosen
        assert n_regs == row.n_regs and function == module.kernel_handle
        # upstream's unit (#7950): spillMemSize / (4 * SIMD width), truncated
        assert n_spills == module.spill_bytes // (4 * module.simd_size)
        if row.kernel == "small":
            assert 0 < module.spill_bytes < 1024
        if row.kernel == "spill" and row.tried == [""]:
            assert module.spill_bytes >= 1024
