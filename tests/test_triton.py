"""The Triton drop-ins, with real Triton (triton-xpu 3.3 compiling on the CPU) and the real
compilers and driver (see ``triton_helpers``)."""

from __future__ import annotations

import os

import pytest
from triton.backends import backends
from triton.backends.compiler import GPUTarget
from triton.runtime.errors import OutOfResources
from triton_helpers import (
    ADD_SIG,
    MM_SIG,
    TARGET,
    RecordingUtils,
    RecordingUtils33,
    add_kernel,
    compile_triton,
    matmul_kernel,
    triton_on_cpu,
)

import xpu_zebin
import xpu_zebin.triton as xt

GRF256 = "-cl-intel-256-GRF-per-thread"


@pytest.fixture(scope="module", autouse=True)
def on_cpu(tmp_path_factory):
    with triton_on_cpu(str(tmp_path_factory.mktemp("triton-cache"))):
        yield
    xt.uninstall()


@pytest.fixture(scope="module")
def triton_kernels():
    """Real Triton SPIR-V: a small kernel and a register-heavy matmul."""
    add = compile_triton(add_kernel, ADD_SIG, {"BLOCK": 1024})
    matmul = compile_triton(matmul_kernel, MM_SIG, {"BM": 64, "BN": 64, "BK": 32})
    return {"add": add, "matmul": matmul}


def _metadata(kernel) -> dict:
    return {"name": kernel.metadata.name, "build_flags": "", "target": TARGET}


def _options(num_warps=4, grf_mode="default"):
    backend = backends["intel"].compiler(TARGET)
    options = backend.parse_options({"num_warps": num_warps})
    object.__setattr__(options, "grf_mode", grf_mode)
    return options


def test_triton_spirv_is_valid(triton_kernels):
    assert xpu_zebin.validate_spirv(triton_kernels["add"].asm["spv"]) == ["add_kernel"]
    assert xpu_zebin.validate_spirv(triton_kernels["matmul"].asm["spv"]) == ["matmul_kernel"]


def test_make_zebin_on_triton_kernels(ocloc, triton_kernels, monkeypatch):
    monkeypatch.setenv("XPU_ZEBIN_OCLOC", ocloc)
    add, matmul = triton_kernels["add"], triton_kernels["matmul"]
    meta = _metadata(add)
    zebin = xt.make_zebin(add.asm["spv"], meta, _options())
    assert meta["build_flags"] == "" and meta["binary_ext"] == "zebin"
    assert xpu_zebin.zebin_info(zebin)["kernels"][0]["name"] == "add_kernel"
    meta = _metadata(matmul)
    zebin = xt.make_zebin(matmul.asm["spv"], meta, _options())
    assert meta["build_flags"] == GRF256  # it spills at default GRF
    assert xpu_zebin.zebin_info(zebin)["kernels"][0]["grf_count"] == 256


def test_make_zebin_keeps_default_grf_beyond_32_warps(system_ocloc, triton_kernels, monkeypatch):
    monkeypatch.setenv("XPU_ZEBIN_OCLOC", system_ocloc)
    matmul = triton_kernels["matmul"]
    meta = _metadata(matmul)
    zebin = xt.make_zebin(matmul.asm["spv"], meta, _options(num_warps=64))
    assert meta["build_flags"] == ""
    assert xpu_zebin.zebin_info(zebin)["kernels"][0]["grf_count"] == 128


def test_standalone_load_binary_on_the_simulated_device(triton_kernels):
    matmul = triton_kernels["matmul"]
    module, function, n_regs, n_spills, n_max_threads = xt.load_binary(
        "matmul_kernel", matmul.asm["spv"], 0, "", True, 0
    )
    assert isinstance(module, xpu_zebin.LoadedKernel) and function == module.kernel_handle
    assert n_regs == 256 and n_max_threads == 1024 and n_spills == module.n_spills
    assert xt.get_last_selected_build_flags() == GRF256
    module.close()


