"""Real Triton (triton-xpu 3.3) compiling kernels to SPIR-V on the CPU, shared by the tests.

Triton's XPU arch parser needs SYCL headers; it is replaced by a stub that names the device
"pvc" (docs/design.md §4): it stands where a GPU's SYCL runtime would be.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

# triton-xpu is a test dependency (pyproject's `test` extra): missing, these tests fail.
# No pytest here: the benchmarks' ranks import this module, and pytest's import would be a
# cost of every rank that no user's process pays.
import triton
import triton.language as tl
from triton.backends import backends
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

ARCH = {
    "architecture": 0,
    "name": "pvc",
    "max_work_group_size": 1024,
    "max_num_sub_groups": 64,
    "sub_group_sizes": [16, 32],
    "has_fp64": True,
    # DPAS / 2D block IO stay off: the bookworm driver leaves such modules unlinked.
    "has_subgroup_matrix_multiply_accumulate": False,
    "has_subgroup_matrix_multiply_accumulate_tensor_float32": False,
    "has_subgroup_2d_block_io": False,
}
TARGET = GPUTarget("xpu", ARCH, 16)


class _ArchParser:
    """Stand-in for Triton's SYCL-built arch parser (no SYCL headers on this machine)."""

    @staticmethod
    def parse_device_arch(_architecture: int) -> str:
        return "pvc"


@contextlib.contextmanager
def triton_on_cpu(cache_dir: str) -> Iterator[None]:
    """Triton compiles on the CPU, into a cache of its own."""
    saved_dir = os.environ.get("TRITON_CACHE_DIR")
    os.environ["TRITON_CACHE_DIR"] = cache_dir
    init_globals = backends["intel"].compiler.__init__.__globals__
    saved = init_globals["compile_module_from_src"]
    init_globals["compile_module_from_src"] = lambda *args, **kwargs: _ArchParser()
    try:
        yield
    finally:
        init_globals["compile_module_from_src"] = saved
        if saved_dir is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = saved_dir


def compile_triton(fn, signature, constants, num_warps=4):
    src = ASTSource(fn, signature, {(list(signature).index(k),): v for k, v in constants.items()})
    return triton.compile(src, target=TARGET, options={"num_warps": num_warps})


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


ADD_SIG = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}


