"""Target profiles: what a GPU is, for building its native code on a machine without it.

A profile is what Triton's XPU driver reports for the device (its ``GPUTarget``: backend,
the architecture dict, warp size), the ``ocloc`` device name, and the Level Zero driver's
identity. ``xpu-zebin target --json`` writes the local device's; a profile file taken on
one machine is used on another (a build farm with no GPU builds for it). Its ``id`` is a
hash of all of that but the name: a bundle entry built for one id loads only where the
local device has the same id.

Where the device is at hand, a profile also records what its driver accepts
(``accepts``): the ``.ze_info`` version its own compiler writes, and for each ``ocloc``
release tried there whether the driver loaded its code. A farm then refuses a compiler
whose output that driver would refuse (:func:`check_compiler`), instead of shipping
entries that fail at load. It is not part of the id: it says what may be built for the
target, not what the target is.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import xpu_zebin

from ._files import read_regular
from .errors import REFUSAL_KINDS, BuildError, InvalidArgumentError, UnsupportedDeviceError

FORMAT = "xpu-zebin-target/1"
#: Profiles are small; a bigger file is not one.
MAX_PROFILE_BYTES = 1 << 20


#: ocloc device names: lowercase ASCII, digits, '_', '.', '-' ("pvc", "dg2", "12.60.7").
_DEVICE = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
WARP_SIZES = (8, 16, 32, 64)


@dataclass(frozen=True)
class TargetProfile:
    ocloc_device: str
    arch: Dict[str, Any]
    warp_size: int = 32
    backend: str = "xpu"
    #: The Level Zero driver's version (``major.minor.build``); None: any driver.
    driver: Optional[str] = None
    name: str = field(default="", compare=False)
    #: What the driver accepts, probed on the device (:func:`probe_accepts`): ``ze_info``,
    #: the ``.ze_info`` version its own compiler writes, and ``compilers``, ``ocloc``
    #: release -> whether the driver loaded that compiler's code. None: not probed.
    accepts: Optional[Dict[str, Any]] = field(default=None, compare=False)

    @property
    def id(self) -> str:
        """What native code for this profile depends on: the backend, the ``ocloc``
        device, the warp size and the driver. Not the architecture dict: Triton's front end
        reads it, so it is in the SPIR-V, which every bundle key holds already (and it is
        reported differently with and without PyTorch's XPU runtime)."""
        canonical = json.dumps([self.backend, self.warp_size, self.ocloc_device, self.driver])
        return hashlib.sha256(canonical.encode()).hexdigest()

    def any_driver(self) -> TargetProfile:
        """The same profile for any driver version (what ``"driver": null`` means)."""
        return dataclasses.replace(self, driver=None)

    def to_json(self) -> Dict[str, Any]:
        return {
            "format": FORMAT,
            "name": self.name or self.ocloc_device,
            "backend": self.backend,
            "arch": self.arch,
            "warp_size": self.warp_size,
            "ocloc_device": self.ocloc_device,
            "driver": self.driver,
            "accepts": self.accepts,
            "id": self.id,
        }

    def gpu_target(self) -> Any:
        """Triton's ``GPUTarget`` for this profile."""
        from triton.backends.compiler import GPUTarget

        return GPUTarget(self.backend, dict(self.arch), self.warp_size)

    @classmethod
    def from_json(cls, data: Any, where: str = "profile") -> TargetProfile:
        """A profile from its JSON, checked (a profile file is input like any other)."""

        def bad(why: str) -> InvalidArgumentError:
            return InvalidArgumentError(f"{where} is not a target profile: {why}")

        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise bad(f"expected a JSON object with format {FORMAT!r}")
        for key, kind in {"ocloc_device": str, "arch": dict, "backend": str, "name": str}.items():
            if not isinstance(data.get(key), kind):
                raise bad(f"{key!r} must be a {kind.__name__}")
        if data.get("warp_size") not in WARP_SIZES or isinstance(data.get("warp_size"), bool):
            raise bad(f"'warp_size' must be one of {WARP_SIZES}")
        driver = data.get("driver")
        if driver is not None and not isinstance(driver, str):
            raise bad("'driver' must be a str or null")
        if not _DEVICE.fullmatch(data["ocloc_device"]):
            raise bad(f"'ocloc_device' {data['ocloc_device']!r} is not an ocloc device name")
        try:  # finite numbers and plain JSON only: it is hashed and written again
            json.dumps(data["arch"], allow_nan=False)
        except (ValueError, TypeError, RecursionError) as e:
            raise bad(f"'arch' is not plain JSON: {e}") from None
        accepts = data.get("accepts")
        if accepts is not None:
            why = _accepts_problem(accepts)
            if why:
                raise bad(f"'accepts' {why}")
        profile = cls(data["ocloc_device"], data["arch"], data["warp_size"], data["backend"],
                      driver, data["name"], accepts)  # fmt: skip
        if "id" in data and data["id"] != profile.id:
            raise bad("its id does not match its contents")
        return profile


_ZE_INFO = re.compile(r"[0-9]{1,6}\.[0-9]{1,6}")
#: ocloc releases as ``ocloc query OCL_DRIVER_VERSION`` prints them ("22.43.24595").
_RELEASE = re.compile(r"[0-9A-Za-z][0-9A-Za-z._+-]{0,63}")


def _accepts_problem(accepts: Any) -> Optional[str]:
    """What is wrong with a profile's ``accepts`` (None: nothing)."""
    if not isinstance(accepts, dict) or set(accepts) - {"ze_info", "compilers"}:
        return "must be an object with ze_info and compilers"
    ze_info = accepts.get("ze_info")
    if ze_info is not None and not (isinstance(ze_info, str) and _ZE_INFO.fullmatch(ze_info)):
        return "ze_info must be a .ze_info version such as '1.20'"
    compilers = accepts.get("compilers", {})
    if not isinstance(compilers, dict) or len(compilers) > 64:
        return "compilers must map at most 64 ocloc releases to true or false"
    for release, ok in compilers.items():
        if not _RELEASE.fullmatch(release) or not isinstance(ok, bool):
            return f"compilers: {release!r}: expected an ocloc release and true or false"
    return None


def compiler_release(ocloc: Optional[Any] = None) -> str:
    """The ``ocloc`` release (``OCL_DRIVER_VERSION``, e.g. ``22.43.24595``): the last
    part of the compiler's identity."""
    return xpu_zebin._core.compiler_identity(ocloc).rsplit("|", 1)[-1].strip()


def _ze_info_major(version: str) -> str:
    return version.split(".")[0].strip()


def _sample(ocloc: Optional[Any]) -> bytes:
    from . import samples

    return xpu_zebin.opencl_to_spirv(samples.ADD_KERNEL, device="pvc", ocloc=ocloc)


def probe_accepts(device: int = 0, ocloc: Optional[Any] = None) -> Optional[Dict[str, Any]]:
    """What device ``device``'s driver accepts: the ``.ze_info`` version its own compiler
    writes for a sample kernel, and whether it loads that kernel as ``ocloc`` (when one
    is found) builds it. None when no ``ocloc`` is there to make the sample's SPIR-V."""
    try:
        spirv = _sample(ocloc)
    except BuildError:
        return None
    with xpu_zebin.compile_and_load(spirv, "add", device=device, cache=False) as own:
        ze_info = xpu_zebin.zebin_info(own.native_binary)["version"]
    accepts: Dict[str, Any] = {"ze_info": ze_info, "compilers": {}}
    arch = xpu_zebin.devices()[device].get("arch")
    if arch:
        built = xpu_zebin.compile(spirv, device=arch, ocloc=ocloc, cache=False)
        try:
            xpu_zebin.compile_and_load(
                built.binary, "add", is_spv=False, device=device, cache=False
            ).close()
            loaded = True
        except BuildError as e:
            if e.kind not in REFUSAL_KINDS:
                raise
            loaded = False
        accepts["compilers"][compiler_release(ocloc)] = loaded
    return accepts


def check_compiler(
    targets: Any, ocloc: Optional[Any] = None, *, allow_mismatch: bool = False
) -> List[str]:
    """Refuse (``InvalidArgumentError``) a farm compiler whose code a target's driver
    would refuse: one its driver refused when the profile was taken, or one that writes a
    ``.ze_info`` major other than the driver's own compiler. ``allow_mismatch`` makes each
    a warning instead. Returns what was found, one line per target."""
    import logging

    release = compiler_release(ocloc)
    found: List[str] = []
    written: Dict[str, str] = {}
    for t in targets:
        if not t.accepts:
            continue
        known = t.accepts.get("compilers", {}).get(release)
        why = None
        if known is False:
            why = f"its driver refused code of ocloc {release} when the profile was taken"
        elif known is None and t.accepts.get("ze_info"):
            if t.ocloc_device not in written:
                try:
                    sample = xpu_zebin.compile(_sample(ocloc), device=t.ocloc_device, ocloc=ocloc)
                    written[t.ocloc_device] = xpu_zebin.zebin_info(sample.binary)["version"]
                except BuildError as e:  # its kernels fail the same way, each listed
                    logging.getLogger("xpu_zebin.targets").warning(
                        "target %s: what ocloc %s writes cannot be checked: %s",
                        t.name or t.ocloc_device, release, e,
                    )  # fmt: skip
                    written[t.ocloc_device] = ""
            ours, theirs = written[t.ocloc_device], t.accepts["ze_info"]
            if ours and _ze_info_major(ours) != _ze_info_major(theirs):
                why = (f"ocloc {release} writes .ze_info {ours}, a format its driver does not "
                       f"know (its own compiler writes {theirs})")  # fmt: skip
        if why is None:
            continue
        build = (t.driver or "").rsplit(".", 1)[-1]
        line = (f"target {t.name or t.ocloc_device} (driver {t.driver}): {why}; build with the "
                f"ocloc of the driver's own release (compute-runtime build {build}: "
                f"`ocloc query OCL_DRIVER_VERSION` ends in .{build})")  # fmt: skip
        found.append(line)
    if found and not allow_mismatch:
        raise InvalidArgumentError(
            "; ".join(found) + " (or allow the mismatch: --allow-compiler-mismatch)"
        )
    for line in found:
        logging.getLogger("xpu_zebin.targets").warning("%s", line)
    return found


def _no_duplicates(pairs: list) -> dict:
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise InvalidArgumentError(f"a key is given twice in {sorted(keys)}")
    return dict(pairs)


def load(path: os.PathLike[str] | str) -> TargetProfile:
    """A profile file (``xpu-zebin target --json -o pvc.json``): a regular file (never
    waits on a FIFO), at most 1 MiB, strict JSON."""
    try:
        text = read_regular(path, MAX_PROFILE_BYTES)
    except OSError as e:
        raise InvalidArgumentError(f"{path}: {e.strerror or e}") from None
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates)
    except (ValueError, RecursionError) as e:
        raise InvalidArgumentError(f"{path} is not JSON: {e}") from None
    return TargetProfile.from_json(data, str(path))