@pytest.mark.parametrize("utils_cls", [RecordingUtils, RecordingUtils33], ids=["main", "3.3"])
def test_install_hands_the_driver_a_native_binary(
    utils_cls, system_ocloc, triton_kernels, monkeypatch
):
    monkeypatch.setenv("XPU_ZEBIN_OCLOC", system_ocloc)
    # Recorded as unset, so the switch the 3.3 path turns on is removed after the test.
    monkeypatch.setenv("TRITON_XPU_GEN_NATIVE_CODE", "")
    utils = xt.install(utils_cls(), backend=False)
    assert xt.install(utils, backend=False) is utils  # idempotent
    spirv = triton_kernels["matmul"].asm["spv"]
    if utils_cls is RecordingUtils:
        result = utils.load_binary("matmul_kernel", spirv, 0, "", True, 0, "pvc")
    else:
        monkeypatch.setenv("TRITON_INTEL_DEVICE_ARCH", "pvc")
        result = utils.load_binary("matmul_kernel", spirv, 0, "", 0)
    ((name, binary, flags, is_spv, _),) = utils.calls
    assert name == "matmul_kernel" and binary[:4] == b"\x7fELF" and is_spv is False
    assert flags == GRF256
    assert utils.get_last_selected_build_flags() == xt.get_last_selected_build_flags() == GRF256
    assert result[2] == 256  # n_regs from the chosen flags
    if utils_cls is RecordingUtils33:  # 3.3's switch turned on once, never flipped per load
        assert os.environ["TRITON_XPU_GEN_NATIVE_CODE"] == "1"
    else:
        assert os.environ["TRITON_XPU_GEN_NATIVE_CODE"] == ""
    result[0].close()
    xt.uninstall()
    assert not getattr(utils.load_binary, "__xpu_zebin__", False)


@pytest.mark.slow
def test_ptss_overflow_raises_triton_out_of_resources(modern_ocloc, ptss_spirv, monkeypatch):
    monkeypatch.setenv("XPU_ZEBIN_OCLOC", modern_ocloc)
    utils = xt.install(RecordingUtils(), backend=False)
    try:
        with pytest.raises(OutOfResources) as e:
            utils.load_binary(
                "pressure", ptss_spirv, 0, "-cl-intel-128-GRF-per-thread", True, 0, "pvc"
            )
    finally:
        xt.uninstall()
    err = e.value
    assert err.name == "per-thread scratch space (PTSS)"
    assert err.limit == 262144 and err.required > err.limit
    assert "max permitted PTSS" in err.log
    assert isinstance(err.__cause__, xpu_zebin.ScratchOverflowError)
    assert utils.calls == []  # nothing reached the driver


def test_build_errors_keep_their_log_without_intel_gpu_error(system_ocloc, monkeypatch):
    """triton-xpu 3.3 has no IntelGPUError: the package's own error comes through."""
    monkeypatch.setenv("XPU_ZEBIN_OCLOC", system_ocloc)
    source = "__kernel void k(__global float* p) { p[0] = 1.0f; }"
    spirv = xpu_zebin.opencl_to_spirv(source, device="pvc", ocloc=system_ocloc)
    meta = {"name": "k", "build_flags": "", "target": GPUTarget("xpu", {"arch": "nosuch"}, 16)}
    with pytest.raises(xpu_zebin.UnsupportedDeviceError) as e:
        xt.make_zebin(spirv, meta, _options())
    assert "nosuch" in e.value.log


def test_triton_compile_uses_the_zebin_stage(system_ocloc, monkeypatch):
    """End to end: with native code requested, Triton's compile runs make_zebin."""
    monkeypatch.setenv("XPU_ZEBIN_OCLOC", system_ocloc)
    monkeypatch.setenv("TRITON_XPU_GEN_NATIVE_CODE", "1")
    xt.install(RecordingUtils())
    try:
        kernel = compile_triton(matmul_kernel, MM_SIG, {"BM": 64, "BN": 64, "BK": 32})
    finally:
        xt.uninstall()
    # triton-xpu 3.3 keeps its binary under "spv"; with native code it is the zebin.
    zebin = kernel.asm["spv"]
    assert zebin[:4] == b"\x7fELF" and kernel.kernel == zebin
    assert kernel.metadata.build_flags == GRF256
    assert xpu_zebin.zebin_info(zebin)["kernels"][0]["grf_count"] == 256


def test_wrapper_keeps_the_drivers_other_attributes_and_takes_a_max_grf_mode(
    system_ocloc, triton_kernels, monkeypatch
):
    monkeypatch.setenv("XPU_ZEBIN_OCLOC", system_ocloc)
    utils = xt.install(RecordingUtils(), backend=False)
    try:
        kernel = triton_kernels["matmul"]
        # The newest driver's 7th argument: the max GRF mode. "128": no larger mode to try.
        module, *_ = utils.load_binary(
            kernel.metadata.name, kernel.asm["spv"], 0, "", True, 0, "128"
        )
        _, native, flags, is_spv, seventh = utils.calls[-1]
        assert (flags, is_spv, seventh) == ("", False, "128") and native[:4] == b"\x7fELF"
        assert utils.get_last_selected_build_flags() == ""
        utils.unload_module(module)  # the driver's own, untouched by the wrapper
        assert module.closed
    finally:
        xt.uninstall()
