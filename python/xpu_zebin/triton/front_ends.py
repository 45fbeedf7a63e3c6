"""One Triton front end per kernel, however many processes ask.

The ranks of a job share Triton's cache directory (``TRITON_CACHE_DIR``; by default every
process of a user shares ``~/.triton/cache``), yet on a cold cache each runs Triton's front
end (its IRs, SPIR-V, metadata) for every kernel and config, and they race on the renames
of the same files (triton-lang/triton #4295). With the drop-in active, Triton's compile
asks for a kernel's cache group through :class:`OneFrontEnd`, around the cache manager
Triton would use (its file cache, or the one ``TRITON_CACHE_MANAGER`` names): on a miss it
takes the group's claim (in xpu-zebin's cache directory, as a native build does, keyed by
Triton's key, the group and Triton's cache directory: ``_core.claim_triton_group``) and
runs the front end; a process that misses the same group in the same directory meanwhile
waits for it and takes the group from Triton's cache, counted in ``xpu-zebin stats`` as
``waits_triton_front_end`` (the front end's time it saved:
``wait_saved_triton_front_end_microseconds``).

Never worse than Triton alone: a holder killed lets go at once, one stopped is seen after
ten seconds, no wait lasts more than five minutes, Ctrl-C and ``cancel_running`` end a
wait, and a claim that cannot be taken runs the front end as Triton does. A compile lets
go when it ends, whether it put its group or failed. Off with ``XPU_ZEBIN_SHARE_BUILDS=0``,
and never waited for where Triton compiles whatever its cache holds or writes what another
process's compile would not (``TRITON_ALWAYS_COMPILE``, ``TRITON_KERNEL_OVERRIDE``,
``TRITON_KERNEL_DUMP``, as the environment or Triton's knobs set them).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional

from .. import _core

logger = logging.getLogger("xpu_zebin.triton")

#: Triton's settings under which a compile is its own (environment, then knob): compiled
#: whatever the cache holds, overridden or dumped (neither is in Triton's cache key).
OWN_COMPILE = (
    ("TRITON_ALWAYS_COMPILE", "always_compile"),
    ("TRITON_KERNEL_OVERRIDE", "override"),
    ("TRITON_KERNEL_DUMP", "dump_ir"),
)

#: The claim this thread holds for a front end under way.
_held = threading.local()
#: (module, name, Triton's own function) for every function wrapped.
_installed: list = []


class SteppedAside(Exception):
    """Raised out of Triton's compile when another process runs this front end and the
    caller (:func:`stepping_aside`) has other front ends to run first: nothing was done;
    the caller compiles it again later (then waiting for it)."""


@contextlib.contextmanager
def stepping_aside() -> Iterator[None]:
    """This thread's compiles step aside (:class:`SteppedAside`) from a front end another
    process runs: a batch takes the kernels nobody is running first."""
    before = getattr(_held, "step_aside", False)
    _held.step_aside = True
    try:
        yield
    finally:
        _held.step_aside = before


#: A task's result in the first round of :func:`unclaimed_first` when its item stepped
#: aside: the runner's callback for finished items skips it (it comes back later).
LATER: Any = object()

#: Runs a task over items, results in order (the autotuner's thread pool).
Runner = Callable[[Callable[[Any], Any], List[Any]], List[Any]]


def unclaimed_first(task: Callable[[Any], Any], items: List[Any], run: Runner) -> List[Any]:
    """``run(task, items)`` (results in order) in two rounds: each item's task first steps
    aside from a front end another process runs (:data:`LATER` for it then), and those
    items come back once the others are done, in order, waiting. N ranks given the same
    configs thus split their front ends between them, as a batch splits its builds."""

    def first(item: Any) -> Any:
        try:
            with stepping_aside():
                return task(item)
        except SteppedAside:
            return LATER

    results = run(first, items)
    later = [i for i, r in enumerate(results) if r is LATER]
    for i, again in zip(later, run(task, [items[i] for i in later]) if later else []):
        results[i] = again
    return results


def let_go() -> None:
    """Let go of the claim this thread holds, if any: its front end ended (a compile that
    failed, or put its group); waiters look in Triton's cache again and run their own."""
    claim = getattr(_held, "claim", None)
    _held.claim = None
    if claim is not None:
        claim.release()


@functools.lru_cache(maxsize=1)
def _compilation_knobs() -> Any:
    """Triton's compilation knobs (3.4 on: settable in code), or None (looked up once: a
    failed import is not cached by Python, and every cold compile asks)."""
    try:
        from triton import knobs

        return knobs.compilation
    except Exception:
        return None


