"""Ahead-of-time bundles: native code for every target of a fleet, built without its GPUs,
so that no kernel load runs IGC.

``precompile`` builds kernels (SPIR-V, or Triton kernels and their autotune configs) for
target profiles (:mod:`xpu_zebin.targets`) with the GRF ladder, concurrently, into a bundle
directory; ``verify``, ``info`` and ``install`` check, show and import one. With a bundle
in place (``XPU_ZEBIN_BUNDLE``, or imported), the Triton drop-in ``load_binary`` finds each
kernel's native binary for the local device and hands it to the driver with
``is_spv=False``: nothing runs IGC. Entries are untrusted input: checked against their
checksums and trial-loaded in a worker before the caller's driver sees them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import xpu_zebin
from xpu_zebin import _core

from . import targets as target_profiles
from . import triton_cache
from ._files import read_regular
from .errors import BuildError, InvalidArgumentError
from .targets import TargetProfile

__all__ = [
    "BUNDLE_ENV", "check_triton_kernel", "find", "info", "install", "install_triton_entries",
    "pack", "precompile", "precompile_triton", "search_path", "triton_cache_kernels", "verify",
]  # fmt: skip

logger = logging.getLogger("xpu_zebin.bundle")

#: A manifest is read at most this big (as the engine reads it).
MAX_MANIFEST_BYTES = 64 << 20
#: Bundle directories the drop-ins look in, ``os.pathsep``-separated (imported bundles too).
BUNDLE_ENV = "XPU_ZEBIN_BUNDLE"

PathLike = Union[str, "os.PathLike[str]"]
#: A native entry for a bundle: its manifest record and its binary.
Built = Tuple[Dict[str, Any], bytes]
#: A Triton cache entry for a bundle: its manifest record and its files.
TritonAddition = Tuple[Dict[str, Any], List[Tuple[str, bytes]]]


def _triton_version() -> Optional[str]:
    try:
        import triton
    except ImportError:
        return None
    return getattr(triton, "__version__", None)


def _header(targets: Sequence[TargetProfile]) -> Dict[str, Any]:
    """What a bundle's manifest says of who wrote it and for which targets."""
    return {
        "format": "", "package": xpu_zebin.__version__, "triton": _triton_version(),
        "targets": {t.id: t.to_json() for t in targets},
    }  # fmt: skip


def _kernel_options(kernel: Dict[str, Any], target: TargetProfile) -> xpu_zebin.Options:
    """The options the drop-in ``load_binary`` builds for this kernel on this target: the
    bundle's key is the drop-in's own."""
    from .triton import LOAD_BINARY_RULE, native_options

    return native_options(
        kernel["name"], kernel.get("build_flags", ""), rule=LOAD_BINARY_RULE,
        device_arch=target.ocloc_device,
    )  # fmt: skip


