"""Finding a kernel's native build in the bundles this process uses (``$XPU_ZEBIN_BUNDLE``,
then every imported one) for the local device: the engine searches and checks each entry
(``src/bundle/search.rs``, ``lookup.rs``); this module says which target profiles (what
Triton reports) and logs the outcome. ``compile_and_load`` asks the same search itself, as
its first level, when given :func:`query`'s answer."""

from __future__ import annotations

import logging
from typing import List, Optional, Tuple

import xpu_zebin
from xpu_zebin import _core

from .. import targets
from ..errors import BuildError
from .format import triton_version

logger = logging.getLogger("xpu_zebin.bundle")

#: Bundle directories the drop-ins look in, ``os.pathsep``-separated (imported bundles too).
BUNDLE_ENV = "XPU_ZEBIN_BUNDLE"

#: What the engine asks bundles: Triton's release, the device's target profiles, most
#: specific first, as ``(ocloc device, id)``, and the bundles to look in.
Query = Tuple[Optional[str], List[Tuple[str, str]], List[str]]


def search_path() -> List[str]:
    """The bundles the drop-ins use: ``$XPU_ZEBIN_BUNDLE``, then every imported one. A
    directory that holds no usable bundle is said once, at WARNING, and skipped."""
    return [str(d) for d in _core.bundle_search_path(triton_version())]


def query(name: str, device: int, arch: Optional[str] = None) -> Optional[Query]:
    """What to ask the bundles for kernel ``name`` on Level Zero device ``device`` (its
    target profile, and the same for any driver), or None when no bundle could answer: none
    in use, no profile for the device, or ``arch`` (the device the caller builds for) is not
    the local one."""
    triton = triton_version()  # looked up once a call: a Triton may be installed later
    dirs = [str(d) for d in _core.bundle_search_path(triton)]
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
    profiles = (profile, profile.any_driver())
    return triton, [(p.ocloc_device, p.id) for p in profiles], dirs


def find(
    name: str, spirv: bytes, options: xpu_zebin.Options, device: int,
    arch: Optional[str] = None,
) -> Optional[Tuple[bytes, str]]:  # fmt: skip
    """The native binary and build flags a bundle holds for this kernel on the local
    device (built for its driver, or for any driver), or None: then the caller compiles.
    ``arch``: the device the caller builds for, when it may not be the local one (a
    ``make_zebin`` for another target finds nothing here). Says why at DEBUG
    (``TRITON_DEBUG=1``); a refused entry or bundle at WARNING."""
    asked = query(name, device, arch)
    if asked is None:
        return None
    native, what, refused = _core.bundle_find(spirv, name, options, asked)
    if native is not None:
        logger.debug("kernel %r: from the bundle (%s, %r)", name, asked[1][0][0], what)
        return native, what
    if refused:
        logger.warning("kernel %r: bundle entry refused (%s); compiling", name, what)
    else:
        logger.debug("kernel %r: compiled: %s", name, what)
    return None
