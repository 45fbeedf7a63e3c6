"""xpu-zebin: SPIR-V to Intel GPU zebin with automatic large-GRF fallback.

Kernels that need too many registers fail to build in the default GRF mode ("total scratch
space exceeds HW supported limit ... PTSS") or build and spill. :func:`compile` retries them
in large GRF mode, says what happened, and raises a classified :class:`BuildError` when
nothing works. The engine is Rust (``xpu_zebin._core``); this module is a thin front.
"""

from __future__ import annotations

import logging
import os
import sys
from concurrent.futures import Executor
from typing import Any, Callable, List, Optional, Sequence, Union

from . import _core
from ._core import Attempt, AttemptError, CompileResult, LoadedKernel
from .errors import (
    BuildError,
    CancelledError,
    CompilerCrashError,
    CompileTimeoutError,
    DegenerateBinaryError,
    InternalError,
    InvalidArgumentError,
    InvalidSpirvError,
    KernelNotFoundError,
    LinkFailureError,
    NoDeviceError,
    ScratchOverflowError,
    ToolchainNotFound,
    UnsupportedDeviceError,
)

__version__: str = _core.__version__

__all__ = [
    "Attempt",
    "AttemptError",
    "BuildError",
    "CancelledError",
    "CompileResult",
    "CompileTimeoutError",
    "CompilerCrashError",
    "DegenerateBinaryError",
    "InternalError",
    "InvalidArgumentError",
    "InvalidSpirvError",
    "KernelNotFoundError",
    "LinkFailureError",
    "LoadedKernel",
    "NoDeviceError",
    "ScratchOverflowError",
    "ToolchainNotFound",
    "UnsupportedDeviceError",
    "compile",
    "compile_and_load",
    "compile_and_load_many",
    "compile_many",
    "devices",
    "doctor",
    "error_kinds",
    "find_ocloc",
    "opencl_to_spirv",
    "validate_spirv",
    "zebin_info",
]

logger = logging.getLogger("xpu_zebin")

PathLike = Union[str, "os.PathLike[str]"]

# Persistent compiler workers are started with this interpreter and import path.
# Absolute: workers run in the package's private directory, not in this one.
_core.configure_workers(
    os.path.realpath(sys.executable), os.pathsep.join(os.path.abspath(p) for p in sys.path if p)
)

validate_spirv = _core.validate_spirv
zebin_info = _core.zebin_info
opencl_to_spirv = _core.opencl_to_spirv


def find_ocloc(ocloc: Optional[PathLike] = None) -> str:
    """The ocloc :func:`compile` would use: ``ocloc``, ``$XPU_ZEBIN_OCLOC``, or PATH."""
    return str(_core.find_ocloc(ocloc))


def doctor(ocloc: Optional[PathLike] = None) -> dict:
    """What the engine would use here: ocloc and its version, libocloc and the worker mode
    (and why compiles run one process each, if they do), Level Zero devices, the cache."""
    return _core.doctor(None if ocloc is None else os.fspath(ocloc))


# Compilers already looked at (by how they were named), so a compile pays this check once.
_worker_checked: set = set()


def _warn_once_without_worker(ocloc: Optional[PathLike]) -> None:
    """Say once per compiler, at WARNING, why it runs one process per compile."""
    named = (None if ocloc is None else os.fspath(ocloc), os.environ.get(_core.OCLOC_ENV))
    try:
        persistent = _core.bool_knob(_core.PERSISTENT_ENV, True)
    except BuildError:
        return  # a bad value: the compiles themselves say so
    if named in _worker_checked or not persistent:
        return  # known already, or one process per compile was asked for
    _worker_checked.add(named)
    try:
        path = str(_core.find_ocloc(ocloc))
    except BuildError:
        return
    why = _core.ocloc_worker_unavailable(path)
    if why:
        logger.warning(
            "no persistent compiler worker for %s (%s): every compile starts a new ocloc "
            "process and loads IGC again, 2-3x slower for small kernels. Fix: install "
            "libocloc.so beside it (Debian: intel-opencl-icd) or name it in %s.toolchain "
            '(JSON: {"libocloc": "/path/libocloc.so"})',
            path,
            why,
            path,
        )


def error_kinds() -> List[tuple]:
    """Every ``BuildError.kind`` with a one-line description."""
    return _core.error_kinds()


