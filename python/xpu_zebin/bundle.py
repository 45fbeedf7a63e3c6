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

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import xpu_zebin
from xpu_zebin import _core

from ._files import read_regular
from .errors import BuildError, InvalidArgumentError
from .targets import TargetProfile

__all__ = [
    "BUNDLE_ENV", "find", "info", "install", "precompile", "precompile_triton", "search_path",
    "triton_cache_kernels", "verify",
]  # fmt: skip

logger = logging.getLogger("xpu_zebin.bundle")

#: Bundle directories the drop-ins look in, ``os.pathsep``-separated (imported bundles too).
BUNDLE_ENV = "XPU_ZEBIN_BUNDLE"

PathLike = Union[str, "os.PathLike[str]"]


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
) -> Dict[str, Any]:
    """Build every kernel for every target into the bundle at ``out``; returns its manifest.

    ``kernels`` are dicts: ``spirv`` (bytes), ``name`` (the kernel), optional
    ``build_flags`` and ``config`` (text naming the autotune config). Builds run with the
    GRF ladder and upstream's ``load_binary`` rule, at most ``jobs`` at once (or as tasks
    on the Dask ``client``). A kernel that cannot be built for a target is listed in the
    manifest's ``failures`` (a PTSS overflow as ``scratch_overflow``), never stored."""
    if not targets:
        raise InvalidArgumentError("precompile needs at least one target profile")
    _check_kernels(kernels)
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
        if isinstance(r, BuildError):
            failures.append({**where, "kind": r.kind, "message": r.message})
            continue
        key = _core.bundle_key(k["spirv"], k["name"], target.ocloc_device, opts, target.id)
        entry = {
            **where, "key": key, "build_flags": r.build_flags, "spill_bytes": r.spill_size,
            "n_spills": r.n_spills, "compiler": compiler, "file": "", "blake3": "", "size": 0,
        }  # fmt: skip
        built.append((entry, r.binary))
    manifest = _core.bundle_write(os.fspath(out), _header(targets), built, failures)
    for f in failures:
        logger.warning("%s (%s) not built for %s: %s", f["kernel"], f["config"], f["target"][:12],
                       f["message"])  # fmt: skip
    return manifest


SPIRV_MAGIC = b"\x03\x02\x23\x07"
#: Triton's metadata files are small; a larger one is not Triton's.
MAX_METADATA_BYTES = 1 << 20
MAX_SPIRV_BYTES = 256 << 20


def triton_cache_kernels(cache_dir: PathLike) -> List[Dict[str, Any]]:
    """The SPIR-V kernels in a Triton cache directory (``TRITON_CACHE_DIR``: one directory
    per compiled kernel holding ``<name>.json``, its metadata, and ``<name>.spv``), as
    :func:`precompile` takes them: yesterday's JIT cache, today's bundle. Entries that are
    not Triton XPU SPIR-V (native ones, other backends, unreadable files) are skipped."""
    kernels, seen = [], set()
    root = Path(os.fspath(cache_dir))
    if not root.is_dir():
        raise InvalidArgumentError(f"{cache_dir} is not a directory")
    for meta_path in sorted(root.glob("*/*.json")):
        if meta_path.name.startswith("__grp__"):
            continue
        try:
            meta = json.loads(read_regular(meta_path, MAX_METADATA_BYTES, follow_links=False))
            name = meta.get("name") if isinstance(meta, dict) else None
            if not isinstance(name, str) or not name or "/" in name:
                continue
            spirv = read_regular(
                meta_path.with_name(f"{name}.spv"), MAX_SPIRV_BYTES, follow_links=False
            )
        except (OSError, ValueError, RecursionError):
            continue
        if spirv[:4] != SPIRV_MAGIC:
            continue
        flags = meta.get("build_flags") if isinstance(meta.get("build_flags"), str) else ""
        slot = (name, spirv, flags)
        if slot not in seen:
            seen.add(slot)
            config = f"{meta_path.parent.name[:12]} num_warps={meta.get('num_warps')}"
            kernels.append({"spirv": spirv, "name": name, "build_flags": flags, "config": config})
    return kernels


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
    **kwargs: Any,
) -> Dict[str, Any]:
    """:func:`precompile` for a Triton kernel: each autotune config (``configs``, else the
    ``@triton.autotune`` kernel's own) through Triton's front end for each target (it runs
    on the CPU), then the native builds. ``kwargs`` are :func:`precompile`'s."""
    import triton
    from triton.compiler import ASTSource

    from .triton import _jit_function, _split_config, _warm_triton

    jit = _jit_function(fn)
    configs = list(configs if configs is not None else getattr(fn, "configs", None) or [])
    if not configs:
        raise InvalidArgumentError("pass configs, or an @triton.autotune kernel that has them")
    _warm_triton()
    names = list(jit.arg_names)
    kernels_by_target: Dict[str, List[Dict[str, Any]]] = {}
    failures = []
    for target in targets:
        for config in configs:
            constants, options = _split_config(config)
            constants = {**(constexprs or {}), **constants}
            sig = {n: "constexpr" if n in constants else signature[n] for n in names}
            src = ASTSource(jit, sig, {(names.index(k),): v for k, v in constants.items()})
            try:
                compiled = triton.compile(src, target=target.gpu_target(), options=options)
            except Exception as e:  # a config Triton cannot lower stays in its slot
                failures.append((config, target, e))
                continue
            spirv = compiled.asm.get("spv", b"")
            if spirv[:4] == b"\x7fELF":
                raise InvalidArgumentError(
                    "Triton produced native code here (TRITON_XPU_GEN_NATIVE_CODE is set): "
                    "precompile needs its SPIR-V"
                )
            kernels_by_target.setdefault(target.id, []).append({
                "spirv": spirv, "name": compiled.metadata.name,
                "build_flags": compiled.metadata.build_flags or "", "config": str(config),
            })  # fmt: skip
    for target in targets:
        kernels = kernels_by_target.get(target.id, [])
        if kernels:
            precompile(kernels, [target], out, **kwargs)
    unlowered = [
        {"kernel": jit.__name__, "config": str(config), "target": target.id, "kind": "front_end",
         "message": f"{type(e).__name__}: {e}"}
        for config, target, e in failures
    ]  # fmt: skip
    for f in unlowered:
        logger.warning("config %s not lowered for %s: %s", f["config"], f["target"][:12],
                       f["message"])  # fmt: skip
    return _core.bundle_write(os.fspath(out), _header(targets), [], unlowered)


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


