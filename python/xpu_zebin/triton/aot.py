"""Triton kernels ahead of time: each autotune config through Triton's front end for each
target profile (it runs on the CPU), the native builds into a bundle (:mod:`xpu_zebin.bundle`),
and Triton's own cache entries for each, SPIR-V and native, so that Triton finds the
kernels compiled."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import tempfile
import threading
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import xpu_zebin
from xpu_zebin import _core

from .. import bundle
from .. import targets as target_profiles
from ..build_options import driver_is_lts, make_zebin_options
from ..bundle.build import as_the_driver_takes, check_output
from ..bundle.format import Built, PathLike, header
from ..errors import BuildError, InvalidArgumentError
from ..targets import TargetProfile
from . import cache_entries
from .cache_entries import TritonAddition
from .dropin import backend_installed, building_for, farm_key
from .frontend import jit_function, kernel_source, warm_triton

# Bundles' loggers: a fleet filters on one name for all of a bundle's making.
logger = logging.getLogger("xpu_zebin.bundle")


def check_precompile_kernels(kernels: Iterable[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The kernel specs :func:`precompile` takes, every one checked before any is built
    (an :class:`InvalidArgumentError` says which and why)."""
    specs = list(kernels)
    if not specs:
        raise InvalidArgumentError("precompile needs at least one kernel")
    for i, spec in enumerate(specs):
        if not isinstance(spec, dict) or "kernel" not in spec or "signature" not in spec:
            raise InvalidArgumentError(f"kernel {i}: expected a dict with kernel and signature")
        unknown = set(spec) - {"kernel", "signature", "configs", "constexprs"}
        if unknown:
            raise InvalidArgumentError(f"kernel {i}: unknown field(s) {sorted(unknown)}")
        try:
            check_kernel(
                spec["kernel"], spec["signature"], spec.get("configs"), spec.get("constexprs")
            )
        except InvalidArgumentError as e:
            raise InvalidArgumentError(f"kernel {i}: {e}") from None
    return specs


def precompile(
    kernels: Iterable[Dict[str, Any]],
    targets: Iterable[Any],
    out: Any,
    **kwargs: Any,
) -> Dict[str, Any]:
    """Native code ahead of time for a model's Triton kernels, into the bundle at ``out``.

    ``kernels``: dicts with ``kernel`` (a ``@triton.jit`` or ``@triton.autotune`` kernel),
    ``signature`` (``{"x_ptr": "*fp32", "n": "i32"}``), and optional ``configs`` (default:
    the autotuner's) and ``constexprs``; all are checked before anything is built.
    ``targets``: :class:`~xpu_zebin.targets.TargetProfile` objects (or profile files).
    ``kwargs`` go to :func:`precompile_kernel` (``jobs``, ``client``,
    ``progress``, ``ocloc``, ``native``). Returns the manifest, with this call's failures
    under ``run_failures``."""
    profiles = [
        t if isinstance(t, target_profiles.TargetProfile) else target_profiles.load(t)
        for t in targets
    ]
    if not profiles:
        raise InvalidArgumentError("precompile needs at least one target profile")
    specs = check_precompile_kernels(kernels)
    manifest: Dict[str, Any] = {}
    run_failures: List[Dict[str, Any]] = []
    for spec in specs:
        manifest = precompile_kernel(
            spec["kernel"], spec["signature"], profiles, out, spec.get("configs"),
            constexprs=spec.get("constexprs"), **kwargs,
        )  # fmt: skip
        run_failures += manifest["run_failures"]
    return {**manifest, "run_failures": run_failures}


