"""The drop-ins themselves: a Triton XPU driver's ``utils.load_binary`` wrapped, the
backend's zebin stage routed through :func:`make_zebin`, a standalone ``load_binary``, and
installing and uninstalling them (see the package's docstring)."""

from __future__ import annotations

import contextlib
import contextvars
import copy
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import xpu_zebin

from .. import bundle
from ..build_options import (
    driver_is_lts,
    load_binary_options,
    make_zebin_options,
    seventh_argument,
)
from ..errors import BuildError
from . import autotune, front_ends
from .errors import triton_error
from .fallback import load_spirv, native_the_driver_takes, note_kept_default, trial_load
from .host import gpu_target_arch

logger = logging.getLogger("xpu_zebin.triton")

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
    device_arch, max_grf_mode = seventh_argument(device_arch_or_max_grf)
    options = load_binary_options(name, build_flags, device_arch, max_grf_mode)
    # The engine asks a bundle first (its entry tried in a worker before it loads here),
    # then the cache and the fleet's store, then builds: one lookup, in Rust.
    asked = bundle.query(name, device) if is_spv else None
    try:
        req = xpu_zebin._load_request(kernel, name, is_spv=bool(is_spv), device=device,
                                      options=options)  # fmt: skip
        loaded = xpu_zebin._report(xpu_zebin._core.compile_and_load(**req, bundle=asked), name)
    except BuildError as e:
        raise triton_error(e) from e
    _last_build_flags = loaded.build_flags
    logger.debug("kernel %r: native code from %s", name, loaded.source)
    return loaded, loaded.kernel_handle, loaded.n_regs, loaded.n_spills, loaded.n_max_threads


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
            device_arch, max_grf_mode = seventh_argument(rest[0] if rest else None)

            def load(binary: bytes, flags: str, spv: bool) -> Any:
                return original(name, binary, shared, flags, spv, device, *rest)

        if not is_spv:
            trial_load(name, kernel, build_flags, device, device_arch)
            result = load(kernel, build_flags, False)
            _last_build_flags = build_flags
            return result
        options = load_binary_options(name, build_flags, device_arch, max_grf_mode)
        try:
            result, flags = load_spirv(
                name, kernel, options, device, lambda native, flags: load(native, flags, False)
            )
        except BuildError as e:
            raise triton_error(e) from e
        logger.debug("kernel %r: loaded the native binary built with %r", name, flags)
        _last_build_flags = flags
        return result

    load_binary.__wrapped__ = original  # type: ignore[attr-defined]
    load_binary.__xpu_zebin__ = True  # type: ignore[attr-defined]
    return load_binary


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


#: Triton's knob for IGC shader dumps (``knobs.intel.dump_shader_info`` upstream).
SHADER_DUMP_ENV = "TRITON_INTEL_ENABLE_IGC_SHADER_DUMP"


def _shader_dump_on() -> bool:
    """Upstream's ``knobs.intel.dump_shader_info`` where the installed Triton has it, else
    its variable (triton-xpu 3.3 has no knobs module; the name is the same)."""
    try:
        from triton import knobs  # type: ignore[attr-defined]

        return bool(knobs.intel.dump_shader_info)
    except Exception:
        value = os.environ.get(SHADER_DUMP_ENV, "").strip().lower()
        return value in ("1", "true", "on", "yes", "y")


def _shader_dump_option(metadata: dict) -> str:
    """What upstream's make_zebin appends to ocloc's options for a shader dump: IGC writes
    its dumps into the kernel's Triton cache directory (empty when not asked for)."""
    where = metadata.get("cache_dir")
    if not _shader_dump_on() or not where:
        return ""
    where = str(where)
    if any(c.isspace() or c in "',\"" for c in where):
        # IGC's option string has no escapes: such a directory would split it (measured:
        # a comma sends the dump elsewhere, a flag in the path reaches the compiler).
        logger.warning("no IGC shader dump: the cache directory %r cannot be said in -igc_opts",
                       where)  # fmt: skip
        return ""
    return f" -igc_opts ',DumpToCustomDir={where},ShaderDumpEnable=1'"


def _track(name: str) -> Any:
    """Upstream's compile tracking (``track.py``: ``TRITON_TRACK_DUMP``) where the installed
    backend has it, so the native stage still appears there; else nothing."""
    try:
        from triton.backends.intel.track import track  # type: ignore[import-not-found]

        return track(name)
    except Exception:
        return contextlib.nullcontext()


