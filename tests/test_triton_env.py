"""Activation by environment: ``XPU_ZEBIN_TRITON=1`` gives every process that imports Triton
the drop-ins, with no code change. Each case is a fresh subprocess running real triton-xpu
(compiling on the CPU) and the real compilers; the script never imports xpu_zebin itself."""

from __future__ import annotations

import ast
import functools
import json
import os
import site
import subprocess
import sys
import venv
from pathlib import Path
from types import SimpleNamespace

import _xpu_zebin_hook
import pytest
from hypothesis import given
from hypothesis import strategies as st

GRF256 = "-cl-intel-256-GRF-per-thread"
RECOVERY_LINE = '(I): Build failure recovered by retrying with large GRF mode for "window_kernel"'
TESTS = Path(__file__).resolve().parent

# Compiles a kernel through triton.compile with native code: the register-heavy matmul
# (spills at 128 GRF), or the PTSS-window kernel (fails at 128 GRF, builds at 256), and
# reports what it got and which modules were imported. The SYCL arch parser stub stands
# where a GPU's SYCL runtime would be (triton_helpers).
SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
import triton
from triton_helpers import (MM_SIG, TARGET_SIMD32, WINDOW_SIG, compile_triton, matmul_kernel,
                            triton_on_cpu, window_kernel)
from triton.compiler import ASTSource

before = sorted(m for m in sys.modules if "xpu_zebin" in m)
with triton_on_cpu(sys.argv[2]):
    if sys.argv[3] == "window":
        src = ASTSource(window_kernel, WINDOW_SIG, {(7,): 16384})
        k = triton.compile(src, target=TARGET_SIMD32, options={"num_warps": 2})
    else:
        k = compile_triton(matmul_kernel, MM_SIG, {"BM": 64, "BN": 64, "BK": 32})