def precompile(
    kernels: Sequence[Dict[str, Any]],
    targets: Sequence[TargetProfile],
    out: PathLike,
    *,
    jobs: Optional[int] = None,
    client: Any = None,
    progress: Union[bool, Callable[[int], None]] = False,
    ocloc: Optional[PathLike] = None,
    allow_compiler_mismatch: bool = False,
) -> Dict[str, Any]:
    """Build every kernel for every target into the bundle at ``out``; returns its manifest.

    ``kernels`` are dicts: ``spirv`` (bytes), ``name`` (the kernel), optional
    ``build_flags`` and ``config`` (text naming the autotune config). Builds run with the
    GRF ladder and upstream's ``load_binary`` rule, at most ``jobs`` at once (or as tasks
    on the Dask ``client``). A kernel that cannot be built for a target is listed in the
    manifest's ``failures`` (a PTSS overflow as ``scratch_overflow``, symbols the compiler
    left unresolved as ``link_failure``), never stored. A compiler whose code a target's
    driver refuses (its profile says so) is refused before anything is built, unless
    ``allow_compiler_mismatch`` (then a warning); for a target whose driver is this
    host's, every entry is loaded here first, and one the driver refuses is built by the
    driver's own compiler instead."""
    if not targets:
        raise InvalidArgumentError("precompile needs at least one target profile")
    _check_kernels(kernels)
    _check_output(out)
    target_profiles.check_compiler(targets, ocloc, allow_mismatch=allow_compiler_mismatch)
    if (Path(os.fspath(out)) / "manifest.json").exists():
        info(out)  # a bundle that cannot be added to is said before anything compiles
    plan: List[Tuple[Dict[str, Any], TargetProfile, Any]] = []
    requests = []
    for target in targets:
        for k in kernels:
            opts = _kernel_options(k, target)
            if ocloc is not None:
                opts = opts.replace(ocloc=ocloc)
            plan.append((k, target, opts))
            requests.append({"spirv": k["spirv"], "device": target.ocloc_device, "options": opts})
    results = xpu_zebin.compile_many(requests, jobs=jobs, client=client, progress=progress)
    compiler = _core.compiler_identity(ocloc)
    built, failures = [], []
    for (k, target, opts), r in zip(plan, results):
        where = {"kernel": k["name"], "config": k.get("config", ""), "target": target.id}
        r, by = _as_the_driver_takes(k, target, opts, r, compiler)
        if isinstance(r, BuildError):
            failures.append({**where, "kind": r.kind, "message": r.message})
            continue
        key = _core.bundle_key(k["spirv"], k["name"], target.ocloc_device, opts, target.id)
        entry = {
            **where, "key": key, "build_flags": r.build_flags, "spill_bytes": r.spill_size,
            "n_spills": r.n_spills, "compiler": by, "file": "", "blake3": "", "size": 0,
        }  # fmt: skip
        built.append((entry, r.binary))
    manifest = _core.bundle_write(os.fspath(out), _header(targets), built, failures)
    for f in failures:
        logger.warning("%s (%s) not built for %s: %s", f["kernel"], f["config"], f["target"][:12],
                       f["message"])  # fmt: skip
    return {**manifest, "run_failures": failures}


@dataclasses.dataclass(frozen=True)
class _JitBuild:
    """A build by the driver's own compiler, shaped as the offline engine's result."""

    binary: bytes
    build_flags: str
    spill_size: int
    n_spills: int


def _local_driver(target: TargetProfile) -> Optional[int]:
    """The index of this host's device that is ``target``'s (its ``ocloc`` device and
    driver version), whose driver can say what it takes; None when there is none."""
    try:
        devices = xpu_zebin.devices()
    except BuildError:
        return None
    for i, d in enumerate(devices):
        if d.get("arch") == target.ocloc_device and d.get("driver") == target.driver:
            return i
    return None


def _as_the_driver_takes(
    kernel: Dict[str, Any], target: TargetProfile, opts: xpu_zebin.Options, r: Any, compiler: str
) -> Tuple[Any, str]:
    """(the result to store, the compiler that built it). Where the target's driver is
    this host's, an offline build it refuses (another release's format, unresolved
    symbols) is not shipped: the driver's own compiler builds the kernel instead."""
    from .triton import REFUSAL_KINDS

    device = _local_driver(target) if target.driver else None
    if device is None:
        return r, compiler
    why = r if isinstance(r, BuildError) else None
    if why is None:
        try:
            xpu_zebin.compile_and_load(
                r.binary, kernel["name"], is_spv=False, device=device, cache=False,
                build_flags=r.build_flags,
            ).close()  # fmt: skip
            return r, compiler
        except BuildError as e:
            why = e
    if why.kind not in REFUSAL_KINDS:
        return r, compiler
    logger.warning("%s for %s: %s; built by the driver's own compiler", kernel["name"],
                   target.name or target.ocloc_device, why)  # fmt: skip
    try:
        with xpu_zebin.compile_and_load(kernel["spirv"], kernel["name"], device=device,
                                        options=opts) as own:  # fmt: skip
            built = _JitBuild(own.native_binary, own.build_flags, own.spill_bytes, own.n_spills)
    except BuildError as e:
        return e, compiler
    return built, f"level-zero driver {target.driver}"


