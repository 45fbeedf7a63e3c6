"""Autotuning at full width: every config of a ``@triton.autotune`` kernel compiled at once.

Triton's autotuner compiles its candidates lazily, one by one, inside its benchmarking loop
(each config's first launch pays Triton's front end and IGC in turn). With the drop-in
active (``XPU_ZEBIN_TRITON=1`` or :func:`xpu_zebin.triton.install`), the first call of an
``Autotuner`` for a key compiles all its pruned configs before benchmarking them: Triton's
front end through Triton's own ``JITFunction.run(warmup=True)`` (the same compile, options
and cache entries the benchmark's launches make), then every native build concurrently
through the package (``compile_many``: the GRF ladder, the binary cache, host-wide core
slots). The benchmark then runs in Triton's order, exactly as before, and each launch finds
its kernel compiled: the drop-in ``load_binary`` gets its native binary from the cache.

Same answer as sequential: the same configs are benchmarked (this only runs where Triton
prunes them, and Triton's own code benchmarks them), a config whose compile fails fails
the same way in its benchmark (a failed native build is handed to that benchmark once, so
it is not paid twice) and is skipped as Triton skips it, and the choice is Triton's. Keys
seen again are Triton's cache hits: nothing is compiled.

``XPU_ZEBIN_AUTOTUNE_JOBS``: parallel native builds, ``0`` (default) as many as cores,
``1`` off. Upstream's ``TRITON_AUTOTUNING_COMPILE_WORKERS`` (triton-lang/triton #9612,
#11847, not merged) is honoured where ours is unset.

Triton versions: triton-xpu 3.3's ``Autotuner.prune_configs(kwargs)`` (positional
arguments in ``self.nargs``) and upstream main's ``prune_configs(kwargs, nargs)``.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Tuple

import xpu_zebin

from .errors import BuildError

logger = logging.getLogger("xpu_zebin.autotune")

JOBS_ENV = "XPU_ZEBIN_AUTOTUNE_JOBS"
UPSTREAM_JOBS_ENV = "TRITON_AUTOTUNING_COMPILE_WORKERS"
#: A Dask scheduler's address: the native builds run on that cluster.
SCHEDULER_ENV = "XPU_ZEBIN_AUTOTUNE_SCHEDULER"
#: Builds waiting for their benchmark are bounded in number and bytes; beyond, the oldest
#: is forgotten (its benchmark compiles it again: slower, never wrong).
MAX_PENDING = 256
MAX_PENDING_BYTES = 256 << 20

_installed: List[Tuple[type, Any]] = []
_client: Any = None


@dataclass(frozen=True)
class Prebuilt:
    """A native build made for a benchmark: its binary and flags, or its error."""

    binary: bytes = b""
    build_flags: str = ""
    error: Optional[BuildError] = None
    #: Built elsewhere (a Dask cluster): loaded in a worker before the driver sees it.
    remote: bool = False
    #: How many configs' benchmarks it answers (configs that differ only in what does
    #: not change the SPIR-V, such as num_stages here, build once).
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
            return n if n > 0 else xpu_zebin._core.default_jobs()
        _warn_once(name, f"{name}={raw!r} is not a whole number from 0 to 1024: autotune "
                   "configs are compiled one by one, as Triton does")  # fmt: skip
        return 1
    return xpu_zebin._core.default_jobs()


def use_client(client: Any) -> None:
    """Build autotune configs on this Dask cluster (a ``distributed.Client``; None: here,
    or on ``$XPU_ZEBIN_AUTOTUNE_SCHEDULER``'s cluster)."""
    global _client
    _client = client


def _cluster() -> Any:
    if _client is not None:
        return _client
    address = os.environ.get(SCHEDULER_ENV, "").strip()
    if not address:
        return None
    from distributed import Client

    return use_client(Client(address)) or _client


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
    """Triton's own compile of one config, as its benchmark's first launch makes it (the
    same specialization, options and cache entries), without launching. None when it
    fails: the benchmark meets the same failure and Triton skips the config."""
    try:
        # The call's own arguments (Triton passes grid and warmup among them), the config's
        # meta-parameters, and no launch.
        current = {"grid": None, **kwargs, **config.all_kwargs(), "warmup": True}
        return tuner.fn.run(*args, **current)
    except Exception as e:  # the benchmark raises it again, in Triton's own handling
        logger.debug("config %s: front end failed (%s); its benchmark will say", config, e)
        return None


def _in_threads(task: Any, configs: List[Any], width: int) -> List[Any]:
    """``task(config)`` for every config, ``width`` at once, results in order. Ctrl-C
    (which only the main thread sees) cancels the compiles the threads run before it
    propagates, so no compiler outlives it."""
    with ThreadPoolExecutor(max_workers=min(width, len(configs))) as pool:
        futures = [pool.submit(task, c) for c in configs]
        try:
            wait(futures)
        except BaseException:
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
    from . import triton as drop_in

    spirv = kernel.asm.get("spv", b"")
    if not isinstance(spirv, bytes) or spirv[:4] == b"\x7fELF":
        return None
    try:
        arch = drop_in._target_device_arch({"target": kernel.metadata.target})
        arch = arch or drop_in._device_arch(0, None)
    except BuildError:
        return None
    name = kernel.metadata.name
    options = drop_in.native_options(
        name, kernel.metadata.build_flags or "", rule=drop_in.LOAD_BINARY_RULE,
        device_arch=arch,
    )  # fmt: skip
    key = drop_in.farm_key(spirv, name, arch, options)
    return key, {"spirv": spirv, "device": arch, "options": options}


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
        built = Prebuilt(result.binary, result.build_flags)
    except BuildError as e:
        built = Prebuilt(error=e)
    with _pending_lock:  # the configs that claimed it meanwhile count too
        _pending[key] = replace(built, uses=uses[key])
        _bound_pending()


def precompile(tuner: Any, configs: List[Any], kwargs: Dict[str, Any], nargs: Dict) -> None:
    """Compile every config of ``tuner`` for these arguments before its benchmark,
    ``jobs()`` at once: each config's Triton front end, then at once its native build, so
    one config's front end (which holds the GIL) runs while another's IGC does (outside
    it). With a Dask cluster, the native builds run there after the front ends."""
    from . import triton as drop_in

    width = jobs()
    if width <= 1 or len(configs) < 2 or not drop_in._offline_usable():
        return
    args = list(nargs.values())  # positional arguments, in the kernel's order
    client = _cluster()
    started = time.perf_counter()
    drop_in._warm_triton()
    _create_binder(tuner.fn)

    uses: Dict[str, int] = {}

    def one(config: Any) -> Optional[Tuple[str, Dict[str, Any]]]:
        kernel = _front_end(tuner, args, kwargs, config)
        native = _native_request(kernel) if kernel is not None else None
        if native is not None and client is None:
            _build(*native, uses)
            return None
        return native

    claimed = [r for r in _in_threads(one, configs, width) if r is not None]
    remote = list(dict(claimed).items())  # one build per key
    if remote:
        results = xpu_zebin.compile_many([r for _, r in remote], client=client)
        for (key, _), result in zip(remote, results):
            count = sum(1 for k, _ in claimed if k == key)
            if isinstance(result, BuildError):
                _keep(key, Prebuilt(error=result, uses=count))
            else:
                _keep(key, Prebuilt(result.binary, result.build_flags, True, count))
    logger.info("%s: %d configs compiled before benchmarking in %.2f s%s",
                getattr(tuner.base_fn, "__name__", "kernel"), len(configs),
                time.perf_counter() - started, " (native builds on the Dask cluster)"
                if remote else "")  # fmt: skip


def install(cls: Any = None) -> None:
    """Compile an ``Autotuner``'s pruned configs at once before it benchmarks them
    (``cls``: Triton's ``Autotuner``). Idempotent; :func:`uninstall` undoes it."""
    if cls is None:
        from triton.runtime.autotuner import Autotuner as cls
    if any(c is cls for c, _ in _installed):
        return
    original = cls.prune_configs

    def prune_configs(self: Any, kwargs: Dict, *rest: Any) -> List[Any]:
        pruned = original(self, kwargs, *rest)
        nargs = rest[0] if rest else getattr(self, "nargs", None)
        if isinstance(nargs, dict):
            try:
                precompile(self, list(pruned), kwargs, nargs)
            except KeyboardInterrupt:
                raise
            except Exception as e:  # never worse: Triton compiles them itself, one by one
                logger.warning("autotune configs not compiled at once: %s", e)
        return pruned

    prune_configs.__wrapped__ = original  # type: ignore[attr-defined]
    cls.prune_configs = prune_configs
    _installed.append((cls, original))


def uninstall() -> None:
    while _installed:
        cls, original = _installed.pop()
        cls.prune_configs = original
