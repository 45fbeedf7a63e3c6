"""How every path asks for a native build: the :class:`~Options` of the drop-in
``load_binary`` (and of a sweep's prebuild, an autotune precompile and a bundle's entries,
which must find the same builds), of the drop-in ``make_zebin``, and upstream's spill rule
of each (docs/design.md §2). One module, so that the keys of the paths cannot drift apart.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
from types import ModuleType
from typing import Any, Callable, Dict, Optional, Tuple

from . import _core
from ._core import Options
from .errors import BuildError, InvalidArgumentError

#: Triton's knob for the device architecture, honoured when no other source names it.
DEVICE_ARCH_ENV = "TRITON_INTEL_DEVICE_ARCH"

#: Upstream's spill rule of each path it has, from the package's table (src/spill.rs):
#: the current upstream line (#8147) unless ``XPU_ZEBIN_SPILL_POLICY`` names another.
LOAD_BINARY_RULE = "upstream:load_binary"

MAKE_ZEBIN_RULE = "upstream:make_zebin"

MAKE_ZEBIN_ROLLING_RULE = "upstream:make_zebin-rolling"

#: Where upstream main's backend exports its own gate (#8147).
BACKEND_MODULE = "triton.backends.intel.compiler"

logger = logging.getLogger("xpu_zebin.triton")

_said: set = set()
_said_lock = threading.Lock()


def _say_once(key: Any, message: str, *args: Any) -> None:
    with _said_lock:
        if key in _said:
            return
        _said.add(key)
    logger.warning(message, *args)


def _backend_module(backend: Any = None) -> Optional[ModuleType]:
    """The module of the installed XPU backend: ``backend``'s (a module, a backend class or
    one of its objects), else ``triton.backends.intel.compiler`` when Triton has one."""
    if isinstance(backend, ModuleType):
        return backend
    if backend is not None:
        cls = backend if isinstance(backend, type) else type(backend)
        # A user's subclass of upstream's backend keeps upstream's gate: walk the bases.
        modules = [sys.modules.get(c.__module__) for c in cls.__mro__]
        with_gate = [m for m in modules if callable(getattr(m, "accepts_default_grf", None))]
        return (with_gate or modules)[0]
    found = sys.modules.get(BACKEND_MODULE)
    if found is not None:
        return found
    try:
        return importlib.import_module(BACKEND_MODULE)
    except Exception:  # no Triton, no Intel backend, or one that cannot load here
        return None


def installed_gate(backend: Any = None) -> Optional[Callable[[int, bool], Any]]:
    """The installed backend's own rebuild gate, ``accepts_default_grf(spill_size, is_lts)``
    (upstream main since #8147, beside ``REBUILD_SPILL_BYTES_PER_THREAD``), or None."""
    module = _backend_module(backend)
    gate = getattr(module, "accepts_default_grf", None)
    constant = getattr(module, "REBUILD_SPILL_BYTES_PER_THREAD", None)
    if callable(gate) and isinstance(constant, int) and not isinstance(constant, bool):
        return gate
    return None


#: Spill sizes the gate is checked at, beside its own boundary: upstream's unit table's
#: values (#8147) and the edges of every earlier rule.
_PROBES = (0, 1, 63, 64, 65, 128, 959, 960, 1000, 1001, 1023, 1024, 1025, 1408, 2047, 2048,
           2175, 2176, 4096, 65536, 262144, 1 << 20, 1 << 30)  # fmt: skip


# (id of the gate, LTS, the module's constant) -> (the gate, its rule): a gate whose
# constant moves is asked again; failures are never kept.
_gate_rules: Dict[Tuple[int, bool, Any], Tuple[Any, str]] = {}
_gate_lock = threading.Lock()


def rule_from_gate(
    gate: Callable[[int, bool], Any], lts: bool, constant: Any = None
) -> Optional[str]:
    """The engine's rule that answers as ``gate`` does for ``lts``: ``any``, ``never`` or
    ``min-bytes:N`` (found by bisection, then checked at upstream's unit-table values and
    the edges of every earlier rule); None when the gate is no such threshold, answers
    other than ``True``/``False``, or fails (then the package's table answers). A gate
    that changes its mind only between the probes is not seen. ``constant``: the module's
    ``REBUILD_SPILL_BYTES_PER_THREAD``, so a moved constant is asked again."""
    key = (id(gate), bool(lts), constant)
    with _gate_lock:
        known = _gate_rules.get(key)
    if known is not None and known[0] is gate:
        return known[1]
    rule = _derive_rule(gate, bool(lts))
    if rule is not None:
        with _gate_lock:
            _gate_rules[key] = (gate, rule)
    return rule


def _derive_rule(gate: Callable[[int, bool], Any], lts: bool) -> Optional[str]:
    def rebuilds(spill: int) -> bool:
        answer = gate(spill, lts)
        if type(answer).__name__ not in ("bool", "bool_"):  # numpy's bool too
            raise TypeError(f"accepts_default_grf answered {answer!r}, not a bool")
        return not answer

    try:
        if rebuilds(0):
            return None  # a rebuild with no spill at all: no rule of the engine's
        top = 1 << 40
        if not rebuilds(top):
            rule, first = "never", None
        else:
            low, high = 0, top  # low keeps, high rebuilds
            while high - low > 1:
                middle = (low + high) // 2
                low, high = (low, middle) if rebuilds(middle) else (middle, high)
            rule, first = ("any" if high == 1 else f"min-bytes:{high}"), high
        probes = _PROBES + ((first - 1, first, first + 1) if first else ())
        for spill in probes:
            if rebuilds(spill) != (first is not None and spill >= first and spill > 0):
                return None
    except Exception:
        return None
    return rule


def rule_in_force(upstream_rule: str, backend: Any = None) -> Tuple[Optional[str], str]:
    """The spill policy a drop-in asks the engine for on upstream's path ``upstream_rule``
    (``upstream:load_binary``, ``upstream:make_zebin``, ``upstream:make_zebin-rolling``),
    and where it comes from. With ``XPU_ZEBIN_SPILL_POLICY`` unset or ``upstream``: the
    installed backend's own gate where it exports one (driver.c takes no LTS input, so
    ``load_binary``'s is the gate's rolling answer: #8147), else the package's table at
    upstream's current line. ``upstream@LINE`` chooses an older line for the same path;
    any other value is the engine's to read (None)."""
    chosen = os.environ.get(_core.SPILL_POLICY_ENV, "").strip().lower()
    path = upstream_rule.split(":", 1)[1]
    if chosen in ("", "upstream"):
        gate = installed_gate(backend)
        if gate is not None:
            constant = getattr(_backend_module(backend), "REBUILD_SPILL_BYTES_PER_THREAD", None)
            rule = rule_from_gate(gate, path == "make_zebin", constant)
            module = getattr(gate, "__module__", BACKEND_MODULE)
            if rule is not None:
                return rule, f"installed backend ({module}.accepts_default_grf)"
            _say_once(
                ("gate", module),
                "xpu-zebin: %s.accepts_default_grf is not a spill threshold this package can "
                "follow; its own table (upstream line %s) decides",
                module, _core.spill_rules()["current_line"],
            )  # fmt: skip
        return upstream_rule, f"table (upstream line #{_core.spill_rules()['current_line']})"
    if chosen.startswith("upstream@") and ":" not in chosen:
        _core.spill_rules()  # a line that does not exist: an error naming the variable
        return f"{chosen}:{path}", f"table ({_core.SPILL_POLICY_ENV}={chosen})"
    return None, f"{_core.SPILL_POLICY_ENV}={chosen}"


def spill_policy(upstream_rule: str, backend: Any = None) -> Optional[str]:
    """The policy a drop-in passes for upstream's path ``upstream_rule``
    (:func:`rule_in_force`); None: the environment's policy, which the engine reads."""
    return rule_in_force(upstream_rule, backend)[0]


def native_options(
    name: Optional[str],
    build_flags: str,
    *,
    rule: str,
    grf_mode: Any = "default",
    num_warps: Optional[int] = None,
    device_arch: Optional[str] = None,
    max_grf_mode: Optional[str] = None,
    backend: Any = None,
) -> Options:
    """The one place the drop-ins build their :class:`~Options`: every path
    (``load_binary``, ``make_zebin``, a sweep's prebuild) asks for one kernel the same
    way, so they share cache entries when the answer is the same. ``backend``: the XPU
    backend whose own spill gate applies (:func:`rule_in_force`)."""
    return Options(
        build_flags=build_flags or "",
        grf_mode=grf_mode if isinstance(grf_mode, str) else "default",  # 3.3: a tuple
        num_warps=num_warps,
        kernel_name=name or None,
        device_arch=device_arch or os.environ.get(DEVICE_ARCH_ENV, "").strip() or None,
        max_grf_mode=max_grf_mode,
        spill_policy=spill_policy(rule, backend),
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


def lts_answer(backend: Any, options: Any = None) -> Tuple[bool, str]:
    """Is the driver a kernel is compiled for an LTS one, and who says so, as upstream
    decides it per kernel: ``XPUOptions.is_lts`` (set from ``properties['is_lts']``), else
    the backend's ``properties['is_lts']``, else its static ``is_lts(driver_version)``
    (main since 2026-08: unknown or below 1.6.35096.9 is LTS); with none of them, LTS,
    upstream's answer for a driver it cannot tell."""
    value = getattr(options, "is_lts", None)
    if isinstance(value, bool):
        return value, "XPUOptions.is_lts"
    if isinstance(getattr(backend, "is_lts", None), bool):  # an answer, not a method
        return backend.is_lts, "the backend's is_lts"
    properties = getattr(backend, "properties", None)
    properties = properties if isinstance(properties, dict) else {}
    if isinstance(properties.get("is_lts"), bool):
        return properties["is_lts"], "properties['is_lts']"
    version = properties.get("driver_version")
    if version is None:
        arch = getattr(getattr(backend, "target", None), "arch", None)
        version = arch.get("driver_version") if isinstance(arch, dict) else None
    is_lts = getattr(backend, "is_lts", None)
    if callable(is_lts):
        for args in ((version,), ()):  # main's static is_lts(ver); an older is_lts()
            try:
                return bool(is_lts(*args)), f"is_lts({', '.join(map(repr, args))})"
            except Exception:
                continue
    return True, "unknown driver: LTS, as upstream assumes"


def driver_is_lts(backend: Any, options: Any = None) -> bool:
    """:func:`lts_answer` without who said it."""
    return lts_answer(backend, options)[0]


def make_zebin_options(
    metadata: dict,
    options: Any,
    device_arch: Optional[str],
    *,
    lts: bool = True,
    backend: Any = None,
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
        backend=backend,
    )


def rules_report(driver_version: Optional[str] = None) -> dict:
    """The spill rule in force on each path and where it comes from (the installed
    backend's gate or the package's table), and the LTS answer a driver of
    ``driver_version`` gets from the installed backend: what ``xpu-zebin doctor`` shows."""
    module = _backend_module()
    backend = getattr(module, "XPUBackend", None)
    is_lts = getattr(backend, "is_lts", None)
    lts, lts_source = True, "the installed backend cannot tell (no is_lts): LTS, as upstream"
    if callable(is_lts):
        try:
            lts = bool(is_lts(driver_version))
            lts_source = f"{module.__name__}.XPUBackend.is_lts({driver_version!r})"
        except Exception as e:  # another Triton's signature
            lts_source = f"is_lts failed ({e}): LTS, as upstream assumes"

    def path(upstream_rule: str, engine_path: str) -> dict:
        policy, source = rule_in_force(upstream_rule)
        rule = _core.spill_rules(policy)[engine_path]
        return {"rule": rule["name"], "describe": rule["describe"], "source": source}

    try:
        table = _core.spill_rules()
        paths = {
            "load_binary": path(LOAD_BINARY_RULE, "jit"),
            "make_zebin": path(MAKE_ZEBIN_RULE if lts else MAKE_ZEBIN_ROLLING_RULE, "offline"),
        }
    except BuildError as e:  # a bad XPU_ZEBIN_SPILL_POLICY: doctor says so, and goes on
        return {"error": str(e), "lts": {"answer": lts, "source": lts_source,
                                         "driver": driver_version}}  # fmt: skip
    return {
        **paths,
        "compile": {"rule": table["offline"]["name"], "describe": table["offline"]["describe"]},
        "compile_and_load": {"rule": table["jit"]["name"], "describe": table["jit"]["describe"]},
        "lts": {"answer": lts, "source": lts_source, "driver": driver_version},
        "current_line": table["current_line"],
        "last_checked": table["last_checked"],
        "lines": table["lines"],
    }
