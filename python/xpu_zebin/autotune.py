"""Deprecated: the autotuner's patch is :mod:`xpu_zebin.triton.autotune` (this name is the
same module, kept for one release)."""

import sys
import warnings

from .triton import autotune as _moved

warnings.warn(
    "xpu_zebin.autotune is deprecated: use xpu_zebin.triton.autotune", DeprecationWarning,
    stacklevel=2,
)  # fmt: skip
sys.modules[__name__] = _moved