@triton.jit
def softmax_kernel(out_ptr, in_ptr, stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(in_ptr + row * stride + offs, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    den = tl.sum(num, axis=0)
    tl.store(out_ptr + row * stride + offs, num / den, mask=mask)


SOFTMAX_SIG = {"out_ptr": "*fp32", "in_ptr": "*fp32", "stride": "i32", "n_cols": "i32",
               "BLOCK": "constexpr"}  # fmt: skip


@triton.jit
def live_kernel(x_ptr, y_ptr, z_ptr, out_ptr, BLOCK: tl.constexpr):
    """Register-heavy by design: two fp64 tiles and a quarter of one stay live across a
    reduction. At one warp of 32 (BLOCK 16384) a hardware thread holds 288 KiB: IGC 2.x
    needs 289,664 bytes of scratch at 128 GRF and 281,344 at 256, past the 262,144-byte
    limit in every GRF mode; with more warps each thread holds less and it builds,
    spilling. (Three whole tiles, 384 KiB, overflowed too, at 2.5 times IGC's time.)
    """
    offs = tl.arange(0, BLOCK)
    part = tl.arange(0, BLOCK // 4)
    x = tl.load(x_ptr + offs)
    y = tl.load(y_ptr + offs)
    z = tl.load(z_ptr + part)
    s = tl.sum(x * y, axis=0) + tl.sum(z, axis=0)
    tl.store(out_ptr + offs, x * s + y)
    tl.store(z_ptr + part, z * s)


LIVE_SIG = {name: "*fp64" for name in ("x_ptr", "y_ptr", "z_ptr", "out_ptr")}
LIVE_BLOCK = 16384
# Warps of 32 lanes (SIMD32), as the sweep's overflow arithmetic above assumes.
TARGET_SIMD32 = GPUTarget("xpu", ARCH, 32)


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):  # fmt: skip
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a = a_ptr + rm[:, None] * sam + rk[None, :] * sak
    b = b_ptr + rk[:, None] * sbk + rn[None, :] * sbn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(0, K, BK):
        acc += tl.dot(tl.load(a), tl.load(b))
        a += BK * sak
        b += BK * sbk
    tl.store(c_ptr + rm[:, None] * scm + rn[None, :] * scn, acc)


MM_SIG = {
    **{p: "*fp32" for p in ("a_ptr", "b_ptr", "c_ptr")},
    **{p: "i32" for p in ("M", "N", "K", "sam", "sak", "sbk", "sbn", "scm", "scn")},
    **{p: "constexpr" for p in ("BM", "BN", "BK")},
}


@triton.jit
def window_kernel(a_ptr, b_ptr, c_ptr, d_ptr, e_ptr, out_ptr, e_out_ptr, BLOCK: tl.constexpr):
    """Sits in the PTSS window at 2 warps of 32 (BLOCK 16384), measured with IGC 2.x: four
    fp64 tiles and half a tile of int8 live across a reduction need about 264 KiB of
    scratch per thread at 128 GRF (over the 256 KiB limit) and about 8 KiB less at 256 GRF,
    so the default build fails and the large-GRF retry recovers it. tests/test_triton_env.py
    shows it still does."""
    offs = tl.arange(0, BLOCK)
    half = tl.arange(0, BLOCK // 2)
    a = tl.load(a_ptr + offs)
    b = tl.load(b_ptr + offs)
    c = tl.load(c_ptr + offs)
    d = tl.load(d_ptr + offs)
    e = tl.load(e_ptr + half)
    s = tl.sum(a * b + c * d, axis=0)
    tl.store(out_ptr + offs, (a + b) * s + (c + d) * s)
    tl.store(e_out_ptr + half, e + s.to(tl.int8))


# In the kernel's parameter order: Triton matches a signature to parameters by position.
WINDOW_SIG = {
    **{name: "*fp64" for name in ("a_ptr", "b_ptr", "c_ptr", "d_ptr")},
    "e_ptr": "*i8",
    "out_ptr": "*fp64",
    "e_out_ptr": "*i8",
    "BLOCK": "constexpr",
}


class RecordingUtils:
    """Stand-in for a Triton XPU driver's ``utils`` (the SYCL queue of a GPU cannot exist
    here). Like the real driver it loads what it gets through Level Zero (the real driver on
    the simulated device), and it records what it was handed."""

    #: The package's choice (both GRF modes at once on an idle core) unless said.
    speculative = None

    def __init__(self):
        self.calls = []
        self.last_flags = ""

    def load_binary(self, name, kernel, shared, build_flags, is_spv, device, device_arch=None):
        import xpu_zebin  # here: processes that use these helpers without it never import it

        self.calls.append((name, bytes(kernel), build_flags, is_spv, device_arch))
        loaded = xpu_zebin.compile_and_load(
            kernel, name, build_flags=build_flags, is_spv=is_spv, device=device, cache=False,
            speculative=self.speculative,
        )  # fmt: skip
        self.last_flags = loaded.build_flags
        return loaded, loaded.kernel_handle, loaded.n_regs, loaded.n_spills, loaded.n_max_threads

    def get_last_selected_build_flags(self):
        return self.last_flags

    def unload_module(self, module):  # Triton's CompiledKernel.__del__ calls it (triton #9444)
        module.close()


class RecordingUtils33(RecordingUtils):
    """The same stand-in with triton-xpu 3.3's signature, which reads is_spv from the env."""

    def load_binary(self, name, kernel, shared, build_flags, device):
        native = os.environ.get("TRITON_XPU_GEN_NATIVE_CODE") == "1"
        return super().load_binary(name, kernel, shared, build_flags, not native, device)


class HostBuffer:
    """Stand-in for a device tensor (no GPU memory here): what Triton's launcher reads of
    an argument (its address and dtype) and what the autotuner's reset/restore hooks call."""

    def __init__(self, dtype: str = "float32", address: int = 1 << 20) -> None:
        self.dtype = dtype
        self.address = address
        self.calls: list = []

    def data_ptr(self) -> int:
        return self.address

    def zero_(self) -> HostBuffer:
        self.calls.append("zero_")
        return self

    def clone(self) -> HostBuffer:
        self.calls.append("clone")
        return HostBuffer(self.dtype, self.address)

    def copy_(self, other: HostBuffer) -> HostBuffer:
        self.calls.append("copy_")
        return self


class CpuDriver:
    """Stand-in for Triton's active XPU driver object, the one boundary that cannot exist
    here (a SYCL device, queue and launcher): kernels load through the real Level Zero
    driver on the simulated PVC (``RecordingUtils33``, triton-xpu 3.3's loader), and a
    launch records what it would run instead of running it (nothing executes here)."""

    def __init__(self, target=None) -> None:
        self.target = target or TARGET
        self.utils = _CpuUtils()
        self.launched: list = []
        driver = self

        class Launcher:
            def __init__(self, src, metadata) -> None:
                self.what = (metadata.name, metadata.num_warps, repr(sorted(src.constants.items())))

            def __call__(self, *args, **kwargs) -> None:
                driver.launched.append(self.what)

        self.launcher_cls = Launcher

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device=None) -> int:
        return 0

    def get_current_target(self):
        return self.target

    def get_benchmarker(self):
        raise RuntimeError("no GPU to time on: pass the autotuner a do_bench")


class _CpuUtils(RecordingUtils33):
    # Upstream's driver builds SPIR-V in one GRF mode, then the other.
    speculative = False

    def load_binary(self, name, kernel, shared, build_flags, device):
        # triton-xpu 3.3's loader answers (module, function, n_regs, n_spills).
        return super().load_binary(name, kernel, shared, build_flags, device)[:4]

    def get_device_properties(self, device) -> dict:
        return {"max_shared_mem": 131072, "multiprocessor_count": 64, "max_num_sub_groups": 64,
                "sub_group_sizes": [16, 32]}  # fmt: skip


def deterministic_bench(driver: CpuDriver):
    """A benchmarker for the autotuner with no GPU: it runs the config's kernel once (its
    compile and load are real; the launch is recorded) and times it by what it is, the
    same for the same config in any process."""
    import zlib

    def do_bench(kernel_call, quantiles=None):
        kernel_call()
        t = 1.0 + (zlib.crc32(repr(driver.launched[-1]).encode()) % 1000) / 1000.0
        return [t, t, t] if quantiles else t

    return do_bench
