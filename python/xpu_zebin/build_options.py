"""How every path asks for a native build: the :class:`~Options` of the drop-in
``load_binary`` (and of a sweep's prebuild, an autotune precompile and a bundle's entries,
which must find the same builds), of the drop-in ``make_zebin``, and upstream's spill rule
of each (docs/design.md §2). One module, so that the keys of the paths cannot drift apart.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Tuple

from . import _core
from ._core import Options
from .errors import InvalidArgumentError

#: Triton's knob for the device architecture, honoured when no other source names it.
DEVICE_ARCH_ENV = "TRITON_INTEL_DEVICE_ARCH"

#: Upstream's spill rule of each path it has (docs/design.md §2).
LOAD_BINARY_RULE = "upstream:load_binary"

MAKE_ZEBIN_RULE = "upstream:make_zebin"

MAKE_ZEBIN_ROLLING_RULE = "upstream:make_zebin-rolling"


def spill_policy(upstream_rule: str) -> Optional[str]:
    """The drop-ins follow upstream's rule for the path they stand in for, whichever
    compiler builds (``upstream`` in ``$XPU_ZEBIN_SPILL_POLICY`` means the same); another
    value there chooses another rule (the engine reads and checks it)."""
    chosen = os.environ.get(_core.SPILL_POLICY_ENV, "").strip().lower()
    return upstream_rule if chosen in ("", "upstream") else None


def native_options(
    name: Optional[str],
    build_flags: str,
    *,
    rule: str,
    grf_mode: Any = "default",
    num_warps: Optional[int] = None,
    device_arch: Optional[str] = None,
    max_grf_mode: Optional[str] = None,
) -> Options:
    """The one place the drop-ins build their :class:`~Options`: every path
    (``load_binary``, ``make_zebin``, a sweep's prebuild) asks for one kernel the same
    way, so they share cache entries when the answer is the same."""
    return Options(
        build_flags=build_flags or "",
        grf_mode=grf_mode if isinstance(grf_mode, str) else "default",  # 3.3: a tuple
        num_warps=num_warps,
        kernel_name=name or None,
        device_arch=device_arch or os.environ.get(DEVICE_ARCH_ENV, "").strip() or None,
        max_grf_mode=max_grf_mode,
        spill_policy=spill_policy(rule),
    )


def load_binary_options(
    name: Optional[str],
    build_flags: str,
    device_arch: Optional[str] = None,
    max_grf_mode: Optional[str] = None,
) -> Options:
    """The options of upstream's ``load_binary`` path (the GRF ladder, its spill rule),
    whoever builds for it: the drop-in, a sweep's or an autotune precompile's prebuild, a
    bundle's entry."""
    return native_options(
        name, build_flags, rule=LOAD_BINARY_RULE, device_arch=device_arch,
        max_grf_mode=max_grf_mode,
    )  # fmt: skip


def seventh_argument(value: Any) -> Tuple[Optional[str], Optional[Any]]:
    """Upstream ``load_binary``'s optional 7th argument as ``(device_arch, max_grf_mode)``:
    the newest driver passes the max GRF mode (``"128"``, ``"256"``, ``"512"``, from
    ``metadata["max_grf_mode"]``, intel-xpu-backend-for-triton issue #8074), older ones
    the device arch (``"cri"`` chooses 512 GRF; ``"unknown"`` when Triton cannot tell).
    Digits are a GRF mode, checked by :class:`~Options` (128, 256 or 512); a
    name is an arch; anything else is an :class:`InvalidArgumentError`."""
    if value is None:
        return None, None
    if isinstance(value, int) and not isinstance(value, bool):
        return None, value
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            return None, text
        if text.replace("_", "").isalnum():
            return (None if text.lower() == "unknown" else text), None
        if not text:
            return None, None
    raise InvalidArgumentError(
        f"load_binary's 7th argument {value!r} is neither a max GRF mode (128, 256, 512) "
        "nor a device arch name",
        kind="invalid_argument",
    )


def driver_is_lts(backend: Any) -> bool:
    """Is the driver Triton compiles for an LTS one? Upstream's own answer where its
    backend has one (``is_lts``); unknown counts as LTS, as upstream's ``is_lts`` does."""
    answer = getattr(backend, "is_lts", None)
    try:
        answer = answer() if callable(answer) else answer
    except Exception:  # another Triton's signature: upstream's default for "unknown"
        answer = None
    return True if answer is None else bool(answer)


def make_zebin_options(
    metadata: dict, options: Any, device_arch: Optional[str], *, lts: bool = True
) -> Options:
    """The options :func:`make_zebin` builds a kernel with (and a bundle keys it by)."""
    return native_options(
        metadata.get("name"),
        metadata.get("build_flags", "") or "",
        rule=MAKE_ZEBIN_RULE if lts else MAKE_ZEBIN_ROLLING_RULE,
        grf_mode=getattr(options, "grf_mode", "default"),
        num_warps=getattr(options, "num_warps", None),
        device_arch=device_arch,
        max_grf_mode=metadata.get("max_grf_mode"),
    )
