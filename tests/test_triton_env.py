"""Activation by environment: ``XPU_ZEBIN_TRITON=1`` gives every process that imports Triton
the drop-ins, with no code change. Each case is a fresh subprocess running real triton-xpu
(compiling on the CPU) and the real compilers; the script never imports xpu_zebin itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

GRF256 = "-cl-intel-256-GRF-per-thread"
RECOVERY_LINE = '(I): Build failure recovered by retrying with large GRF mode for "window_kernel"'
TESTS = Path(__file__).resolve().parent

# Compiles a kernel through triton.compile with native code: the register-heavy matmul
# (spills at 128 GRF), or the PTSS-window kernel (fails at 128 GRF, builds at 256), and
# reports what it got and which modules were imported. The SYCL arch parser stub stands
# where a GPU's SYCL runtime would be (triton_helpers).
SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
import triton
from triton_helpers import (MM_SIG, TARGET_SIMD32, WINDOW_SIG, compile_triton, matmul_kernel,
                            triton_on_cpu, window_kernel)
from triton.compiler import ASTSource

before = sorted(m for m in sys.modules if "xpu_zebin" in m)
with triton_on_cpu(sys.argv[2]):
    if sys.argv[3] == "window":
        src = ASTSource(window_kernel, WINDOW_SIG, {(7,): 16384})
        k = triton.compile(src, target=TARGET_SIMD32, options={"num_warps": 2})
    else:
        k = compile_triton(matmul_kernel, MM_SIG, {"BM": 64, "BN": 64, "BK": 32})
binary = k.asm["spv"]
from triton.backends import backends
utils_cls = backends["intel"].driver.__init__.__globals__["XPUUtils"]
print(json.dumps({
    "utils_patched": getattr(utils_cls.__init__, "__xpu_zebin__", False),
    "build_flags": k.metadata.build_flags,
    "elf": binary[:4] == b"\\x7fELF",
    "modules_at_start": before,
    "modules": sorted(m for m in sys.modules if "xpu_zebin" in m),
}))
"""


def _run(tmp_path, env_overrides: dict, kernel: str = "matmul") -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("XPU_ZEBIN_TRITON", "TRITON_DEBUG")}
    env.update(env_overrides)
    script = tmp_path / "probe.py"  # Triton reads a kernel's source: a file, not -c
    script.write_text(SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script), str(TESTS), str(tmp_path / "triton-cache"), kernel],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


@pytest.fixture
def native_env(system_ocloc):
    return {"TRITON_XPU_GEN_NATIVE_CODE": "1", "XPU_ZEBIN_OCLOC": system_ocloc}


def test_the_variable_activates_the_drop_in(tmp_path, native_env):
    report, stderr = _run(tmp_path, {**native_env, "XPU_ZEBIN_TRITON": "1", "TRITON_DEBUG": "1"})
    assert report["elf"] and report["build_flags"] == GRF256  # it spills at default GRF
    assert "xpu_zebin.triton" in report["modules"]
    assert report["utils_patched"]  # every XPUUtils the driver makes loads through the package
    # The package's own account of the choice, shown as Triton's debug output is.
    assert f"chose '{GRF256}'" in stderr, stderr[-3000:]


def test_the_variable_recovers_a_ptss_failure_inside_triton_compile(
    tmp_path, native_env, modern_ocloc
):
    """The window kernel still overflows PTSS at 128 GRF and builds at 256 (IGC 2.x)."""
    env = {**native_env, "XPU_ZEBIN_OCLOC": modern_ocloc, "XPU_ZEBIN_TRITON": "1"}
    report, stderr = _run(tmp_path, env, kernel="window")
    assert report["elf"] and report["build_flags"] == GRF256
    assert RECOVERY_LINE in stderr, stderr[-3000:]


@pytest.mark.parametrize("value", [None, "0"], ids=["unset", "zero"])
def test_without_the_variable_triton_is_untouched(tmp_path, native_env, modern_ocloc, value):
    # Triton's own native path runs `ocloc ... -o`, which Debian's ocloc 22.43 lacks.
    env = {**native_env, "PATH": f"{Path(modern_ocloc).parent}:{os.environ['PATH']}"}
    if value is not None:
        env["XPU_ZEBIN_TRITON"] = value
    report, stderr = _run(tmp_path, env)
    assert report["modules_at_start"] == [] and report["modules"] == []  # nothing imported
    assert report["elf"] and not report["utils_patched"]  # Triton's own path built it
    assert "xpu_zebin" not in stderr


def test_the_hook_is_installed_with_the_package():
    import site

    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    assert any((Path(d) / "xpu_zebin.pth").is_file() for d in dirs), dirs
    assert any((Path(d) / "_xpu_zebin_hook.py").is_file() for d in dirs), dirs
