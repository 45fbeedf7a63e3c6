"""Importing a bundle: checked, copied entry by checked entry into a directory of bundles
(one rename puts it in place; what was there is replaced only when it is an imported
bundle), then its entries for this device tried once in workers."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional, Set, Tuple

import xpu_zebin
from xpu_zebin import _core

from .. import targets
from .._files import same_regular_files
from ..errors import BuildError, InvalidArgumentError
from .format import MAX_MANIFEST_BYTES, PathLike, as_directory

logger = logging.getLogger("xpu_zebin.bundle")


def import_checked(
    bundle: PathLike,
    into: Optional[PathLike] = None,
    *,
    replace: bool = False,
    try_here: bool = True,
    before: Optional[Callable[[Path], Any]] = None,
) -> Tuple[Path, Set[str]]:
    """:func:`import_bundle`, for callers that add to it: ``before(checked source)`` runs
    before anything is written; returns where the bundle is and the checksums of the
    entries that loaded here (``try_here``)."""
    with as_directory(bundle) as src:
        report = _core.bundle_verify(os.fspath(src), True)
        if report["bad"]:
            key, why = report["bad"][0]
            raise InvalidArgumentError(f"{bundle}: entry {key[:20]} is bad ({why}); not imported")
        if before is not None:
            before(src)
        parent = Path(os.fspath(into)) if into is not None else Path(_core.bundles_dir())
        dest = parent / _bundle_name(Path(os.fspath(bundle)))
        _copy_into(src.resolve(), parent, dest, bundle, replace)
    return dest, (try_local_entries(dest) if try_here else set())


def import_bundle(
    bundle: PathLike, into: Optional[PathLike] = None, *, replace: bool = False
) -> Path:
    """Check a bundle (a directory or an archive) and copy it, entry by checked entry,
    into ``into`` (a directory of bundles; default ``bundles`` in the cache directory), as
    ``<into>/<bundle's name>``, where the drop-ins find it. An existing bundle of that name
    is replaced in one rename when it is this bundle again (the same manifest), or with
    ``replace`` (another bundle of the same name); anything else there is refused, never
    deleted. Entries for this device are then tried once, so later loads skip the trial.
    Returns where the bundle is. (Its Triton cache entries too:
    :func:`xpu_zebin.triton.import_bundle`.)"""
    return import_checked(bundle, into, replace=replace)[0]


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
        raise InvalidArgumentError(f"cannot import {bundle} into {parent}: {e}") from None
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
        raise InvalidArgumentError(f"cannot import {bundle} into {parent}: {e}") from None
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
    """Do two bundle directories hold the same manifest (the same bundle, imported again)?
    Compared a block at a time: a large bundle's manifest is never held whole."""
    try:
        return same_regular_files(a / "manifest.json", b / "manifest.json", MAX_MANIFEST_BYTES)
    except OSError:
        return False


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


#: Entries tried at once: the binaries read and the modules loaded are this many at most,
#: whatever the bundle's size.
TRY_AT_ONCE = 64


def try_local_entries(bundle: Path) -> set:
    """Load the entries built for this machine's device (for its driver or for any) in
    workers now, :data:`TRY_AT_ONCE` at a time, so each is remembered as safe here and
    later loads skip the trial (and refuse nothing). Returns the checksums of the bytes
    that loaded."""

    try:
        profile = targets.local()
    except BuildError as e:
        logger.info("%s: entries not tried here (%s)", bundle, e)
        return set()
    ids = (profile.id, profile.any_driver().id)
    mine = _core.bundle_entries_for(os.fspath(bundle), list(ids))
    loaded: set = set()
    for start in range(0, len(mine), TRY_AT_ONCE):
        _try_entries(bundle, mine[start : start + TRY_AT_ONCE], loaded)
    return loaded


def _try_entries(bundle: Path, entries: list, loaded: set) -> None:
    """Try ``entries`` (key, kernel, build flags) here in workers; the checksums of those
    that loaded go to ``loaded``."""
    tried, binaries = [], []
    for key, kernel, flags in entries:
        try:  # the installed copy's own files, read and checked as a lookup reads them
            binaries.append(_core.bundle_native(os.fspath(bundle), key))
            tried.append((kernel, flags))
        except BuildError as why:
            logger.warning("%s: %s not tried here: %s", bundle, kernel, why)
    requests = [
        {"binary": b, "kernel_name": kernel, "is_spv": False, "build_flags": flags}
        for (kernel, flags), b in zip(tried, binaries)
    ]
    for (kernel, _), binary, result in zip(
        tried, binaries, xpu_zebin.compile_and_load_many(requests)
    ):
        if isinstance(result, BuildError):
            logger.warning("%s: %s does not load here: %s", bundle, kernel, result)
        else:
            result.close()
            loaded.add(_core.bundle_checksum(binary))