def triton_cache_kernels(cache_dir: PathLike) -> List[Dict[str, Any]]:
    """The SPIR-V kernels in a Triton cache directory (``TRITON_CACHE_DIR``), as
    :func:`precompile` takes them: yesterday's JIT cache, today's bundle. Entries that are
    not Triton XPU SPIR-V (native ones, other backends, unreadable files) are skipped."""
    return triton_cache.kernels_in(cache_dir)


def _check_output(out: PathLike) -> None:
    """The bundle directory can be written: said before anything compiles."""
    path = Path(os.fspath(out))
    if path.exists() and not path.is_dir():
        raise InvalidArgumentError(f"{out} exists and is not a bundle directory")


def _check_kernels(kernels: Sequence[Dict[str, Any]]) -> None:
    """Each kernel a dict with SPIR-V bytes and a kernel name, none twice."""
    if not kernels:
        raise InvalidArgumentError("precompile needs at least one kernel")
    seen = set()
    for i, k in enumerate(kernels):
        if not isinstance(k, dict) or not isinstance(k.get("spirv"), (bytes, bytearray)):
            raise InvalidArgumentError(f"kernel {i}: expected a dict with 'spirv' bytes")
        if not isinstance(k.get("name"), str) or not k["name"]:
            raise InvalidArgumentError(f"kernel {i}: expected a non-empty 'name'")
        slot = (k["name"], k.get("config", ""), bytes(k["spirv"]), k.get("build_flags", ""))
        if slot in seen:
            raise InvalidArgumentError(f"kernel {i} ({k['name']}) is given twice")
        seen.add(slot)


