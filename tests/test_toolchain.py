"""The foundation: both real compilers run, and the package reads what they write."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import xpu_zebin


def test_each_ocloc_compiles_generated_spirv(ocloc, add_spirv):
    assert xpu_zebin.validate_spirv(add_spirv) == ["add"]
    result = xpu_zebin.compile(add_spirv, device="pvc", ocloc=ocloc, cache=False)
    assert result.binary[:4] == b"\x7fELF"
    info = xpu_zebin.zebin_info(result.binary)
    assert ".ze_info" in info["sections"]
    assert any(s.startswith(".text.") for s in info["sections"])
    (kernel,) = info["kernels"]
    assert kernel["name"] == "add"
    assert kernel["grf_count"] == 128
    assert kernel["simd_size"] in (8, 16, 32)
    assert result.build_flags == "" and result.n_regs == 128 and result.spill_size == 0
    assert [a.ok for a in result.attempts] == [True]


def test_the_two_toolchains_are_different_compilers(system_ocloc, modern_ocloc, add_spirv):
    zebins = [
        xpu_zebin.zebin_info(
            xpu_zebin.compile(add_spirv, device="pvc", ocloc=o, cache=False).binary
        )
        for o in (system_ocloc, modern_ocloc)
    ]
    # IGC 1.x writes .ze_info 1.x versions in the 1.2x range, IGC 2.x far newer ones.
    versions = [tuple(int(p) for p in z["version"].split(".")) for z in zebins]
    assert versions[0] < versions[1], versions


def test_ocloc_discovery_order(monkeypatch, system_ocloc, modern_ocloc, tmp_path):
    monkeypatch.delenv("XPU_ZEBIN_OCLOC", raising=False)
    assert xpu_zebin.find_ocloc() == system_ocloc  # PATH
    monkeypatch.setenv("XPU_ZEBIN_OCLOC", modern_ocloc)
    assert xpu_zebin.find_ocloc() == modern_ocloc  # environment beats PATH
    assert xpu_zebin.find_ocloc(system_ocloc) == system_ocloc  # argument beats both
    monkeypatch.setenv("XPU_ZEBIN_OCLOC", str(tmp_path / "nope"))
    with pytest.raises(xpu_zebin.ToolchainNotFound, match="XPU_ZEBIN_OCLOC"):
        xpu_zebin.find_ocloc()


def test_no_ocloc_anywhere_names_all_three_places(monkeypatch, add_spirv, tmp_path):
    monkeypatch.delenv("XPU_ZEBIN_OCLOC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(xpu_zebin.ToolchainNotFound) as e:
        xpu_zebin.compile(add_spirv, device="pvc")
    assert e.value.kind == "toolchain_missing"
    for place in ("explicitly", "XPU_ZEBIN_OCLOC", "PATH"):
        assert place in str(e.value)


def test_console_script_answers():
    script = Path(sys.executable).parent / "xpu-zebin"
    out = subprocess.run([str(script), "--help"], capture_output=True, text=True, check=True)
    for command in ("compile", "batch", "info", "demo", "devices", "kinds"):
        assert command in out.stdout
    import xpu_zebin.triton  # noqa: F401  the shim module imports without Triton
