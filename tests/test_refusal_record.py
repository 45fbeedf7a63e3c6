"""A refused cache entry is the entry's fault, never the compiler's (issue 32).

A writer of a cache directory the package reads can forge an entry (the checksum is blake3
over key and body: no secret). Its refusal by the driver must never switch the offline
compiler off for the host: only a build this process's compiler has just made, whose
refusal the driver's own build of the same kernel confirms, is remembered. Real compilers,
the real Level Zero driver on the simulated PVC, real Triton SPIR-V (triton-xpu 3.3)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import entries
import pytest
from test_driver_fallback import StandIn
from triton_helpers import (
    ADD_SIG,
    SOFTMAX_SIG,
    TARGET,
    RecordingUtils,
    add_kernel,
    compile_triton,
    softmax_kernel,
    triton_on_cpu,
)

import xpu_zebin
import xpu_zebin.triton as xt
from xpu_zebin import _core, targets
from xpu_zebin.triton.fallback import compiler_pair

COUNTING = """#!{python}
\"\"\"The real ocloc, each compile counted.\"\"\"
import subprocess, sys
if sys.argv[1:2] == ["compile"]:
    with open({count!r}, "a") as f:
        f.write("compile\\n")
sys.exit(subprocess.call([{real!r}] + sys.argv[1:]))
"""


class Counting:
    def __init__(self, directory: Path, real: str) -> None:
        directory.mkdir()
        self.path, self.count_file = directory / "ocloc", directory / "compiles"
        self.count_file.write_text("")
        self.path.write_text(COUNTING.format(python=sys.executable, count=str(self.count_file),
                                             real=real))  # fmt: skip
        self.path.chmod(0o755)

    @property
    def compiles(self) -> int:
        return len(self.count_file.read_text().splitlines())


@pytest.fixture(scope="module", autouse=True)
def on_cpu(tmp_path_factory):
    with triton_on_cpu(str(tmp_path_factory.mktemp("triton-cache"))):
        yield
    xt.uninstall()


@pytest.fixture(scope="module")
def kernels():
    return {
        "add_kernel": compile_triton(add_kernel, ADD_SIG, {"BLOCK": 1024}).asm["spv"],
        "softmax_kernel": compile_triton(softmax_kernel, SOFTMAX_SIG, {"BLOCK": 256}).asm["spv"],
    }


@pytest.fixture(autouse=True)
def clean_record():
    _core.forget_compiler_refusals()
    yield
    _core.forget_compiler_refusals()


@pytest.fixture
def counting(tmp_path, system_ocloc, monkeypatch) -> Counting:
    ocloc = Counting(tmp_path / "counting", system_ocloc)
    monkeypatch.setenv("XPU_ZEBIN_OCLOC", str(ocloc.path))
    monkeypatch.setenv("TRITON_INTEL_DEVICE_ARCH", "pvc")
    return ocloc


def _major(zebin: bytes) -> str:
    return xpu_zebin.zebin_info(zebin)["version"].split(".")[0]


def _raise_major(zebin: bytes) -> bytes:
    return re.sub(rb"(version:[ ]*')1[.]", rb"\g<1>9.", zebin, count=1)


def _forge(entry: Path, binary: bytes) -> None:
    """Rewrite a cache entry's binary, its checksum recomputed, as a cache's writer can."""
    entries.forge(entry, binary)


def _poison(cache: Path, good: bytes, poisoned: bytes) -> Path:
    (entry,) = [p for p in (cache / "zebin-v3").glob("*/*.zeentry")
                if entries.binary_of(p) == good]  # fmt: skip
    _forge(entry, poisoned)
    return entry


def _load(name: str, spirv: bytes) -> list:
    """The wrapped load_binary on a recording driver: the binaries the driver was handed."""
    utils = xt.install(RecordingUtils(), backend=False)
    try:
        utils.load_binary(name, spirv, 0, "", True, 0)[0].close()
    finally:
        xt.uninstall()
    return [binary for _, binary, _, _, _ in utils.calls]


@pytest.mark.parametrize("poison", ["other_major", "malformed"])
def test_a_poisoned_cache_entry_switches_nothing_off(counting, kernels, private_cache, tmp_path,
                                                     monkeypatch, poison):  # fmt: skip
    """load_binary: a forged entry (another .ze_info major, or one malformed kernel in the
    driver's format) is removed and the kernel rebuilt fresh; no pair is recorded; the
    entry does not stay to be refused again; a second kernel in a clean cache is still
    built by the offline compiler."""
    spirv = kernels["add_kernel"]
    options = xt.native_options("add_kernel", "", rule=xt.LOAD_BINARY_RULE, device_arch="pvc")
    good = xpu_zebin.compile(spirv, device="pvc", options=options).binary  # into the cache
    bad = (_raise_major(good) if poison == "other_major"
           else good.replace(b"execution_env", b"execution_xxx"))  # fmt: skip
    entry = _poison(private_cache, good, bad)
    assert counting.compiles == 1
    handed = _load("add_kernel", spirv)
    assert handed == [good], "the fresh build, never the forged bytes"
    assert counting.compiles == 2
    pair = compiler_pair(xpu_zebin.Options(), 0)
    assert pair is not None and not _core.compiler_refused(*pair)
    assert _core.compiler_refusals() == []
    # The forged entry is gone: the fresh build stands in its place.
    assert entries.binary_of(entry) == good
    # Another kernel, a clean cache: the offline compiler still builds it.
    monkeypatch.setenv("XPU_ZEBIN_CACHE_DIR", str(tmp_path / "clean"))
    handed = _load("softmax_kernel", kernels["softmax_kernel"])
    assert counting.compiles == 3 and len(handed) == 1 and _major(handed[0]) == "1"


def test_make_zebin_rebuilds_a_poisoned_entry(counting, kernels, private_cache):
    from triton.backends import backends

    backend = backends["intel"].compiler(TARGET)
    options = backend.parse_options({"num_warps": 4})
    spirv = kernels["add_kernel"]
    meta = {"name": "add_kernel", "build_flags": "", "target": TARGET}
    good = xt.make_zebin(spirv, meta, options, "pvc")
    _poison(private_cache, good, _raise_major(good))
    meta = {"name": "add_kernel", "build_flags": "", "target": TARGET}
    assert xt.make_zebin(spirv, meta, options, "pvc") == good
    assert counting.compiles == 2
    assert not _core.compiler_refused(*compiler_pair(xpu_zebin.Options(), 0))


def test_a_genuinely_refused_fresh_build_is_still_remembered(system_ocloc, kernels, tmp_path,
                                                            monkeypatch):  # fmt: skip
    """The stand-in of another release: its fresh build is refused and the driver's own
    build has another major: remembered, with what doctor shows; forgotten on request."""
    stand_in = StandIn(tmp_path / "other-release", system_ocloc)
    monkeypatch.setenv("XPU_ZEBIN_OCLOC", str(stand_in.path))
    monkeypatch.setenv("TRITON_INTEL_DEVICE_ARCH", "pvc")
    handed = _load("add_kernel", kernels["add_kernel"])
    assert [_major(b) for b in handed] == ["9", "1"]
    pair = compiler_pair(xpu_zebin.Options(), 0)
    assert _core.compiler_refused(*pair)
    (record,) = _core.compiler_refusals()
    assert (record["compiler"], record["driver"]) == pair
    assert "9.x" in record["why"] and "INVALID_NATIVE_BINARY" in record["why"]
    out = subprocess.run([sys.executable, "-m", "xpu_zebin.cli", "doctor", "--json"],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert json.loads(out.stdout)["refused_compilers"] == [record]
    text = subprocess.run([sys.executable, "-m", "xpu_zebin.cli", "doctor"],
                          capture_output=True, text=True, timeout=300).stdout  # fmt: skip
    assert f"refused here: native code of {stand_in.path}" in text, text
    out = subprocess.run([sys.executable, "-m", "xpu_zebin.cli", "doctor", "--forget-refusals"],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0 and "forgot 1 refused" in out.stderr
    assert not _core.compiler_refused(*pair) and _core.compiler_refusals() == []


def test_import_triton_entries_keeps_only_what_loads_here(system_ocloc, tmp_path, monkeypatch):
    """A forged native entry (its major raised, every checksum recomputed) in a bundle: the
    Triton entries put into Triton's cache are only those whose bytes loaded here."""
    pvc = targets.local()
    out = tmp_path / "model"
    configs = [{"constexprs": {"BLOCK": b}, "num_warps": 4} for b in (256, 1024)]
    with triton_on_cpu(str(tmp_path / "farm-cache")):
        xt.precompile_kernel(softmax_kernel, SOFTMAX_SIG, [pvc], out, configs,
                             ocloc=system_ocloc)  # fmt: skip
    data = json.loads((out / "manifest.json").read_text())
    native = next(t for t in data["triton_cache"] if t["native"])
    f = next(f for f in native["files"] if not f["name"].endswith(".json"))
    path = out / "triton" / native["target"] / native["hash"] / f["name"]
    good = entries.held(path)
    forged = _raise_major(good)
    same = [e for e in data["entries"] if e["blake3"] == f["blake3"]]  # each path's entry
    assert same
    for where, record in ((path, f), *((out / e["file"], e) for e in same)):
        entries.forge_file(where, record, forged)
    (out / "manifest.json").write_text(json.dumps(data))
    put = []
    monkeypatch.setattr(xt.cache_entries, "put", lambda t, files: put.append(t["hash"]))
    assert xt.import_triton_entries(out) == 3  # 2 configs x (SPIR-V, native), less one
    assert native["hash"] not in put and len(put) == 3
