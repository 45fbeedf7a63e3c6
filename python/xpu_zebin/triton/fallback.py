"""Native code the driver takes (docs/design.md §6): a bundle's build, else the offline
compiler's, else, when the driver refuses that (a compiler of another release, unresolved
symbols) or the offline compiler fails where the driver's own may not, the driver's own
compiler builds the kernel from its SPIR-V in a worker, as upstream's path does; a
(compiler, driver) pair whose format was refused goes to the driver's compiler at once
after, on this host."""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Optional, Tuple

import xpu_zebin

from .. import bundle
from ..errors import REFUSAL_KINDS, BuildError, NoDeviceError
from . import autotune
from .errors import package_error, triton_error
from .host import loads_here, ocloc_arch, offline_failed, offline_usable

logger = logging.getLogger("xpu_zebin.triton")

#: Offline failures that are the input's own, which the driver's compiler would meet too
#: (or the caller's): final. Every other one (a builtin or device the offline compiler
#: does not know, its crash, a build failure, a compiler that cannot run) has the
#: driver's own compiler build the kernel instead, as upstream's path would. A PTSS
#: overflow stays Triton's OutOfResources, as upstream's.
FINAL_OFFLINE_KINDS = ("scratch_overflow", "invalid_spirv", "kernel_not_found",
                       "invalid_argument", "cancelled")  # fmt: skip

_said_once: set = set()
_said_lock = threading.Lock()


def _say_once(key: Any, message: str, *args: Any) -> None:
    """A warning once per process for ``key`` (one line saying why, not one per kernel)."""
    with _said_lock:
        if key in _said_once:
            return
        _said_once.add(key)
    logger.warning(message, *args)


def note_kept_default(name: str, result: Any) -> None:
    """A default-GRF build that spilled, whose large-GRF rebuild failed, is kept: upstream's
    make_zebin raises the rebuild's error there, the package keeps the working build (never
    worse than upstream; the conformance table, docs/grf-rules.md). Said once per process."""
    attempts = getattr(result, "attempts", [])
    if len(attempts) == 2 and attempts[0].ok and not attempts[1].ok:
        _say_once(
            "kept-default",
            "xpu-zebin: kernel %r spills %d bytes in default GRF and its large-GRF rebuild "
            "failed (%s); the default build is kept, where upstream's make_zebin raises the "
            "rebuild's error",
            name, result.spill_size, attempts[1].error,
        )  # fmt: skip
        logger.debug("kernel %r: kept the default-GRF build: %s", name, attempts[1].error)


def compiler_pair(options: xpu_zebin.Options, device: int) -> Optional[Tuple[str, str]]:
    """(the offline compiler's identity, this device's driver version), or None when
    either cannot be told (no compiler, no driver: nothing to remember)."""
    try:
        identity = xpu_zebin._core.compiler_identity(options.ocloc)
        driver = xpu_zebin.devices()[device]["driver"]
    except (BuildError, IndexError, KeyError, TypeError):
        return None
    return identity, str(driver)


def refused_here(pair: Optional[Tuple[str, str]]) -> bool:
    return pair is not None and xpu_zebin._core.compiler_refused(*pair)


def _ze_info_major(binary: bytes) -> Optional[str]:
    try:
        return str(xpu_zebin.zebin_info(binary)["version"]).split(".")[0]
    except BuildError:
        return None


