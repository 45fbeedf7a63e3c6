"""Triton's front end as the package drives it: the JIT function under its wrappers, a
config's constexprs and options, the source object for one config, and what makes Triton
safe for threads to race through (its one-time set-up, ``ast.parse`` in turns)."""

from __future__ import annotations

import ast
import functools
import logging
import sys
import threading
from typing import Any, Dict, Optional, Tuple

from ..errors import InvalidArgumentError

logger = logging.getLogger("xpu_zebin.triton")

# CPython before 3.11.8 and 3.12.2 keeps ast.parse's recursion count in one state shared by
# every thread: a thread switch inside a parse (a finalizer run by the garbage collector)
# fails another thread's parse with "SystemError: AST constructor recursion depth
# mismatch" (python/cpython#106905, fixed by #113035). Triton parses each kernel's source
# at every compile (JITFunction.parse), so configs compiled on threads hit it (seen here on
# 3.11.7), where Triton's own one-at-a-time autotuner does not.
AST_PARSE_RACES = sys.version_info < (3, 11, 8) or (3, 12) <= sys.version_info < (3, 12, 2)
_AST_TURNS = threading.RLock()  # reentrant: a finalizer run inside a parse may parse too


def jit_function(fn: Any) -> Any:
    """The JITFunction under an autotuner or heuristics wrapper."""
    from triton.runtime.jit import JITFunction

    while not isinstance(fn, JITFunction):
        inner = getattr(fn, "fn", None)
        if inner is None:
            raise TypeError(f"{fn!r} is not a Triton kernel (@triton.jit or @triton.autotune)")
        fn = inner
    return fn


def split_config(config: Any) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(constexpr values, compile options) of a ``triton.Config`` or a dict of both."""
    if isinstance(config, dict):
        options = dict(config)
        constants = dict(options.pop("constexprs", None) or options.pop("kwargs", None) or {})
        return constants, options
    options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    for name in ("num_ctas", "maxnreg"):
        value = getattr(config, name, None)
        if value is not None and (name != "num_ctas" or value != 1):
            options[name] = value
    return dict(config.kwargs), options


def warm_triton() -> None:
    """Triton's one-time set-up, before threads race through it: its cache key reads
    sysconfig's config vars, whose first, lazy initialisation is not thread-safe (seen
    here: ``EXT_SUFFIX`` None in a concurrent first call); and ``ast.parse`` in turns where
    CPython's races (``parse_in_turns``)."""
    import sysconfig

    parse_in_turns()

    sysconfig.get_config_vars()
    try:
        from triton.compiler.compiler import triton_key
    except ImportError:  # other Triton versions: sysconfig above is the known race
        return
    triton_key()


def parse_in_turns() -> None:
    """On a CPython whose ``ast.parse`` races between threads (``AST_PARSE_RACES``), make
    every parse in the process take turns, once and for good: the result is the same, and
    a parse is short next to a compile."""
    if not AST_PARSE_RACES or getattr(ast.parse, "_xpu_zebin_in_turns", False):
        return
    with _AST_TURNS:
        if getattr(ast.parse, "_xpu_zebin_in_turns", False):
            return
        unguarded = ast.parse

        @functools.wraps(unguarded)
        def parse(*args: Any, **kwargs: Any) -> Any:
            with _AST_TURNS:
                return unguarded(*args, **kwargs)

        parse._xpu_zebin_in_turns = True  # type: ignore[attr-defined]
        ast.parse = parse
        logger.debug("ast.parse takes turns between threads (python/cpython#106905)")


def kernel_source(jit: Any, signature: Dict[str, str], constexprs: Optional[Dict[str, Any]],
                   config: Any) -> Tuple[Any, Dict[str, Any]]:  # fmt: skip
    """Triton's source object for one config, and the config's compile options."""
    from triton.compiler import ASTSource

    if not isinstance(config, dict) and not hasattr(config, "kwargs"):
        raise InvalidArgumentError(f"config {config!r} is neither a dict nor a triton.Config")
    if not isinstance(signature, dict):
        raise InvalidArgumentError("the signature is a dict of argument name to Triton type")
    constants, options = split_config(config)
    constants = {**(constexprs or {}), **constants}
    names = list(jit.arg_names)
    unknown = set(constants) - set(names)
    if unknown:
        raise InvalidArgumentError(f"{jit.__name__} has no parameter(s) {sorted(unknown)}")
    missing = [n for n in names if n not in constants and n not in signature]
    if missing:
        raise InvalidArgumentError(f"the signature does not type {missing}")
    sig = {n: "constexpr" if n in constants else signature[n] for n in names}
    src = ASTSource(jit, sig, {(names.index(k),): v for k, v in constants.items()})
    return src, options