def _kernel_of(src: bytes, name: Optional[str]) -> Optional[str]:
    """The kernel make_zebin reports on: the metadata's name, else the module's first entry
    point, as upstream's make_zebin reads the first ``spill_size`` of the module (it never
    reads ``metadata["name"]``). None for SPIR-V that does not parse (the build says why)."""
    if name:
        return name
    try:
        return xpu_zebin.validate_spirv(src)[0]
    except (BuildError, IndexError):
        return None


def make_zebin(
    src: bytes,
    metadata: dict,
    options: Any,
    device_arch: Optional[str] = None,
    *,
    lts: Optional[bool] = None,
    backend: Any = None,
):
    """Drop-in for the XPU backend's ``make_zebin`` stage (upstream main's semantics).

    The GRF ladder (default, then large) runs only for ``grf_mode == 'default'`` and
    ``num_warps <= 32``; ``metadata["build_flags"]`` is updated with the flags that won.
    Spills follow upstream's gate for the driver (``lts``, by default ``options.is_lts``,
    else LTS: any spilled byte; rolling: at least 1024 bytes per hardware thread, #8147),
    asked of the installed ``backend``'s own ``accepts_default_grf`` where it has one. The
    device comes from ``device_arch``, ``metadata["target"].arch``,
    ``$TRITON_INTEL_DEVICE_ARCH``, or the driver. A bundle that holds the kernel for this
    device answers first (no compile). ``knobs.intel.dump_shader_info`` dumps IGC's shaders
    into ``metadata["cache_dir"]``, and the stage reports to upstream's ``track.py``.
    """
    if lts is None:
        lts = driver_is_lts(backend, options)
    cls = backend if isinstance(backend, type) or backend is None else type(backend)
    with _track(f"{cls.__name__}.make_zebin" if cls is not None else "make_zebin"):
        native = _make_zebin(src, metadata, options, device_arch, lts, backend)
    return native


def _make_zebin(
    src: bytes, metadata: dict, options: Any, device_arch: Optional[str], lts: bool, backend: Any
) -> bytes:
    arch = device_arch or gpu_target_arch(metadata.get("target"))
    farm = _farm.get()
    if farm is not None:
        arch = farm.device
    try:
        opts = make_zebin_options(metadata, options, arch, lts=lts, backend=backend)
        name = _kernel_of(src, opts.kernel_name)
        opts = opts.replace(kernel_name=name)
        dump = _shader_dump_option(metadata)
        if dump:  # IGC dumps only when it compiles: never a cached build
            opts = opts.replace(build_flags=opts.build_flags + dump, cache=False)
        if farm is not None and farm.ocloc:
            opts = opts.replace(ocloc=farm.ocloc)
        with _track("generate_native_code") as tracked:
            if farm is not None:
                found = farm.prebuilt.get(farm_key(src, name or "", farm.device, opts))
                if found is None:
                    result = xpu_zebin.compile(src, device=arch, options=opts)
                    note_kept_default(name or "", result)
                    found = result.binary, result.build_flags
                native, flags = found
            else:
                native, flags = native_the_driver_takes(name or "", src, opts, arch)
            if hasattr(tracked, "__setitem__"):
                tracked["size"] = len(native)
    except BuildError as e:
        raise triton_error(e) from e
    # The dump option goes to ocloc, never into the kernel's flags (as upstream's).
    if dump:  # exactly what was added, where the engine put it (one space apart)
        flags = flags.replace(dump, "").replace(dump.strip(), "").strip()
    metadata["build_flags"] = flags
    metadata["binary_ext"] = "zebin"
    return native


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
        lts = driver_is_lts(self, options)  # per kernel, as upstream's XPUOptions.is_lts
        if "zebin" in stages:
            stages["zebin"] = lambda src, metadata: make_zebin(
                src, metadata, options, arch, lts=lts, backend=self
            )
        elif getattr(options, "generate_native_code", False):
            # triton-xpu 3.3 has no zebin stage: its make_spv runs ocloc itself and returns
            # the zebin under the "spv" key, the only binary its CompiledKernel reads as
            # bytes. Keep that shape: SPIR-V from make_spv, then make_zebin, in one stage.
            spv_options = copy.copy(options)
            object.__setattr__(spv_options, "generate_native_code", False)

            def spv_then_zebin(src: Any, metadata: dict) -> bytes:
                spirv = self.make_spv(src, metadata, spv_options)
                return make_zebin(spirv, metadata, options, arch, lts=lts, backend=self)

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
        front_ends.install()
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
    front_ends.uninstall()
