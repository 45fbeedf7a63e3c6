"""Sweeps: every config of a Triton kernel compiled at once through ``triton.compile``, as
its autotuner would one by one, with the package's GRF fallback as the native stage."""

from __future__ import annotations

import logging
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Union

import xpu_zebin

from ..build_options import load_binary_options
from ..errors import BuildError
from .dropin import install_backend
from .errors import triton_error
from .fallback import compiler_pair, jit_native, refused_here
from .frontend import jit_function, split_config, warm_triton
from .host import gpu_target_arch, loads_here, ocloc_arch

logger = logging.getLogger("xpu_zebin.triton")


@dataclass
class ConfigResult:
    """One config of a sweep: Triton's compiled kernel and the build flags that won, or
    the error (``OutOfResources`` for a PTSS overflow, with required and limit bytes)."""

    config: Any
    kernel: Any = None
    build_flags: Optional[str] = None
    error: Optional[BaseException] = None

    @property
    def ok(self) -> bool:
        return self.error is None


def compile_configs(
    fn: Any,
    signature: Dict[str, str],
    configs: Optional[Iterable[Any]] = None,
    *,
    constexprs: Optional[Dict[str, Any]] = None,
    target: Any = None,
    jobs: Optional[int] = None,
    progress: Union[bool, Callable[[int], None]] = False,
) -> List[ConfigResult]:
    """Compile every config of a Triton kernel at once, as its autotuner would one by one.

    ``fn`` is a ``@triton.jit`` kernel or an ``@triton.autotune`` one (its configs are used
    when ``configs`` is None); ``configs`` are ``triton.Config`` objects or dicts with
    ``constexprs`` and compile options (``num_warps``, ``num_stages``, ``grf_mode``, ...).
    ``signature`` types the runtime arguments (``{"x_ptr": "*fp32", "n": "i32"}``);
    constexpr arguments come from each config and ``constexprs``. Each config runs through
    ``triton.compile`` (Triton's own pipeline and cache, so the autotuner's later compiles
    of the same configs are cache hits) with the package's GRF fallback as its native stage;
    at most ``jobs`` (default: cores) at once: Triton's front-end takes turns, the native
    compiles, which dominate register-heavy kernels, run in parallel. When Triton stops at
    SPIR-V (triton-xpu 3.3 without ``TRITON_XPU_GEN_NATIVE_CODE``), the native binary is
    built here too, into the package's cache, where the drop-in ``load_binary`` finds it.
    Results are in input order; a config that cannot build has its error in its slot.
    """
    import triton
    from triton.compiler import ASTSource

    jit = jit_function(fn)
    if configs is None:
        configs = getattr(fn, "configs", None)
        if configs is None:
            raise TypeError("pass configs, or an @triton.autotune kernel that has them")
    configs = list(configs)
    if target is None:
        from triton.runtime.driver import driver

        target = driver.active.get_current_target()
    install_backend()
    warm_triton()
    names = list(jit.arg_names)

    def one(config: Any) -> ConfigResult:
        constants, options = split_config(config)
        constants = {**(constexprs or {}), **constants}
        unknown = set(constants) - set(names)
        if unknown:
            raise TypeError(f"{jit.__name__} has no parameter(s) {sorted(unknown)}")
        sig = {n: "constexpr" if n in constants else signature[n] for n in names}
        src = ASTSource(jit, sig, {(names.index(k),): v for k, v in constants.items()})
        try:
            kernel = triton.compile(src, target=target, options=options)
            flags = kernel.metadata.build_flags
            spirv = kernel.asm.get("spv", b"")
            if isinstance(spirv, bytes) and spirv[:4] != b"\x7fELF":
                flags = _prebuild_native(kernel, spirv, target)
            return ConfigResult(config, kernel, flags)
        except Exception as e:  # every failure stays in its slot, as the autotuner skips it
            return ConfigResult(config, error=e)

    results = _run_all(one, configs, jobs, progress)
    for r in results:
        if r.error is not None:
            logger.info("config %s: %s", r.config, r.error, exc_info=r.error)
    return results


def _run_all(
    one: Callable[[Any], ConfigResult],
    configs: List[Any],
    jobs: Optional[int],
    progress: Union[bool, Callable[[int], None]],
) -> List[ConfigResult]:
    """``one(config)`` for every config on at most ``jobs`` threads, in input order, with a
    progress bar (``progress=True``) or a callable called with each finished index."""
    done = progress if callable(progress) else None
    bar = None
    if progress is True:
        from tqdm import tqdm

        bar = tqdm(total=len(configs), desc="xpu-zebin sweep", unit="config", file=sys.stderr)
    workers = max(1, jobs or xpu_zebin._core.default_jobs())
    try:
        with ThreadPoolExecutor(max_workers=min(workers, max(1, len(configs)))) as pool:
            futures = [pool.submit(one, c) for c in configs]
            for i, f in enumerate(futures):
                f.add_done_callback(
                    lambda _f, i=i: (bar.update(1) if bar else None, done(i) if done else None)
                )
            return [f.result() for f in futures]
    finally:
        if bar is not None:
            bar.close()


def _prebuild_native(kernel: Any, spirv: bytes, gpu_target: Any) -> str:
    """The native build ``load_binary`` will need, now, into the package's cache: the same
    request the drop-in ``load_binary`` makes for this kernel, so it is a cache hit."""
    arch = gpu_target_arch(gpu_target) or ocloc_arch(0, None)
    opts = load_binary_options(kernel.metadata.name, kernel.metadata.build_flags or "", arch)
    try:
        pair = compiler_pair(opts, 0) if loads_here(arch) else None
        if refused_here(pair):  # load_binary will have the driver's compiler build it
            return jit_native(kernel.metadata.name, spirv, opts, 0)[1]
        result = xpu_zebin.compile(spirv, device=arch, options=opts)
    except BuildError as e:
        raise triton_error(e) from e
    return result.build_flags