def _triton_target() -> Optional[Any]:
    """What Triton's own driver reports for the current device, where it can (it needs
    PyTorch's XPU runtime)."""
    try:
        from triton.runtime.driver import driver

        return driver.active.get_current_target()
    except Exception:  # no Triton, no PyTorch XPU, no SYCL device: Level Zero says it
        return None


def _arch_from_level_zero(info: Dict[str, Any]) -> Dict[str, Any]:
    """The architecture dict Triton's driver would report, from what Level Zero says: the
    fields Triton's XPU backend reads."""
    sizes = list(info["sub_group_sizes"]) or [16]
    return {
        "name": info["name"],
        "architecture": int(info.get("ip_version") or 0) << 8,
        "max_work_group_size": info["max_work_group_size"],
        "max_num_sub_groups": info["max_work_group_size"] // min(sizes),
        "sub_group_sizes": sizes,
    }


_local: Dict[int, TargetProfile] = {}


def local(device: int = 0, *, arch: Optional[Dict[str, Any]] = None) -> TargetProfile:
    """The profile of Level Zero device ``device`` (the simulated PVC serves the tests):
    Triton's target when its driver can report one, else ``arch`` or what Level Zero
    reports. Computed once per device and process unless ``arch`` is given."""
    given = arch
    if given is None and device in _local:
        return _local[device]
    info = xpu_zebin.devices()[device]
    if not info.get("arch"):
        raise UnsupportedDeviceError(
            f"device {device} ({info['name']}, id 0x{info['device_id']:04x}) has no known "
            "ocloc device name",
            kind="unsupported_device",
        )
    warp_size = 32
    if arch is None:
        target = _triton_target()
        if target is not None and isinstance(getattr(target, "arch", None), dict):
            arch, warp_size = dict(target.arch), int(target.warp_size)
    profile = TargetProfile(
        ocloc_device=info["arch"],
        arch=arch if arch is not None else _arch_from_level_zero(info),
        warp_size=warp_size,
        driver=info["driver"],
        name=info["arch"],
    )
    if given is None:
        _local[device] = profile
    return profile
