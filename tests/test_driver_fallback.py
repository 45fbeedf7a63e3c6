"""A compiler of another release than the driver: the drop-ins never make a kernel fail that
the driver's own JIT (upstream's path) loads.

The stand-in for "another release" is the real ``ocloc`` whose output's ``.ze_info``
major is raised (docs/design.md §4: the simulated PVC's bookworm driver refuses a zebin
whose major it does not know with ``ZE_RESULT_ERROR_INVALID_NATIVE_BINARY``, as it
refuses the modern ocloc's zebins of some real DPAS kernels). The driver is the real
Level Zero driver on the simulated PVC.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import entries
import pytest
import triton
import triton.language as tl
from triton.backends import backends
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
from xpu_zebin import _core
from xpu_zebin.triton.fallback import compiler_pair

STAND_IN = '''#!{python}
"""The real ocloc of another release: it says so when asked, and a compile's zebin gets
.ze_info major 9 (a format the driver does not know). Each compile is counted."""
import pathlib, re, subprocess, sys
args = sys.argv[1:]
if args[:1] == ["compile"]:
    with open({count!r}, "a") as f:
        f.write("compile\\n")
rc = subprocess.call([{real!r}] + args)
if rc == 0 and args[:2] == ["query", "OCL_DRIVER_VERSION"]:
    pathlib.Path("OCL_DRIVER_VERSION").write_bytes(b"{release}\\0")
if rc == 0 and args[:1] == ["compile"] and "-out_dir" in args:
    out = pathlib.Path(args[args.index("-out_dir") + 1])
    for p in out.iterdir():
        if p.name.startswith("kernel"):
            data = p.read_bytes()
            if data[:4] == b"\\x7fELF" and {malformed}:  # one malformed kernel, same format
                p.write_bytes(data.replace(b"execution_env", b"execution_xxx"))
            elif data[:4] == b"\\x7fELF":  # a zebin (not SPIR-V from -spv_only)
                p.write_bytes(re.sub(rb"(version:[ ]*')1[.]", rb"\\g<1>9.", data, count=1))
sys.exit(rc)
'''


RELEASE = "26.99.99999"


class StandIn:
    def __init__(self, directory: Path, real: str, malformed: bool = False) -> None:
        directory.mkdir()
        self.path = directory / "ocloc"
        self.count_file = directory / "compiles"
        self.count_file.write_text("")
        self.path.write_text(
            STAND_IN.format(
                python=sys.executable,
                count=str(self.count_file),
                real=real,
                release=RELEASE,
                malformed=malformed,
            )
        )
        self.path.chmod(0o755)

    @property
    def compiles(self) -> int:
        return len(self.count_file.read_text().splitlines())


@pytest.fixture
def refused_ocloc(tmp_path, system_ocloc, monkeypatch) -> StandIn:
    stand_in = StandIn(tmp_path / "other-release", system_ocloc)
    monkeypatch.setenv("XPU_ZEBIN_OCLOC", str(stand_in.path))
    monkeypatch.setenv("TRITON_INTEL_DEVICE_ARCH", "pvc")
    return stand_in


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


def _major(zebin: bytes) -> str:
    return xpu_zebin.zebin_info(zebin)["version"].split(".")[0]


def test_the_stand_in_is_refused_by_the_driver(refused_ocloc, kernels):
    """The premise: the stand-in's build is one this driver refuses, and says so."""
    built = xpu_zebin.compile(kernels["add_kernel"], device="pvc", cache=False)
    assert _major(built.binary) == "9"
    with pytest.raises(xpu_zebin.UnsupportedDeviceError, match="INVALID_NATIVE_BINARY"):
        xpu_zebin.compile_and_load(built.binary, "add_kernel", is_spv=False, cache=False)