def _remember_refusal(
    pair: Optional[Tuple[str, str]], fresh: bytes, own: bytes, why: BuildError
) -> None:
    """A refusal of the offline compiler's format holds for every kernel of it on this
    driver: remembered on this host when ``fresh`` (a build this process's offline compiler
    has just made: never bytes from a cache, a bundle or anything another user can write)
    has a ``.ze_info`` major other than the one the driver's own compiler wrote for the
    same kernel (``own``). Anything else (one malformed kernel, unresolved symbols,
    another device's build) is the kernel's own."""
    ours, theirs = _ze_info_major(fresh), _ze_info_major(own)
    if pair is None or ours is None or theirs is None or ours == theirs:
        return
    reason = f".ze_info {ours}.x, the driver's own {theirs}.x: {why}"
    xpu_zebin._core.remember_compiler_refused(*pair, reason)
    _say_once(
        ("refused", pair),
        "xpu-zebin: this Level Zero driver (%s) refuses native code of %s (its .ze_info "
        "format %s.x, the driver's own %s.x); kernels are built by the driver's own compiler "
        "from now on, as upstream's path does (use the compiler release that matches the "
        "driver to build offline)",
        pair[1], pair[0].split("|")[0], ours, theirs,
    )  # fmt: skip


def _driver_refusal(
    name: str, native: bytes, flags: str, device: int, failure: BaseException
) -> Optional[BuildError]:
    """Why the driver refused ``native``, when that is what ``failure`` (the driver's
    loader failing on it) was: a format it does not know or symbols nothing provides.
    A Triton driver's own exception does not say, so the binary is loaded in a worker,
    where the package's classifier names the driver's answer. None: another failure."""
    error = package_error(failure)
    if error is None:
        try:
            xpu_zebin.compile_and_load(
                native, name, is_spv=False, device=device, build_flags=flags, cache=False
            ).close()
            return None
        except BuildError as e:
            error = e
    return error if error.kind in REFUSAL_KINDS else None


#: What the engine asks the bundles for (``bundle.query``): Triton's release, the device's
#: target profiles, the bundles' directories; None: no bundle.
Asked = Optional[Tuple[Optional[str], Any, Any]]


def jit_native(
    name: str, spirv: bytes, options: xpu_zebin.Options, device: int, asked: Asked = None
) -> Tuple[bytes, str]:
    """The driver's own compiler builds the kernel from its SPIR-V (in a worker unless
    isolation is off), with the GRF fallback: (native binary, chosen flags). The engine
    asks the bundles first (``asked``), their entry tried in a worker before it loads."""
    req = xpu_zebin._load_request(spirv, name, device=device, options=options)
    loaded = xpu_zebin._report(xpu_zebin._core.compile_and_load(**req, bundle=asked), name)
    with loaded:
        return loaded.native_binary, loaded.build_flags


def _compile(
    spirv: bytes, options: xpu_zebin.Options, arch: str, asked: Asked, counted: bool = True
) -> Any:
    """``compile``, the engine asking the bundles first (``asked``): a host without
    ``ocloc`` is answered from them too. ``counted`` False: the request was counted once
    already (a bundle's answer to it did not load here)."""
    if counted:
        return xpu_zebin.compile(spirv, device=arch, options=options, bundle=asked)
    result = xpu_zebin._core.compile(spirv, arch, options, bundle=asked, counted=False)
    return xpu_zebin._report(result, result.kernel)


def trial_load(
    name: str, native: bytes, build_flags: str, device: int, device_arch: Optional[str]
) -> None:
    """A native binary Triton hands over (from its cache, say) loads in a worker process
    before the driver loads it here: the driver's loader dies on a malformed one. Once per
    binary, kernel, flags and device on this host; skipped without isolation."""
    if not xpu_zebin._isolated_default():
        return
    try:
        xpu_zebin.compile_and_load(
            native, name, is_spv=False, device=device, build_flags=build_flags,
            device_arch=device_arch,
        ).close()  # fmt: skip
    except NoDeviceError as e:  # the package sees no device at all: the driver decides
        logger.warning("kernel %r: native binary not tried in a worker (%s)", name, e)
    except BuildError as e:  # a worker that cannot start included: never load it untried
        raise triton_error(e) from e


