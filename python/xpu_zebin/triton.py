"""Triton XPU drop-ins: ``load_binary`` and ``make_zebin``.

The recommended activation is the environment: with ``XPU_ZEBIN_TRITON=1`` every Python
process that imports Triton's Intel backend gets the drop-ins, subprocesses included (see
``_xpu_zebin_hook``). In code, one line does the same (nothing happens on import)::

    import xpu_zebin.triton; xpu_zebin.triton.install()

``install()`` wraps the active driver's ``utils.load_binary``: SPIR-V is built by this
package (the offline ``ocloc`` engine when ``ocloc`` is found, else Level Zero's
``compile_and_load``), with the large-GRF fallback, classified errors and the binary cache,
and the chosen native binary and build flags are then handed to the driver's own loader
with ``is_spv=False``, so the SYCL objects Triton's launcher needs still come from the
driver and its ``get_last_selected_build_flags()`` agrees. It also routes the XPU backend's
``zebin`` stage through :func:`make_zebin`. triton-xpu 3.3 has no zebin stage: when
``TRITON_XPU_GEN_NATIVE_CODE`` asks for native code there, its ``spv`` stage is extended to
run :func:`make_zebin` after SPIR-V generation, the shape 3.3's own native path has.

Errors: a PTSS overflow raises ``triton.runtime.errors.OutOfResources(required, limit,
"per-thread scratch space (PTSS)")`` so the autotuner skips the config; other build errors
raise ``IntelGPUError`` where Triton has it, else the package's own :class:`BuildError`.
Either way ``.log`` holds the compiler's output and ``__cause__`` the package's error.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import logging
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple, Union

import xpu_zebin

from . import autotune, bundle
from .errors import (
    BuildError,
    InvalidArgumentError,
    NoDeviceError,
    ScratchOverflowError,
    UnsupportedDeviceError,
)

__all__ = [
    "ConfigResult",
    "compile_configs",
    "get_last_selected_build_flags",
    "install",
    "install_backend",
    "load_binary",
    "make_zebin",
    "precompile",
    "uninstall",
]

logger = logging.getLogger("xpu_zebin.triton")

#: Triton's knob for the device architecture, honoured when no other source names it.
DEVICE_ARCH_ENV = "TRITON_INTEL_DEVICE_ARCH"
#: triton-xpu 3.3's switch for native code (its driver reads it at load time).
NATIVE_CODE_ENV = "TRITON_XPU_GEN_NATIVE_CODE"

_last_build_flags = ""
# (utils object, its original load_binary) for every install, so uninstall can undo it.
_installed_utils: List[Tuple[Any, Callable]] = []
_installed_backend: List[Tuple[type, Callable]] = []


def _debug_logging() -> None:
    """``TRITON_DEBUG=1``: the package's details on stderr too, as Triton's own are."""
    if os.environ.get("TRITON_DEBUG", "").strip().lower() in ("1", "true", "on", "yes"):
        root = logging.getLogger("xpu_zebin")
        if not root.handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
            root.addHandler(handler)
            root.setLevel(logging.DEBUG)


def get_last_selected_build_flags() -> str:
    """The build flags of the last kernel loaded through this module (upstream contract)."""
    return _last_build_flags


def _triton_error(error: BuildError) -> Exception:
    """The exception Triton's callers expect for ``error``, carrying its log."""
    try:
        from triton.runtime import errors as triton_errors
    except ImportError:
        return error
    converted: Optional[Exception] = None
    if isinstance(error, ScratchOverflowError) and error.required is not None:
        converted = triton_errors.OutOfResources(
            error.required, error.limit, "per-thread scratch space (PTSS)"
        )
    elif hasattr(triton_errors, "IntelGPUError"):
        converted = triton_errors.IntelGPUError(f"{error}\n{error.log}")
    if converted is None:
        return error
    converted.log = error.log  # type: ignore[attr-defined]
    converted.kind = error.kind  # type: ignore[attr-defined]
    converted.attempts = error.attempts  # type: ignore[attr-defined]
    return converted


