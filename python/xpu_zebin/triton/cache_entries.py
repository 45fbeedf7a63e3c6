"""Triton's own cache, as bundles meet it: the files of a kernel Triton compiled (taken
through its cache manager), SPIR-V kernels of an existing cache directory, and a bundle's
Triton entries, checked, put back into a cache with Triton's cache manager
(``TRITON_CACHE_DIR``, or the manager ``TRITON_CACHE_MANAGER`` names), so that Triton finds
those kernels compiled: :func:`import_bundle` is the bundle's import and this.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from xpu_zebin import _core

from .. import targets
from .._files import read_regular
from ..bundle.format import PathLike, as_directory, triton_version
from ..bundle.importing import import_checked, try_local_entries
from ..errors import BuildError, InvalidArgumentError
from ..targets import TargetProfile

logger = logging.getLogger("xpu_zebin.bundle")

SPIRV_MAGIC = b"\x03\x02\x23\x07"
ELF_MAGIC = b"\x7fELF"
#: Triton's metadata files are small; a larger one is not Triton's.
MAX_METADATA_BYTES = 1 << 20
MAX_BINARY_BYTES = 256 << 20

#: A Triton cache entry for a bundle: its manifest record and its files.
TritonAddition = Tuple[Dict[str, Any], List[Tuple[str, bytes]]]


def key_digest() -> Optional[str]:
    """What Triton's cache keys start with (``triton_key()``: its version and the hash of
    its own sources and library), hashed: a Triton entry made by another Triton build is
    never found, so it is not installed. None without Triton."""
    try:
        from triton.compiler.compiler import triton_key
    except ImportError:
        return None
    return hashlib.sha256(triton_key().encode()).hexdigest()


def entry_files(compiled: Any, source_name: str) -> List[Tuple[str, bytes]]:
    """The files Triton's cache holds for a kernel it just compiled (``compiled``, from the
    source named ``source_name``): its metadata and its binary, what Triton keeps with
    ``TRITON_STORE_BINARY_ONLY`` (the IRs are not needed to load it). Read through Triton's
    cache manager, bounded, no link followed."""
    from triton.runtime.cache import get_cache_manager

    meta_name = f"{source_name[:150]}.json"
    group = get_cache_manager(compiled.hash).get_group(meta_name) or {}
    binary_name = f"{source_name[:150]}.spv"
    files = []
    for name, limit in ((meta_name, MAX_METADATA_BYTES), (binary_name, MAX_BINARY_BYTES)):
        if name not in group:
            raise InvalidArgumentError(f"Triton's cache has no {name} for {compiled.hash[:12]}")
        files.append((name, read_regular(Path(group[name]), limit, follow_links=False)))
    return files


def kernels_in(cache_dir: PathLike) -> List[Dict[str, Any]]:
    """The SPIR-V kernels in a Triton cache directory (one directory per compiled kernel
    holding ``<name>.json``, its metadata, and ``<name>.spv``), as
    :func:`xpu_zebin.bundle.precompile` takes them. Entries that are not Triton XPU SPIR-V
    (native ones, other backends, unreadable files) are skipped."""
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
                meta_path.with_name(f"{name}.spv"), MAX_BINARY_BYTES, follow_links=False
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


_BUILD_FLAG = re.compile(r"-(cl|ze)-[A-Za-z0-9][A-Za-z0-9_-]{0,80}")


def _whole(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _launch_metadata_problem(meta: Dict[str, Any]) -> Optional[str]:
    """What Triton's launcher and loader take from the metadata as they are (the grid's
    warps, the sub-group size, the shared memory, the flags the driver builds with), if
    one is not a value Triton writes: None when all are."""
    warps = meta.get("num_warps")
    if not _whole(warps, 1, 64) or warps & (warps - 1):
        return f"num_warps {warps!r} is not a power of two up to 64"
    lanes = meta.get("threads_per_warp")
    if not _whole(lanes, 8, 64) or lanes not in (8, 16, 32, 64):
        return f"threads_per_warp {lanes!r} is not 8, 16, 32 or 64"
    if not _whole(meta.get("shared"), 0, 1 << 30):
        return f"shared {meta.get('shared')!r} is not a byte count up to 1 GiB"
    flags = meta.get("build_flags")
    if not isinstance(flags, str) or len(flags) > 4096:
        return "build_flags is not text of at most 4096 characters"
    # The flags this host's compiler will build the entry's SPIR-V with: OpenCL and
    # Level Zero options only (the GRF modes, precision, large buffers), never IGC's
    # internal ones (-igc_opts can make the compiler write files anywhere).
    if not all(_BUILD_FLAG.fullmatch(word) for word in flags.split()):
        return f"build_flags {flags!r} holds an option that is not an OpenCL or Level Zero one"
    name = meta.get("name")
    if not isinstance(name, str) or not name.isidentifier():
        return f"name {name!r} is not a kernel name"
    return None


def check_metadata(entry: Dict[str, Any], files: Dict[str, bytes]) -> str:
    """The entry's metadata file name, once its metadata is Triton's for this entry: its
    hash (the cache key the files go under) and kernel are the entry's own."""
    meta_name = next(n for n in files if n.endswith(".json"))
    try:
        meta = json.loads(files[meta_name])
    except (ValueError, RecursionError) as e:
        raise InvalidArgumentError(f"Triton entry {entry['hash'][:12]}: metadata: {e}") from None
    if not isinstance(meta, dict) or meta.get("hash") != entry["hash"]:
        raise InvalidArgumentError(f"Triton entry {entry['hash'][:12]}: its metadata is "
                                   "for another cache key")  # fmt: skip
    if meta.get("name") != entry["kernel"]:
        raise InvalidArgumentError(f"Triton entry {entry['hash'][:12]}: its metadata is "
                                   f"for kernel {meta.get('name')!r}")  # fmt: skip
    why = _launch_metadata_problem(meta)
    if why:
        raise InvalidArgumentError(f"Triton entry {entry['hash'][:12]}: its metadata's {why}")
    # How Triton loads the binary follows its metadata (generate_native_code): it must say
    # what the binary is, and what the manifest says.
    binary = next(data for name, data in files.items() if not name.endswith(".json"))
    native = binary[:4] == ELF_MAGIC
    if bool(meta.get("generate_native_code")) != native or bool(entry.get("native")) != native:
        raise InvalidArgumentError(f"Triton entry {entry['hash'][:12]}: its metadata or manifest "
                                   "says another kind of binary than it holds")  # fmt: skip
    return meta_name


