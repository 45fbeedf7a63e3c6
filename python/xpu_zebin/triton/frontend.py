"""Triton's front end as the package drives it: the JIT function under its wrappers, a
config's constexprs and options, the source object for one config, and Triton's one-time
set-up made before threads race through it."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from ..errors import InvalidArgumentError


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
    here: ``EXT_SUFFIX`` None in a concurrent first call)."""
    import sysconfig

    sysconfig.get_config_vars()
    try:
        from triton.compiler.compiler import triton_key
    except ImportError:  # other Triton versions: sysconfig above is the known race
        return
    triton_key()


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