def precompile_triton(
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
    """:func:`precompile` for a Triton kernel: each autotune config (``configs``, else the
    ``@triton.autotune`` kernel's own) through Triton's front end for each target (it runs
    on the CPU), then the native builds. The bundle also holds Triton's own cache entries
    for each: the SPIR-V one (Triton's default; the drop-in then loads the native binary
    from the bundle) and, with ``native``, the one Triton writes with
    ``TRITON_XPU_GEN_NATIVE_CODE`` (native code inside, built by :func:`make_zebin`'s rules;
    its package entry serves the drop-in ``make_zebin``). ``kwargs`` are :func:`precompile`'s."""
    from .triton import _warm_triton

    if not targets:
        raise InvalidArgumentError("precompile needs at least one target profile")
    _check_output(out)
    jit, configs = check_triton_kernel(fn, signature, configs, constexprs)
    target_profiles.check_compiler(
        targets, kwargs.get("ocloc"), allow_mismatch=kwargs.get("allow_compiler_mismatch", False)
    )
    _warm_triton()
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
            run_failures += precompile(kernels, [target], out, **kwargs)["run_failures"]
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
    header = {**_header(targets), "triton_key": triton_cache.key_digest()}
    manifest = _core.bundle_write(os.fspath(out), header, built, failures, entries)
    return {**manifest, "run_failures": failures + run_failures}


def check_triton_kernel(
    fn: Any, signature: Dict[str, str], configs: Optional[Sequence[Any]] = None,
    constexprs: Optional[Dict[str, Any]] = None,
) -> Tuple[Any, List[Any]]:  # fmt: skip
    """A Triton kernel to precompile, checked before anything is built: its JIT function
    and configs (given, else the autotuner's), each config's constexprs and options and
    the signature agreeing with its parameters. An :class:`InvalidArgumentError` says why."""
    from .triton import _jit_function

    try:
        jit = _jit_function(fn)
    except TypeError as e:
        raise InvalidArgumentError(str(e)) from None
    configs = list(configs if configs is not None else getattr(fn, "configs", None) or [])
    if not configs:
        raise InvalidArgumentError("pass configs, or an @triton.autotune kernel that has them")
    for config in configs:
        _triton_source(jit, signature, constexprs, config)
    return jit, configs


@dataclasses.dataclass
class _Lowered:
    """One config of a Triton kernel through Triton's front end for one target."""

    target: TargetProfile
    config: Any
    kernel: Dict[str, Any]  # as precompile takes it
    compiled: Any  # Triton's CompiledKernel (SPIR-V inside)
    entry: TritonAddition  # its Triton cache entry


def _failure(kernel: str, config: Any, target: TargetProfile, e: BaseException) -> Dict[str, Any]:
    return {"kernel": kernel, "config": str(config), "target": target.id,
            "kind": getattr(e, "kind", None) or "front_end",
            "message": f"{type(e).__name__}: {e}"}  # fmt: skip


def _triton_source(jit: Any, signature: Dict[str, str], constexprs: Optional[Dict[str, Any]],
                   config: Any) -> Tuple[Any, Dict[str, Any]]:  # fmt: skip
    """Triton's source object for one config, and the config's compile options."""
    from triton.compiler import ASTSource

    from .triton import _split_config

    if not isinstance(config, dict) and not hasattr(config, "kwargs"):
        raise InvalidArgumentError(f"config {config!r} is neither a dict nor a triton.Config")
    if not isinstance(signature, dict):
        raise InvalidArgumentError("the signature is a dict of argument name to Triton type")
    constants, options = _split_config(config)
    constants = {**(constexprs or {}), **constants}
    names = list(jit.arg_names)
    unknown = set(constants) - set(names)
    if unknown:
        raise InvalidArgumentError(f"{jit.__name__} has no parameter(s) {sorted(unknown)}")
    missing = [n for n in names if n not in constants and n not in signature]
    if missing:
        raise InvalidArgumentError(f"the signature does not type {missing}")
    sig = {n: "constexpr" if n in constants else signature[n] for n in names}
    src = ASTSource(jit, sig, {(names.index(k),): v for k, v in constants.items()})
    return src, options


def _front_end(jit: Any, signature: Dict[str, str], constexprs: Optional[Dict[str, Any]],
               config: Any, target: TargetProfile) -> _Lowered:  # fmt: skip
    """Triton's front end for one config and target."""
    import triton

    src, options = _triton_source(jit, signature, constexprs, config)
    compiled = triton.compile(src, target=target.gpu_target(), options=options)
    spirv = compiled.asm.get("spv", b"")
    if spirv[:4] != triton_cache.SPIRV_MAGIC:
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
    return entry, triton_cache.entry_files(compiled, src.name)


def _native_triton_entry(
    jit: Any, signature: Dict[str, str], constexprs: Optional[Dict[str, Any]], low: _Lowered,
    opts: xpu_zebin.Options, build: Any, ocloc: Optional[str],
) -> TritonAddition:  # fmt: skip
    """Triton's native cache entry for one lowered config: ``triton.compile`` with
    ``generate_native_code``, its native stage answered by the package's ``build``."""
    import triton

    from . import triton as drop_in

    spirv, name, device = low.kernel["spirv"], low.kernel["name"], low.target.ocloc_device
    src, options = _triton_source(jit, signature, constexprs, low.config)
    prebuilt = {drop_in.farm_key(spirv, name, device, opts): (build.binary, build.build_flags)}
    options = {**options, "generate_native_code": True}
    with drop_in.building_for(device, ocloc, prebuilt):
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
    config: the builds with :func:`make_zebin`'s options (all at once, as ``precompile``
    runs them), as package entries (the drop-in ``make_zebin`` finds them), and Triton's
    cache entries with them inside (Triton's native stage, answered by those builds)."""
    from triton.compiler.compiler import make_backend

    from . import triton as drop_in

    ocloc = os.fspath(kwargs["ocloc"]) if kwargs.get("ocloc") is not None else None
    plan = []
    for low in lowered:
        m = low.compiled.metadata
        meta = {"name": m.name, "build_flags": m.build_flags,
                "max_grf_mode": getattr(m, "max_grf_mode", None)}  # fmt: skip
        lts = drop_in._driver_is_lts(make_backend(low.target.gpu_target()))
        opts = drop_in.make_zebin_options(meta, m, low.target.ocloc_device, lts=lts)
        plan.append((low, opts.replace(ocloc=ocloc) if ocloc else opts))
    results = xpu_zebin.compile_many(
        [{"spirv": low.kernel["spirv"], "device": low.target.ocloc_device, "options": o}
         for low, o in plan],
        jobs=kwargs.get("jobs"), client=kwargs.get("client"),
        progress=kwargs.get("progress", False),
    )  # fmt: skip
    compiler = _core.compiler_identity(ocloc)
    built, entries, failures = [], [], []
    with drop_in.backend_installed(), _private_triton_cache():
        for (low, opts), r in zip(plan, results):
            config = f"{low.config} (make_zebin)"
            r, by = _as_the_driver_takes(low.kernel, low.target, opts, r, compiler)
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


_warned: set = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning("%s", message)


# Bundles already looked at: path -> (stat stamp, usable).
_checked: Dict[str, Tuple[Tuple[int, int, int], bool]] = {}


def _usable(d: str) -> bool:
    """A bundle made from another Triton version's SPIR-V is refused by name, once."""
    try:
        st = os.stat(Path(d) / "manifest.json")
    except OSError:
        if os.path.isfile(d):
            _warn_once(f"{BUNDLE_ENV}: {d} is a file (a bundle archive?): archives are used "
                       "once imported (xpu-zebin bundle import); skipped")  # fmt: skip
        else:
            _warn_once(f"{BUNDLE_ENV}: {d} holds no bundle (no manifest.json); skipped")
        return False
    stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
    known = _checked.get(d)
    if known and known[0] == stamp:
        return known[1]
    ok = True
    try:
        built_with, here = info(d).get("triton"), _triton_version()
        if built_with and here and built_with != here:
            _warn_once(f"bundle {d} was built from Triton {built_with}'s SPIR-V; this is "
                       f"Triton {here}: not used")  # fmt: skip
            ok = False
    except BuildError as e:
        _warn_once(f"bundle not used: {e}")
        ok = False
    _checked[d] = (stamp, ok)
    return ok


def search_path() -> List[str]:
    """The bundles the drop-ins use: ``$XPU_ZEBIN_BUNDLE``, then every imported one. A
    directory that holds no usable bundle is said once, at WARNING, and skipped."""
    dirs = [d for d in os.environ.get(BUNDLE_ENV, "").split(os.pathsep) if d.strip()]
    try:
        imported = Path(_core.bundles_dir())
        if imported.is_dir():
            dirs += sorted(str(p) for p in imported.iterdir() if not p.name.startswith("."))
    except (BuildError, OSError):
        pass
    return [d for d in dirs if _usable(d)]


@contextlib.contextmanager
def _as_directory(bundle: PathLike) -> Iterator[Path]:
    """A bundle directory, or an archive file unpacked (checked) into a private one."""
    path = Path(os.fspath(bundle))
    if path.is_dir() or not path.exists():
        yield path
        return
    path = path.resolve()  # a link the user names is followed, once, here
    with tempfile.TemporaryDirectory(prefix="xpu-zebin-bundle.") as tmp:
        _core.bundle_unpack(os.fspath(path), os.path.join(tmp, path.name))
        yield Path(tmp) / path.name


def pack(bundle: PathLike, archive: PathLike) -> int:
    """Write the bundle directory as one archive file (a tar of its checked files, with
    reproducible headers), to ship; every command that takes a bundle takes it too.
    Returns how many files it holds."""
    return _core.bundle_pack(os.fspath(bundle), os.fspath(archive))


def verify(bundle: PathLike) -> Dict[str, Any]:
    """Every entry checked: ``{"ok": [keys], "bad": [(key, why)]}`` (Triton entries as
    ``triton:<hash>``)."""
    with _as_directory(bundle) as d:
        return _core.bundle_verify(os.fspath(d))


def info(bundle: PathLike) -> Dict[str, Any]:
    """The bundle's manifest (checked)."""
    with _as_directory(bundle) as d:
        return _core.bundle_read(os.fspath(d))


def install(
    bundle: PathLike,
    into: Optional[PathLike] = None,
    *,
    target: Optional[TargetProfile] = None,
    triton: bool = True,
    replace: bool = False,
) -> Path:
    """Check a bundle (a directory or an archive) and copy it, entry by checked entry,
    into ``into`` (a directory of bundles; default ``bundles`` in the cache directory), as
    ``<into>/<bundle's name>``, where the drop-ins find it. An existing bundle of that name
    is replaced in one rename when it is this bundle again (the same manifest), or with
    ``replace`` (another bundle of the same name); anything else there is refused, never
    deleted. Entries for
    this device are then tried once, so later loads skip the trial. With ``triton``, its
    Triton cache entries for this device (or for ``target``: an image built on a machine
    without it) go into Triton's cache through Triton's cache manager. Returns where the
    bundle is."""
    with _as_directory(bundle) as src:
        report = verify(src)
        if report["bad"]:
            key, why = report["bad"][0]
            raise InvalidArgumentError(f"{bundle}: entry {key[:20]} is bad ({why}); not installed")
        # Triton's entries are checked before anything is written anywhere.
        triton_entries = _checked_triton_entries(src, target) if triton else []
        parent = Path(os.fspath(into)) if into is not None else Path(_core.bundles_dir())
        dest = parent / _bundle_name(Path(os.fspath(bundle)))
        _copy_into(src.resolve(), parent, dest, bundle, replace)
    if target is None:
        # Triton loads a native entry with no trial of its own: only the exact bytes that
        # loaded here in a worker go into its cache.
        loaded = _try_local_entries(dest)
        triton_entries = [(t, f) for t, f in triton_entries if not t["native"] or _holds(f, loaded)]
    _put_triton_entries(dest, triton_entries)
    return dest


def _holds(files: Dict[str, bytes], binaries: set) -> bool:
    """Is a Triton entry's binary one of ``binaries`` (checksums of bytes that loaded)?"""
    return any(
        _core.bundle_checksum(data) in binaries
        for name, data in files.items()
        if not name.endswith(".json")
    )


def _bundle_name(path: Path) -> str:
    """What an installed bundle is called: its directory's (or archive's, less ``.tar``)
    name; one that would be hidden (the drop-ins skip those) is refused."""
    resolved = path.resolve()
    name = resolved.name
    if not resolved.is_dir() and name.endswith(".tar"):
        name = name[: -len(".tar")]
    if not name or name.startswith("."):
        raise InvalidArgumentError(f"{path}: a bundle's name cannot be empty or start with '.'")
    return name


def _copy_into(src: Path, parent: Path, dest: Path, bundle: PathLike, replace: bool) -> None:
    """Copy the checked bundle ``src`` to ``dest`` through a staging directory. What is at
    ``dest`` is first moved aside in one rename, then checked: what is deleted is exactly
    what was checked (a directory swapped in meanwhile is put back, never deleted), and a
    different bundle of the same name is replaced only with ``replace``."""
    try:
        parent.mkdir(parents=True, exist_ok=True)
        _recover_interrupted(parent, dest)
        staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=parent))
    except OSError as e:
        raise InvalidArgumentError(f"cannot install {bundle} into {parent}: {e}") from None
    old, keep_staging = staging / "old", False
    try:
        _core.bundle_copy(os.fspath(src), os.fspath(staging / "bundle"))
        with contextlib.suppress(FileNotFoundError):
            os.rename(dest, old)
        if old.exists() or old.is_symlink():
            try:
                _replaceable(old, dest)
                if not replace and not _same_manifest(old, staging / "bundle"):
                    raise InvalidArgumentError(
                        f"{dest} holds another bundle of the same name: not replaced (import "
                        "it under another name, or replace it: --replace)"
                    )
            except InvalidArgumentError:
                try:
                    os.rename(old, dest)  # put back as it was
                except OSError:
                    keep_staging = True  # never deleted: left where it was moved
                    logger.warning("%s was changed meanwhile; what was there is in %s", dest, old)
                raise
        os.rename(staging / "bundle", dest)  # fails, never replaces, if dest came back
    except OSError as e:
        raise InvalidArgumentError(f"cannot install {bundle} into {parent}: {e}") from None
    finally:
        if not keep_staging:
            shutil.rmtree(staging, ignore_errors=True)


