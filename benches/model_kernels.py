"""A model-sized set of real Triton kernels and autotune configs (attention forward and
backward, layer norm forward and backward, matmul, softmax, reductions, elementwise), for
the cold-start benchmark: compiled to SPIR-V on the CPU by triton-xpu's own front end."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from typing import Any, Dict, List, Optional

import triton
import triton.language as tl
from triton.backends import backends
from triton.compiler import ASTSource


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask),
             mask=mask)  # fmt: skip


@triton.jit
def gelu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    tl.store(out_ptr + offs, y, mask=mask)


@triton.jit
def softmax_kernel(out_ptr, in_ptr, stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(in_ptr + row * stride + offs, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    tl.store(out_ptr + row * stride + offs, num / tl.sum(num, axis=0), mask=mask)


@triton.jit
def log_softmax_nll_kernel(loss_ptr, logits_ptr, target_ptr, stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(logits_ptr + row * stride + offs, mask=mask, other=-float("inf"))
    m = tl.max(x, axis=0)
    lse = m + tl.log(tl.sum(tl.exp(x - m), axis=0))
    t = tl.load(target_ptr + row)
    xt = tl.sum(tl.where(offs == t, x, 0.0), axis=0)
    tl.store(loss_ptr + row, lse - xt)


@triton.jit
def sum_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.atomic_add(out_ptr, tl.sum(x, axis=0))


@triton.jit
def layer_norm_fwd(x_ptr, y_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, stride, n, eps,
                   BLOCK: tl.constexpr):  # fmt: skip
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0)
    mean = tl.sum(x, axis=0) / n
    xc = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / n + eps)
    w = tl.load(w_ptr + cols, mask=mask)
    b = tl.load(b_ptr + cols, mask=mask)
    tl.store(y_ptr + row * stride + cols, xc * rstd * w + b, mask=mask)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def layer_norm_bwd_dx(dx_ptr, dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, stride, n,
                      BLOCK: tl.constexpr):  # fmt: skip
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0)
    dy = tl.load(dy_ptr + row * stride + cols, mask=mask, other=0.0)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    mean = tl.load(mean_ptr + row)
    rstd = tl.load(rstd_ptr + row)
    xhat = tl.where(mask, (x - mean) * rstd, 0.0)
    wdy = w * dy
    c1 = tl.sum(xhat * wdy, axis=0) / n
    c2 = tl.sum(wdy, axis=0) / n
    tl.store(dx_ptr + row * stride + cols, (wdy - (xhat * c1 + c2)) * rstd, mask=mask)


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):  # fmt: skip
    pm, pn = tl.program_id(0), tl.program_id(1)
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * sam + (k + rk)[None, :] * sak)
        b = tl.load(b_ptr + (k + rk)[:, None] * sbk + rn[None, :] * sbn)
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * scm + rn[None, :] * scn, acc)


@triton.jit
def attention_fwd(q_ptr, k_ptr, v_ptr, o_ptr, seq, scale, BM: tl.constexpr, BN: tl.constexpr,
                  D: tl.constexpr):  # fmt: skip
    start = tl.program_id(0) * BM
    head = tl.program_id(1) * seq * D
    rm = start + tl.arange(0, BM)
    rd = tl.arange(0, D)
    q = tl.load(q_ptr + head + rm[:, None] * D + rd[None, :])
    m_i = tl.full((BM,), -float("inf"), tl.float32)
    l_i = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, D), tl.float32)
    for n in range(0, seq, BN):
        rn = n + tl.arange(0, BN)
        k = tl.load(k_ptr + head + rn[None, :] * D + rd[:, None])
        s = tl.dot(q, k) * scale
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        v = tl.load(v_ptr + head + rn[:, None] * D + rd[None, :])
        acc = acc * alpha[:, None] + tl.dot(p, v)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
    tl.store(o_ptr + head + rm[:, None] * D + rd[None, :], acc / l_i[:, None])


@triton.jit
def attention_bwd_dv(q_ptr, k_ptr, do_ptr, lse_ptr, dv_ptr, seq, scale, BM: tl.constexpr,
                     BN: tl.constexpr, D: tl.constexpr):  # fmt: skip
    start = tl.program_id(0) * BN
    head = tl.program_id(1) * seq * D
    rn = start + tl.arange(0, BN)
    rd = tl.arange(0, D)
    k = tl.load(k_ptr + head + rn[:, None] * D + rd[None, :])
    dv = tl.zeros((BN, D), tl.float32)
    for m in range(0, seq, BM):
        rm = m + tl.arange(0, BM)
        q = tl.load(q_ptr + head + rm[None, :] * D + rd[:, None])
        lse = tl.load(lse_ptr + rm)
        p = tl.exp(tl.dot(k, q) * scale - lse[None, :])
        do = tl.load(do_ptr + head + rm[:, None] * D + rd[None, :])
        dv += tl.dot(p, do)
    tl.store(dv_ptr + head + rn[:, None] * D + rd[None, :], dv)


PTR, INT, FLT, CST = "*fp32", "i32", "fp32", "constexpr"
SIGNATURES = {
    add_kernel: {"x_ptr": PTR, "y_ptr": PTR, "out_ptr": PTR, "n": INT, "BLOCK": CST},
    gelu_kernel: {"x_ptr": PTR, "out_ptr": PTR, "n": INT, "BLOCK": CST},
    softmax_kernel: {"out_ptr": PTR, "in_ptr": PTR, "stride": INT, "n_cols": INT, "BLOCK": CST},
    log_softmax_nll_kernel: {
        "loss_ptr": PTR,
        "logits_ptr": PTR,
        "target_ptr": "*i32",
        "stride": INT,
        "n_cols": INT,
        "BLOCK": CST,
    },
    sum_kernel: {"x_ptr": PTR, "out_ptr": PTR, "n": INT, "BLOCK": CST},
    layer_norm_fwd: {
        "x_ptr": PTR,
        "y_ptr": PTR,
        "w_ptr": PTR,
        "b_ptr": PTR,
        "mean_ptr": PTR,
        "rstd_ptr": PTR,
        "stride": INT,
        "n": INT,
        "eps": FLT,
        "BLOCK": CST,
    },
    layer_norm_bwd_dx: {
        "dx_ptr": PTR,
        "dy_ptr": PTR,
        "x_ptr": PTR,
        "w_ptr": PTR,
        "mean_ptr": PTR,
        "rstd_ptr": PTR,
        "stride": INT,
        "n": INT,
        "BLOCK": CST,
    },
    matmul_kernel: {
        **{p: PTR for p in ("a_ptr", "b_ptr", "c_ptr")},
        **{p: INT for p in ("M", "N", "K", "sam", "sak", "sbk", "sbn", "scm", "scn")},
        "BM": CST,
        "BN": CST,
        "BK": CST,
    },
    attention_fwd: {
        "q_ptr": PTR,
        "k_ptr": PTR,
        "v_ptr": PTR,
        "o_ptr": PTR,
        "seq": INT,
        "scale": FLT,
        "BM": CST,
        "BN": CST,
        "D": CST,
    },
    attention_bwd_dv: {
        "q_ptr": PTR,
        "k_ptr": PTR,
        "do_ptr": PTR,
        "lse_ptr": PTR,
        "dv_ptr": PTR,
        "seq": INT,
        "scale": FLT,
        "BM": CST,
        "BN": CST,
        "D": CST,
    },
}


def _configs() -> List[tuple]:
    """(kernel, constexprs, num_warps): 44 kernel-config pairs, as autotuners try them."""
    out: List[tuple] = []
    out += [(add_kernel, {"BLOCK": b}, 4) for b in (256, 512, 1024, 2048, 4096)]
    out += [(gelu_kernel, {"BLOCK": b}, 4) for b in (512, 1024, 2048)]
    out += [(softmax_kernel, {"BLOCK": b}, w) for b, w in ((256, 4), (512, 4), (1024, 8),
                                                           (2048, 8), (4096, 16))]  # fmt: skip
    out += [(log_softmax_nll_kernel, {"BLOCK": b}, w) for b, w in ((1024, 4), (2048, 8),
                                                                   (4096, 16))]  # fmt: skip
    out += [(sum_kernel, {"BLOCK": b}, 4) for b in (512, 1024, 2048, 4096)]
    out += [(layer_norm_fwd, {"BLOCK": b}, w) for b, w in ((256, 4), (512, 4), (1024, 8),
                                                           (2048, 8), (4096, 16))]  # fmt: skip
    out += [(layer_norm_bwd_dx, {"BLOCK": b}, w) for b, w in ((512, 4), (1024, 8), (2048, 8),
                                                              (4096, 16))]  # fmt: skip
    out += [(matmul_kernel, {"BM": m, "BN": n, "BK": k}, w)
            for m, n, k, w in ((32, 32, 32, 4), (64, 32, 32, 4), (32, 64, 32, 4), (64, 64, 32, 4),
                               (64, 64, 16, 8), (32, 32, 16, 2))]  # fmt: skip
    out += [(attention_fwd, {"BM": m, "BN": n, "D": 64}, w)
            for m, n, w in ((16, 16, 2), (32, 16, 4), (16, 32, 4), (32, 32, 4))]  # fmt: skip
    out += [(attention_bwd_dv, {"BM": m, "BN": n, "D": 64}, w)
            for m, n, w in ((16, 16, 2), (32, 16, 4), (16, 32, 4), (32, 32, 4))]  # fmt: skip
    return out


def stub_arch_parser() -> None:
    """Triton's XPU arch parser needs SYCL headers; the device is named instead."""

    class ArchParser:
        @staticmethod
        def parse_device_arch(_architecture: int) -> str:
            return "pvc"

    backends["intel"].compiler.__init__.__globals__["compile_module_from_src"] = lambda *a, **k: (
        ArchParser()
    )