def _device_arch(device: int, device_arch: Optional[str]) -> str:
    """The ocloc device name: given, ``$TRITON_INTEL_DEVICE_ARCH``, or what the driver says."""
    arch = device_arch or os.environ.get(DEVICE_ARCH_ENV)
    if arch:
        return arch
    try:
        arch = xpu_zebin.devices()[device].get("arch")
    except (BuildError, IndexError):
        arch = None
    if not arch:
        raise UnsupportedDeviceError(
            f"cannot tell device {device}'s architecture for ocloc: pass device_arch "
            f"or set {DEVICE_ARCH_ENV} (e.g. pvc, bmg, cri)",
            kind="unsupported_device",
        )
    return arch


def _offline_engine_available() -> bool:
    try:
        xpu_zebin.find_ocloc()
        return True
    except BuildError:
        return False


def _seventh_argument(value: Any) -> Tuple[Optional[str], Optional[Any]]:
    """Upstream ``load_binary``'s optional 7th argument as ``(device_arch, max_grf_mode)``:
    the newest driver passes the max GRF mode (``"128"``, ``"256"``, ``"512"``, from
    ``metadata["max_grf_mode"]``, intel-xpu-backend-for-triton issue #8074), older ones
    the device arch (``"cri"`` chooses 512 GRF; ``"unknown"`` when Triton cannot tell).
    Digits are a GRF mode, checked by :class:`~xpu_zebin.Options` (128, 256 or 512); a
    name is an arch; anything else is an :class:`InvalidArgumentError`."""
    if value is None:
        return None, None
    if isinstance(value, int) and not isinstance(value, bool):
        return None, value
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            return None, text
        if text.replace("_", "").isalnum():
            return (None if text.lower() == "unknown" else text), None
        if not text:
            return None, None
    raise InvalidArgumentError(
        f"load_binary's 7th argument {value!r} is neither a max GRF mode (128, 256, 512) "
        "nor a device arch name",
        kind="invalid_argument",
    )


def _spill_policy(upstream_rule: str) -> Optional[str]:
    """The drop-ins follow upstream's rule for the path they stand in for, whichever
    compiler builds (``upstream`` in ``$XPU_ZEBIN_SPILL_POLICY`` means the same); another
    value there chooses another rule (the engine reads and checks it)."""
    chosen = os.environ.get(xpu_zebin._core.SPILL_POLICY_ENV, "").strip().lower()
    return upstream_rule if chosen in ("", "upstream") else None


#: Upstream's spill rule of each path it has (docs/design.md §2).
LOAD_BINARY_RULE = "upstream:load_binary"
MAKE_ZEBIN_RULE = "upstream:make_zebin"
MAKE_ZEBIN_ROLLING_RULE = "upstream:make_zebin-rolling"


def native_options(
    name: Optional[str],
    build_flags: str,
    *,
    rule: str,
    grf_mode: Any = "default",
    num_warps: Optional[int] = None,
    device_arch: Optional[str] = None,
    max_grf_mode: Optional[str] = None,
) -> xpu_zebin.Options:
    """The one place the drop-ins build their :class:`~xpu_zebin.Options`: every path
    (``load_binary``, ``make_zebin``, a sweep's prebuild) asks for one kernel the same
    way, so they share cache entries when the answer is the same."""
    return xpu_zebin.Options(
        build_flags=build_flags or "",
        grf_mode=grf_mode if isinstance(grf_mode, str) else "default",  # 3.3: a tuple
        num_warps=num_warps,
        kernel_name=name or None,
        device_arch=device_arch or os.environ.get(DEVICE_ARCH_ENV, "").strip() or None,
        max_grf_mode=max_grf_mode,
        spill_policy=_spill_policy(rule),
    )


#: Driver answers that mean "not this compiler's code": the zebin's format (its
#: ``.ze_info`` major) is one the driver does not know, or it imports symbols nothing
#: provides. The driver's own compiler builds such a kernel (upstream's path).
REFUSAL_KINDS = ("unsupported_device", "link_failure")
#: Offline failures that are the input's own, which the driver's compiler would meet too
#: (or the caller's): final. Every other one (a builtin or device the offline compiler
#: does not know, its crash, a build failure, a compiler that cannot run) has the
#: driver's own compiler build the kernel instead, as upstream's path would. A PTSS
#: overflow stays Triton's OutOfResources, as upstream's.
FINAL_OFFLINE_KINDS = ("scratch_overflow", "invalid_spirv", "kernel_not_found",
                       "invalid_argument", "cancelled")  # fmt: skip

_said_once: set = set()
_said_lock = threading.Lock()
# The offline compiler could not run in this process (toolchain_missing): not tried again.
_offline_broken: List[str] = []