def test_wrapped_load_binary_falls_back_to_the_drivers_jit(refused_ocloc, kernels, caplog):
    utils = xt.install(RecordingUtils(), backend=False)
    try:
        with caplog.at_level(logging.WARNING, logger="xpu_zebin"):
            first = utils.load_binary("add_kernel", kernels["add_kernel"], 0, "", True, 0)
        # The driver refused the stand-in's zebin once; then took its own JIT's.
        handed = [(binary, is_spv) for _, binary, _, is_spv, _ in utils.calls]
        assert [_major(b) for b, _ in handed] == ["9", "1"]
        assert not any(is_spv for _, is_spv in handed)
        assert first[2] == 128 and xt.get_last_selected_build_flags() == ""
        said = [r.getMessage() for r in caplog.records if "refuses native code" in r.getMessage()]
        assert len(said) == 1 and "format 9.x, the driver's own 1.x" in said[0]
        assert "INVALID_NATIVE_BINARY" in caplog.text  # the kernel's own line says why
        assert refused_ocloc.compiles == 1
        # The pair is remembered: the next kernel goes to the driver's JIT at once.
        second = utils.load_binary("softmax_kernel", kernels["softmax_kernel"], 0, "", True, 0)
        assert refused_ocloc.compiles == 1
        assert _major(utils.calls[-1][1]) == "1" and len(utils.calls) == 3
        first[0].close()
        second[0].close()
    finally:
        xt.uninstall()
    # Per host, not per process: another process knows it without compiling.
    pair = compiler_pair(xpu_zebin.Options(), 0)
    assert pair is not None and _core.compiler_refused(*pair)
    code = "import sys, xpu_zebin._core as c; sys.exit(3 - 3 * c.compiler_refused(*sys.argv[1:]))"
    assert subprocess.run([sys.executable, "-c", code, *pair]).returncode == 0
    assert not _core.compiler_refused(pair[0] + "x", pair[1])


def test_make_zebin_gives_code_the_driver_takes(refused_ocloc, kernels):
    backend = backends["intel"].compiler(TARGET)
    options = backend.parse_options({"num_warps": 4})
    meta = {"name": "add_kernel", "build_flags": "", "target": TARGET}
    zebin = xt.make_zebin(kernels["add_kernel"], meta, options, "pvc")
    assert _major(zebin) == "1" and meta["build_flags"] == ""
    assert xpu_zebin.zebin_info(zebin)["kernels"][0]["name"] == "add_kernel"
    assert refused_ocloc.compiles == 1
    meta = {"name": "softmax_kernel", "build_flags": "", "target": TARGET}
    zebin = xt.make_zebin(kernels["softmax_kernel"], meta, options, "pvc")
    assert _major(zebin) == "1" and refused_ocloc.compiles == 1
    # What make_zebin answers loads with no retry, as Triton's cache and Inductor load it.
    xpu_zebin.compile_and_load(zebin, "softmax_kernel", is_spv=False, cache=False).close()


def test_a_cached_refused_build_goes_to_the_jit(refused_ocloc, kernels):
    """A build of the refused compiler already in the package's cache (a sweep's prebuild,
    a shared cache) is not handed over once the driver refused it: bytes read from a cache
    say nothing of the compiler, so the kernel is built fresh, and that fresh build's
    refusal is what is remembered; the refused entry does not stay in the cache."""
    spirv = kernels["add_kernel"]
    options = xt.native_options("add_kernel", "", rule=xt.LOAD_BINARY_RULE, device_arch="pvc")
    xpu_zebin.compile(spirv, device="pvc", options=options)  # into the cache
    assert refused_ocloc.compiles == 1
    utils = xt.install(RecordingUtils(), backend=False)
    try:
        loaded = utils.load_binary("add_kernel", spirv, 0, "", True, 0)
    finally:
        xt.uninstall()
    assert [_major(c[1]) for c in utils.calls] == ["9", "1"]  # the fresh build, then the JIT's
    assert refused_ocloc.compiles == 2
    assert _core.compiler_refused(*compiler_pair(xpu_zebin.Options(), 0))
    assert not xpu_zebin.compile(spirv, device="pvc", options=options).cached
    loaded[0].close()


def test_one_malformed_kernel_is_not_the_compilers_fault(system_ocloc, kernels, tmp_path,
                                                          monkeypatch):  # fmt: skip
    """A zebin the driver refuses in the format it knows (one malformed kernel, the same
    .ze_info major as the driver's own) is that kernel's failure: it loads from the
    driver's compiler, and the next kernel is built offline again."""
    stand_in = StandIn(tmp_path / "malformed", system_ocloc, malformed=True)
    monkeypatch.setenv("XPU_ZEBIN_OCLOC", str(stand_in.path))
    monkeypatch.setenv("TRITON_INTEL_DEVICE_ARCH", "pvc")
    utils = xt.install(RecordingUtils(), backend=False)
    try:
        for name in ("add_kernel", "softmax_kernel"):
            loaded = utils.load_binary(name, kernels[name], 0, "", True, 0)
            loaded[0].close()
    finally:
        xt.uninstall()
    assert stand_in.compiles == 2 and len(utils.calls) == 4  # each refused, then the JIT's
    assert not _core.compiler_refused(*compiler_pair(xpu_zebin.Options(), 0))