#: A staging directory this old belongs to an import that ended without clearing it.
STALE_STAGING_SECONDS = 3600


def _recover_interrupted(parent: Path, dest: Path) -> None:
    """An import killed between its two renames left the installed bundle in its staging
    directory (``.<name>.*/old``): put it back where nothing took its place. A staging
    directory an hour old is cleared, unless what it holds was never checked as a bundle
    (a directory that was swapped in and could not be put back: kept, never deleted)."""
    import time

    for staging in parent.iterdir():
        if not staging.name.startswith(f".{dest.name}.") or staging.is_symlink():
            continue
        old = staging / "old"
        try:
            if old.exists() or old.is_symlink():
                _replaceable(old, dest)
                if not (dest.exists() or dest.is_symlink()):
                    os.rename(old, dest)
                    logger.warning("%s: put back from an import that was interrupted", dest)
                    continue
            if time.time() - staging.lstat().st_mtime > STALE_STAGING_SECONDS:
                shutil.rmtree(staging, ignore_errors=True)
        except (InvalidArgumentError, OSError):
            continue  # not a bundle, or gone meanwhile: left as it is


def _same_manifest(a: Path, b: Path) -> bool:
    """Do two bundle directories hold the same manifest (the same bundle, imported again)?"""
    try:
        return read_regular(a / "manifest.json", MAX_MANIFEST_BYTES) == read_regular(
            b / "manifest.json", MAX_MANIFEST_BYTES
        )
    except OSError:
        return False