def _report(
    result: Union[CompileResult, LoadedKernel], kernel: str
) -> Union[CompileResult, LoadedKernel]:
    """Log what the engine did, and print upstream's recovery line on a fresh recovery."""
    for note in result.notes:
        logger.info("%s", note)
    if result.recovered and not result.cached:
        # The same line upstream Triton's XPU driver prints, so existing log scrapers work.
        print(
            f'(I): Build failure recovered by retrying with large GRF mode for "{kernel}"',
            file=sys.stderr,
        )
        logger.info(
            "kernel %r: default GRF build failed (%s); built with %r",
            kernel,
            result.attempts[0].error,
            result.build_flags,
        )
    elif len(result.attempts) > 1:
        logger.info(
            "kernel %r: spilled %s with default GRF; chose %r (attempts: %s)",
            kernel,
            result.attempts[0].spill_size,
            result.build_flags,
            [(a.build_flags, a.spill_size) for a in result.attempts],
        )
    return result


# compile()'s options and their defaults; compile_many() requests use the same names.
_OPTIONS = {
    "build_flags": "",
    "grf_mode": "default",
    "num_warps": None,
    "kernel_name": None,
    "ocloc": None,
    "timeout": None,
    "cache": True,
    "cache_dir": None,
    "spill_threshold": 0,
    "speculative": None,
}


# What each option may hold: (types, or None for any non-negative int of the width given).
_U32, _U64 = 2**32 - 1, 2**64 - 1
_OPTION_TYPES = {
    "build_flags": str,
    "grf_mode": str,
    "num_warps": _U32,
    "kernel_name": str,
    "ocloc": (str, bytes, os.PathLike),
    "timeout": (int, float),
    "cache": bool,
    "cache_dir": (str, bytes, os.PathLike),
    "spill_threshold": _U64,
    "speculative": bool,
    "is_spv": bool,
    "device_arch": str,
    "isolated": bool,
}


# Options whose default is None (meaning: pick one); for the others None is an error.
_MAY_BE_NONE = {
    "num_warps", "kernel_name", "ocloc", "timeout", "cache_dir", "speculative",
    "device_arch", "isolated",
}  # fmt: skip


def _check_options(options: dict) -> None:
    """Every option's type and range, as an :class:`InvalidArgumentError` naming it (the
    engine checks their values: GRF modes, timeouts, NULs)."""
    for name, value in options.items():
        expected = _OPTION_TYPES.get(name)
        if expected is None or (value is None and name in _MAY_BE_NONE):
            continue
        if isinstance(expected, int):
            ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= expected
            want = f"an integer from 0 to {expected}"
        elif name == "timeout":  # the engine checks the range; a float it must be
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            ok = ok and abs(value) <= _core.MAX_SECONDS * 2
            want = f"seconds, a finite number from 0 to {_core.MAX_SECONDS:g}"
        else:
            ok = isinstance(value, expected) and (expected is bool or not isinstance(value, bool))
            want = " or ".join(
                t.__name__ for t in (expected if isinstance(expected, tuple) else (expected,))
            )
        if not ok:
            raise InvalidArgumentError(
                f"{name}={value!r} is not valid: expected {want}", kind="invalid_argument"
            )


def _bytes(name: str, value: Any) -> bytes:
    """A module's bytes (never ``bytes(n)``: an integer would allocate n zeros)."""
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise InvalidArgumentError(
            f"{name} must be bytes (a SPIR-V module or zebin), not {type(value).__name__}"
        )
    return bytes(value)


def _jobs(jobs: Optional[int]) -> Optional[int]:
    if jobs is not None and (
        not isinstance(jobs, int) or isinstance(jobs, bool) or not 1 <= jobs <= 4096
    ):
        raise InvalidArgumentError(f"jobs={jobs!r} is not valid: expected 1 to 4096")
    return jobs


def _request(spirv: bytes, device: str, **options: object) -> dict:
    """A complete request for the native engine: every option present, paths as strings."""
    unknown = set(options) - set(_OPTIONS)
    if unknown:
        raise TypeError(f"unknown compile option(s): {', '.join(sorted(unknown))}")
    _check_options(options)
    spirv = _bytes("spirv", spirv)
    if not isinstance(device, str):
        raise InvalidArgumentError(f"device={device!r} is not valid: expected a str")
    req = {**_OPTIONS, **options, "spirv": spirv, "device": device}
    for key in ("ocloc", "cache_dir"):
        if req[key] is not None:
            req[key] = os.fsdecode(req[key])  # type: ignore[arg-type]
    return req