def test_a_matching_compiler_is_not_remembered(system_ocloc, kernels, monkeypatch):
    monkeypatch.setenv("XPU_ZEBIN_OCLOC", system_ocloc)
    utils = xt.install(RecordingUtils(), backend=False)
    try:
        loaded = utils.load_binary("add_kernel", kernels["add_kernel"], 0, "", True, 0, "pvc")
    finally:
        xt.uninstall()
    assert len(utils.calls) == 1
    loaded[0].close()
    pair = compiler_pair(xpu_zebin.Options(), 0)
    assert pair is not None and not _core.compiler_refused(*pair)


@triton.jit
def block_matmul(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):  # fmt: skip
    """fp16 matmul through block pointers: with 2D block IO on, Triton lowers its loads and
    stores to ``intel_sub_group_2d_block_read/write_*`` builtins."""
    a = tl.make_block_ptr(a_ptr, (M, K), (sam, sak), (tl.program_id(0) * BM, 0), (BM, BK), (1, 0))
    b = tl.make_block_ptr(b_ptr, (K, N), (sbk, sbn), (0, tl.program_id(1) * BN), (BK, BN), (1, 0))
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(0, K, BK):
        acc += tl.dot(tl.load(a), tl.load(b))
        a = tl.advance(a, (0, BK))
        b = tl.advance(b, (BK, 0))
    c = tl.make_block_ptr(c_ptr, (M, N), (scm, scn), (tl.program_id(0) * BM, tl.program_id(1) * BN),
                          (BM, BN), (1, 0))  # fmt: skip
    tl.store(c, acc.to(tl.float16))


@pytest.fixture(scope="module")
def block_spirv() -> bytes:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton_helpers import ARCH

    arch = dict(ARCH, has_subgroup_matrix_multiply_accumulate=True, has_subgroup_2d_block_io=True)
    sig = {**{p: "*fp16" for p in ("a_ptr", "b_ptr", "c_ptr")},
           **{p: "i32" for p in ("M", "N", "K", "sam", "sak", "sbk", "sbn", "scm", "scn")},
           **{p: "constexpr" for p in ("BM", "BN", "BK")}}  # fmt: skip
    names = list(sig)
    constants = {(names.index(k),): v for k, v in {"BM": 64, "BN": 64, "BK": 32}.items()}
    src = ASTSource(block_matmul, sig, constants)
    compiled = triton.compile(src, target=GPUTarget("xpu", arch, 16), options={"num_warps": 4})
    return compiled.asm["spv"]


def test_unresolved_symbols_are_a_link_failure(system_ocloc, modern_ocloc, block_spirv, tmp_path):
    """Debian's IGC 1.x "builds" calls of 2D block builtins it does not know into imports
    nothing provides; the driver would fail at link. compile() says so, naming them."""
    with pytest.raises(xpu_zebin.LinkFailureError, match="intel_sub_group_2d_block_") as e:
        xpu_zebin.compile(block_spirv, device="pvc", ocloc=system_ocloc)
    assert e.value.kind == "link_failure" and "Build succeeded" in e.value.log
    assert e.value.attempts and all(a.ok for a in e.value.attempts)  # it built, then this
    library = xpu_zebin.compile(
        block_spirv, device="pvc", ocloc=system_ocloc, allow_unresolved=True
    )
    imports = xpu_zebin.zebin_info(library.binary)["undefined_symbols"]
    assert imports and all("intel_sub_group_2d_block_" in s for s in imports)
    # Kept in a cache, that build answers only a request that allows its imports: a hit
    # reads them from the ELF alone, and refuses the rest with the same failure.
    cache = {"cache": True, "cache_dir": str(tmp_path)}
    xpu_zebin.compile(block_spirv, device="pvc", ocloc=system_ocloc, allow_unresolved=True, **cache)
    again = xpu_zebin.compile(
        block_spirv, device="pvc", ocloc=system_ocloc, allow_unresolved=True, **cache
    )
    assert again.source == "cache" and again.binary == library.binary
    with pytest.raises(xpu_zebin.LinkFailureError, match="intel_sub_group_2d_block_"):
        xpu_zebin.compile(block_spirv, device="pvc", ocloc=system_ocloc, **cache)
    # The modern compiler knows them; what it imports, the driver's linker provides itself.
    modern = xpu_zebin.compile(block_spirv, device="pvc", ocloc=modern_ocloc)
    assert xpu_zebin.zebin_info(modern.binary)["undefined_symbols"] == []