def _build_offline(
    name: str, spirv: bytes, options: xpu_zebin.Options, device: int, asked: Asked
) -> Tuple[bytes, str, bool]:
    """``ocloc``'s build of SPIR-V with the GRF fallback: (binary, chosen flags, made by
    this process's compiler just now), the bundles asked first (``asked``); a build an
    autotune precompile made for this very request, when there is one (it asked the
    bundles first too)."""
    arch = ocloc_arch(device, options.device_arch)
    prebuilt = autotune.take(autotune.request_key(spirv, name, arch, options))
    if prebuilt is not None and prebuilt.error is not None:
        raise prebuilt.error  # built for this benchmark a moment ago: its answer
    counted = True
    if prebuilt is not None:
        try:
            if prebuilt.untrusted:  # another machine's, or a level's: tried first
                trial_load(name, prebuilt.binary, prebuilt.build_flags, device, arch)
            return prebuilt.binary, prebuilt.build_flags, not prebuilt.untrusted
        except Exception as e:  # built here instead, as if it had not been made
            logger.warning("kernel %r: its build for the benchmark did not load (%s)", name, e)
            # The precompile counted this request; a bundle's bytes are not asked again.
            counted, asked = False, (None if prebuilt.source == "bundle" else asked)
    result = compile_trusting_no_cache(name, spirv, options, arch, device, asked, counted)
    return result.binary, result.build_flags, result.source == "compiled"


def forget_cached(name: str, spirv: bytes, options: xpu_zebin.Options, arch: str) -> bool:
    """Remove the cache entry of this build (one the driver refused), so that no later
    process is answered with it; False when it could not be removed."""
    try:
        return xpu_zebin._core.forget_cached(spirv, arch, options)
    except BuildError as e:
        logger.warning("kernel %r: its cache entry could not be removed (%s)", name, e)
        return False


def compile_trusting_no_cache(
    name: str, spirv: bytes, options: xpu_zebin.Options, arch: str, device: int,
    asked: Asked = None, counted: bool = True,
) -> Any:  # fmt: skip
    """``compile`` (the bundles asked first: ``asked``), where an entry a level gave is
    untrusted input (a bundle, a shared cache, a neighbour): its binary loads in a worker
    before the driver loads it here (once per binary and host). One that does not load,
    the driver's refusal included, is removed from the cache and the kernel built fresh
    (written back in its place): a refusal of bytes read from a level is never the
    compiler's, and never stays to be refused again."""
    result = _compile(spirv, options, arch, asked, counted)
    if not result.cached:
        return result
    try:
        trial_load(name, result.binary, result.build_flags, device, options.device_arch)
        return result
    except Exception as e:
        if result.source == "bundle":  # the other levels, then the compiler
            logger.warning("kernel %r: native binary from a bundle did not load (%s); trying "
                           "the next level", name, e)  # fmt: skip
            return compile_trusting_no_cache(name, spirv, options, arch, device, counted=False)
        removed = forget_cached(name, spirv, options, arch)
        logger.warning("kernel %r: cached zebin (from the %s) did not load here (%s); %s and "
                       "rebuilt fresh", name, result.source, e,
                       "removed" if removed else "skipped")  # fmt: skip
    # This process's compiler, never the store again (it would hand the same bytes back):
    # written back to the local cache where the entry was removed.
    fresh = xpu_zebin._core.compile(spirv, arch, options.replace(cache=removed), store=False)
    return xpu_zebin._report(fresh, fresh.kernel)


def _instead(
    name: str,
    spirv: bytes,
    options: xpu_zebin.Options,
    device: int,
    why: BuildError,
    pair: Optional[Tuple[str, str]],
    refused: Optional[bytes],
    arch: Optional[str] = None,
) -> Tuple[bytes, str]:
    """The driver's own build of a kernel the offline path could not give it (``why``,
    said once per kernel); a ``refused`` offline build (one this process has just made)
    is removed from the cache and weighed against it to tell whether the compiler's format
    is what the driver refuses (``_remember_refusal``)."""
    logger.warning("kernel %r: %s; the driver's own compiler builds it from its SPIR-V", name, why)
    if refused is not None:
        forget_cached(name, spirv, options, arch or ocloc_arch(device, options.device_arch))
    native, flags = jit_native(name, spirv, options, device)
    if refused is not None:
        _remember_refusal(pair, refused, native, why)
    return native, flags