def _say_once(key: Any, message: str, *args: Any) -> None:
    """A warning once per process for ``key`` (one line saying why, not one per kernel)."""
    with _said_lock:
        if key in _said_once:
            return
        _said_once.add(key)
    logger.warning(message, *args)


def _package_error(e: BaseException) -> Optional[BuildError]:
    """The package's error behind ``e`` (itself, or what a Triton error was made from)."""
    if isinstance(e, BuildError):
        return e
    cause = e.__cause__
    return cause if isinstance(cause, BuildError) else None


def _compiler_pair(options: xpu_zebin.Options, device: int) -> Optional[Tuple[str, str]]:
    """(the offline compiler's identity, this device's driver version), or None when
    either cannot be told (no compiler, no driver: nothing to remember)."""
    try:
        identity = xpu_zebin._core.compiler_identity(options.ocloc)
        driver = xpu_zebin.devices()[device]["driver"]
    except (BuildError, IndexError, KeyError, TypeError):
        return None
    return identity, str(driver)


def _refused_here(pair: Optional[Tuple[str, str]]) -> bool:
    return pair is not None and xpu_zebin._core.compiler_refused(*pair)


def _ze_info_major(binary: bytes) -> Optional[str]:
    try:
        return str(xpu_zebin.zebin_info(binary)["version"]).split(".")[0]
    except BuildError:
        return None


def _remember_refusal(pair: Optional[Tuple[str, str]], refused: bytes, own: bytes) -> None:
    """A refusal of the offline compiler's format holds for every kernel of it on this
    driver: remembered on this host when its ``.ze_info`` major is not the one the
    driver's own compiler wrote for the same kernel (``own``). Anything else (one
    malformed kernel, unresolved symbols, another device's build) is the kernel's own."""
    ours, theirs = _ze_info_major(refused), _ze_info_major(own)
    if pair is None or ours is None or theirs is None or ours == theirs:
        return
    xpu_zebin._core.remember_compiler_refused(*pair)
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
    error = _package_error(failure)
    if error is None:
        try:
            xpu_zebin.compile_and_load(
                native, name, is_spv=False, device=device, build_flags=flags, cache=False
            ).close()
            return None
        except BuildError as e:
            error = e
    return error if error.kind in REFUSAL_KINDS else None


def _jit_native(
    name: str, spirv: bytes, options: xpu_zebin.Options, device: int
) -> Tuple[bytes, str]:
    """The driver's own compiler builds the kernel from its SPIR-V (in a worker unless
    isolation is off), with the GRF fallback: (native binary, chosen flags)."""
    with xpu_zebin.compile_and_load(spirv, name, device=device, options=options) as loaded:
        return loaded.native_binary, loaded.build_flags


class _Refused(Exception):
    """The driver refused a build of the offline compiler (the package's error inside)."""

    def __init__(self, error: BuildError, binary: bytes) -> None:
        super().__init__(str(error))
        self.error = error
        self.binary = binary


def _from_bundle(
    name: str, spirv: bytes, options: xpu_zebin.Options, device: int
) -> Optional[Tuple[bytes, str]]:
    """A bundle's build of this kernel for this device that loads here (trial-loaded in a
    worker first), or None."""
    found = bundle.find(name, spirv, options, device)
    if found is not None:
        try:
            _trial_load(name, found[0], found[1], device, options.device_arch)
            return found
        except Exception as e:  # an entry that does not load here: compile instead
            logger.warning("kernel %r: bundle entry did not load (%s); compiling", name, e)
    return None


def _offline_usable() -> bool:
    return not _offline_broken and _offline_engine_available()