def compile(
    spirv: bytes,
    *,
    device: str,
    build_flags: str = "",
    grf_mode: str = "default",
    num_warps: Optional[int] = None,
    kernel_name: Optional[str] = None,
    ocloc: Optional[PathLike] = None,
    timeout: Optional[float] = None,
    cache: bool = True,
    cache_dir: Optional[PathLike] = None,
    spill_threshold: int = 0,
    speculative: Optional[bool] = None,
) -> CompileResult:
    """Compile SPIR-V to a zebin for ``device`` (an ocloc device name such as ``pvc``).

    With ``grf_mode="default"`` and no GRF flag in ``build_flags``, a build that fails, or
    that spills more than ``spill_threshold`` bytes, is retried in large GRF mode (256
    registers; 512 on ``cri``), unless ``num_warps > 32``. Raises a :class:`BuildError`
    subclass naming the cause; when both attempts fail, the first attempt's error.

    ``speculative`` runs both GRF modes at once and cancels the large one if the default
    build is accepted: the same answer, sooner. ``None`` (default) speculates only when a
    core is idle. ``timeout`` is per compiler run, in seconds.
    """
    req = _request(
        spirv,
        device,
        build_flags=build_flags,
        grf_mode=grf_mode,
        num_warps=num_warps,
        kernel_name=kernel_name,
        ocloc=ocloc,
        timeout=timeout,
        cache=cache,
        cache_dir=cache_dir,
        spill_threshold=spill_threshold,
        speculative=speculative,
    )
    result = _core.compile(**req)
    if not result.cached:
        _warn_once_without_worker(req["ocloc"])
    return _report(result, result.kernel)


def compile_many(
    requests: Sequence[dict],
    *,
    jobs: Optional[int] = None,
    executor: Optional[Executor] = None,
    client: Any = None,
    progress: Union[bool, Callable[[int], None]] = False,
) -> List[Union[CompileResult, BuildError]]:
    """Compile many kernels concurrently; results in input order.

    Each request is a dict of :func:`compile`'s arguments (``spirv`` and ``device``
    required). A failure is returned in its slot as the :class:`BuildError`, never raised,
    so one bad kernel does not sink the batch. ``jobs`` bounds the parallel compilers
    (default: cores). With ``executor`` (any ``concurrent.futures.Executor``: a process
    pool, Ray's or Dask's), each request runs there as a :func:`compile` call instead; with
    ``client`` (a ``distributed.Client``), each is a task on that Dask cluster, and a worker
    lost mid-batch costs only a re-run of its tasks (``pip install xpu-zebin[dask]``).
    ``progress=True`` shows a progress bar; a callable is called with each finished index.
    """
    reqs = [_request(**r) for r in requests]

    def run(callback: Optional[Callable[[int], None]]) -> list:
        if client is not None:
            from . import dask

            return dask.compile_many(reqs, client, callback)
        if executor is not None:
            return _run_on_executor(executor, reqs, callback)
        return _core.compile_many(reqs, jobs=_jobs(jobs), progress=callback)

    results = _with_progress(len(reqs), progress, run)
    for ocloc in {r["ocloc"] for r in reqs} if executor is None and client is None else ():
        _warn_once_without_worker(ocloc)
    for r in results:
        if isinstance(r, CompileResult):
            _report(r, r.kernel)
    return results


def devices() -> List[dict]:
    """The Level Zero devices: name, device_id, arch, max_work_group_size, sub_group_sizes.

    Raises :class:`NoDeviceError` without a driver or GPU; ``XPU_ZEBIN_SIMULATED_DEVICE=pvc``
    (set before first use) runs Intel's real driver on a simulated PVC device instead.
    """
    return _core.devices()


# Set to 0 to build Level Zero SPIR-V inside this process (unsafe for untrusted input).
ISOLATED_ENV = "XPU_ZEBIN_ISOLATED"


def _isolated_default() -> bool:
    """``XPU_ZEBIN_ISOLATED`` (default on); a value that is not a boolean raises
    :class:`InvalidArgumentError` naming it, as every knob does."""
    return _core.bool_knob(ISOLATED_ENV, True)


# compile_and_load()'s options and their defaults; compile_and_load_many() uses the same.
_LOAD_OPTIONS = {
    "build_flags": "",
    "is_spv": True,
    "device": 0,
    "device_arch": None,
    "cache": True,
    "cache_dir": None,
    "spill_threshold": 0,
    "isolated": None,
    "timeout": None,
    "speculative": None,
}


def _load_request(binary: bytes, kernel_name: str, **options: object) -> dict:
    unknown = set(options) - set(_LOAD_OPTIONS)
    if unknown:
        raise TypeError(f"unknown compile_and_load option(s): {', '.join(sorted(unknown))}")
    _check_options(options)
    device = options.get("device", 0)
    if not isinstance(device, int) or isinstance(device, bool) or not 0 <= device < 2**32:
        raise InvalidArgumentError(f"device={device!r} is not valid: expected a device index")
    if not isinstance(kernel_name, str):
        raise InvalidArgumentError(f"kernel_name={kernel_name!r} is not valid: expected a str")
    req = {**_LOAD_OPTIONS, **options, "binary": _bytes("binary", binary)}
    req["kernel_name"] = kernel_name
    if req["isolated"] is None:
        req["isolated"] = _isolated_default()
    if req["cache_dir"] is not None:
        req["cache_dir"] = os.fsdecode(req["cache_dir"])  # type: ignore[arg-type]
    return req