def load_spirv(
    name: str,
    spirv: bytes,
    options: xpu_zebin.Options,
    device: int,
    load: Callable[[bytes, str], Any],
) -> Tuple[Any, str]:
    """SPIR-V to the driver's loader: a bundle's build (the engine asks the bundles first,
    in Rust), else the package's native build when the driver takes it. When the driver
    refuses it (a compiler of another release, unresolved symbols), or the offline
    compiler fails where the driver's own may not, the driver's own compiler builds it
    from the SPIR-V, as upstream's path does, and one line says why; a (compiler, driver)
    pair whose format was refused goes to the driver's compiler at once after
    (docs/design.md §6)."""
    asked = bundle.query(name, device)
    offline = offline_usable()
    pair = compiler_pair(options, device) if offline else None
    refused: Optional[bytes] = None
    if not offline or refused_here(pair):
        native, flags = jit_native(name, spirv, options, device, asked)
        return load(native, flags), flags
    try:
        native, flags, fresh = _build_offline(name, spirv, options, device, asked)
    except BuildError as e:
        if e.kind in FINAL_OFFLINE_KINDS:
            raise
        if e.kind == "toolchain_missing":  # it cannot run here: not tried again
            offline_failed(str(e))
        why: BuildError = e
    else:
        try:
            return load(native, flags), flags
        except Exception as e:
            refusal = _driver_refusal(name, native, flags, device, e)
            if refusal is None:
                raise
            # Only a fresh build of this process's compiler speaks for the compiler.
            why, refused = refusal, (native if fresh else None)
    native, flags = _instead(name, spirv, options, device, why, pair, refused)
    return load(native, flags), flags


def native_the_driver_takes(
    name: str, spirv: bytes, options: xpu_zebin.Options, arch: Optional[str]
) -> Tuple[bytes, str]:
    """``make_zebin``'s answer is final (Triton's cache and Inductor's launcher load it
    with no retry), so where the kernel will load on this host, the driver must take it:
    a bundle's build or an ``ocloc`` build the driver refuses (another compiler release,
    unresolved symbols) is made by the driver's own compiler instead, and a (compiler,
    driver) pair whose format was refused goes there at once after. The check is the
    trial load the drop-in ``load_binary`` does anyway (remembered per binary on this
    host), made before the binary is handed on (docs/design.md §6)."""
    here = loads_here(arch)
    # The engine asks the bundles first, on every path below (only for the local device).
    asked = bundle.query(name, 0, arch)
    if not offline_usable():  # no ocloc here: the driver's own compiler, in a worker
        return jit_native(name, spirv, options, 0, asked)
    pair = compiler_pair(options, 0) if here else None
    if refused_here(pair):
        return jit_native(name, spirv, options, 0, asked)
    refused: Optional[bytes] = None
    arch = arch or ocloc_arch(0, None)
    try:
        if here:  # a level's build is tried first: refused, it is rebuilt fresh
            result = compile_trusting_no_cache(name, spirv, options, arch, 0, asked)
        else:
            result = _compile(spirv, options, arch, asked)
    except BuildError as e:  # upstream's make_zebin fails too, but where the driver may not
        if not here or e.kind not in REFUSAL_KINDS:
            raise
        why: BuildError = e
    else:
        note_kept_default(name, result)
        if not here:
            return result.binary, result.build_flags
        try:
            trial_load(name, result.binary, result.build_flags, 0, options.device_arch)
            return result.binary, result.build_flags
        except Exception as e:
            refusal = package_error(e)
            if refusal is None or refusal.kind not in REFUSAL_KINDS:
                raise
            # Only a fresh build of this process's compiler speaks for the compiler.
            why, refused = refusal, (result.binary if result.source == "compiled" else None)
    return _instead(name, spirv, options, 0, why, pair, refused, arch)