def _build_offline(
    name: str, spirv: bytes, options: xpu_zebin.Options, device: int
) -> Tuple[bytes, str]:
    """``ocloc``'s build of SPIR-V with the GRF fallback: (binary, chosen flags); a build
    an autotune precompile made for this very request, when there is one."""
    arch = _device_arch(device, options.device_arch)
    prebuilt = autotune.take(autotune.request_key(spirv, name, arch, options))
    if prebuilt is not None and prebuilt.error is not None:
        raise prebuilt.error  # built for this benchmark a moment ago: its answer
    if prebuilt is not None:
        try:
            if prebuilt.untrusted:  # another machine's, or the cache's: tried first
                _trial_load(name, prebuilt.binary, prebuilt.build_flags, device, arch)
            return prebuilt.binary, prebuilt.build_flags
        except Exception as e:  # built here instead, as if it had not been made
            logger.warning("kernel %r: its build for the benchmark did not load (%s)", name, e)
    result = xpu_zebin.compile(spirv, device=arch, options=options)
    if result.cached:
        # A cache entry is untrusted input (a shared cache, a neighbour): its binary
        # loads in a worker before the driver loads it here (once per binary and host);
        # one that does not load is rebuilt from the SPIR-V, and one the driver refuses
        # goes back to the caller as the driver's answer.
        try:
            _trial_load(name, result.binary, result.build_flags, device, options.device_arch)
        except Exception as e:
            refusal = _package_error(e)
            if refusal is not None and refusal.kind in REFUSAL_KINDS:
                raise _Refused(refusal, result.binary) from None
            logger.warning("kernel %r: cached zebin did not load (%s); rebuilding", name, e)
            result = xpu_zebin.compile(spirv, device=arch, options=options, cache=False)
    return result.binary, result.build_flags


def _instead(
    name: str,
    spirv: bytes,
    options: xpu_zebin.Options,
    device: int,
    why: BuildError,
    pair: Optional[Tuple[str, str]],
    refused: Optional[bytes],
) -> Tuple[bytes, str]:
    """The driver's own build of a kernel the offline path could not give it (``why``,
    said once per kernel); a ``refused`` offline build is weighed against it to tell
    whether the compiler's format is what the driver refuses (``_remember_refusal``)."""
    logger.warning("kernel %r: %s; the driver's own compiler builds it from its SPIR-V", name, why)
    native, flags = _jit_native(name, spirv, options, device)
    if refused is not None:
        _remember_refusal(pair, refused, native)
    return native, flags


def _load_spirv(
    name: str,
    spirv: bytes,
    options: xpu_zebin.Options,
    device: int,
    load: Callable[[bytes, str], Any],
) -> Tuple[Any, str]:
    """SPIR-V to the driver's loader: a bundle's build, else the package's native build
    when the driver takes it. When the driver refuses it (a compiler of another release,
    unresolved symbols), or the offline compiler fails where the driver's own may not,
    the driver's own compiler builds it from the SPIR-V, as upstream's path does, and one
    line says why; a (compiler, driver) pair whose format was refused goes to the
    driver's compiler at once after (docs/design.md §6)."""
    found = _from_bundle(name, spirv, options, device)
    if found is not None:
        return load(*found), found[1]
    offline = _offline_usable()
    pair = _compiler_pair(options, device) if offline else None
    refused: Optional[bytes] = None
    if not offline or _refused_here(pair):
        native, flags = _jit_native(name, spirv, options, device)
        return load(native, flags), flags
    try:
        native, flags = _build_offline(name, spirv, options, device)
    except _Refused as e:  # a cached build of the offline compiler, refused by the driver
        why: BuildError = e.error
        refused = e.binary
    except BuildError as e:
        if e.kind in FINAL_OFFLINE_KINDS:
            raise
        if e.kind == "toolchain_missing":  # it cannot run here: not tried again
            _offline_broken.append(str(e))
        why = e
    else:
        try:
            return load(native, flags), flags
        except Exception as e:
            refusal = _driver_refusal(name, native, flags, device, e)
            if refusal is None:
                raise
            why, refused = refusal, native
    native, flags = _instead(name, spirv, options, device, why, pair, refused)
    return load(native, flags), flags


_native_code_lock = threading.Lock()


def _native_code_requested() -> bool:
    return os.environ.get(NATIVE_CODE_ENV, "").strip().lower() in ("1", "true", "on", "yes")


def _native_code_on() -> None:
    """triton-xpu 3.3's loader takes no ``is_spv``: it reads ``TRITON_XPU_GEN_NATIVE_CODE``
    from the environment at each load, and the drop-in only ever hands it native binaries.
    So the switch is turned on once, before the first load, and left on: the environment is
    never flipped around a load while other threads read it. (3.3's compiler reads the same
    switch: later compiles build native code in their ``spv`` stage, through
    :func:`make_zebin`, which is 3.3's own native path.)"""
    if _native_code_requested():
        return
    with _native_code_lock:
        before = os.environ.get(NATIVE_CODE_ENV)
        if _native_code_requested():
            return
        if before is not None and before.strip():
            logger.warning(
                "%s=%r turned on: triton-xpu 3.3's loader takes native binaries only with it",
                NATIVE_CODE_ENV,
                before,
            )
        os.environ[NATIVE_CODE_ENV] = "1"