def put(entry: Dict[str, Any], files: Dict[str, bytes]) -> None:
    """Put one Triton entry into Triton's cache with its cache manager (files first, the
    group that makes it a hit last, as Triton writes its own)."""
    from triton.runtime.cache import get_cache_manager

    meta_name = check_metadata(entry, files)
    manager = get_cache_manager(entry["hash"])
    group = {name: manager.put(data, name) for name, data in files.items()}
    manager.put_group(meta_name, group)


def import_triton_entries(bundle: PathLike, target: Optional[TargetProfile] = None) -> int:
    """Put the bundle's Triton cache entries for ``target`` (default: this machine's
    device) into Triton's cache, with Triton's own cache manager (``TRITON_CACHE_DIR``,
    ``TRITON_CACHE_MANAGER``): Triton then finds those kernels compiled, front end and
    native build alike. Entries made by another Triton build (they would never be found)
    are not installed, and said. Every entry is checked before any is written: its files'
    checksums, a binary that is SPIR-V or one of the bundle's checked native entries for
    that kernel and target, metadata for its own key and kernel. Returns how many."""
    with as_directory(bundle) as d:
        chosen = checked_entries(d, target)
        if chosen is None:
            return 0
        # Triton loads a native entry with no trial of its own: as import_bundle, only the
        # exact bytes that loaded here in a worker go into its cache.
        loaded = (try_local_entries(d) if chosen.natives else set()) if target is None else None
        return put_entries(d, chosen, loaded)


@dataclasses.dataclass
class Chosen:
    """The Triton entries of a bundle to put into Triton's cache, every one checked: by
    Triton key, the entry chosen (this exact driver's over any driver's) as its target and
    its files' checksums, and the Triton build they were made by."""

    ids: List[str]
    triton_key: str
    by_hash: Dict[str, Tuple[str, Tuple[Tuple[str, str], ...]]]
    natives: bool


def _as_checked(t: Dict[str, Any]) -> Tuple[str, Tuple[Tuple[str, str], ...]]:
    """An entry as its check saw it: its target and its files' names and checksums."""
    return t["target"], tuple(sorted((f["name"], f["blake3"]) for f in t["files"]))


