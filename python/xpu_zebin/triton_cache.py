"""Deprecated: Triton's cache entries are :mod:`xpu_zebin.triton.cache_entries` (this name
is the same module, kept for one release)."""

import sys
import warnings

from .triton import cache_entries as _moved

warnings.warn(
    "xpu_zebin.triton_cache is deprecated: use xpu_zebin.triton.cache_entries",
    DeprecationWarning, stacklevel=2,
)  # fmt: skip
sys.modules[__name__] = _moved