def load_binary(
    name: str,
    kernel: bytes,
    shared: int,
    build_flags: str,
    is_spv: bool,
    device: int,
    device_arch_or_max_grf: Optional[str] = None,
) -> Tuple[Any, Any, int, int, int]:
    """Upstream ``load_binary`` without a Triton driver: the result of ``compile_and_load``.

    Returns ``(module, function, n_regs, n_spills, n_max_threads)``, where ``module`` is the
    :class:`~xpu_zebin.LoadedKernel` that owns both handles, ``function`` the kernel handle
    as an integer and ``n_spills`` upstream's number, 32-bit slots per lane. ``shared`` is
    accepted for signature compatibility; the 7th argument is the max GRF mode (``"128"``,
    ``"256"``, ``"512"``) or, from older Triton, the device arch.
    """
    global _last_build_flags
    device_arch, max_grf_mode = _seventh_argument(device_arch_or_max_grf)
    options = native_options(
        name, build_flags, rule=LOAD_BINARY_RULE, device_arch=device_arch,
        max_grf_mode=max_grf_mode,
    )  # fmt: skip
    found = bundle.find(name, kernel, options, device) if is_spv else None
    loaded = None
    if found is not None:  # loaded in a worker first by compile_and_load itself
        try:
            loaded = xpu_zebin.compile_and_load(
                found[0], name, is_spv=False, device=device,
                options=options.replace(build_flags=found[1]),
            )  # fmt: skip
        except BuildError as e:  # an entry that does not load here: compile instead
            logger.warning("kernel %r: bundle entry did not load (%s); compiling", name, e)
    try:
        if loaded is None:
            loaded = xpu_zebin.compile_and_load(
                kernel, name, is_spv=bool(is_spv), device=device, options=options
            )
    except BuildError as e:
        raise _triton_error(e) from e
    _last_build_flags = loaded.build_flags
    return loaded, loaded.kernel_handle, loaded.n_regs, loaded.n_spills, loaded.n_max_threads


