"""Ahead-of-time bundles: native code for every target of a fleet, built without its GPUs,
so that no kernel load runs IGC.

:func:`precompile` builds SPIR-V kernels for target profiles (:mod:`xpu_zebin.targets`)
with the GRF ladder, concurrently, into a bundle directory; :func:`verify`, :func:`info`,
:func:`pack` and :func:`import_bundle` check, show, ship and import one. With a bundle in
place (``XPU_ZEBIN_BUNDLE``, or imported), the Triton drop-ins :func:`find` each kernel's
native binary for the local device and hand it to the driver: nothing runs IGC. Entries
are untrusted input: checked against their checksums and trial-loaded in a worker before
the caller's driver sees them.

Nothing here knows Triton: its kernels, its cache entries and the import that puts them
into Triton's cache are :mod:`xpu_zebin.triton`'s (``precompile_kernel``,
``import_bundle``). The module that owns each step:

- ``format``: the bundle on disk (directory or archive), reading, checking, packing;
- ``build``: :func:`precompile`, checked against a target's driver where this host has it;
- ``lookup``: :func:`find`, :func:`search_path` and :func:`query` (what the engine's own
  bundle level asks for, in ``compile_and_load``);
- ``importing``: :func:`import_bundle`.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from .build import precompile
from .format import MAX_MANIFEST_BYTES, PathLike, info, pack, verify
from .importing import STALE_STAGING_SECONDS, import_bundle
from .lookup import BUNDLE_ENV, find, query, search_path

__all__ = [
    "BUNDLE_ENV", "find", "import_bundle", "info", "pack", "precompile", "query",
    "search_path", "verify",
]  # fmt: skip

#: Names this module had before Triton's part moved to :mod:`xpu_zebin.triton` (and
#: ``install`` became ``import``, as the command line says): kept for one release, each
#: with a ``DeprecationWarning`` naming the new one.
_MOVED = {
    "install": ("xpu_zebin.triton", "import_bundle"),
    "install_triton_entries": ("xpu_zebin.triton", "import_triton_entries"),
    "triton_cache_kernels": ("xpu_zebin.triton", "kernels_in_cache"),
    "precompile_triton": ("xpu_zebin.triton", "precompile_kernel"),
    "check_triton_kernel": ("xpu_zebin.triton", "check_kernel"),
    "triton_cache": ("xpu_zebin.triton.cache_entries", None),
}


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, new = _MOVED[name]
    warnings.warn(
        f"xpu_zebin.bundle.{name} is deprecated: use {module}{'.' + new if new else ''}",
        DeprecationWarning,
        stacklevel=2,
    )
    found = importlib.import_module(module)
    return getattr(found, new) if new else found