binary = k.asm["spv"]
from triton.backends import backends
utils_cls = backends["intel"].driver.__init__.__globals__["XPUUtils"]
print(json.dumps({
    "utils_patched": getattr(utils_cls.__init__, "__xpu_zebin__", False),
    "autotuner_patched": hasattr(triton.runtime.autotuner.Autotuner.prune_configs, "__wrapped__"),
    "build_flags": k.metadata.build_flags,
    "elf": binary[:4] == b"\\x7fELF",
    "modules_at_start": before,
    "modules": sorted(m for m in sys.modules if "xpu_zebin" in m),
}))
"""


def _run(tmp_path, env_overrides: dict, kernel: str = "matmul") -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("XPU_ZEBIN_TRITON", "TRITON_DEBUG")}
    env.update(env_overrides)
    script = tmp_path / "probe.py"  # Triton reads a kernel's source: a file, not -c
    script.write_text(SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script), str(TESTS), str(tmp_path / "triton-cache"), kernel],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


@pytest.fixture
def native_env(system_ocloc):
    return {"TRITON_XPU_GEN_NATIVE_CODE": "1", "XPU_ZEBIN_OCLOC": system_ocloc}


def test_the_variable_activates_the_drop_in(tmp_path, native_env):
    report, stderr = _run(tmp_path, {**native_env, "XPU_ZEBIN_TRITON": "1", "TRITON_DEBUG": "1"})
    assert report["elf"] and report["build_flags"] == GRF256  # it spills at default GRF
    assert "xpu_zebin.triton" in report["modules"]
    assert report["utils_patched"]  # every XPUUtils the driver makes loads through the package
    assert report["autotuner_patched"]  # every autotuner compiles its configs at once
    # The package's own account of the choice, shown as Triton's debug output is.
    assert f"chose '{GRF256}'" in stderr, stderr[-3000:]


@pytest.mark.slow
def test_the_variable_recovers_a_ptss_failure_inside_triton_compile(
    tmp_path, native_env, modern_ocloc
):
    """The window kernel still overflows PTSS at 128 GRF and builds at 256 (IGC 2.x)."""
    env = {**native_env, "XPU_ZEBIN_OCLOC": modern_ocloc, "XPU_ZEBIN_TRITON": "1"}
    report, stderr = _run(tmp_path, env, kernel="window")
    assert report["elf"] and report["build_flags"] == GRF256
    assert RECOVERY_LINE in stderr, stderr[-3000:]


@pytest.mark.parametrize("value", [None, "0"], ids=["unset", "zero"])
def test_without_the_variable_triton_is_untouched(tmp_path, native_env, modern_ocloc, value):
    # Triton's own native path runs `ocloc ... -o`, which Debian's ocloc 22.43 lacks.
    env = {**native_env, "PATH": f"{Path(modern_ocloc).parent}:{os.environ['PATH']}"}
    if value is not None:
        env["XPU_ZEBIN_TRITON"] = value
    report, stderr = _run(tmp_path, env)
    assert report["modules_at_start"] == [] and report["modules"] == []  # nothing imported
    assert report["elf"] and not report["utils_patched"]  # Triton's own path built it
    assert not report["autotuner_patched"]
    assert "xpu_zebin" not in stderr


def _installed(name: str) -> Path:
    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    found = [Path(d) / name for d in dirs if (Path(d) / name).is_file()]
    assert found, (name, dirs)
    return found[0]


def test_the_hook_is_installed_with_the_package():
    _installed("xpu_zebin.pth")
    _installed("_xpu_zebin_hook.py")


def _python(args: list, env_overrides: dict, python: str = sys.executable) -> tuple[str, list]:
    """Run a Python with the given environment (XPU_ZEBIN_TRITON and PYTHONPATH only from
    ``env_overrides``): its stdout and its stderr's non-blank lines."""
    env = {k: v for k, v in os.environ.items() if k not in ("XPU_ZEBIN_TRITON", "PYTHONPATH")}
    env.update(env_overrides)
    out = subprocess.run([python, *args], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    return out.stdout, [line for line in out.stderr.splitlines() if line.strip()]


# Imports Triton (its backend registry too) and reports what of xpu-zebin is in this process,
# with the records the "xpu_zebin" logger emitted when "capture" is asked for (else logging
# has no handler, and its last-resort handler prints warnings on stderr).
TRITON_PROBE = """
import json, logging, sys
records = []
if sys.argv[1:] == ["capture"]:
    handler = logging.Handler()
    handler.emit = lambda r: records.append([r.name, r.levelname, r.getMessage()])
    logging.getLogger("xpu_zebin").addHandler(handler)
import triton
from triton.backends import backends
utils_cls = backends["intel"].driver.__init__.__globals__["XPUUtils"]
print(json.dumps({
    "intel": backends["intel"].compiler.__name__,
    "utils_patched": getattr(utils_cls.__init__, "__xpu_zebin__", False),
    "hook_armed": any(type(f).__name__ == "_Finder" for f in sys.meta_path),
    "package": sorted(m for m in sys.modules if m.split(".")[0] == "xpu_zebin"),
    "records": records,
}))
"""


def test_a_broken_install_leaves_triton_working_with_one_warning(tmp_path):
    """An ``xpu_zebin`` that cannot be imported (here: shadowed by one that raises) costs the
    drop-in, not Triton: ``import triton`` works, untouched, and one WARNING says why."""
    shadow = tmp_path / "shadow" / "xpu_zebin"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise ImportError("broken install")\n')
    env = {"XPU_ZEBIN_TRITON": "1", "PYTHONPATH": str(shadow.parent)}
    for mode in ("last-resort", "capture"):
        stdout, stderr = _python(["-c", TRITON_PROBE, mode], env)
        report = json.loads(stdout.strip().splitlines()[-1])
        assert report["intel"] == "XPUBackend" and not report["utils_patched"]
        assert report["package"] == []
        if mode == "capture":
            [(name, level, message)] = report["records"]
            assert (name, level) == ("xpu_zebin", "WARNING")
            assert stderr == []
        else:
            [message] = stderr
        assert "not active" in message and "ImportError: broken install" in message, message


@pytest.mark.parametrize("case", ["missing", "raising"])
def test_the_pth_line_survives_a_missing_or_failing_hook(tmp_path, case):
    """A ``.pth`` line that raises would print a traceback at every interpreter start: a hook
    that is gone (a half-removed install) or fails gives one line on stderr instead. The
    interpreter is a fresh venv holding the installed ``.pth`` (Python 3.11 reads a venv's
    ``.pth`` files twice: still one line)."""
    venv.create(tmp_path / "venv", with_pip=False)
    python = tmp_path / "venv" / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    (Path(purelib) / "xpu_zebin.pth").write_text(_installed("xpu_zebin.pth").read_text())
    if case == "raising":
        (Path(purelib) / "_xpu_zebin_hook.py").write_text('raise RuntimeError("hook exploded")\n')
    stdout, stderr = _python(["-c", "print('alive')"], {"XPU_ZEBIN_TRITON": "1"}, str(python))
    assert stdout == "alive\n"
    [line] = stderr
    assert "XPU_ZEBIN_TRITON" in line and "not active" in line, line
    why = "RuntimeError: hook exploded" if case == "raising" else "ModuleNotFoundError"
    assert why in line, line


@pytest.mark.parametrize("value", ["2", "maybe", " enable "])
def test_an_unrecognised_value_warns_once_and_leaves_triton_untouched(value):
    stdout, stderr = _python(["-c", TRITON_PROBE], {"XPU_ZEBIN_TRITON": value})
    report = json.loads(stdout.strip().splitlines()[-1])
    assert not report["hook_armed"] and not report["utils_patched"]
    assert report["package"] == []
    [line] = stderr
    assert f"XPU_ZEBIN_TRITON={value!r}" in line and "not active" in line, line


TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def _expected_setting(value: str):
    """The rule, spelled out: surrounding whitespace ignored, then one of the words in any
    mix of case (ASCII only: no other character stands for a letter of them)."""
    start, end = 0, len(value)
    while start < end and value[start].isspace():
        start += 1
    while end > start and value[end - 1].isspace():
        end -= 1
    core = value[start:end]

    def spells(word: str) -> bool:
        return len(core) == len(word) and all(c in (w, w.upper()) for c, w in zip(core, word))

    if any(spells(w) for w in TRUE_WORDS):
        return True
    if core == "" or any(spells(w) for w in FALSE_WORDS):
        return False
    return None


# Arbitrary text, and the words themselves in random case with whitespace around them (which
# arbitrary text alone would almost never produce).
_spaces = st.text(alphabet=" \t\n\r\x0b\x0c\xa0\u2003\u3000", max_size=3)
_words = st.builds(
    lambda pre, word, upper, post: (
        pre + "".join(c.upper() if u else c for c, u in zip(word, upper)) + post
    ),
    _spaces,
    st.sampled_from(TRUE_WORDS + FALSE_WORDS + ("", "of", "yess", "tru", "onn", "n0")),
    st.lists(st.booleans(), min_size=5, max_size=5),
    _spaces,
)
_values = st.one_of(st.text(), _words)


@functools.cache
def _pth_condition():
    """The installed ``.pth`` line's condition for importing the hook, compiled."""
    [statement] = [
        s for s in ast.parse(_installed("xpu_zebin.pth").read_text()).body
        if isinstance(s, ast.Expr) and isinstance(s.value, ast.IfExp)
    ]  # fmt: skip
    return compile(ast.Expression(statement.value.test), "xpu_zebin.pth", "eval")


def _pth_imports_the_hook(value) -> bool:
    """Whether the ``.pth`` line would import the hook for this value (``None``: unset): its
    condition, evaluated on an environment holding only the value."""
    environ = {} if value is None else {"XPU_ZEBIN_TRITON": value}
    return bool(eval(_pth_condition(), {"os": SimpleNamespace(environ=environ)}))


@given(_values)
def test_the_parser_classifies_every_value_by_the_rule(value):
    assert _xpu_zebin_hook.parse_setting(value) is _expected_setting(value)


@given(st.one_of(st.none(), _values))
def test_the_pth_line_skips_the_hook_for_false_values_only(value):
    """Values the hook would warn about or act on all reach it; false ones never load it."""
    setting = _xpu_zebin_hook.parse_setting(value)
    assert _pth_imports_the_hook(value) == (setting is not False)