def install_triton_entries(bundle: PathLike, target: Optional[TargetProfile] = None) -> int:
    """Put the bundle's Triton cache entries for ``target`` (default: this machine's
    device) into Triton's cache, with Triton's own cache manager (``TRITON_CACHE_DIR``,
    ``TRITON_CACHE_MANAGER``): Triton then finds those kernels compiled, front end and
    native build alike. Entries made by another Triton build (they would never be found)
    are not installed, and said. Every entry is checked before any is written: its files'
    checksums, a binary that is SPIR-V or one of the bundle's checked native entries for
    that kernel and target, metadata for its own key and kernel. Returns how many."""
    with _as_directory(bundle) as d:
        checked = _checked_triton_entries(d, target)
    _put_triton_entries(bundle, checked)
    return len(checked)


def _put_triton_entries(
    bundle: PathLike, checked: List[Tuple[Dict[str, Any], Dict[str, bytes]]]
) -> None:
    for t, files in checked:
        try:
            triton_cache.put(t, files)
        except OSError as e:
            raise InvalidArgumentError(
                f"cannot put {t['hash'][:12]} into Triton's cache: {e}"
            ) from None
    if checked:
        logger.info("%s: %d Triton cache entries installed", bundle, len(checked))


def _checked_triton_entries(
    bundle: Path, target: Optional[TargetProfile]
) -> List[Tuple[Dict[str, Any], Dict[str, bytes]]]:
    """The bundle's Triton entries for ``target`` (default: this device), each checked,
    with their files; none when Triton is absent or another build of it made them."""
    from . import targets

    manifest = info(bundle)
    if target is None:
        try:
            target = targets.local()
        except BuildError as e:
            logger.info("%s: Triton entries not installed: %s", bundle, e)
            return []
    ids = [target.id, target.any_driver().id]
    mine = [t for t in manifest.get("triton_cache", []) if t["target"] in ids]
    here = triton_cache.key_digest() if mine else None
    if not mine or here is None:
        if mine:
            logger.info("%s: Triton is not installed here: its Triton entries are not", bundle)
        return []
    if manifest.get("triton_key") != here:
        logger.warning("%s: its Triton cache entries were made by another Triton build than "
                       "this one (%s): they would never be found; not installed", bundle,
                       _triton_version())  # fmt: skip
        return []
    by_hash: Dict[str, Tuple[Dict[str, Any], Dict[str, bytes]]] = {}
    for t, files in _core.bundle_triton_files(os.fspath(bundle), ids):
        files = dict(files)
        triton_cache.check_metadata(t, files)
        # One entry per Triton key: the one for this exact driver over one for any driver.
        if by_hash.get(t["hash"], ({"target": ""},))[0]["target"] != target.id:
            by_hash[t["hash"]] = (t, files)
    return list(by_hash.values())


