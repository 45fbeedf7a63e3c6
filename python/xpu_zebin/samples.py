"""OpenCL C sample kernels, compiled to SPIR-V with ``ocloc -spv_only``.

``ptss_overflow_kernel()`` is the case this package exists for: it overflows the
per-thread scratch limit (PTSS) in default GRF mode on IGC 2.x yet builds in large GRF
mode. It keeps :data:`PTSS_OVERFLOW_VECTORS` ``double16`` values live across a loop
(4 KiB each per SIMD32 hardware thread), so IGC needs 264,832 bytes of scratch at 128 GRF
and 258,304 at 256 GRF, either side of the 262,144-byte limit. The test suite checks that
it still sits in that window on the compiler it runs.

``register_pressure_kernel(k)`` keeps ``k`` float values live instead (~128 bytes of
spill per value at SIMD32): small ``k`` make the spill cases. Its
:data:`PTSS_OVERFLOW_VALUES` made the same window with 16 times as many variables, so
IGC took about three times as long over it: 12.7 s and 18.6 s for the two attempts
against 4.2 s and 6.4 s (``ocloc`` alone, one after the other, on this project's 2-core
VM; the demo runs both at once).
"""

from __future__ import annotations

#: ``double16`` values that overflow PTSS at 128 GRF and build at 256 GRF (IGC 2.x, pvc,
#: SIMD32): one more fails at 256 GRF too, one fewer builds at 128.
PTSS_OVERFLOW_VECTORS = 66

#: Float values that overflowed PTSS at 128 GRF and built at 256 GRF (IGC 2.x, pvc,
#: SIMD32, measured 2026-11); ``ptss_overflow_kernel()`` is the sample now.
PTSS_OVERFLOW_VALUES = 2150

ADD_KERNEL = """\
__kernel void add(__global const float* a, __global const float* b, __global float* c) {
  int i = get_global_id(0);
  c[i] = a[i] + b[i];
}
"""


def ptss_overflow_kernel(vectors: int = PTSS_OVERFLOW_VECTORS, name: str = "pressure") -> str:
    """OpenCL C for a SIMD32 kernel that keeps ``vectors`` ``double16`` values live across
    a loop (pvc has fp64). Few, wide variables: IGC spends its time on the spill, not on
    thousands of names."""
    if vectors < 8:
        raise ValueError("vectors must be at least 8")
    pragma = "#pragma OPENCL EXTENSION cl_khr_fp64 : enable"
    return _live_across_loop(name, "double16", "(double16)(0.0)", vectors, 0, pragma)


def register_pressure_kernel(values: int, name: str = "pressure") -> str:
    """OpenCL C for a SIMD32 kernel that keeps ``values`` floats live across a loop."""
    return band_kernel(0, values, name)


def band_kernel(extra: int, values: int = 54, name: str = "band") -> str:
    """OpenCL C for a SIMD32 kernel with ``values`` floats live across a loop and ``extra``
    more live around it: small spills that grow with ``extra``. Measured with IGC 2.x on
    pvc, ``values=54`` spills 512 to 1536 bytes per hardware thread for ``extra`` 5 to 14
    (the simulated PVC's driver reports 512 to 2048) and nothing at 256 GRF: the band
    where upstream's spill rules have disagreed (#7959 kept 1024 to 2175 bytes at SIMD32;
    #8147 rebuilds from 1024). The tests find the values that land in each window."""
    if values < 2 or extra < 0:
        raise ValueError("values must be at least 2 and extra at least 0")
    return _live_across_loop(name, "float", "0.0f", values, extra)


def _live_across_loop(
    name: str, kind: str, zero: str, values: int, extra: int, pragma: str = ""
) -> str:
    """The samples' one shape: ``values`` variables of type ``kind`` live across a loop
    (each feeds two others), ``extra`` more live around it, all summed after."""
    if extra and kind != "float":
        raise ValueError("extra values are floats: only the float samples take them")
    lines = [pragma] if pragma else []
    lines += [
        "__attribute__((intel_reqd_sub_group_size(32)))",
        f"__kernel void {name}(__global const {kind}* in, __global {kind}* out, int n) {{",
        "  int gid = get_global_id(0);",
    ]
    lines += [f"  {kind} v{j} = in[gid + {j}];" for j in range(values)]
    lines += [f"  {kind} w{j} = in[gid + {values + j}] * 3.0f;" for j in range(extra)]
    lines.append("  for (int it = 0; it < n; ++it) {")
    lines += [
        f"    v{j} = fma(v{j}, v{(j + 1) % values}, v{(j + 7) % values});" for j in range(values)
    ]
    lines += ["  }", f"  {kind} s = {zero};"]
    lines += [f"  s += v{j};" for j in range(values)]
    lines += [f"  s += w{j} * v{j % values};" for j in range(extra)]
    lines += ["  out[gid] = s;", "}"]
    return "\n".join(lines) + "\n"
