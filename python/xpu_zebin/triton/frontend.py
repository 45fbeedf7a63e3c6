"""Triton's front end as the package drives it: the JIT function under its wrappers, a
config's constexprs and options, the source object for one config, and what makes Triton
safe for threads to race through (its one-time set-up, ``ast.parse`` against a race)."""

from __future__ import annotations

import ast
import functools
import logging
import sys
import threading
from typing import Any, Dict, Optional, Tuple

from ..errors import InvalidArgumentError

logger = logging.getLogger("xpu_zebin.triton")

# CPython 3.11 before 3.11.8 and 3.12 before 3.12.2 keep ast.parse's recursion count in
# one state shared by every thread: a thread switch inside a parse (a finalizer run by the
# garbage collector) fails another thread's parse of a tree it built correctly, with
# "SystemError: AST constructor recursion depth mismatch" (python/cpython#106905, fixed by
# #113035; 3.10 and older have no such count). Triton parses each kernel's source at every
# compile (JITFunction.parse), so configs compiled on threads hit it (seen here on 3.11.7),
# where Triton's own one-at-a-time autotuner does not.
AST_PARSE_RACES = (3, 11) <= sys.version_info < (3, 11, 8) or (
    (3, 12) <= sys.version_info < (3, 12, 2)
)
AST_PARSE_TRIES = 8
_RACE_MESSAGES = ("AST constructor recursion depth mismatch", "during ast construction")
_INSTALL = threading.Lock()


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
    here: ``EXT_SUFFIX`` None in a concurrent first call); and ``ast.parse`` made to parse
    again where CPython's races (``reparse_racing_parses``)."""
    import sysconfig

    reparse_racing_parses()

    sysconfig.get_config_vars()
    try:
        from triton.compiler.compiler import triton_key
    except ImportError:  # other Triton versions: sysconfig above is the known race
        return
    triton_key()


def reparse_racing_parses() -> None:
    """On a CPython whose ``ast.parse`` races between threads (``AST_PARSE_RACES``), make
    ``ast.parse`` parse again, up to ``AST_PARSE_TRIES`` times, when it fails by the race
    alone; once and for good. Each parse starts the shared count afresh, so a parse again
    gives the tree the first would have. No lock around a parse: nothing held across a
    fork or a finalizer. Code that took ``ast.parse`` into its own name before is not covered."""
    if not AST_PARSE_RACES or getattr(ast.parse, "_xpu_zebin_reparses", False):
        return
    with _INSTALL:
        if getattr(ast.parse, "_xpu_zebin_reparses", False):
            return
        racy = ast.parse

        @functools.wraps(racy)
        def parse(*args: Any, **kwargs: Any) -> Any:
            tries = 1
            while True:
                try:
                    return racy(*args, **kwargs)
                except (SystemError, RecursionError) as e:
                    if tries >= AST_PARSE_TRIES or not any(m in str(e) for m in _RACE_MESSAGES):
                        raise
                    tries += 1

        parse._xpu_zebin_reparses = True  # type: ignore[attr-defined]
        ast.parse = parse
        logger.debug("ast.parse tries again when another thread's parse spoils it "
                     "(python/cpython#106905)")  # fmt: skip


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