def _replaceable(moved: Path, dest: Path) -> None:
    """Only an installed bundle is replaced: a directory holding a bundle's files only
    (``moved``: what was at ``dest``)."""
    is_dir = moved.is_dir() and not moved.is_symlink()
    names = {p.name for p in moved.iterdir()} if is_dir else None
    if (
        names is None
        or "manifest.json" not in names
        or names - {"manifest.json", "native", "triton", ".lock"}
    ):
        raise InvalidArgumentError(f"{dest} exists and is not an installed bundle: not replaced")


def _try_local_entries(bundle: Path) -> set:
    """Load the entries built for this machine's device (for its driver or for any) in
    workers now, all at once, so each is remembered as safe here and later loads skip the
    trial (and refuse nothing). Returns the checksums of the bytes that loaded."""
    from . import targets

    try:
        profile = targets.local()
    except BuildError as e:
        logger.info("%s: entries not tried here (%s)", bundle, e)
        return set()
    manifest = info(bundle)
    ids = (profile.id, profile.any_driver().id)
    mine = [e for e in manifest["entries"] if e["target"] in ids]
    binaries = [(bundle / e["file"]).read_bytes() for e in mine]
    requests = [
        {"binary": b, "kernel_name": e["kernel"], "is_spv": False, "build_flags": e["build_flags"]}
        for e, b in zip(mine, binaries)
    ]
    loaded = set()
    for entry, binary, result in zip(mine, binaries, xpu_zebin.compile_and_load_many(requests)):
        if isinstance(result, BuildError):
            logger.warning("%s: %s does not load here: %s", bundle, entry["kernel"], result)
        else:
            result.close()
            loaded.add(_core.bundle_checksum(binary))
    return loaded


