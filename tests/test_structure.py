"""The source's shape, checked: no dependency cycle between the engine's modules, no Python
function over 80 lines (Rust: clippy's `too_many_lines`, 80 in clippy.toml), and every
design note the code cites exists in the repository."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _module_dependencies() -> dict:
    deps: dict = {}
    for path in (ROOT / "src").rglob("*.rs"):
        parts = list(path.relative_to(ROOT / "src").with_suffix("").parts)
        if parts[-1] == "mod":
            parts = parts[:-1]
        if parts in (["lib"], []) or parts[-1] == "tests":  # a module's tests in a file
            continue
        code = path.read_text().split("#[cfg(test)]")[0]  # tests may use anything
        used = set(re.findall(r"crate::(\w+)", code)) - {parts[0]}
        deps.setdefault(parts[0], set()).update(used)
    return deps


def test_no_module_dependency_cycle():
    deps = _module_dependencies()
    assert "engine" in deps and "ladder" in deps
    cycles = _in_cycles(deps)
    assert cycles == [], f"modules in a dependency cycle: {cycles}"


def _in_cycles(deps: dict) -> list:
    """The modules that reach themselves through their dependencies."""

    def reaches(start: str, goal: str, seen: set) -> bool:
        for d in deps.get(start, ()):
            if d == goal or (d not in seen and (seen.add(d) or reaches(d, goal, seen))):
                return True
        return False

    return sorted(m for m in deps if reaches(m, m, set()))


def test_cited_design_notes_exist():
    notes = (ROOT / "docs" / "design.md").read_text()
    sections = set(re.findall(r"^## (\d+)\.", notes, re.M))
    cited = []
    for path in [*ROOT.glob("src/**/*.rs"), *ROOT.glob("python/**/*.py"), *ROOT.glob("tests/*.py"),
                 *ROOT.glob("scripts/*")]:  # fmt: skip
        text = path.read_text(errors="replace")
        assert "DESIGN.md" not in text or path.name == "test_structure.py", path
        cited += [(path.name, s) for s in re.findall(r"docs/design\.md §(\d+)", text)]
    assert cited, "the code cites its design notes"
    assert [c for c in cited if c[1] not in sections] == []


def test_no_python_function_over_80_lines():
    import ast

    long = []
    for path in [*ROOT.glob("python/**/*.py"), *ROOT.glob("benches/*.py"),
                 *ROOT.glob("scripts/*.py"), *ROOT.glob("docs/*.py")]:  # fmt: skip
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 80:
                    long.append(f"{path.name}:{node.name} ({lines} lines)")
    assert long == []


def _python_imports() -> dict:
    """Each module of the package and the package modules it imports (at its top or in a
    function): ``from . import x`` depends on ``x``, not on the package it is in."""
    import ast

    root = ROOT / "python"

    def name_of(path: pathlib.Path) -> str:
        parts = list(path.relative_to(root).with_suffix("").parts)
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    modules = {name_of(p): p for p in root.glob("xpu_zebin/**/*.py")}

    def known(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    deps: dict = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        used = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                used.update(known(a.name) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                for a in node.names:  # a submodule by name, else the module itself
                    used.add(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else known(base))
        # A module's own packages are imported with it: not a dependency of its own.
        deps[name] = {d for d in used if d and d != name and not name.startswith(d + ".")}
    return deps


def test_no_python_import_circle():
    """No two modules of the package import each other, directly or through others, not
    even inside a function (a lazy import hides a circle; it does not remove it)."""
    deps = _python_imports()
    assert "xpu_zebin.triton.dropin" in deps and "xpu_zebin.bundle.lookup" in deps
    assert _in_cycles(deps) == []


def test_bundles_know_nothing_of_triton_and_modules_stay_small():
    """``xpu_zebin.bundle`` imports nothing of ``xpu_zebin.triton`` (its deprecated names
    are looked up by name, for one release); no Python module over ~450 lines and no Rust
    file over ~600: signals of mixed concerns."""
    deps = _python_imports()
    bundle = {d for m, ds in deps.items() if m.startswith("xpu_zebin.bundle") for d in ds}
    assert [d for d in bundle if d.startswith("xpu_zebin.triton")] == []
    long = [
        f"{p.relative_to(ROOT)} ({n})"
        for pattern, limit in (("python/**/*.py", 450), ("src/**/*.rs", 600))
        for p in ROOT.glob(pattern)
        if (n := len(p.read_text().splitlines())) > limit and p.name != "tests.rs"
    ]
    assert long == []


def test_renamed_names_still_answer_with_a_deprecation_warning():
    import warnings

    import xpu_zebin.triton as xt
    from xpu_zebin import bundle

    moved = {
        "install": xt.import_bundle,
        "install_triton_entries": xt.import_triton_entries,
        "triton_cache_kernels": xt.kernels_in_cache,
        "precompile_triton": xt.precompile_kernel,
        "check_triton_kernel": xt.check_kernel,
        "triton_cache": xt.cache_entries,
    }
    for old, new in moved.items():
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            assert getattr(bundle, old) is new
        assert [w.category for w in said] == [DeprecationWarning], old
    import xpu_zebin.autotune
    import xpu_zebin.triton_cache

    assert xpu_zebin.autotune is xt.autotune and xpu_zebin.triton_cache is xt.cache_entries


def test_moved_modules_are_attributes_and_the_cli_runs_as_a_module():
    import subprocess
    import sys
    import warnings

    import xpu_zebin
    import xpu_zebin.triton as xt

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert xpu_zebin.autotune.use_client is xt.autotune.use_client  # as once documented
        assert xpu_zebin.triton_cache is xt.cache_entries
    assert xpu_zebin._batch_task is xpu_zebin._tasks.batch_task  # pickled by older releases
    for module in ("xpu_zebin", "xpu_zebin.cli"):
        run = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True,
                             text=True, timeout=120)  # fmt: skip
        assert run.returncode == 0 and run.stdout.startswith("xpu-zebin "), run.stderr


#: Modules that may read a file another way than ``_files.read_regular``, and why.
UNBOUNDED_READS_ALLOWED = {
    "_files.py": "the one bounded reader: regular files only, never a FIFO, at most a limit",
}


def test_every_file_read_goes_through_the_bounded_reader():
    """No module of the package reads a file it is given without a bound (issue 33): no
    ``read_bytes``/``read_text``, no ``open`` of any kind, no ``.read()`` to the end, no
    ``json.load``/``pickle.load`` of a file object; ``_files.read_regular`` does it."""
    import ast

    def unbounded(call: ast.Call) -> str:
        f = call.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        owner = getattr(getattr(f, "value", None), "id", "")
        if name in ("read_bytes", "read_text", "open", "fdopen", "readlines", "fromfile"):
            return name
        if name == "read" and not call.args and not call.keywords:
            return ".read()"
        if name == "load" and owner in ("json", "pickle", "marshal", "tomllib", "yaml"):
            return f"{owner}.load"
        return ""

    modules = [p for p in ROOT.glob("python/**/*.py") if p.name not in UNBOUNDED_READS_ALLOWED]
    assert len(modules) > 20 and (ROOT / "python/xpu_zebin/_files.py").is_file()
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno} {what}"
        for path in modules
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and (what := unbounded(node))
    ]
    assert found == [], "read through xpu_zebin._files.read_regular"


def test_every_module_kept_whole_exists():
    """tests/conftest.py's ONE_WORKER_MODULES names test files in tests/: a renamed one
    would silently be split across workers again."""
    from conftest import ONE_WORKER_MODULES

    assert ONE_WORKER_MODULES
    assert all((ROOT / "tests" / module).is_file() for module in ONE_WORKER_MODULES)
