"""Triton XPU drop-ins: ``load_binary`` and ``make_zebin``.

The recommended activation is the environment: with ``XPU_ZEBIN_TRITON=1`` every Python
process that imports Triton's Intel backend gets the drop-ins, subprocesses included (see
``_xpu_zebin_hook``). In code, one line does the same (nothing happens on import)::

    import xpu_zebin.triton; xpu_zebin.triton.install()

``install()`` wraps the active driver's ``utils.load_binary``: SPIR-V is built by this
package (the offline ``ocloc`` engine when ``ocloc`` is found, else Level Zero's
``compile_and_load``), with the large-GRF fallback, classified errors and the binary cache,
and the chosen native binary and build flags are then handed to the driver's own loader
with ``is_spv=False``, so the SYCL objects Triton's launcher needs still come from the
driver and its ``get_last_selected_build_flags()`` agrees. It also routes the XPU backend's
``zebin`` stage through :func:`make_zebin`. triton-xpu 3.3 has no zebin stage: when
``TRITON_XPU_GEN_NATIVE_CODE`` asks for native code there, its ``spv`` stage is extended to
run :func:`make_zebin` after SPIR-V generation, the shape 3.3's own native path has.

Errors: a PTSS overflow raises ``triton.runtime.errors.OutOfResources(required, limit,
"per-thread scratch space (PTSS)")`` so the autotuner skips the config; other build errors
raise ``IntelGPUError`` where Triton has it, else the package's own :class:`BuildError`.
Either way ``.log`` holds the compiler's output and ``__cause__`` the package's error.

The module that owns each step (the flow at the top of docs/design.md):

- ``dropin``: the wrapped ``load_binary``, ``make_zebin``, installing them;
- ``fallback``: native code the driver takes (bundle, offline build, else the driver's own
  compiler, docs/design.md §6);
- ``autotune``: an autotuner's configs compiled at once (docs/design.md §7);
- ``sweep``: :func:`compile_configs`;
- ``aot``: Triton kernels ahead of time (:func:`precompile`), into a bundle;
- ``cache_entries``: Triton's own cache entries in bundles, and :func:`import_bundle`;
- ``frontend``, ``host``, ``errors``: Triton's front end, what this host has, the errors
  Triton's callers expect.

The options of every path and upstream's spill rules are :mod:`xpu_zebin.build_options`.
"""

from __future__ import annotations

from ..build_options import (
    DEVICE_ARCH_ENV,
    LOAD_BINARY_RULE,
    MAKE_ZEBIN_ROLLING_RULE,
    MAKE_ZEBIN_RULE,
    make_zebin_options,
    native_options,
)
from ..errors import REFUSAL_KINDS
from . import autotune
from .aot import check_kernel, check_precompile_kernels, precompile, precompile_kernel
from .cache_entries import import_bundle, import_triton_entries
from .cache_entries import kernels_in as kernels_in_cache
from .dropin import (
    NATIVE_CODE_ENV,
    backend_installed,
    building_for,
    farm_key,
    get_last_selected_build_flags,
    install,
    install_backend,
    load_binary,
    make_zebin,
    uninstall,
)
from .fallback import FINAL_OFFLINE_KINDS
from .sweep import ConfigResult, compile_configs

__all__ = [
    "ConfigResult",
    "autotune",
    "check_kernel",
    "compile_configs",
    "get_last_selected_build_flags",
    "import_bundle",
    "import_triton_entries",
    "install",
    "install_backend",
    "kernels_in_cache",
    "load_binary",
    "make_zebin",
    "precompile",
    "precompile_kernel",
    "uninstall",
]
# Also importable from here, as before: the knobs, spill rules and option builders
# (xpu_zebin.build_options), backend_installed, building_for, farm_key,
# check_precompile_kernels, the refusal and final kinds.