def test_precompile_lists_unresolved_symbols_as_a_failure(system_ocloc, block_spirv, tmp_path):
    from triton_helpers import ARCH

    from xpu_zebin import bundle, targets

    farm = targets.TargetProfile("pvc", ARCH, 16, name="pvc-farm")  # any driver: no trial here
    manifest = bundle.precompile(
        [{"spirv": block_spirv, "name": "block_matmul"}], [farm], tmp_path / "b", ocloc=system_ocloc
    )
    assert manifest["entries"] == []
    ((failure,),) = [manifest["failures"]]
    assert failure["kind"] == "link_failure" and "intel_sub_group_2d_block_" in failure["message"]


def test_target_profile_records_what_its_driver_accepts(system_ocloc, refused_ocloc):
    from xpu_zebin import targets

    accepts = targets.probe_accepts(0, ocloc=system_ocloc)
    assert accepts["ze_info"].split(".")[0] == "1"
    assert accepts["compilers"] == {targets.compiler_release(system_ocloc): True}
    refused = targets.probe_accepts(0, ocloc=str(refused_ocloc.path))
    assert refused["compilers"] == {RELEASE: False}
    profile = targets.TargetProfile.from_json({**targets.local().to_json(), "accepts": refused})
    assert profile.accepts == refused and profile.id == targets.local().id
    for bad in ({"compilers": {RELEASE: "yes"}}, {"ze_info": "one"}, {"other": 1}, []):
        with pytest.raises(xpu_zebin.InvalidArgumentError, match="accepts"):
            targets.TargetProfile.from_json({**targets.local().to_json(), "accepts": bad})


def test_precompile_refuses_a_compiler_the_targets_driver_refuses(
    system_ocloc, refused_ocloc, kernels, tmp_path, caplog
):
    """A profile taken on the device knows its driver: a farm compiler of a release that
    driver refused, or one writing a .ze_info major the driver's own compiler does not, is
    refused before anything is built, naming the release to use; allowed, it warns, and an
    entry for this host's driver that the driver refuses is built by the driver instead."""
    import dataclasses

    from xpu_zebin import bundle, targets

    local = targets.local()
    kernel = [{"spirv": kernels["add_kernel"], "name": "add_kernel"}]
    # Probed with the stand-in: the profile says this release was refused.
    refused = targets.probe_accepts(0, ocloc=str(refused_ocloc.path))
    told = dataclasses.replace(local, accepts=refused)
    # Probed with another compiler: only the .ze_info format tells.
    probed = dataclasses.replace(local, accepts=targets.probe_accepts(0, ocloc=system_ocloc))
    for profile, why in ((told, "refused code of ocloc 26.99"), (probed, "writes .ze_info 9.")):
        with pytest.raises(xpu_zebin.InvalidArgumentError, match=why) as e:
            bundle.precompile(kernel, [profile], tmp_path / "b", ocloc=str(refused_ocloc.path))
        assert "compute-runtime build 24595" in str(e.value)
    assert not (tmp_path / "b").exists()
    compiles = refused_ocloc.compiles
    with caplog.at_level(logging.WARNING, logger="xpu_zebin"):
        manifest = bundle.precompile(kernel, [told], tmp_path / "b", ocloc=str(refused_ocloc.path),
                                     allow_compiler_mismatch=True)  # fmt: skip
    assert any("refused code of ocloc 26.99" in r.getMessage() for r in caplog.records)
    assert refused_ocloc.compiles == compiles + 1
    ((entry,),) = [manifest["entries"]]
    assert entry["compiler"] == f"level-zero driver {local.driver}"
    native = entries.held(tmp_path / "b" / entry["file"])
    assert _major(native) == "1"
    xpu_zebin.compile_and_load(native, "add_kernel", is_spv=False, cache=False).close()
    # The system compiler for the same profile: nothing to refuse.
    assert targets.check_compiler([probed], system_ocloc) == []


