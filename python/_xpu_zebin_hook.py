"""xpu-zebin's Triton drop-in, activated by the environment: ``XPU_ZEBIN_TRITON=1``.

The wheel installs ``xpu_zebin.pth`` beside this module; at interpreter start it imports
this module only when ``XPU_ZEBIN_TRITON`` is set to a true value, so without it nothing is
imported, patched or slowed. :func:`arm` then waits, with an import hook, for Triton's
backend registry (``triton.backends``, imported by ``import triton``): once it holds the
Intel backend, its zebin stage goes through :func:`xpu_zebin.triton.make_zebin`, and every
``XPUUtils`` its driver creates loads kernels through the package's ``load_binary``.
Subprocesses that inherit the environment (Inductor's compile workers, serving stacks) get
the same. The package itself is imported only then.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Any, Callable, Dict, Optional

# Triton fills its backend registry when this package is imported (triton-xpu 3.3 loads
# each backend's compiler.py and driver.py from their files, past any import hook).
BACKENDS = "triton.backends"


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


def _patch_backends(module: Any) -> None:
    intel = getattr(module, "backends", {}).get("intel")
    if intel is None:
        return
    import xpu_zebin.triton

    xpu_zebin.triton.install_backend(intel.compiler)
    # The driver builds its utils lazily from the XPUUtils class of its own module.
    utils_cls = vars(sys.modules.get(intel.driver.__module__) or object).get("XPUUtils")
    if utils_cls is None:
        utils_cls = intel.driver.__init__.__globals__.get("XPUUtils")
    if utils_cls is not None:
        _patch_utils_class(utils_cls)


_PATCHES: Dict[str, Callable[[Any], None]] = {BACKENDS: _patch_backends}


class _PatchingLoader(importlib.abc.Loader):
    """The module's own loader, then the patch; everything else is the original loader's."""

    def __init__(self, loader: Any, patch: Callable[[Any], None]) -> None:
        self._loader = loader
        self._patch = patch

    def create_module(self, spec: Any) -> Optional[Any]:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        self._patch(module)

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
            patch(sys.modules[name])
    sys.meta_path.insert(0, _Finder())
