"""xpu-zebin's Triton drop-in, activated by the environment: ``XPU_ZEBIN_TRITON=1``.

The wheel installs ``xpu_zebin.pth`` beside this module; at interpreter start it imports
this module only when ``XPU_ZEBIN_TRITON`` is set to something other than a false value, so
without it nothing is imported, patched or slowed. :func:`activate` reads the variable
(:func:`parse_setting`: ``1``, ``true``, ``yes``, ``on`` turn the drop-in on; ``0``,
``false``, ``no``, ``off`` or empty leave it off; anything else is warned about and leaves it
off). :func:`arm` then waits, with an import hook, for Triton's
backend registry (``triton.backends``, imported by ``import triton``): once it holds the
Intel backend, its zebin stage goes through :func:`xpu_zebin.triton.make_zebin`, and every
``XPUUtils`` its driver creates loads kernels through the package's ``load_binary``;
its autotuner compiles configs at once, and its compile shares front ends between
processes (:mod:`xpu_zebin.triton.front_ends`).
Subprocesses that inherit the environment (Inductor's compile workers, serving stacks) get
the same. The package itself is imported only then.

Nothing here may break the interpreter or Triton: a package that cannot be imported (a
broken or half-removed install), or a Triton it cannot patch, leaves Triton as it is, with
one warning on the ``xpu_zebin`` logger that says why (printed by :mod:`logging`'s
last-resort handler when nothing is configured). The ``.pth`` line itself prints one line,
not a traceback, when this module cannot be imported at all.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from typing import Any, Callable, Dict, Optional

#: The variable that turns the drop-in on.
ENV = "XPU_ZEBIN_TRITON"
#: Its values, compared with surrounding whitespace removed and case ignored. The ``.pth``
#: line skips importing this module for exactly the false ones.
TRUE_VALUES = ("1", "true", "yes", "on")
FALSE_VALUES = ("", "0", "false", "no", "off")

# Triton fills its backend registry when this package is imported (triton-xpu 3.3 loads
# each backend's compiler.py and driver.py from their files, past any import hook).
BACKENDS = "triton.backends"
# Triton's autotuner (imported by ``import triton`` too).
AUTOTUNER = "triton.runtime.autotuner"
# Triton's compile, whose cache manager the ranks of a job share front ends through.
COMPILER = "triton.compiler.compiler"


def parse_setting(value: Optional[str]) -> Optional[bool]:
    """``True`` or ``False`` for a recognised value of :data:`ENV` (unset is ``False``),
    ``None`` for any other."""
    word = (value or "").strip().lower()
    if word in TRUE_VALUES:
        return True
    if word in FALSE_VALUES:
        return False
    return None


def _warn(message: str, *args: Any) -> None:
    import logging

    logging.getLogger("xpu_zebin").warning(message, *args)


_said: set = set()


def _inactive(why: str) -> None:
    """One warning per reason (each of Triton's patched modules meets the same one)."""
    if why not in _said:
        _said.add(why)
        _warn("xpu-zebin's Triton drop-in is not active: %s; Triton runs without it", why)


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())}"


def _patch_utils_class(cls: Any) -> None:
    """Every utils object the driver creates loads kernels through the package."""
    original_init = cls.__init__
    if getattr(original_init, "__xpu_zebin__", False):
        return

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        import xpu_zebin.triton

        xpu_zebin.triton.install(self, backend=False)

    __init__.__xpu_zebin__ = True  # type: ignore[attr-defined]
    __init__.__wrapped__ = original_init  # type: ignore[attr-defined]
    cls.__init__ = __init__


def _package(name: str) -> Optional[Any]:
    """``xpu_zebin.<name>``, or None (said once) for a broken or half-removed install:
    Triton then stays as it is."""
    import importlib

    try:
        return importlib.import_module(f"xpu_zebin.{name}")
    except Exception as e:
        _inactive(f"cannot import xpu_zebin ({_error(e)})")
        return None


def _patch_backends(module: Any) -> None:
    intel = getattr(module, "backends", {}).get("intel")
    drop_in = _package("triton") if intel is not None else None
    if drop_in is None:
        return
    drop_in.install_backend(intel.compiler)
    # The driver builds its utils lazily from the XPUUtils class of its own module.
    utils_cls = vars(sys.modules.get(intel.driver.__module__) or object).get("XPUUtils")
    if utils_cls is None:
        utils_cls = intel.driver.__init__.__globals__.get("XPUUtils")
    if utils_cls is not None:
        _patch_utils_class(utils_cls)


def _patch_autotuner(module: Any) -> None:
    """Every ``@triton.autotune`` kernel compiles its configs at once before benchmarking."""
    autotune = _package("triton.autotune") if getattr(module, "Autotuner", None) else None
    if autotune is not None:
        autotune.install(module.Autotuner)


def _patch_compiler(module: Any) -> None:
    """Every compile's cache manager shares its front end between processes."""
    front_ends = _package("triton.front_ends") if hasattr(module, "get_cache_manager") else None
    if front_ends is not None:
        front_ends.install(module)


_PATCHES: Dict[str, Callable[[Any], None]] = {
    BACKENDS: _patch_backends,
    AUTOTUNER: _patch_autotuner,
    COMPILER: _patch_compiler,
}


def _apply(patch: Callable[[Any], None], module: Any) -> None:
    """A patch that fails leaves the import it follows working."""
    try:
        patch(module)
    except Exception as e:
        _inactive(f"patching {module.__name__} failed ({_error(e)})")


class _PatchingLoader(importlib.abc.Loader):
    """The module's own loader, then the patch; everything else is the original loader's."""

    def __init__(self, loader: Any, patch: Callable[[Any], None]) -> None:
        self._loader = loader
        self._patch = patch

    def create_module(self, spec: Any) -> Optional[Any]:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        _apply(self._patch, module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Optional[Any]:
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PatchingLoader(spec.loader, patch)
        return spec


def arm() -> None:
    """Patch Triton's Intel backend when it is imported (at once if it already is)."""
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    for name, patch in _PATCHES.items():
        if name in sys.modules:
            _apply(patch, sys.modules[name])
    sys.meta_path.insert(0, _Finder())


_UNSET: Any = object()
_activated: Any = _UNSET


def activate() -> Optional[bool]:
    """What the ``.pth`` line runs: :func:`arm` when :data:`ENV` is true; for a value that is
    neither true nor false, one warning and nothing else. The parsed setting. Once per
    process: Python 3.11's ``site`` runs a venv's ``.pth`` files twice."""
    global _activated
    if _activated is not _UNSET:
        return _activated
    value = os.environ.get(ENV)
    setting = _activated = parse_setting(value)
    if setting is None:
        _warn(
            "%s=%r is neither true (%s) nor false (%s or empty): xpu-zebin's Triton drop-in "
            "is not active",
            ENV,
            value,
            ", ".join(TRUE_VALUES),
            ", ".join(FALSE_VALUES[1:]),
        )
    elif setting:
        arm()
    return setting