def source(fn: Any, constants: Dict[str, Any]) -> ASTSource:
    """Triton's source object for one kernel and its constexprs."""
    names = list(SIGNATURES[fn])
    return ASTSource(fn, SIGNATURES[fn], {(names.index(k),): v for k, v in constants.items()})


def specs() -> List[Dict[str, Any]]:
    """The set as ``xpu_zebin.triton.precompile`` takes it: each kernel, its signature,
    its configs."""
    by_fn: Dict[Any, List[Dict[str, Any]]] = {}
    for fn, constants, warps in _configs():
        by_fn.setdefault(fn, []).append({"constexprs": constants, "num_warps": warps})
    return [
        {"kernel": fn, "signature": {k: v for k, v in SIGNATURES[fn].items() if v != CST},
         "configs": configs}
        for fn, configs in by_fn.items()
    ]  # fmt: skip


def model_spirv(target: Any, limit: Optional[int] = None) -> List[Dict[str, Any]]:
    """Every kernel-config pair through Triton's front end for ``target`` (a GPUTarget), or
    ``limit`` of them spread evenly over the set (small elementwise kernels to attention):
    dicts with ``spirv``, ``name``, ``build_flags`` and ``config``."""
    import os

    stub_arch_parser()
    if "TRITON_CACHE_DIR" not in os.environ:  # this run's own, removed at its end
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="xpu-zebin-model-")
        atexit.register(shutil.rmtree, os.environ["TRITON_CACHE_DIR"], ignore_errors=True)
    every = _configs()
    if limit is not None:
        count = max(1, min(limit, len(every)))
        every = [every[i * len(every) // count] for i in range(count)]
    kernels = []
    for fn, constants, warps in every:
        compiled = triton.compile(source(fn, constants), target=target,
                                  options={"num_warps": warps})  # fmt: skip
        kernels.append({
            "spirv": compiled.asm["spv"], "name": compiled.metadata.name,
            "build_flags": compiled.metadata.build_flags or "",
            "config": f"{compiled.metadata.name} {constants} warps={warps}",
        })  # fmt: skip
    return kernels