def _compiles_on_its_own() -> bool:
    """Whether Triton's settings make this compile its own (``OWN_COMPILE``)."""
    for env, _ in OWN_COMPILE:
        if os.environ.get(env, "0").strip().lower() in ("1", "true", "yes", "on"):
            return True
    knobs = _compilation_knobs()
    try:
        return any(bool(getattr(knobs, knob, False)) for _, knob in OWN_COMPILE)
    except Exception:  # a knob that cannot be read: Triton's own compile says
        return False


def _whole(group: Optional[Dict[str, str]], filename: str) -> bool:
    """Whether Triton's cache answered with the group: its metadata file among its files
    (what Triton's compile takes for a hit)."""
    return group is not None and filename in group


class OneFrontEnd:
    """Triton's cache manager for one kernel (``inner``, under Triton's key ``key``) whose
    group lookups are claimed: one front end per group across processes."""

    def __init__(self, inner: Any, key: str) -> None:
        self._inner = inner
        self._key = key
        self._claim: Any = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or "_inner" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self._inner, name)

    def _local_found(self, filename: str) -> bool:
        """Whether Triton's file level holds the group (a store behind it is not asked at
        every look of a wait: the holder's group reaches this host's files)."""
        files = getattr(self._inner, "_local", self._inner)
        try:
            group = files.get_group(filename)
        except Exception:  # a group half cleaned away: not there yet
            return False
        return _whole(group, filename)

    def get_group(self, filename: str) -> Optional[Dict[str, str]]:
        group = self._inner.get_group(filename)
        if _whole(group, filename):
            return group
        where = getattr(self._inner, "cache_dir", None)
        if self._claim is not None or not where or _compiles_on_its_own():
            return group
        claim, later, how = _core.claim_triton_group(
            f"{self._key}\0{os.path.realpath(where)}",
            filename,
            functools.partial(self._local_found, filename),
            step_aside=getattr(_held, "step_aside", False),
        )
        logger.debug("Triton's front end of %s (%s): %s", filename, self._key[:12], how)
        if later:
            raise SteppedAside(how)
        if claim is None:
            found = self._inner.get_group(filename)
            return found if _whole(found, filename) else group
        let_go()
        self._claim = _held.claim = claim
        return group

    def put_group(self, filename: str, group: Dict[str, str]) -> Any:
        try:
            return self._inner.put_group(filename, group)
        finally:
            self._let_go()

    def _let_go(self) -> None:
        claim, self.__dict__["_claim"] = self.__dict__.get("_claim"), None
        if claim is not None:
            if getattr(_held, "claim", None) is claim:
                _held.claim = None
            claim.release()

    def __del__(self) -> None:
        self._let_go()


def _sharing(original: Callable[[str], Any]) -> Callable[[str], Any]:
    """Triton's ``get_cache_manager``, its managers wrapped in :class:`OneFrontEnd`."""

    def get_cache_manager(key: str) -> Any:
        let_go()  # this thread's last front end ended (a compile runs one at a time)
        return OneFrontEnd(original(key), key)

    return get_cache_manager


def _letting_go(original: Callable[..., Any]) -> Callable[..., Any]:
    """Triton's ``compile``, letting go of its claim when it ends, however it ends (a
    failure's traceback may keep its cache manager alive long after)."""

    @functools.wraps(original)
    def compile(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        finally:
            let_go()

    return compile


def install(compiler_module: Any = None) -> None:
    """Share front ends for every compile of Triton's ``triton.compiler.compiler`` module
    (``compiler_module``; by default the one imported), its ``compile`` wrapped wherever
    Triton's packages re-export it. Idempotent."""
    import sys

    if compiler_module is None:
        import triton.compiler.compiler as compiler_module
    manager = getattr(compiler_module, "get_cache_manager", None)
    original = getattr(compiler_module, "compile", None)
    if manager is None or original is None or getattr(manager, "__xpu_zebin__", False):
        return
    wrapped = {"get_cache_manager": _sharing(manager), "compile": _letting_go(original)}
    for function in wrapped.values():
        function.__xpu_zebin__ = True  # type: ignore[attr-defined]
    package = compiler_module.__name__.rpartition(".")[0]
    for module in (compiler_module, sys.modules.get(package), sys.modules.get("triton")):
        for name, function in wrapped.items():
            if module is not None and getattr(module, name, None) in (manager, original):
                _installed.append((module, name, getattr(module, name)))
                setattr(module, name, function)


def uninstall() -> None:
    """Triton's own functions back where :func:`install` wrapped them."""
    while _installed:
        module, name, original = _installed.pop()
        setattr(module, name, original)