@pytest.mark.slow
def test_cli_target_records_and_precompile_refuses(refused_ocloc, system_ocloc, tmp_path):
    import json

    from xpu_zebin import samples

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "xpu_zebin", *args], capture_output=True,
                              text=True, timeout=600)  # fmt: skip

    profile = tmp_path / "pvc.json"
    done = cli("target", "--json", "--ocloc", str(refused_ocloc.path), "-o", str(profile))
    assert done.returncode == 0, done.stderr
    accepts = json.loads(profile.read_text())["accepts"]
    assert accepts["compilers"] == {RELEASE: False} and accepts["ze_info"].startswith("1.")
    source = tmp_path / "add.cl"
    source.write_text(samples.ADD_KERNEL)
    out = tmp_path / "b"
    args = ["precompile", str(source), "--target", str(profile), "-o", str(out)]
    refused = cli(*args, "--ocloc", str(refused_ocloc.path))
    assert refused.returncode == 2 and "compute-runtime build" in refused.stderr
    assert "Traceback" not in refused.stderr and not out.exists()
    allowed = cli(*args, "--ocloc", str(refused_ocloc.path), "--allow-compiler-mismatch")
    assert allowed.returncode == 0, allowed.stderr
    assert "refused code of ocloc 26.99.99999" in allowed.stderr
    assert cli(*args, "--ocloc", system_ocloc).returncode == 0
    for bogus in ("", str(tmp_path / "nope"), str(tmp_path), "/dev/null"):
        done = cli("target", "--ocloc", bogus, "-o", str(tmp_path / "x.json"))
        assert done.returncode == 2 and "--ocloc" in done.stderr, (bogus, done.stderr)
    # A profile of a device this ocloc does not know: its kernels are listed as failures,
    # the other target's are built (nothing to check the format with is not a refusal).
    bmg = {**json.loads(profile.read_text()), "ocloc_device": "bmg", "name": "bmg"}
    bmg.pop("id")
    (tmp_path / "bmg.json").write_text(json.dumps(bmg))
    both = cli(*args[:-2], "-o", str(tmp_path / "both"), "--target", str(tmp_path / "bmg.json"),
               "--ocloc", system_ocloc)  # fmt: skip
    assert both.returncode == 1 and "1 native entries, 1 failures" in both.stdout, both.stderr


def test_import_puts_into_tritons_cache_only_native_code_that_loaded_here(
    refused_ocloc, tmp_path, monkeypatch
):
    """A bundle for any driver, built by a compiler this driver refuses: its native Triton
    entries are tried here too, and only bytes that loaded go into Triton's cache (Triton
    loads them with no trial of its own); its SPIR-V entries go in."""
    from xpu_zebin import targets

    out = tmp_path / "model"
    config = {"constexprs": {"BLOCK": 256}, "num_warps": 4}
    any_driver = targets.local().any_driver()
    manifest = xt.precompile_kernel(softmax_kernel, SOFTMAX_SIG, [any_driver], out, [config],
                                        ocloc=str(refused_ocloc.path))  # fmt: skip
    assert sorted(t["native"] for t in manifest["triton_cache"]) == [False, True]
    user_cache = tmp_path / "user-cache"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(user_cache))
    xt.import_bundle(out, tmp_path / "into")
    binaries = [p.read_bytes()[:4] for p in user_cache.rglob("*.spv")]
    assert binaries == [b"\x03\x02\x23\x07"]  # the SPIR-V entry only


def test_sweeps_and_bundles_of_a_refused_compiler_still_load(refused_ocloc, tmp_path, monkeypatch):
    """compile_configs prebuilds with the refused compiler (nothing is known yet), and a
    bundle for any driver holds its builds: the wrapped and the standalone load_binary
    still load every kernel, from the driver's own compiler, and after the first refusal of
    a fresh build the refused compiler is not run again."""
    from xpu_zebin import bundle, targets

    configs = [{"constexprs": {"BLOCK": b}, "num_warps": 4} for b in (256, 512)]
    results = xt.compile_configs(softmax_kernel, SOFTMAX_SIG, configs, target=TARGET)
    assert all(r.ok for r in results) and refused_ocloc.compiles == 2
    utils = xt.install(RecordingUtils(), backend=False)
    try:
        for r in results:
            loaded = utils.load_binary(r.kernel.name, r.kernel.asm["spv"], 0, "", True, 0)
            loaded[0].close()
            assert _major(utils.calls[-1][1]) == "1"
    finally:
        xt.uninstall()
    # The first cached build refused is built once fresh (bytes from a cache never speak
    # for the compiler); that fresh refusal is remembered: the second is not built again.
    assert refused_ocloc.compiles == 3
    # A bundle for any driver, of this compiler's builds (made before the refusal was known).
    spirv = compile_triton(add_kernel, ADD_SIG, {"BLOCK": 512}).asm["spv"]
    out = tmp_path / "b"
    bundle.precompile([{"spirv": spirv, "name": "add_kernel"}], [targets.local().any_driver()],
                      out, ocloc=str(refused_ocloc.path))  # fmt: skip
    monkeypatch.setenv("XPU_ZEBIN_BUNDLE", str(out))
    module, *_ = xt.load_binary("add_kernel", spirv, 0, "", True, 0)
    assert _major(module.native_binary) == "1"
    module.close()
    utils = xt.install(RecordingUtils(), backend=False)
    try:
        loaded = utils.load_binary("add_kernel", spirv, 0, "", True, 0)
        loaded[0].close()
    finally:
        xt.uninstall()
    assert [_major(c[1]) for c in utils.calls] == ["1"]
    assert refused_ocloc.compiles == 4  # the bundle's build only


