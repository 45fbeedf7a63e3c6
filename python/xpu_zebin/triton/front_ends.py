"""One Triton front end per kernel, however many processes ask.

The ranks of a job share Triton's cache directory (``TRITON_CACHE_DIR``; by default every
process of a user shares ``~/.triton/cache``), yet on a cold cache each runs Triton's front
end (its IRs, SPIR-V, metadata) for every kernel and config, and they race on the renames
of the same files (triton-lang/triton #4295). With the drop-in active, Triton's compile
asks for a kernel's cache group through :class:`OneFrontEnd`, around the cache manager
Triton would use (its file cache, or the one ``TRITON_CACHE_MANAGER`` names): on a miss it
takes the group's claim (in xpu-zebin's cache directory, as a native build does:
``_core.claim_triton_group``) and runs the front end; a process that misses the same group
meanwhile waits for it and takes the group from Triton's cache, counted in ``xpu-zebin
stats`` as ``waits_triton_front_end``.

Never worse than Triton alone: a holder killed lets go at once, one stopped is seen after
ten seconds, no wait lasts more than five minutes, and a claim that cannot be taken runs
the front end as Triton does. A front end that fails lets go when its compile's cache
manager goes, at this thread's next compile, or (the autotuner's) at once. Off with
``XPU_ZEBIN_SHARE_BUILDS=0``, and for ``TRITON_ALWAYS_COMPILE=1`` (which compiles anyway).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable, Dict, Optional

from .. import _core

logger = logging.getLogger("xpu_zebin.triton")

#: Triton's knob to compile whatever its cache holds: nothing to wait for then.
ALWAYS_COMPILE_ENV = "TRITON_ALWAYS_COMPILE"

#: The claim this thread holds for a front end under way.
_held = threading.local()
#: (module, Triton's own get_cache_manager) for every module patched.
_installed: list = []


def let_go() -> None:
    """Let go of the claim this thread holds, if any: its front end ended without its group
    (a compile that failed); waiters look in Triton's cache again and run their own."""
    claim = getattr(_held, "claim", None)
    _held.claim = None
    if claim is not None:
        claim.release()


class OneFrontEnd:
    """Triton's cache manager for one kernel (``inner``, under Triton's key ``key``) whose
    group lookups are claimed: one front end per group across processes."""

    def __init__(self, inner: Any, key: str) -> None:
        self._inner = inner
        self._key = key
        self._claim: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _found(self, filename: str) -> Optional[Dict[str, str]]:
        group = self._inner.get_group(filename)
        return group if group is not None and filename in group else None

    def get_group(self, filename: str) -> Optional[Dict[str, str]]:
        group = self._inner.get_group(filename)
        if group is not None and filename in group:
            return group
        if os.environ.get(ALWAYS_COMPILE_ENV, "0") == "1":
            return group
        claim, how = _core.claim_triton_group(
            self._key, filename, lambda: self._found(filename) is not None
        )
        logger.debug("Triton's front end of %s (%s): %s", filename, self._key[:12], how)
        if claim is None:
            found = self._found(filename)
            return found if found is not None else group
        let_go()
        self._claim = _held.claim = claim
        return group

    def put_group(self, filename: str, group: Dict[str, str]) -> Any:
        try:
            return self._inner.put_group(filename, group)
        finally:
            self._let_go()

    def _let_go(self) -> None:
        claim, self._claim = self._claim, None
        if claim is not None:
            if getattr(_held, "claim", None) is claim:
                _held.claim = None
            claim.release()

    def __del__(self) -> None:
        self._let_go()


def sharing(original: Callable[[str], Any]) -> Callable[[str], Any]:
    """Triton's ``get_cache_manager``, its managers wrapped in :class:`OneFrontEnd`."""

    def get_cache_manager(key: str) -> Any:
        let_go()  # this thread's last front end ended (a compile runs one at a time)
        return OneFrontEnd(original(key), key)

    get_cache_manager.__xpu_zebin__ = True  # type: ignore[attr-defined]
    get_cache_manager.__wrapped__ = original  # type: ignore[attr-defined]
    return get_cache_manager


def install(compiler_module: Any = None) -> None:
    """Share front ends for every compile of Triton's ``triton.compiler.compiler`` module
    (``compiler_module``; by default the one imported). Idempotent."""
    if compiler_module is None:
        import triton.compiler.compiler as compiler_module
    original = getattr(compiler_module, "get_cache_manager", None)
    if original is None or getattr(original, "__xpu_zebin__", False):
        return
    compiler_module.get_cache_manager = sharing(original)
    _installed.append((compiler_module, original))


def uninstall() -> None:
    """Triton's own ``get_cache_manager`` back where :func:`install` wrapped it."""
    while _installed:
        module, original = _installed.pop()
        module.get_cache_manager = original
