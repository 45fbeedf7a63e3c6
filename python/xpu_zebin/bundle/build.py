"""Building a bundle: native code for every target profile of a fleet, with the GRF ladder,
concurrently, checked against a target's driver where this host has it."""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import xpu_zebin
from xpu_zebin import _core

from .. import targets as target_profiles
from ..build_options import load_binary_options
from ..errors import REFUSAL_KINDS, BuildError, InvalidArgumentError
from ..targets import TargetProfile
from .format import MANIFEST, PathLike, header, info

logger = logging.getLogger("xpu_zebin.bundle")


def precompile(
    kernels: Sequence[Dict[str, Any]],
    targets: Sequence[TargetProfile],
    out: PathLike,
    *,
    jobs: Optional[int] = None,
    client: Any = None,
    progress: Union[bool, Callable[[int], None]] = False,
    ocloc: Optional[PathLike] = None,
    allow_compiler_mismatch: bool = False,
) -> Dict[str, Any]:
    """Build every kernel for every target into the bundle at ``out``; returns its manifest.

    ``kernels`` are dicts: ``spirv`` (bytes), ``name`` (the kernel), optional
    ``build_flags`` and ``config`` (text naming the autotune config). Builds run with the
    GRF ladder and upstream's ``load_binary`` rule, at most ``jobs`` at once (or as tasks
    on the Dask ``client``). A kernel that cannot be built for a target is listed in the
    manifest's ``failures`` (a PTSS overflow as ``scratch_overflow``, symbols the compiler
    left unresolved as ``link_failure``), never stored. A compiler whose code a target's
    driver refuses (its profile says so) is refused before anything is built, unless
    ``allow_compiler_mismatch`` (then a warning); for a target whose driver is this
    host's, every entry is loaded here first, and one the driver refuses is built by the
    driver's own compiler instead."""
    if not targets:
        raise InvalidArgumentError("precompile needs at least one target profile")
    _check_kernels(kernels)
    check_output(out)
    target_profiles.check_compiler(targets, ocloc, allow_mismatch=allow_compiler_mismatch)
    if (Path(os.fspath(out)) / MANIFEST).exists():
        info(out)  # a bundle that cannot be added to is said before anything compiles
    plan: List[Tuple[Dict[str, Any], TargetProfile, Any]] = []
    requests = []
    for target in targets:
        for k in kernels:
            opts = load_binary_options(k["name"], k.get("build_flags", ""), target.ocloc_device)
            if ocloc is not None:
                opts = opts.replace(ocloc=ocloc)
            plan.append((k, target, opts))
            requests.append({"spirv": k["spirv"], "device": target.ocloc_device, "options": opts})
    results = xpu_zebin.compile_many(requests, jobs=jobs, client=client, progress=progress)
    compiler = _core.compiler_identity(ocloc)
    built, failures = [], []
    for (k, target, opts), r in zip(plan, results):
        where = {"kernel": k["name"], "config": k.get("config", ""), "target": target.id}
        r, by = as_the_driver_takes(k, target, opts, r, compiler)
        if isinstance(r, BuildError):
            failures.append({**where, "kind": r.kind, "message": r.message})
            continue
        key = _core.bundle_key(k["spirv"], k["name"], target.ocloc_device, opts, target.id)
        entry = {
            **where, "key": key, "build_flags": r.build_flags, "spill_bytes": r.spill_size,
            "n_spills": r.n_spills, "compiler": by, "file": "", "blake3": "", "size": 0,
        }  # fmt: skip
        built.append((entry, r.binary))
    manifest = _core.bundle_write(os.fspath(out), header(targets), built, failures)
    for f in failures:
        logger.warning("%s (%s) not built for %s: %s", f["kernel"], f["config"], f["target"][:12],
                       f["message"])  # fmt: skip
    return {**manifest, "run_failures": failures}


@dataclasses.dataclass(frozen=True)
class _JitBuild:
    """A build by the driver's own compiler, shaped as the offline engine's result."""

    binary: bytes
    build_flags: str
    spill_size: int
    n_spills: int


def _local_driver(target: TargetProfile) -> Optional[int]:
    """The index of this host's device that is ``target``'s (its ``ocloc`` device and
    driver version), whose driver can say what it takes; None when there is none."""
    try:
        devices = xpu_zebin.devices()
    except BuildError:
        return None
    for i, d in enumerate(devices):
        if d.get("arch") == target.ocloc_device and d.get("driver") == target.driver:
            return i
    return None


def as_the_driver_takes(
    kernel: Dict[str, Any], target: TargetProfile, opts: xpu_zebin.Options, r: Any, compiler: str
) -> Tuple[Any, str]:
    """(the result to store, the compiler that built it). Where the target's driver is
    this host's, an offline build it refuses (another release's format, unresolved
    symbols) is not shipped: the driver's own compiler builds the kernel instead."""
    device = _local_driver(target) if target.driver else None
    if device is None:
        return r, compiler
    why = r if isinstance(r, BuildError) else None
    if why is None:
        try:
            xpu_zebin.compile_and_load(
                r.binary, kernel["name"], is_spv=False, device=device, cache=False,
                build_flags=r.build_flags,
            ).close()  # fmt: skip
            return r, compiler
        except BuildError as e:
            why = e
    if why.kind not in REFUSAL_KINDS:
        return r, compiler
    logger.warning("%s for %s: %s; built by the driver's own compiler", kernel["name"],
                   target.name or target.ocloc_device, why)  # fmt: skip
    try:
        with xpu_zebin.compile_and_load(kernel["spirv"], kernel["name"], device=device,
                                        options=opts) as own:  # fmt: skip
            built = _JitBuild(own.native_binary, own.build_flags, own.spill_bytes, own.n_spills)
    except BuildError as e:
        return e, compiler
    return built, f"level-zero driver {target.driver}"


def check_output(out: PathLike) -> None:
    """The bundle directory can be written: said before anything compiles."""
    path = Path(os.fspath(out))
    if path.exists() and not path.is_dir():
        raise InvalidArgumentError(f"{out} exists and is not a bundle directory")


def _check_kernels(kernels: Sequence[Dict[str, Any]]) -> None:
    """Each kernel a dict with SPIR-V bytes and a kernel name, none twice."""
    if not kernels:
        raise InvalidArgumentError("precompile needs at least one kernel")
    seen = set()
    for i, k in enumerate(kernels):
        if not isinstance(k, dict) or not isinstance(k.get("spirv"), (bytes, bytearray)):
            raise InvalidArgumentError(f"kernel {i}: expected a dict with 'spirv' bytes")
        if not isinstance(k.get("name"), str) or not k["name"]:
            raise InvalidArgumentError(f"kernel {i}: expected a non-empty 'name'")
        slot = (k["name"], k.get("config", ""), bytes(k["spirv"]), k.get("build_flags", ""))
        if slot in seen:
            raise InvalidArgumentError(f"kernel {i} ({k['name']}) is given twice")
        seen.add(slot)