def precompile_kernel(
    fn: Any,
    signature: Dict[str, str],
    targets: Sequence[TargetProfile],
    out: PathLike,
    configs: Optional[Sequence[Any]] = None,
    *,
    constexprs: Optional[Dict[str, Any]] = None,
    native: bool = True,
    **kwargs: Any,
) -> Dict[str, Any]:
    """:func:`xpu_zebin.bundle.precompile` for a Triton kernel: each autotune config
    (``configs``, else the ``@triton.autotune`` kernel's own) through Triton's front end for
    each target (it runs on the CPU), then the native builds. The bundle also holds Triton's
    own cache entries for each: the SPIR-V one (Triton's default; the drop-in then loads the
    native binary from the bundle) and, with ``native``, the one Triton writes with
    ``TRITON_XPU_GEN_NATIVE_CODE`` (native code inside, built by :func:`make_zebin`'s rules;
    its package entry serves the drop-in ``make_zebin``). ``kwargs`` are
    :func:`xpu_zebin.bundle.precompile`'s."""
    if not targets:
        raise InvalidArgumentError("precompile needs at least one target profile")
    check_output(out)
    jit, configs = check_kernel(fn, signature, configs, constexprs)
    target_profiles.check_compiler(
        targets, kwargs.get("ocloc"), allow_mismatch=kwargs.get("allow_compiler_mismatch", False)
    )
    warm_triton()
    lowered: List[_Lowered] = []
    failures: List[Dict[str, Any]] = []
    entries: List[TritonAddition] = []
    for target in targets:
        for config in configs:
            try:
                lowered.append(_front_end(jit, signature, constexprs, config, target))
            except Exception as e:  # a config Triton cannot lower stays in its slot
                failures.append(_failure(jit.__name__, config, target, e))
                continue
            entries.append(lowered[-1].entry)
    run_failures: List[Dict[str, Any]] = []
    for target in targets:
        kernels = [low.kernel for low in lowered if low.target is target]
        if kernels:
            run_failures += bundle.precompile(kernels, [target], out, **kwargs)["run_failures"]
    built: List[Built] = []
    if native and lowered:
        built, native_entries, native_failures = _native(
            jit, signature, constexprs, lowered, kwargs
        )
        entries += native_entries
        failures += native_failures
    for f in failures:
        logger.warning("config %s not built for %s: %s", f["config"], f["target"][:12],
                       f["message"])  # fmt: skip
    made_by = {**header(targets), "triton_key": cache_entries.key_digest()}
    manifest = _core.bundle_write(os.fspath(out), made_by, built, failures, entries)
    return {**manifest, "run_failures": failures + run_failures}


def check_kernel(
    fn: Any, signature: Dict[str, str], configs: Optional[Sequence[Any]] = None,
    constexprs: Optional[Dict[str, Any]] = None,
) -> Tuple[Any, List[Any]]:  # fmt: skip
    """A Triton kernel to precompile, checked before anything is built: its JIT function
    and configs (given, else the autotuner's), each config's constexprs and options and
    the signature agreeing with its parameters. An :class:`InvalidArgumentError` says why."""
    try:
        jit = jit_function(fn)
    except TypeError as e:
        raise InvalidArgumentError(str(e)) from None
    configs = list(configs if configs is not None else getattr(fn, "configs", None) or [])
    if not configs:
        raise InvalidArgumentError("pass configs, or an @triton.autotune kernel that has them")
    for config in configs:
        kernel_source(jit, signature, constexprs, config)
    return jit, configs


@dataclasses.dataclass
class _Lowered:
    """One config of a Triton kernel through Triton's front end for one target."""

    target: TargetProfile
    config: Any
    kernel: Dict[str, Any]  # as xpu_zebin.bundle.precompile takes it
    compiled: Any  # Triton's CompiledKernel (SPIR-V inside)
    entry: TritonAddition  # its Triton cache entry


def _failure(kernel: str, config: Any, target: TargetProfile, e: BaseException) -> Dict[str, Any]:
    return {"kernel": kernel, "config": str(config), "target": target.id,
            "kind": getattr(e, "kind", None) or "front_end",
            "message": f"{type(e).__name__}: {e}"}  # fmt: skip


def _front_end(jit: Any, signature: Dict[str, str], constexprs: Optional[Dict[str, Any]],
               config: Any, target: TargetProfile) -> _Lowered:  # fmt: skip
    """Triton's front end for one config and target."""
    import triton

    src, options = kernel_source(jit, signature, constexprs, config)
    compiled = triton.compile(src, target=target.gpu_target(), options=options)
    spirv = compiled.asm.get("spv", b"")
    if spirv[:4] != cache_entries.SPIRV_MAGIC:
        raise InvalidArgumentError(
            "Triton produced native code here (TRITON_XPU_GEN_NATIVE_CODE is set): "
            "precompile needs its SPIR-V"
        )
    kernel = {"spirv": spirv, "name": compiled.metadata.name, "config": str(config),
              "build_flags": compiled.metadata.build_flags or ""}  # fmt: skip
    entry = _triton_entry(compiled, src, config, target, native=False)
    return _Lowered(target, config, kernel, compiled, entry)


def _triton_entry(compiled: Any, src: Any, config: Any, target: TargetProfile,
                  native: bool) -> TritonAddition:  # fmt: skip
    entry = {"hash": compiled.hash, "kernel": compiled.metadata.name, "config": str(config),
             "target": target.id, "native": native}  # fmt: skip
    return entry, cache_entries.entry_files(compiled, src.name)


