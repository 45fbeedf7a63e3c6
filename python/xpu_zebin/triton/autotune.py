"""Autotuning at full width: every config of a ``@triton.autotune`` kernel compiled at once.

Triton's autotuner compiles its candidates one by one as it benchmarks them. With the drop-in
active (``XPU_ZEBIN_TRITON=1`` or :func:`xpu_zebin.triton.install`), the first call of an
``Autotuner`` for a key compiles all its pruned configs before benchmarking them: Triton's
front end through Triton's own ``JITFunction.run(warmup=True)`` (the same compile, options
and cache entries the benchmark's launches make), then every native build concurrently
through the package (``compile_many``: the GRF ladder, the binary cache, host-wide core
slots). The benchmark then runs in Triton's order, exactly as before, and each launch finds
its kernel compiled: the drop-in ``load_binary`` gets its native binary from the cache.

Same answer as sequential: the same configs are benchmarked (by Triton's own code), a
config whose compile fails fails the same way in its benchmark (a failed native build is
handed to it, not paid twice) and is skipped as Triton skips it, and the choice is
Triton's. Keys seen again are Triton's cache hits: nothing is compiled.

``XPU_ZEBIN_AUTOTUNE_JOBS``: parallel native builds, ``0`` (default) as many as cores,
``1`` off. Upstream's ``TRITON_AUTOTUNING_COMPILE_WORKERS`` (triton-lang/triton #9612,
#11847, not merged) is honoured where ours is unset.

Triton versions: triton-xpu 3.3's ``prune_configs(kwargs)`` and main's ``(kwargs, nargs)``.
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed, wait
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Tuple

import xpu_zebin

from .. import bundle
from ..build_options import load_binary_options
from ..errors import BuildError
from . import front_ends
from .frontend import warm_triton
from .host import gpu_target_arch, ocloc_arch, offline_usable

logger = logging.getLogger("xpu_zebin.autotune")

JOBS_ENV = "XPU_ZEBIN_AUTOTUNE_JOBS"
UPSTREAM_JOBS_ENV = "TRITON_AUTOTUNING_COMPILE_WORKERS"
#: A Dask scheduler's address: the native builds run on that cluster.
SCHEDULER_ENV = "XPU_ZEBIN_AUTOTUNE_SCHEDULER"
#: Builds waiting for their benchmark are bounded in number and bytes; beyond, the oldest
#: is forgotten (its benchmark compiles it again: slower, never wrong).
MAX_PENDING = 256
#: Front ends at once at most (each holds its kernel's IR); the native builds they start
#: take the host's core slots like any compile.
MAX_THREADS = 8
MAX_PENDING_BYTES = 256 << 20

_installed: List[Tuple[type, Dict[str, Any]]] = []
_client: Any = None


@dataclass(frozen=True)
class Prebuilt:
    """A native build made for a benchmark: its binary and flags, or its error."""

    binary: bytes = b""
    build_flags: str = ""
    error: Optional[BuildError] = None
    #: Built elsewhere (a Dask cluster) or a level's (a bundle, a cache others may write):
    #: loaded in a worker before the driver sees it. ``source``: ``CompileResult.source``.
    untrusted: bool = False
    source: str = ""
    #: How many configs' benchmarks it answers (configs with the same SPIR-V build once).
    uses: int = 1


_pending: collections.OrderedDict[str, Prebuilt] = collections.OrderedDict()
_pending_lock = threading.Lock()


def jobs() -> int:
    """Parallel native builds for an autotuner's configs: ``XPU_ZEBIN_AUTOTUNE_JOBS``, else
    ``TRITON_AUTOTUNING_COMPILE_WORKERS``, else as many as cores; 1 means off. A value
    that is not a whole number from 0 to 1024 is said once and means off (never worse)."""
    for name in (JOBS_ENV, UPSTREAM_JOBS_ENV):
        raw = os.environ.get(name)
        if raw is None or not raw.strip():
            continue
        text = raw.strip()
        if text.isascii() and text.isdigit() and int(text) <= 1024:
            n = int(text)
            if n > 0:
                return n
            cores = xpu_zebin._core.default_jobs()
            # Ours: as many as cores; upstream's PRs: at most 4, half the cores.
            return cores if name == JOBS_ENV else max(1, min(4, cores // 2))
        _warn_once(name, f"{name}={raw!r} is not a whole number from 0 to 1024: autotune "
                   "configs are compiled one by one, as Triton does")  # fmt: skip
        return 1
    return xpu_zebin._core.default_jobs()


def use_client(client: Any) -> None:
    """Build autotune configs on this Dask cluster (a ``distributed.Client``; None: here,
    or on ``$XPU_ZEBIN_AUTOTUNE_SCHEDULER``'s cluster)."""
    global _client
    _client = client


_unreachable: Dict[str, str] = {}


def _cluster() -> Any:
    """The Dask client to build on: :func:`use_client`'s, else one to the scheduler
    ``XPU_ZEBIN_AUTOTUNE_SCHEDULER`` names; a scheduler that cannot be reached is said
    once and the builds run here (never a wait per key)."""
    if _client is not None:
        return _client
    address = os.environ.get(SCHEDULER_ENV, "").strip()
    if not address or address in _unreachable:
        return None
    try:
        from distributed import Client

        return use_client(Client(address, timeout=10)) or _client
    except Exception as e:  # no Dask, or no scheduler there: build here
        _unreachable[address] = str(e)
        _warn_once(SCHEDULER_ENV, f"{SCHEDULER_ENV}={address!r}: {e}; autotune configs "
                   "are built on this machine")  # fmt: skip
        return None


_warned: set = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning("%s", message)


def take(key: str) -> Optional[Prebuilt]:
    """The build a precompile made for the benchmark of the request with this key
    (``xpu_zebin.triton.farm_key``: input, kernel, device, flags tried, spill rule), once
    per config that asked for it (then forgotten)."""
    with _pending_lock:
        built = _pending.get(key)
        if built is not None:
            if built.uses <= 1:
                del _pending[key]
            else:
                _pending[key] = replace(built, uses=built.uses - 1)
        return built


def _keep(key: str, built: Prebuilt) -> None:
    with _pending_lock:
        _pending[key] = built
        _bound_pending()


def _bound_pending() -> None:
    """Forget the oldest builds beyond the bounds (with the lock held)."""
    while len(_pending) > MAX_PENDING or (
        len(_pending) > 1 and sum(len(p.binary) for p in _pending.values()) > MAX_PENDING_BYTES
    ):
        _pending.popitem(last=False)


def _front_end(tuner: Any, args: List[Any], kwargs: Dict[str, Any], config: Any) -> Any:
    """Triton's own compile of one config, as its benchmark's first launch makes it, not
    launched. None when it fails: the benchmark fails the same way, and Triton skips it."""
    try:
        # The call's own arguments (grid and warmup among them), the config's, no launch.
        current = {"grid": None, **kwargs, **config.all_kwargs(), "warmup": True}
        return tuner.fn.run(*(_as_argument(a) for a in args), **current)
    except front_ends.SteppedAside:
        raise  # another process runs it: this one comes back for it (unclaimed_first)
    except Exception as e:  # the benchmark raises it again, in Triton's own handling
        logger.debug("config %s: front end failed (%s); its benchmark will say", config, e)
        return None
    finally:
        front_ends.let_go()  # a failed front end's claim: others need not wait for it


def _as_argument(arg: Any) -> Any:
    """What ``JITFunction.warmup`` makes of an argument (a ``torch.dtype`` stands for a
    tensor of it)."""
    try:
        from triton.runtime.jit import MockTensor
    except ImportError:
        return arg
    return MockTensor.wrap_dtype(arg)


def _precompilable(config: Any, kwargs: Dict[str, Any]) -> bool:
    """Can a config be compiled before its benchmark as the benchmark will? Not one with a
    ``pre_hook`` (it may change what is compiled, e.g. a descriptor's block shape), nor
    one whose meta-parameters the call also passes (Triton refuses that at once)."""
    return config.pre_hook is None and not (kwargs.keys() & config.kwargs.keys())


def _in_threads(
    task: Any,
    configs: List[Any],
    width: int,
    stop: threading.Event,
    done: Optional[Any] = None,
) -> List[Any]:
    """``task(config)`` for every config, ``width`` at once, results in order;
    ``done(config)`` here as each finishes (the pipelined benchmark). Ctrl-C stops the
    tasks not started and cancels the compiles running (``cancel_running``) before it
    propagates: no compiler outlives it."""
    with ThreadPoolExecutor(max_workers=min(width, len(configs), MAX_THREADS)) as pool:
        futures = {pool.submit(task, c): c for c in configs}
        try:
            for finished in as_completed(futures) if done else ():
                if finished.exception() is None and finished.result() is not front_ends.LATER:
                    done(futures[finished])  # (a config another process runs: later)
            wait(futures)
        except BaseException:
            stop.set()
            for f in futures:
                f.cancel()
            xpu_zebin._core.cancel_running()
            raise
    return [f.result() for f in futures]


def _create_binder(fn: Any) -> None:
    """Triton makes a kernel's argument binder lazily at its first call; made here, before
    threads race to make it."""
    from triton.runtime.driver import driver

    while fn is not None and not hasattr(fn, "device_caches"):
        fn = getattr(fn, "fn", None)  # under @triton.heuristics
    try:
        fn.device_caches[driver.active.get_current_device()]
    except Exception:  # another Triton: its first call makes it
        pass


def _native_request(kernel: Any) -> Optional[Tuple[str, Dict[str, Any]]]:
    """(key, request) of the drop-in ``load_binary``'s native build of a compiled kernel
    whose binary is SPIR-V; None when Triton made native code itself (its zebin stage,
    the package's ``make_zebin``) or the device cannot be told (the load path says so)."""
    spirv = kernel.asm.get("spv", b"")
    if not isinstance(spirv, bytes) or spirv[:4] == b"\x7fELF":
        return None
    try:
        arch = gpu_target_arch(kernel.metadata.target)
        arch = arch or ocloc_arch(0, None)
    except BuildError:
        return None
    name = kernel.metadata.name
    options = load_binary_options(name, kernel.metadata.build_flags or "", arch)
    # The engine asks the bundles first, as the load this build is made for would.
    request = {"spirv": spirv, "device": arch, "options": options,
               "bundle": bundle.query(name, 0, arch)}  # fmt: skip
    return request_key(spirv, name, arch, options), request


def request_key(spirv: bytes, name: str, device: str, options: Any) -> str:
    """What identifies a native build for a benchmark: the bundle key scheme (input,
    kernel, flags tried, spill rule) for this device and this compiler."""
    identity = xpu_zebin._core.compiler_identity(options.ocloc)
    return xpu_zebin._core.bundle_key(spirv, name, device, options, f"{device}|{identity}")


def _build(key: str, request: Dict[str, Any], uses: Dict[str, int]) -> None:
    """One config's native build, kept for its benchmark (its error too); a build another
    config of this precompile already claimed is made once, for both."""
    with _pending_lock:
        uses[key] = uses.get(key, 0) + 1
        if uses[key] > 1:
            if key in _pending:  # built already: it answers one more config
                _pending[key] = replace(_pending[key], uses=_pending[key].uses + 1)
            return
    try:
        result = xpu_zebin.compile(**request)
        built = Prebuilt(result.binary, result.build_flags, None, result.cached, result.source)
    except BuildError as e:
        if e.kind == "cancelled":  # not the input's answer: its benchmark builds it
            with _pending_lock:
                uses.pop(key, None)
            return
        built = Prebuilt(error=e)
    with _pending_lock:  # the configs that claimed it meanwhile count too
        _pending[key] = replace(built, uses=uses[key])
        _bound_pending()


def _current_device() -> Tuple[Any, Any]:
    """(the driver, the caller's device): upstream's driver keeps the device per thread
    (PyTorch's current XPU device), so worker threads are put on the caller's."""
    from triton.runtime.driver import driver

    active = driver.active
    return active, active.get_current_device()


def precompile(tuner: Any, configs: List[Any], kwargs: Dict[str, Any], nargs: Dict) -> List[str]:
    """Compile every config of ``tuner`` before its benchmark, ``jobs()`` at once: each
    config's front end (holding the GIL; those another process runs last), then at once
    its native build (outside it), or on a Dask cluster after the front ends. Returns the
    keys of the builds it left for the benchmark."""
    width = jobs()
    configs = [c for c in configs if _precompilable(c, kwargs)]
    if width <= 1 or len(configs) < 2 or not nargs or not offline_usable():
        return []
    args = list(nargs.values())  # positional arguments, in the kernel's order
    client = _cluster()
    started = time.perf_counter()
    warm_triton()
    _create_binder(tuner.fn)
    active, device = _current_device()
    stop = threading.Event()
    uses: Dict[str, int] = {}

    def one(config: Any) -> Optional[Tuple[str, Dict[str, Any]]]:
        if stop.is_set():
            return None
        setter = getattr(active, "set_current_device", None)
        if callable(setter) and active.get_current_device() != device:
            setter(device)
        kernel = _front_end(tuner, args, kwargs, config)
        if kernel is None or getattr(kernel, "module", None) is not None or stop.is_set():
            return None  # failed, or loaded already (a key whose kernels Triton has)
        native = _native_request(kernel)
        if native is not None and client is None:
            _build(*native, uses)
            return None
        return native

    bench = _early_bench(tuner, args, kwargs) if client is None and pipelined() else None
    run = functools.partial(_in_threads, width=width, stop=stop, done=bench)
    claimed = [r for r in front_ends.unclaimed_first(one, configs, run) if r is not None]
    remote = list(dict(claimed).items())  # one build per key
    if remote:
        results = xpu_zebin.compile_many([r for _, r in remote], client=client)
        for (key, _), result in zip(remote, results):
            count = sum(1 for k, _ in claimed if k == key)
            uses[key] = count
            if isinstance(result, BuildError):
                _keep(key, Prebuilt(error=result, uses=count))
            else:
                _keep(key, Prebuilt(result.binary, result.build_flags, untrusted=True,
                                    uses=count, source=result.source))  # fmt: skip
    logger.info("%s: %d configs compiled before benchmarking in %.2f s%s",
                getattr(tuner.base_fn, "__name__", "kernel"), len(configs),
                time.perf_counter() - started, " (native builds on the Dask cluster)"
                if remote else "")  # fmt: skip
    return list(uses)


PIPELINE_ENV = "XPU_ZEBIN_AUTOTUNE_PIPELINE"
#: Timings measured as soon as a config was built, for the autotuner's own loop to take.
_timed: Dict[Tuple[int, int], Any] = {}


def pipelined() -> bool:
    """``XPU_ZEBIN_AUTOTUNE_PIPELINE=1``: each config is benchmarked as soon as it is
    built, on the caller's thread, while others still build (off by default, as in
    upstream's PR: the benchmark then shares the host with the compilers)."""
    return xpu_zebin._core.bool_knob(PIPELINE_ENV, False)


def _early_bench(tuner: Any, args: List[Any], kwargs: Dict[str, Any]) -> Any:
    """Benchmark one built config now, with Triton's own ``_bench``; the autotuner's loop
    then takes the timing instead of measuring again (the same configs, order of choice
    and timings)."""

    def bench(config: Any) -> None:
        _timed[(id(tuner), id(config))] = tuner._bench(*args, config=config, **kwargs)

    return bench


def _forget(keys: List[str]) -> None:
    """Builds a precompile left that no benchmark took (a bundle answered, the driver's
    compiler built it): dropped when the autotuner's call ends."""
    with _pending_lock:
        for key in keys:
            _pending.pop(key, None)


_tuning = threading.local()


def install(cls: Any = None) -> None:
    """Compile an ``Autotuner``'s pruned configs at once before it benchmarks them
    (``cls``: Triton's ``Autotuner``). Only inside its own ``run`` (on a key it has not
    seen) and ``warmup``: other callers of ``prune_configs`` (a subclass, a tool asking
    which configs there are) get Triton's answer and nothing compiled. Not with
    ``cache_results`` (Triton's disk cache may answer without benchmarking). Idempotent;
    :func:`uninstall` undoes it."""
    if cls is None:
        from triton.runtime.autotuner import Autotuner as cls
    if any(c is cls for c, _ in _installed):
        return
    originals = {name: getattr(cls, name) for name in ("prune_configs", "run", "warmup", "_bench")}

    def prune_configs(self: Any, kwargs: Dict, *rest: Any) -> List[Any]:
        pruned = originals["prune_configs"](self, kwargs, *rest)
        nargs = rest[0] if rest else getattr(self, "nargs", None)
        calls = getattr(_tuning, "calls", None)
        if calls and calls[-1] is self and isinstance(nargs, dict):
            if getattr(self, "cache_results", False):
                return pruned
            try:
                _tuning.left = precompile(self, list(pruned), kwargs, nargs)
            except KeyboardInterrupt:
                raise
            except Exception as e:  # never worse: Triton compiles them itself, one by one
                logger.warning("autotune configs not compiled at once: %s", e)
        return pruned

    def entered(name: str) -> Any:
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            calls = _tuning.__dict__.setdefault("calls", [])
            calls.append(self)
            try:
                return originals[name](self, *args, **kwargs)
            finally:
                calls.pop()
                _forget(_tuning.__dict__.pop("left", []))
                for key in [k for k in _timed if k[0] == id(self)]:
                    del _timed[key]

        method.__wrapped__ = originals[name]  # type: ignore[attr-defined]
        return method

    def _bench(self: Any, *args: Any, config: Any, **meta: Any) -> Any:
        timed = _timed.pop((id(self), id(config)), None)  # measured as soon as it was built
        return timed if timed is not None else originals["_bench"](self, *args, config=config,
                                                                   **meta)  # fmt: skip

    prune_configs.__wrapped__ = originals["prune_configs"]  # type: ignore[attr-defined]
    _bench.__wrapped__ = originals["_bench"]  # type: ignore[attr-defined]
    cls.prune_configs, cls._bench = prune_configs, _bench
    cls.run, cls.warmup = entered("run"), entered("warmup")
    _installed.append((cls, originals))


def uninstall() -> None:
    while _installed:
        cls, originals = _installed.pop()
        for name, original in originals.items():
            setattr(cls, name, original)
