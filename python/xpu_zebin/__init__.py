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
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Sequence, TypedDict, Union

from . import _core
from ._accounts import stats
from ._core import Attempt, AttemptError, CompileResult, LoadedKernel, Options
from ._tasks import batch_task
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
    "Options",
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
    "stats",
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
    return os.fspath(_core.find_ocloc(ocloc))


def doctor(ocloc: Optional[PathLike] = None) -> dict:
    """What the engine would use here: ocloc, libocloc and the worker mode (and why), Level
    Zero devices, the cache and its ``stats``, each path's spill rule (``spill_rules``)."""
    from .build_options import rules_report

    report = _core.doctor(None if ocloc is None else os.fspath(ocloc))
    devices = report.get("level_zero_devices") or [{}]
    report["spill_rules"] = rules_report(devices[0].get("driver"))
    report["refused_compilers"] = _core.compiler_refusals()  # --forget-refusals clears them
    return {**report, "stats": stats()}


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
            '(JSON: {"libocloc": "/path/libocloc.so"})', path, why, path,
        )  # fmt: skip


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


class OptionValues(TypedDict, total=False):
    """:class:`Options` as keywords (their defaults: ``Options()``)."""

    build_flags: str
    grf_mode: str
    num_warps: Optional[int]
    kernel_name: Optional[str]
    device_arch: Optional[str]
    max_grf_mode: Optional[Union[int, str]]
    ocloc: Optional[PathLike]
    timeout: Optional[float]
    cache: bool
    cache_dir: Optional[PathLike]
    spill_policy: Optional[str]
    speculative: Optional[bool]
    isolated: Optional[bool]
    allow_unresolved: bool


if TYPE_CHECKING:
    from typing_extensions import Unpack


def _options(options: Optional[Options], changes: dict) -> Options:
    """``options`` (default ``Options()``) with keyword ``changes``: a bad value raises
    :class:`InvalidArgumentError` naming it, an unknown name ``TypeError``."""
    if options is None:
        return Options(**changes)
    if not isinstance(options, Options):
        raise InvalidArgumentError(
            f"options={options!r} is not valid: expected xpu_zebin.Options",
            kind="invalid_argument",
        )
    return options.replace(**changes) if changes else options


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


def _request(spirv: bytes, device: str, options: Optional[Options] = None, **changes: Any) -> dict:
    """A request for the native engine: module, device, options (bundles to ask first)."""
    asked = changes.pop("bundle", None)
    opts = _options(options, changes)
    if not isinstance(device, str):
        raise InvalidArgumentError(f"device={device!r} is not valid: expected a str")
    req = {"spirv": _bytes("spirv", spirv), "device": device, "options": opts}
    return req if asked is None else {**req, "bundle": asked}  # an older worker knows no key


def compile(
    spirv: bytes,
    *,
    device: str,
    options: Optional[Options] = None,
    bundle: Optional[tuple] = None,
    **changes: Unpack[OptionValues],
) -> CompileResult:
    """Compile SPIR-V to a zebin for ``device`` (an ocloc device name such as ``pvc``).

    ``options`` (an :class:`Options`) and keyword changes to it (``build_flags``,
    ``grf_mode``, ``num_warps``, ``kernel_name``, ``spill_policy``, ``timeout``, ...) say
    how. With ``grf_mode="default"`` and no GRF flag in ``build_flags``, a build that
    fails, or spills more than the spill policy allows (default: upstream's ``make_zebin``
    rule, any spilled byte), is retried in large GRF mode (256 registers; 512 on ``cri``
    or with ``max_grf_mode=512``), unless ``num_warps > 32``. Raises a
    :class:`BuildError` subclass naming the cause; when both attempts fail, the first
    attempt's error.

    ``speculative`` runs both GRF modes at once, the large one cancelled if the default is
    accepted (``None``, the default: when a core is idle); ``timeout``: seconds per run.

    With a remote store (``XPU_ZEBIN_REMOTE``, :mod:`xpu_zebin.remote`) a build a trusted
    key signed is taken from it; ``bundle`` (:func:`xpu_zebin.bundle.query`) asks bundles
    first. ``result.source`` says where: ``compiled``, ``cache``, ``remote`` or ``bundle``.
    """
    req = _request(spirv, device, options, bundle=bundle, **changes)
    result = _core.compile(**req)
    if not result.cached:
        _warn_once_without_worker(req["options"].ocloc)
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
    required, ``options`` and option keywords as for :func:`compile`). A failure is
    returned in its slot as the :class:`BuildError`, never raised, so one bad kernel does
    not sink the batch. ``jobs`` bounds the parallel builds (default: cores). With
    ``executor`` (any ``concurrent.futures.Executor``: a process pool, Ray's or Dask's),
    each request runs there as a :func:`compile` call instead; with ``client`` (a
    ``distributed.Client``), each is a task on that Dask cluster, and a worker lost
    mid-batch costs only a re-run of its tasks (``pip install xpu-zebin[dask]``).
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
    for ocloc in {r["options"].ocloc for r in reqs} if executor is None and client is None else ():
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
ISOLATED_ENV = _core.ISOLATED_ENV