def put_entries(bundle: PathLike, chosen: Chosen, loaded: Optional[set] = None) -> int:
    """Put the ``chosen`` Triton entries of ``bundle`` into Triton's cache, read again one
    at a time: only an entry whose files are the ones checked (their checksums, which the
    engine holds the bytes to), made by the same Triton build; with ``loaded``, a native
    one only when its bytes are among those that loaded here. Returns how many."""
    entries = _core.bundle_triton_entries(os.fspath(bundle), chosen.ids)
    if entries.triton_key != chosen.triton_key:
        logger.warning("%s: its Triton entries changed since they were checked: not imported",
                       bundle)  # fmt: skip
        return 0
    put_count, unloaded, changed = 0, 0, 0
    for t, files in entries:
        if t["hash"] not in chosen.by_hash:
            continue
        if chosen.by_hash[t["hash"]] != _as_checked(t):
            changed += chosen.by_hash[t["hash"]][0] == t["target"]  # not the other target's
            continue
        named = dict(files)
        if loaded is not None and t["native"] and not holds(named, loaded):
            unloaded += 1
            continue
        try:
            put(t, named)
        except OSError as e:
            raise InvalidArgumentError(
                f"cannot put {t['hash'][:12]} into Triton's cache: {e}"
            ) from None
        put_count += 1
    if unloaded:
        logger.warning("%s: %d native Triton entries do not load here: not imported", bundle,
                       unloaded)  # fmt: skip
    if changed:
        logger.warning("%s: %d Triton entries changed since they were checked: not imported",
                       bundle, changed)  # fmt: skip
    if put_count:
        logger.info("%s: %d Triton cache entries imported", bundle, put_count)
    return put_count


def checked_entries(bundle: Path, target: Optional[TargetProfile]) -> Optional[Chosen]:
    """Check every Triton entry of ``bundle`` for ``target`` (default: this device), one
    at a time (their files are not kept: a bundle may hold a hundred thousand), and choose
    which to put; None when there is none, Triton is absent or another build made them."""
    if target is None:
        try:
            target = targets.local()
        except BuildError as e:
            logger.info("%s: Triton entries not imported: %s", bundle, e)
            return None
    ids = [target.id, target.any_driver().id]
    entries = _core.bundle_triton_entries(os.fspath(bundle), ids)
    here = key_digest() if len(entries) else None
    if not len(entries) or here is None:
        if len(entries):
            logger.info("%s: Triton is not installed here: its Triton entries are not", bundle)
        return None
    if entries.triton_key != here:
        logger.warning("%s: its Triton cache entries were made by another Triton build than "
                       "this one (%s): they would never be found; not imported", bundle,
                       triton_version())  # fmt: skip
        return None
    chosen = Chosen(ids, here, {}, False)
    for t, files in entries:
        check_metadata(t, dict(files))
        # One entry per Triton key: the one for this exact driver over one for any driver.
        if chosen.by_hash.get(t["hash"], ("",))[0] != target.id:
            chosen.by_hash[t["hash"]] = _as_checked(t)
        chosen.natives = chosen.natives or bool(t["native"])
    return chosen


def holds(files: Dict[str, bytes], binaries: set) -> bool:
    """Is a Triton entry's binary one of ``binaries`` (checksums of bytes that loaded)?"""
    return any(
        _core.bundle_checksum(data) in binaries
        for name, data in files.items()
        if not name.endswith(".json")
    )


def import_bundle(
    bundle: PathLike,
    into: Optional[PathLike] = None,
    *,
    target: Optional[TargetProfile] = None,
    triton: bool = True,
    replace: bool = False,
) -> Path:
    """:func:`xpu_zebin.bundle.import_bundle` (check a bundle, a directory or an archive,
    and copy it entry by checked entry into ``into``, where the drop-ins find it; its
    entries for this device tried once), and with ``triton`` its Triton cache entries for
    this device (or for ``target``: an image built on a machine without it) into Triton's
    cache through Triton's cache manager, every one checked before anything is written.
    Triton loads a native entry with no trial of its own: only the exact bytes that
    loaded here in a worker go into its cache. Returns where the bundle is."""
    chosen: List[Optional[Chosen]] = []
    dest, loaded = import_checked(
        bundle, into, replace=replace, try_here=target is None,
        before=(lambda src: chosen.append(checked_entries(src, target))) if triton else None,
    )  # fmt: skip
    if chosen and chosen[0] is not None:
        # Read again from the installed copy (every entry was checked in the source).
        put_entries(dest, chosen[0], loaded if target is None else None)
    return dest