def compile_and_load(
    binary: bytes,
    kernel_name: str,
    *,
    build_flags: str = "",
    is_spv: bool = True,
    device: int = 0,
    device_arch: Optional[str] = None,
    cache: bool = True,
    cache_dir: Optional[PathLike] = None,
    spill_threshold: int = 0,
    isolated: Optional[bool] = None,
    timeout: Optional[float] = None,
    speculative: Optional[bool] = None,
) -> LoadedKernel:
    """Build ``binary`` with the Level Zero driver and load ``kernel_name`` from it.

    SPIR-V (``is_spv=True``) without an explicit GRF flag is retried in large GRF mode when
    the build fails or ``spillMemSize`` exceeds ``spill_threshold``, as upstream Triton's
    ``load_binary`` does; a native zebin is loaded as it is. The result owns the module
    and kernel handles (``close()`` or a ``with`` block releases them). A SPIR-V build's
    native binary is cached, so a warm load skips the JIT.

    SPIR-V is compiled in a worker process (``isolated``, the default): an input that
    crashes the driver's compiler raises :class:`CompilerCrashError` and this process goes
    on; only the driver's native binary is loaded here. A native binary you pass is loaded
    in a worker first (the driver's loader can die on a malformed one), once per binary
    and device with the cache on. ``isolated=False`` (or ``XPU_ZEBIN_ISOLATED=0``) does
    both inside this process, which such an input ends: for trusted kernels only.
    ``timeout`` is per build, in seconds; ``speculative`` runs both GRF modes at once
    (``None``: when a core is idle).
    """
    req = _load_request(
        binary,
        kernel_name,
        build_flags=build_flags,
        is_spv=is_spv,
        device=device,
        device_arch=device_arch,
        cache=cache,
        cache_dir=cache_dir,
        spill_threshold=spill_threshold,
        isolated=isolated,
        timeout=timeout,
        speculative=speculative,
    )
    loaded = _core.compile_and_load(**req)
    return _report(loaded, kernel_name)


def compile_and_load_many(
    requests: Sequence[dict],
    *,
    jobs: Optional[int] = None,
    progress: Union[bool, Callable[[int], None]] = False,
) -> List[Union[LoadedKernel, BuildError]]:
    """Load many kernels through Level Zero concurrently; results in input order.

    Each request is a dict of :func:`compile_and_load`'s arguments (``binary`` and
    ``kernel_name`` required). SPIR-V builds run in up to ``jobs`` worker processes at once
    (default: cores); a failure is returned in its slot as the :class:`BuildError`.
    ``progress=True`` shows a progress bar; a callable is called with each finished index.
    """
    reqs = [_load_request(**r) for r in requests]
    results = _with_progress(
        len(reqs),
        progress,
        lambda callback: _core.compile_and_load_many(reqs, jobs=_jobs(jobs), progress=callback),
    )
    for r, req in zip(results, reqs):
        if isinstance(r, LoadedKernel):
            _report(r, req["kernel_name"])
    return results


def _with_progress(total: int, progress: Union[bool, Callable[[int], None]], run: Callable):
    """Call ``run(callback)`` with a tqdm bar (``progress=True``) or the given callable."""
    bar = None
    if progress is True:
        from tqdm import tqdm

        bar = tqdm(total=total, desc="xpu-zebin", unit="kernel", file=sys.stderr)
        callback: Optional[Callable[[int], None]] = lambda _i: bar.update(1)  # noqa: E731
    else:
        callback = progress or None
    try:
        return run(callback)
    finally:
        if bar is not None:
            bar.close()


def _batch_task(req: dict, caller: int) -> Union[CompileResult, BuildError]:
    """One request of a batch run by an executor or by Dask, its failure in its slot. In a
    process other than the caller's (a process pool's, a Dask worker's), processes start
    tasks at the same moment: its speculative builds let the others' take their cores."""
    if os.getpid() != caller:
        _core.join_multiprocess_batch()
    try:
        return _core.compile(**req)
    except BuildError as e:
        return e


def _run_on_executor(
    executor: Executor, reqs: List[dict], callback: Optional[Callable[[int], None]]
) -> List[Union[CompileResult, BuildError]]:
    futures = [executor.submit(_batch_task, r, os.getpid()) for r in reqs]
    for i, f in enumerate(futures):
        f.add_done_callback(lambda _f, i=i: callback(i) if callback else None)
    return [f.result() for f in futures]