def _native_triton_entry(
    jit: Any, signature: Dict[str, str], constexprs: Optional[Dict[str, Any]], low: _Lowered,
    opts: xpu_zebin.Options, build: Any, ocloc: Optional[str],
) -> TritonAddition:  # fmt: skip
    """Triton's native cache entry for one lowered config: ``triton.compile`` with
    ``generate_native_code``, its native stage answered by the package's ``build``."""
    import triton

    spirv, name, device = low.kernel["spirv"], low.kernel["name"], low.target.ocloc_device
    src, options = kernel_source(jit, signature, constexprs, low.config)
    prebuilt = {farm_key(spirv, name, device, opts): (build.binary, build.build_flags)}
    options = {**options, "generate_native_code": True}
    with building_for(device, ocloc, prebuilt):
        compiled = triton.compile(src, target=low.target.gpu_target(), options=options)
    if compiled.asm.get("spv") != build.binary:
        raise InvalidArgumentError("Triton's native stage gave another binary than the "
                                   "package's build")  # fmt: skip
    return _triton_entry(compiled, src, low.config, low.target, native=True)


_private_cache_lock = threading.Lock()


@contextlib.contextmanager
def _private_triton_cache() -> Iterator[None]:
    """Triton's native compiles of a precompile run in a cache of their own: an entry the
    farm's cache holds from another compiler or earlier options is never taken for this
    build (Triton's key holds neither). Triton takes its cache directory from the
    environment only, so ``TRITON_CACHE_DIR`` names it meanwhile, for the whole process
    (one precompile at a time; a farm process compiles nothing else meanwhile). With a
    custom ``TRITON_CACHE_MANAGER`` its cache is used; the binary is compared with the
    package's build either way."""
    if os.environ.get("TRITON_CACHE_MANAGER"):
        yield
        return
    with _private_cache_lock, tempfile.TemporaryDirectory(prefix="xpu-zebin-triton.") as tmp:
        before = os.environ.get("TRITON_CACHE_DIR")
        os.environ["TRITON_CACHE_DIR"] = tmp
        try:
            yield
        finally:
            if before is None:
                os.environ.pop("TRITON_CACHE_DIR", None)
            else:
                os.environ["TRITON_CACHE_DIR"] = before


def _native(
    jit: Any, signature: Dict[str, str], constexprs: Optional[Dict[str, Any]],
    lowered: List[_Lowered], kwargs: Dict[str, Any],
) -> Tuple[List[Built], List[TritonAddition], List[Dict[str, Any]]]:  # fmt: skip
    """What Triton's native path (``TRITON_XPU_GEN_NATIVE_CODE``) needs for each lowered
    config: the builds with :func:`make_zebin`'s options (all at once, as
    ``xpu_zebin.bundle.precompile`` runs them), as package entries (the drop-in
    ``make_zebin`` finds them), and Triton's cache entries with them inside (Triton's native
    stage, answered by those builds)."""
    from triton.compiler.compiler import make_backend

    ocloc = os.fspath(kwargs["ocloc"]) if kwargs.get("ocloc") is not None else None
    plan = []
    for low in lowered:
        m = low.compiled.metadata
        meta = {"name": m.name, "build_flags": m.build_flags,
                "max_grf_mode": getattr(m, "max_grf_mode", None)}  # fmt: skip
        backend = make_backend(low.target.gpu_target())
        lts = driver_is_lts(backend, m)  # the kernel's own answer, as make_zebin's
        opts = make_zebin_options(meta, m, low.target.ocloc_device, lts=lts, backend=backend)
        plan.append((low, opts.replace(ocloc=ocloc) if ocloc else opts))
    results = xpu_zebin.compile_many(
        [{"spirv": low.kernel["spirv"], "device": low.target.ocloc_device, "options": o}
         for low, o in plan],
        jobs=kwargs.get("jobs"), client=kwargs.get("client"),
        progress=kwargs.get("progress", False),
    )  # fmt: skip
    compiler = _core.compiler_identity(ocloc)
    built, entries, failures = [], [], []
    with backend_installed(), _private_triton_cache():
        for (low, opts), r in zip(plan, results):
            config = f"{low.config} (make_zebin)"
            r, by = as_the_driver_takes(low.kernel, low.target, opts, r, compiler)
            if isinstance(r, BuildError):
                failures.append(_failure(low.kernel["name"], config, low.target, r))
                continue
            spirv, name = low.kernel["spirv"], low.kernel["name"]
            key = _core.bundle_key(spirv, name, low.target.ocloc_device, opts, low.target.id)
            built.append(({
                "kernel": name, "config": config, "target": low.target.id, "key": key,
                "build_flags": r.build_flags, "spill_bytes": r.spill_size,
                "n_spills": r.n_spills, "compiler": by, "file": "", "blake3": "", "size": 0,
            }, r.binary))  # fmt: skip
            try:
                entry, files = _native_triton_entry(jit, signature, constexprs, low, opts, r, ocloc)
                entries.append(({**entry, "native_key": key}, files))  # tied to its own build
            except Exception as e:  # stays in its slot, as the front end's failures do
                failures.append(_failure(name, config, low.target, e))
    return built, entries, failures