def _refused_bundle(refused_ocloc: StandIn, out: Path) -> tuple:
    """A bundle (for any driver) of softmax built by a compiler this driver refuses, with
    make_zebin's build among its entries: (its SPIR-V, make_zebin's options and metadata)."""
    import json

    from xpu_zebin import targets

    local = targets.local()
    config = {"constexprs": {"BLOCK": 256}, "num_warps": 4}
    xt.precompile_kernel(softmax_kernel, SOFTMAX_SIG, [local.any_driver()], out, [config],
                             ocloc=str(refused_ocloc.path))  # fmt: skip
    manifest = json.loads((out / "manifest.json").read_text())
    spv_entry = next(t for t in manifest["triton_cache"] if not t["native"])
    spirv = next((out / "triton" / spv_entry["target"] / spv_entry["hash"]).glob("*.spv"))
    ours = next(e for e in manifest["entries"] if "make_zebin" in e["config"])
    assert _major(entries.held(out / ours["file"])) == "9"
    options = backends["intel"].compiler(local.gpu_target()).parse_options({"num_warps": 4})
    meta = {"name": "softmax_kernel", "build_flags": "", "target": local.gpu_target()}
    return entries.held(spirv), options, meta


def test_make_zebin_does_not_answer_with_a_bundle_entry_the_driver_refuses(
    refused_ocloc, tmp_path, monkeypatch, caplog
):
    """A bundle (for any driver) built by a compiler this driver refuses holds make_zebin's
    build of a kernel: make_zebin's answer, which Triton loads with no retry, is the
    driver's own build instead."""
    spirv, options, meta = _refused_bundle(refused_ocloc, tmp_path / "model")
    monkeypatch.setenv("XPU_ZEBIN_BUNDLE", str(tmp_path / "model"))
    monkeypatch.setenv("XPU_ZEBIN_OCLOC", str(tmp_path / "no-ocloc-here"))
    zebin = xt.make_zebin(spirv, meta, options, "pvc")
    assert _major(zebin) == "1" and "native binary from a bundle did not load" in caplog.text
    xpu_zebin.compile_and_load(zebin, "softmax_kernel", is_spv=False, cache=False).close()


def test_make_zebin_counts_once_a_request_whose_bundle_entry_the_driver_refuses(
    refused_ocloc, system_ocloc, tmp_path, monkeypatch, caplog
):
    """With ocloc here, the offline engine answers make_zebin from the bundles first: an
    entry this driver refuses (another compiler release) is tried in a worker, refused,
    and the kernel built by the ocloc here; the request is counted once (its bundle hit),
    the rebuild not again."""
    spirv, options, meta = _refused_bundle(refused_ocloc, tmp_path / "model")
    monkeypatch.setenv("XPU_ZEBIN_BUNDLE", str(tmp_path / "model"))
    monkeypatch.setenv("XPU_ZEBIN_OCLOC", system_ocloc)
    before = xpu_zebin.stats()["counters"]
    zebin = xt.make_zebin(spirv, meta, options, "pvc")
    after = xpu_zebin.stats()["counters"]
    assert _major(zebin) == "1" and "native binary from a bundle did not load" in caplog.text
    assert after["requests"] - before["requests"] == 1, (before, after)
    assert after["hits_bundle"] - before["hits_bundle"] == 1, (before, after)
    xpu_zebin.compile_and_load(zebin, "softmax_kernel", is_spv=False, cache=False).close()
