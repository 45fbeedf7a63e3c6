"""Finding a kernel's native build in the bundles this process uses (``$XPU_ZEBIN_BUNDLE``,
then every imported one) for the local device; the engine checks each entry
(``src/bundle/lookup.rs``)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import List, Optional, Tuple

import xpu_zebin
from xpu_zebin import _core

from .. import targets
from ..errors import BuildError
from .format import triton_version

logger = logging.getLogger("xpu_zebin.bundle")

#: Bundle directories the drop-ins look in, ``os.pathsep``-separated (imported bundles too).
BUNDLE_ENV = "XPU_ZEBIN_BUNDLE"

_warned: set = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning("%s", message)


def _say_not_used(why: str) -> None:
    """Why a bundle is not used, as the engine's manifest index says it, once: no bundle
    there at all (where the name came from), another Triton's (it says so itself), or
    what is wrong with it. The one wording for the search path and for lookups."""
    if why.endswith("; skipped"):
        _warn_once(f"{BUNDLE_ENV}: {why}")
    else:
        _warn_once(why if why.endswith(": not used") else f"bundle not used: {why}")


def search_path() -> List[str]:
    """The bundles the drop-ins use: ``$XPU_ZEBIN_BUNDLE``, then every imported one. A
    directory that holds no usable bundle is said once, at WARNING, and skipped."""
    return _search_path(triton_version())


def _search_path(triton: Optional[str]) -> List[str]:
    """:func:`search_path` for the Triton release ``triton``: the engine's manifest index
    answers whether each bundle can be used here (a manifest read once per change, the
    same index its lookups use)."""
    dirs = [d for d in os.environ.get(BUNDLE_ENV, "").split(os.pathsep) if d.strip()]
    try:
        imported = Path(_core.bundles_dir())
        if imported.is_dir():
            dirs += sorted(str(p) for p in imported.iterdir() if not p.name.startswith("."))
    except (BuildError, OSError):
        pass
    usable = []
    for d in dirs:
        why = _core.bundle_usable(d, triton)
        if why is None:
            usable.append(d)
        else:
            _say_not_used(why)
    return usable


def find(
    name: str, spirv: bytes, options: xpu_zebin.Options, device: int,
    arch: Optional[str] = None,
) -> Optional[Tuple[bytes, str]]:  # fmt: skip
    """The native binary and build flags a bundle holds for this kernel on the local
    device (built for its driver, or for any driver), or None: then the caller compiles.
    ``arch``: the device the caller builds for, when it may not be the local one (a
    ``make_zebin`` for another target finds nothing here). Says why at DEBUG
    (``TRITON_DEBUG=1``); a refused entry or bundle at WARNING."""
    triton = triton_version()  # looked up once a call: a Triton may be installed later
    dirs = _search_path(triton)
    if not dirs:
        return None

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
        status, what, native, skipped = _core.bundle_lookup(dirs, key, name, target.id, triton)
        for why in skipped:
            _say_not_used(why)
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
