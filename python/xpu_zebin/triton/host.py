"""What this host offers a Triton kernel: its device's architecture (for ``ocloc``), whether
a build for an architecture loads here, and whether the offline compiler runs here."""

from __future__ import annotations

import os
from typing import Any, List, Optional

import xpu_zebin

from ..build_options import DEVICE_ARCH_ENV
from ..errors import BuildError, UnsupportedDeviceError


def ocloc_arch(device: int, given: Optional[str]) -> str:
    """The ocloc device name: given, ``$TRITON_INTEL_DEVICE_ARCH``, or what the driver says."""
    arch = given or os.environ.get(DEVICE_ARCH_ENV)
    if arch:
        return arch
    try:
        arch = xpu_zebin.devices()[device].get("arch")
    except (BuildError, IndexError):
        arch = None
    if not arch:
        raise UnsupportedDeviceError(
            f"cannot tell device {device}'s architecture for ocloc: pass device_arch "
            f"or set {DEVICE_ARCH_ENV} (e.g. pvc, bmg, cri)",
            kind="unsupported_device",
        )
    return arch


def gpu_target_arch(gpu_target: Any) -> Optional[str]:
    """The device arch a Triton ``GPUTarget`` names (Triton's XPU backend puts the
    device's properties in its ``arch``), or None."""
    arch = getattr(gpu_target, "arch", None)
    if isinstance(arch, dict):
        return arch.get("arch") or arch.get("device_arch")
    return None


def loads_here(arch: Optional[str]) -> bool:
    """Will a build for ``arch`` (None: this host's device) load on this host's device 0,
    so that this driver's verdict on it applies?"""
    try:
        local = xpu_zebin.devices()[0].get("arch")
    except (BuildError, IndexError):
        return False
    return bool(local) and (arch is None or local.strip().lower() == arch.strip().lower())


def offline_engine_available() -> bool:
    try:
        xpu_zebin.find_ocloc()
        return True
    except BuildError:
        return False


# Why the offline compiler could not run in this process (toolchain_missing): it is not
# tried again.
_offline_broken: List[str] = []


def offline_usable() -> bool:
    """Is the offline compiler there, and did it not fail to run in this process?"""
    return not _offline_broken and offline_engine_available()


def offline_failed(why: str) -> None:
    """The offline compiler cannot run here (``why``): the driver's own compiler builds
    from now on, in this process."""
    _offline_broken.append(why)
