"""``_core.pyi`` says what the native module is: every name, every class attribute, and
the types calls actually return, checked against the runtime."""

from __future__ import annotations

import ast
import pathlib
import typing

import xpu_zebin
from xpu_zebin import _core

STUB = pathlib.Path(xpu_zebin.__file__).with_name("_core.pyi")


def _stub() -> ast.Module:
    return ast.parse(STUB.read_text())


def _public(names) -> set:
    return {n for n in names if not n.startswith("_")}


def test_every_name_is_in_both():
    tree = _stub()
    declared = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            declared.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            declared.add(node.target.id)
    runtime = _public(dir(_core)) - {"bindings"}
    assert _public(declared) == runtime


def test_every_class_attribute_exists():
    for node in _stub().body:
        if not isinstance(node, ast.ClassDef):
            continue
        cls = getattr(_core, node.name)
        for item in node.body:
            name = None
            if isinstance(item, ast.FunctionDef) and not item.name.startswith("__"):
                name = item.name
            elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                name = item.target.id
            if name is not None:
                instance_only = isinstance(item, ast.AnnAssign) and node.name == "Options"
                target = _core.Options() if instance_only else cls
                assert hasattr(target, name), f"{node.name}.{name}"


def _returns() -> dict:
    """Function name -> its return annotation, evaluated in the stub's namespace."""
    namespace = {**vars(typing), "os": __import__("os"), "Path": pathlib.Path}
    namespace.update({k: getattr(_core, k) for k in dir(_core)})
    namespace["BuildError"] = xpu_zebin.BuildError
    out = {}
    for node in _stub().body:
        if isinstance(node, ast.FunctionDef) and node.returns is not None:
            out[node.name] = eval(ast.unparse(node.returns), namespace)
    return out


def _is(value, annotation) -> bool:
    origin = typing.get_origin(annotation)
    if annotation is None or annotation is type(None):
        return value is None
    if origin is typing.Union:
        return any(_is(value, a) for a in typing.get_args(annotation))
    if origin in (list, tuple, dict):
        return isinstance(value, origin)
    return isinstance(value, annotation)


def test_calls_return_what_the_stub_says(add_spirv, system_ocloc):
    returns = _returns()
    calls = {
        "find_ocloc": lambda: _core.find_ocloc(system_ocloc),
        "default_jobs": _core.default_jobs,
        "error_kinds": _core.error_kinds,
        "validate_spirv": lambda: _core.validate_spirv(add_spirv),
        "broken_workers": _core.broken_workers,
        "bool_knob": lambda: _core.bool_knob("XPU_ZEBIN_UNSET_FOR_TEST", True),
        "ze_handle_counts": _core.ze_handle_counts,
        "devices": _core.devices,
        "ocloc_worker_unavailable": lambda: _core.ocloc_worker_unavailable(system_ocloc),
        "compile": lambda: _core.compile(add_spirv, "pvc", _core.Options(ocloc=system_ocloc)),
        "compiler_identity": lambda: _core.compiler_identity(system_ocloc),
        "bundles_dir": _core.bundles_dir,
        "bundle_key": lambda: _core.bundle_key(add_spirv, "add", "pvc", _core.Options(), "t"),
    }
    for name, call in calls.items():
        value = call()
        assert _is(value, returns[name]), f"{name} returned {type(value).__name__}"
    result = calls["compile"]()
    assert _is(result.n_spills, int) and _is(result.spill_size, int)
    info = _core.zebin_info(result.binary)
    assert _is(info, returns["zebin_info"])


def test_options_attributes_have_the_stub_types(system_ocloc, tmp_path):
    namespace = {**vars(typing), "os": __import__("os"), "Path": pathlib.Path}
    classes = {n.name: n for n in _stub().body if isinstance(n, ast.ClassDef)}
    full = _core.Options(
        num_warps=4, kernel_name="k", device_arch="pvc", max_grf_mode="256",
        ocloc=system_ocloc, timeout=2, cache_dir=tmp_path, spill_policy="any",
        speculative=False, isolated=True,
    )  # fmt: skip
    for options in (_core.Options(), full):
        for item in classes["Options"].body:
            if isinstance(item, ast.AnnAssign):
                annotation = eval(ast.unparse(item.annotation), namespace)
                value = getattr(options, item.target.id)
                assert _is(value, annotation), f"Options.{item.target.id} = {value!r}"