def _trial_load(
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
        raise _triton_error(e) from e


def _wrap_load_binary(original: Callable) -> Callable:
    def load_binary(*args: Any) -> Any:
        global _last_build_flags
        if len(args) == 5:  # triton-xpu 3.3: (name, kernel, shared, build_flags, device)
            name, kernel, shared, build_flags, device = args
            # What the bytes are, not what the switch said when Triton compiled them.
            is_spv, device_arch, max_grf_mode = bytes(kernel[:4]) != b"\x7fELF", None, None
            _native_code_on()

            def load(binary: bytes, flags: str, spv: bool) -> Any:
                return original(name, binary, shared, flags, device)

        else:  # upstream: (name, kernel, shared, build_flags, is_spv, device[, arch/max GRF])
            name, kernel, shared, build_flags, is_spv, device, *rest = args
            device_arch, max_grf_mode = _seventh_argument(rest[0] if rest else None)

            def load(binary: bytes, flags: str, spv: bool) -> Any:
                return original(name, binary, shared, flags, spv, device, *rest)

        if not is_spv:
            _trial_load(name, kernel, build_flags, device, device_arch)
            result = load(kernel, build_flags, False)
            _last_build_flags = build_flags
            return result
        options = native_options(
            name, build_flags, rule=LOAD_BINARY_RULE, device_arch=device_arch,
            max_grf_mode=max_grf_mode,
        )  # fmt: skip
        try:
            result, flags = _load_spirv(
                name, kernel, options, device, lambda native, flags: load(native, flags, False)
            )
        except BuildError as e:
            raise _triton_error(e) from e
        logger.debug("kernel %r: loaded the native binary built with %r", name, flags)
        _last_build_flags = flags
        return result

    load_binary.__wrapped__ = original  # type: ignore[attr-defined]
    load_binary.__xpu_zebin__ = True  # type: ignore[attr-defined]
    return load_binary


def _target_device_arch(metadata: dict) -> Optional[str]:
    target = metadata.get("target")
    arch = getattr(target, "arch", None)
    if isinstance(arch, dict):
        return arch.get("arch") or arch.get("device_arch")
    return None


def _driver_is_lts(backend: Any) -> bool:
    """Is the driver Triton compiles for an LTS one? Upstream's own answer where its
    backend has one (``is_lts``); unknown counts as LTS, as upstream's ``is_lts`` does."""
    answer = getattr(backend, "is_lts", None)
    try:
        answer = answer() if callable(answer) else answer
    except Exception:  # another Triton's signature: upstream's default for "unknown"
        answer = None
    return True if answer is None else bool(answer)


def make_zebin_options(
    metadata: dict, options: Any, device_arch: Optional[str], *, lts: bool = True
) -> xpu_zebin.Options:
    """The options :func:`make_zebin` builds a kernel with (and a bundle keys it by)."""
    return native_options(
        metadata.get("name"),
        metadata.get("build_flags", "") or "",
        rule=MAKE_ZEBIN_RULE if lts else MAKE_ZEBIN_ROLLING_RULE,
        grf_mode=getattr(options, "grf_mode", "default"),
        num_warps=getattr(options, "num_warps", None),
        device_arch=device_arch,
        max_grf_mode=metadata.get("max_grf_mode"),
    )


@dataclass(frozen=True)
class _Farm:
    """How Triton's native stage builds while a bundle is precompiled: for ``device``,
    with ``ocloc``, answering from ``prebuilt`` (bundle key -> binary, flags) first."""

    device: str
    ocloc: Optional[str]
    prebuilt: Dict[str, Tuple[bytes, str]]


_farm: contextvars.ContextVar[Optional[_Farm]] = contextvars.ContextVar(
    "xpu_zebin_farm", default=None
)


@contextlib.contextmanager
def building_for(
    device: str, ocloc: Optional[str], prebuilt: Optional[Dict[str, Tuple[bytes, str]]] = None
) -> Iterator[None]:
    """Triton's native stage (through :func:`make_zebin`) builds for ``device`` with
    ``ocloc`` in this context, whatever device Triton's backend parsed (a build farm);
    a build already made (``prebuilt``, by :func:`farm_key`) is used as it is."""
    token = _farm.set(_Farm(device, ocloc, dict(prebuilt or {})))
    try:
        yield
    finally:
        _farm.reset(token)


def farm_key(spirv: bytes, name: str, device: str, options: xpu_zebin.Options) -> str:
    """What identifies a native build on a farm: its bundle key, for no target."""
    return xpu_zebin._core.bundle_key(spirv, name, device, options, "farm")


def make_zebin(
    src: bytes,
    metadata: dict,
    options: Any,
    device_arch: Optional[str] = None,
    *,
    lts: bool = True,
):
    """Drop-in for the XPU backend's ``make_zebin`` stage (upstream main's semantics).

    The GRF ladder (default, then large) runs only for ``grf_mode == 'default'`` and
    ``num_warps <= 32``; ``metadata["build_flags"]`` is updated with the flags that won.
    Spills follow upstream's rule for the driver (``lts``: any spilled byte; rolling: more
    than 16 slots per lane). The device comes from ``device_arch``,
    ``metadata["target"].arch``, ``$TRITON_INTEL_DEVICE_ARCH``, or the driver. A bundle
    that holds the kernel for this device answers first (no compile).
    """
    arch = device_arch or _target_device_arch(metadata)
    farm = _farm.get()
    if farm is not None:
        arch = farm.device
    try:
        opts = make_zebin_options(metadata, options, arch, lts=lts)
        if farm is not None and farm.ocloc:
            opts = opts.replace(ocloc=farm.ocloc)
        name = opts.kernel_name or ""
        if farm is not None:
            found = farm.prebuilt.get(farm_key(src, name, farm.device, opts))
            if found is None:
                result = xpu_zebin.compile(src, device=arch, options=opts)
                found = result.binary, result.build_flags
            native, flags = found
        else:
            native, flags = _native_the_driver_takes(name, src, opts, arch)
    except BuildError as e:
        raise _triton_error(e) from e
    metadata["build_flags"] = flags
    metadata["binary_ext"] = "zebin"
    return native


def _loads_here(arch: Optional[str]) -> bool:
    """Will a build for ``arch`` (None: this host's device) load on this host's device 0,
    so that this driver's verdict on it applies?"""
    try:
        local = xpu_zebin.devices()[0].get("arch")
    except (BuildError, IndexError):
        return False
    return bool(local) and (arch is None or local.strip().lower() == arch.strip().lower())


def _native_the_driver_takes(
    name: str, spirv: bytes, options: xpu_zebin.Options, arch: Optional[str]
) -> Tuple[bytes, str]:
    """``make_zebin``'s answer is final (Triton's cache and Inductor's launcher load it
    with no retry), so where the kernel will load on this host, the driver must take it:
    a bundle's build or an ``ocloc`` build the driver refuses (another compiler release,
    unresolved symbols) is made by the driver's own compiler instead, and a (compiler,
    driver) pair whose format was refused goes there at once after. The check is the
    trial load the drop-in ``load_binary`` does anyway (remembered per binary on this
    host), made before the binary is handed on (docs/design.md §6)."""
    here = _loads_here(arch)
    found = bundle.find(name, spirv, options, 0, arch=arch)
    if found is not None:
        try:
            if here:
                _trial_load(name, found[0], found[1], 0, options.device_arch)
            return found
        except Exception as e:  # an entry that does not load here: built instead
            logger.warning("kernel %r: bundle entry did not load (%s); compiling", name, e)
    if not _offline_usable():  # no ocloc here: the driver's own compiler, in a worker
        return _jit_native(name, spirv, options, 0)
    pair = _compiler_pair(options, 0) if here else None
    if _refused_here(pair):
        return _jit_native(name, spirv, options, 0)
    refused: Optional[bytes] = None
    try:
        result = xpu_zebin.compile(spirv, device=arch or _device_arch(0, None), options=options)
    except BuildError as e:  # upstream's make_zebin fails too, but where the driver may not
        if not here or e.kind not in REFUSAL_KINDS:
            raise
        why: BuildError = e
    else:
        if not here:
            return result.binary, result.build_flags
        try:
            _trial_load(name, result.binary, result.build_flags, 0, options.device_arch)
            return result.binary, result.build_flags
        except Exception as e:
            refusal = _package_error(e)
            if refusal is None or refusal.kind not in REFUSAL_KINDS:
                raise
            why, refused = refusal, result.binary
    return _instead(name, spirv, options, 0, why, pair, refused)


def install_backend(cls: Any = None) -> None:
    """Route the XPU backend's zebin stage (``cls``: the backend class, by default Triton's
    registered Intel backend) through :func:`make_zebin`. Idempotent."""
    _debug_logging()
    if cls is None:
        from triton.backends import backends

        cls = backends["intel"].compiler
    if any(c is cls for c, _ in _installed_backend):
        return
    original_add_stages = cls.add_stages

    def add_stages(self, stages: dict, options: Any, *args: Any, **kwargs: Any) -> None:
        original_add_stages(self, stages, options, *args, **kwargs)
        arch = getattr(self, "device_arch", None)
        lts = _driver_is_lts(self)
        if "zebin" in stages:
            stages["zebin"] = lambda src, metadata: make_zebin(
                src, metadata, options, arch, lts=lts
            )
        elif getattr(options, "generate_native_code", False):
            # triton-xpu 3.3 has no zebin stage: its make_spv runs ocloc itself and returns
            # the zebin under the "spv" key, the only binary its CompiledKernel reads as
            # bytes. Keep that shape: SPIR-V from make_spv, then make_zebin, in one stage.
            spv_options = copy.copy(options)
            object.__setattr__(spv_options, "generate_native_code", False)

            def spv_then_zebin(src: Any, metadata: dict) -> bytes:
                spirv = self.make_spv(src, metadata, spv_options)
                return make_zebin(spirv, metadata, options, arch, lts=lts)

            stages["spv"] = spv_then_zebin

    cls.add_stages = add_stages
    _installed_backend.append((cls, original_add_stages))


@contextlib.contextmanager
def backend_installed() -> Iterator[None]:
    """:func:`install_backend` for the block, undone after unless it was there before."""
    from triton.backends import backends

    cls = backends["intel"].compiler
    before = any(c is cls for c, _ in _installed_backend)
    install_backend(cls)
    try:
        yield
    finally:
        for i, (c, original) in enumerate(_installed_backend):
            if c is cls and not before:
                cls.add_stages = original
                del _installed_backend[i]
                break


def install(utils: Any = None, *, backend: bool = True) -> Any:
    """Route a Triton XPU driver's kernel loading (and the backend's zebin stage) through
    this package. ``utils`` defaults to ``triton.runtime.driver.active.utils``. Idempotent;
    :func:`uninstall` undoes it. Returns the utils object."""
    if utils is None:
        from triton.runtime.driver import driver

        utils = driver.active.utils
    if not getattr(utils.load_binary, "__xpu_zebin__", False):
        original = utils.load_binary
        utils.load_binary = _wrap_load_binary(original)
        _installed_utils.append((utils, original))
    if backend:
        install_backend()
        autotune.install()
    _debug_logging()
    return utils


def uninstall() -> None:
    """Restore every driver and backend :func:`install` changed."""
    while _installed_utils:
        utils, original = _installed_utils.pop()
        utils.load_binary = original
    while _installed_backend:
        cls, original_add_stages = _installed_backend.pop()
        cls.add_stages = original_add_stages
    autotune.uninstall()


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


def _jit_function(fn: Any) -> Any:
    """The JITFunction under an autotuner or heuristics wrapper."""
    from triton.runtime.jit import JITFunction

    while not isinstance(fn, JITFunction):
        inner = getattr(fn, "fn", None)
        if inner is None:
            raise TypeError(f"{fn!r} is not a Triton kernel (@triton.jit or @triton.autotune)")
        fn = inner
    return fn


def _split_config(config: Any) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(constexpr values, compile options) of a ``triton.Config`` or a dict of both."""
    if isinstance(config, dict):
        options = dict(config)
        constants = dict(options.pop("constexprs", None) or options.pop("kwargs", None) or {})
        return constants, options
    options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    for name in ("num_ctas", "maxnreg"):
        value = getattr(config, name, None)
        if value is not None and (name != "num_ctas" or value != 1):
            options[name] = value
    return dict(config.kwargs), options


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

    jit = _jit_function(fn)
    if configs is None:
        configs = getattr(fn, "configs", None)
        if configs is None:
            raise TypeError("pass configs, or an @triton.autotune kernel that has them")
    configs = list(configs)
    if target is None:
        from triton.runtime.driver import driver

        target = driver.active.get_current_target()
    install_backend()
    _warm_triton()
    names = list(jit.arg_names)

    def one(config: Any) -> ConfigResult:
        constants, options = _split_config(config)
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
                flags = _prebuild_native(kernel, spirv, options, target)
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


def _warm_triton() -> None:
    """Triton's one-time set-up, before threads race through it: its cache key reads
    sysconfig's config vars, whose first, lazy initialisation is not thread-safe (seen
    here: ``EXT_SUFFIX`` None in a concurrent first call)."""
    import sysconfig

    sysconfig.get_config_vars()
    try:
        from triton.compiler.compiler import triton_key
    except ImportError:  # other Triton versions: sysconfig above is the known race
        return
    triton_key()


def _prebuild_native(kernel: Any, spirv: bytes, options: Dict[str, Any], target: Any) -> str:
    """The native build ``load_binary`` will need, now, into the package's cache: the same
    request the drop-in ``load_binary`` makes for this kernel, so it is a cache hit."""
    arch = _target_device_arch({"target": target}) or _device_arch(0, None)
    opts = native_options(
        kernel.metadata.name,
        kernel.metadata.build_flags or "",
        rule=LOAD_BINARY_RULE,
        device_arch=arch,
    )
    try:
        pair = _compiler_pair(opts, 0) if _loads_here(arch) else None
        if _refused_here(pair):  # load_binary will have the driver's compiler build it
            return _jit_native(kernel.metadata.name, spirv, opts, 0)[1]
        result = xpu_zebin.compile(spirv, device=arch, options=opts)
    except BuildError as e:
        raise _triton_error(e) from e
    return result.build_flags


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
            bundle.check_triton_kernel(
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
    ``kwargs`` go to :func:`xpu_zebin.bundle.precompile_triton` (``jobs``, ``client``,
    ``progress``, ``ocloc``, ``native``). Returns the manifest, with this call's failures
    under ``run_failures``."""
    from . import targets as target_profiles

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
        manifest = bundle.precompile_triton(
            spec["kernel"], spec["signature"], profiles, out, spec.get("configs"),
            constexprs=spec.get("constexprs"), **kwargs,
        )  # fmt: skip
        run_failures += manifest["run_failures"]
    return {**manifest, "run_failures": run_failures}