def verify(bundle: PathLike) -> Dict[str, Any]:
    """Every entry checked: ``{"ok": [keys], "bad": [(key, why)]}``."""
    return _core.bundle_verify(os.fspath(bundle))


def info(bundle: PathLike) -> Dict[str, Any]:
    """The bundle's manifest (checked)."""
    return _core.bundle_read(os.fspath(bundle))


def install(bundle: PathLike, into: Optional[PathLike] = None) -> Path:
    """Check a bundle and copy it, entry by checked entry, into ``into`` (a directory of
    bundles; default ``bundles`` in the cache directory), as ``<into>/<bundle's name>``,
    where the drop-ins find it. An existing bundle of that name is replaced in one rename;
    anything else there is refused, never deleted. Entries for this device are then tried
    once, so later loads skip the trial. Returns where it is."""
    report = verify(bundle)
    if report["bad"]:
        key, why = report["bad"][0]
        raise InvalidArgumentError(f"{bundle}: entry {key[:12]} is bad ({why}); not installed")
    src = Path(os.fspath(bundle)).resolve()
    parent = Path(os.fspath(into)) if into is not None else Path(_core.bundles_dir())
    dest = parent / src.name
    try:
        parent.mkdir(parents=True, exist_ok=True)
        if dest.exists() or dest.is_symlink():
            _replaceable(dest)
        staging = Path(tempfile.mkdtemp(prefix=f".{src.name}.", dir=parent))
        try:
            _core.bundle_copy(os.fspath(src), os.fspath(staging / "bundle"))
            if dest.exists():
                os.replace(dest, staging / "old")
            os.replace(staging / "bundle", dest)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    except OSError as e:
        raise InvalidArgumentError(f"cannot install {bundle} into {parent}: {e}") from None
    _try_local_entries(dest)
    return dest


def _replaceable(dest: Path) -> None:
    """Only an installed bundle is replaced: a directory holding a bundle's files only."""
    names = {p.name for p in dest.iterdir()} if dest.is_dir() and not dest.is_symlink() else None
    if (
        names is None
        or "manifest.json" not in names
        or names - {"manifest.json", "native", ".lock"}
    ):
        raise InvalidArgumentError(f"{dest} exists and is not an installed bundle: not replaced")


def _try_local_entries(bundle: Path) -> None:
    """Load the entries built for this machine's device in workers now, all at once, so
    each is remembered as safe here and later loads skip the trial (and refuse nothing)."""
    from . import targets

    try:
        profile = targets.local()
    except BuildError as e:
        logger.info("%s: entries not tried here (%s)", bundle, e)
        return
    manifest = info(bundle)
    mine = [e for e in manifest["entries"] if e["target"] == profile.id]
    requests = [
        {"binary": (bundle / e["file"]).read_bytes(), "kernel_name": e["kernel"], "is_spv": False,
         "build_flags": e["build_flags"]}
        for e in mine
    ]  # fmt: skip
    for entry, result in zip(mine, xpu_zebin.compile_and_load_many(requests)):
        if isinstance(result, BuildError):
            logger.warning("%s: %s does not load here: %s", bundle, entry["kernel"], result)
        else:
            result.close()


def find(
    name: str, spirv: bytes, options: xpu_zebin.Options, device: int
) -> Optional[Tuple[bytes, str]]:
    """The native binary and build flags a bundle holds for this kernel on the local
    device (built for its driver, or for any driver), or None: then the caller compiles.
    Says why at DEBUG (``TRITON_DEBUG=1``); a refused entry or bundle at WARNING."""
    dirs = search_path()
    if not dirs:
        return None
    from . import targets

    try:
        profile = targets.local(device)
    except BuildError as e:
        logger.debug("kernel %r: compiled, no bundle lookup (%s)", name, e)
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
