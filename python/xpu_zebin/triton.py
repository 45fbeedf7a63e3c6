"""Triton XPU drop-ins: ``load_binary`` and ``make_zebin``.

Placeholder for the Triton shim (tracked as its own issue). Importing this module never
patches anything: activation will be one explicit call, ``xpu_zebin.triton.install()``.
"""

from __future__ import annotations

__all__: list = []