def find(
    name: str, spirv: bytes, options: xpu_zebin.Options, device: int,
    arch: Optional[str] = None,
) -> Optional[Tuple[bytes, str]]:  # fmt: skip
    """The native binary and build flags a bundle holds for this kernel on the local
    device (built for its driver, or for any driver), or None: then the caller compiles.
    ``arch``: the device the caller builds for, when it may not be the local one (a
    ``make_zebin`` for another target finds nothing here). Says why at DEBUG
    (``TRITON_DEBUG=1``); a refused entry or bundle at WARNING."""
    dirs = search_path()
    if not dirs:
        return None
    from . import targets

    try:
        profile = targets.local(device)
    except BuildError as e:
        logger.debug("kernel %r: compiled, no bundle lookup (%s)", name, e)
        return None
    if arch and arch != profile.ocloc_device:
        logger.debug("kernel %r: compiled: built for %s, not this device", name, arch)
        return None
    others: List[str] = []
    for target in (profile, profile.any_driver()):
        key = _core.bundle_key(spirv, name, target.ocloc_device, options, target.id)
        status, what, native, skipped = _core.bundle_lookup(dirs, key, name, target.id)
        for why in skipped:
            _warn_once(f"bundle not used: {why}")
        if status == "native":
            logger.debug("kernel %r: from the bundle (%s, %r)", name, profile.name,
                         what["build_flags"])  # fmt: skip
            return native, what["build_flags"]
        if status == "refused":
            logger.warning("kernel %r: bundle entry refused (%s); compiling", name, what)
            return None
        others += [t for t in what if t not in others]
    others = [t for t in others if t not in (profile.id, profile.any_driver().id)]
    if others:
        logger.debug("kernel %r: compiled: the bundle has it for other targets only (%s)",
                     name, ", ".join(t[:12] for t in others))  # fmt: skip
    else:
        logger.debug("kernel %r: compiled: not in the bundle", name)
    return None