def _isolated_default() -> bool:
    """``XPU_ZEBIN_ISOLATED`` (default on); a non-boolean raises, as every knob does."""
    return _core.bool_knob(ISOLATED_ENV, True)


def _load_request(
    binary: bytes,
    kernel_name: str,
    *,
    is_spv: bool = True,
    device: int = 0,
    options: Optional[Options] = None,
    **changes: Any,
) -> dict:
    opts = _options(options, changes)
    if opts.kernel_name is not None and opts.kernel_name != kernel_name:
        raise InvalidArgumentError(
            f"options.kernel_name={opts.kernel_name!r} differs from kernel_name={kernel_name!r}",
            kind="invalid_argument",
        )
    if not isinstance(device, int) or isinstance(device, bool) or not 0 <= device < 2**32:
        raise InvalidArgumentError(f"device={device!r} is not valid: expected a device index")
    if not isinstance(kernel_name, str):
        raise InvalidArgumentError(f"kernel_name={kernel_name!r} is not valid: expected a str")
    if not isinstance(is_spv, bool):
        raise InvalidArgumentError(f"is_spv={is_spv!r} is not valid: expected True or False")
    return {
        "binary": _bytes("binary", binary),
        "kernel_name": kernel_name,
        "is_spv": is_spv,
        "device": device,
        "options": opts,
    }


def compile_and_load(
    binary: bytes,
    kernel_name: str,
    *,
    is_spv: bool = True,
    device: int = 0,
    options: Optional[Options] = None,
    **changes: Unpack[OptionValues],
) -> LoadedKernel:
    """Build ``binary`` with the Level Zero driver and load ``kernel_name`` from it.

    SPIR-V (``is_spv=True``) without an explicit GRF flag is retried in large GRF mode when
    the build fails or spills more than the spill policy allows (default: upstream's
    ``load_binary`` rule, more than 16 32-bit slots per lane), as upstream Triton's
    ``load_binary`` does; a native zebin is loaded as it is. ``n_spills`` is upstream's
    number (``spillMemSize / (4 * simd_size)``), ``spill_bytes`` the bytes. The result owns
    the module and kernel handles (``close()`` or a ``with`` block releases them). A SPIR-V
    build's native binary is cached, so a warm load skips the JIT.

    SPIR-V is compiled in a worker process (``isolated``, the default): an input that
    crashes the driver's compiler raises :class:`CompilerCrashError` and this process goes
    on; only the driver's native binary is loaded here. A native binary you pass is loaded
    in a worker first (the driver's loader can die on a malformed one), once per binary
    and device with the cache on. ``isolated=False`` (or ``XPU_ZEBIN_ISOLATED=0``) does
    both inside this process, which such an input ends: for trusted kernels only.
    ``options`` and keyword changes to it are as for :func:`compile`.
    """
    req = _load_request(
        binary, kernel_name, is_spv=is_spv, device=device, options=options, **changes
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
    ``kernel_name`` required, ``options`` and option keywords as for :func:`compile`).
    SPIR-V builds run in up to ``jobs`` worker processes at once (default: cores); a
    failure is returned in its slot as the :class:`BuildError`. ``progress=True`` shows a
    progress bar; a callable is called with each finished index.
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


def _run_on_executor(
    executor: Executor, reqs: List[dict], callback: Optional[Callable[[int], None]]
) -> List[Union[CompileResult, BuildError]]:
    futures = [executor.submit(batch_task, r, os.getpid()) for r in reqs]
    for i, f in enumerate(futures):
        f.add_done_callback(lambda _f, i=i: callback(i) if callback else None)
    return [f.result() for f in futures]


# Earlier releases' names: a task pickled by one (a Dask cluster mid-upgrade) still runs.
_batch_task = batch_task

#: Modules moved into xpu_zebin.triton, still attributes here (a DeprecationWarning each).
_MOVED_MODULES = ("autotune", "triton_cache")


def __getattr__(name: str) -> Any:
    if name not in _MOVED_MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return importlib.import_module(f"{__name__}.{name}")
