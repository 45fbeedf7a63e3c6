"""OpenCL C sample kernels, compiled to SPIR-V with ``ocloc -spv_only``.

``register_pressure_kernel(k)`` keeps ``k`` float values live across a loop, so register
demand grows with ``k`` (~128 bytes of spill per value at SIMD32). Around
:data:`PTSS_OVERFLOW_VALUES` it overflows the per-thread scratch limit in default GRF mode
on IGC 2.x yet builds in large GRF mode: the case this package exists for. The test suite
checks that this number still sits in that window on the compiler it runs.
"""

from __future__ import annotations

#: Live values that overflow PTSS at 128 GRF and build at 256 GRF (IGC 2.x, pvc, SIMD32).
PTSS_OVERFLOW_VALUES = 2150

ADD_KERNEL = """\
__kernel void add(__global const float* a, __global const float* b, __global float* c) {
  int i = get_global_id(0);
  c[i] = a[i] + b[i];
}
"""


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
    lines = [
        "__attribute__((intel_reqd_sub_group_size(32)))",
        f"__kernel void {name}(__global const float* in, __global float* out, int n) {{",
        "  int gid = get_global_id(0);",
    ]
    lines += [f"  float v{j} = in[gid + {j}];" for j in range(values)]
    lines += [f"  float w{j} = in[gid + {values + j}] * 3.0f;" for j in range(extra)]
    lines.append("  for (int it = 0; it < n; ++it) {")
    lines += [
        f"    v{j} = fma(v{j}, v{(j + 1) % values}, v{(j + 7) % values});" for j in range(values)
    ]
    lines += ["  }", "  float s = 0.0f;"]
    lines += [f"  s += v{j};" for j in range(values)]
    lines += [f"  s += w{j} * v{j % values};" for j in range(extra)]
    lines += ["  out[gid] = s;", "}"]
    return "\n".join(lines) + "\n"
