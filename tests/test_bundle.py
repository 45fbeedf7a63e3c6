"""Ahead-of-time bundles on the real compilers and the real driver: target profiles taken on
the (simulated) PVC, native code built for them without using the device, and loads that
run no compiler, refuse other targets and survive corrupted entries."""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
from pathlib import Path

import entries
import pytest
from triton_helpers import SOFTMAX_SIG, RecordingUtils, softmax_kernel, triton_on_cpu

import xpu_zebin
import xpu_zebin.triton as xt
from xpu_zebin import bundle, samples, targets

G256 = "-cl-intel-256-GRF-per-thread"


@pytest.fixture(scope="module")
def kernels(system_ocloc) -> list:
    sources = {
        "add": samples.ADD_KERNEL,
        "small": samples.register_pressure_kernel(40, name="small"),
        "spill": samples.register_pressure_kernel(300, name="spill"),
    }
    return [
        {"spirv": xpu_zebin.opencl_to_spirv(src, device="pvc", ocloc=system_ocloc), "name": n}
        for n, src in sources.items()
    ]


@pytest.fixture
def pvc() -> targets.TargetProfile:
    return targets.local()


def _bmg(profile: targets.TargetProfile) -> targets.TargetProfile:
    """A profile of another GPU, as a file from another machine would give it."""
    return dataclasses.replace(profile, ocloc_device="bmg", name="bmg", driver="1.6.35096")


def _native_of(manifest: dict, out: Path, kernel: str, target: str) -> bytes:
    entry = next(e for e in manifest["entries"] if (e["kernel"], e["target"]) == (kernel, target))
    return entries.held(out / entry["file"])


def test_target_profile_of_the_local_device_round_trips(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "xpu_zebin", "target", "--json", "-o", str(tmp_path / "p.json")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["ocloc_device"] == "pvc" and data["backend"] == "xpu" and data["driver"]
    profile = targets.load(tmp_path / "p.json")
    assert profile.id == data["id"] == targets.local().id  # the same in another process
    data["warp_size"] = 16  # edited after the fact: its id no longer matches
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(xpu_zebin.InvalidArgumentError, match="id does not match"):
        targets.load(tmp_path / "bad.json")
    (tmp_path / "junk.json").write_bytes(b"\xff" * 100)
    with pytest.raises(xpu_zebin.InvalidArgumentError):
        targets.load(tmp_path / "junk.json")


def test_precompile_builds_every_target_and_loads_with_no_compile(
    kernels, pvc, modern_ocloc, tmp_path, monkeypatch, caplog
):
    out = tmp_path / "bundle"
    manifest = bundle.precompile(kernels, [pvc, _bmg(pvc)], out, ocloc=modern_ocloc)
    assert manifest["failures"] == []
    assert {(e["kernel"], e["target"]) for e in manifest["entries"]} == {
        (k["name"], t.id) for k in kernels for t in (pvc, _bmg(pvc))
    }
    flags = {e["kernel"]: e["build_flags"] for e in manifest["entries"] if e["target"] == pvc.id}
    assert flags == {"add": "", "small": "", "spill": G256}  # load_binary's rule (#8147)
    assert bundle.verify(out) == {"ok": [e["key"] for e in manifest["entries"]], "bad": []}

    monkeypatch.setenv("XPU_ZEBIN_BUNDLE", str(out))
    monkeypatch.setenv("XPU_ZEBIN_OCLOC", str(tmp_path / "no-ocloc-here"))
    with caplog.at_level(logging.DEBUG, logger="xpu_zebin.bundle"):
        for k in kernels:
            module, _, n_regs, n_spills, _ = xt.load_binary(k["name"], k["spirv"], 0, "", True, 0)
            assert n_spills == module.spill_bytes // (4 * module.simd_size)
            with module:
                # The bundle's own bytes (a JIT build would be the driver's, not ocloc's).
                assert module.native_binary == _native_of(manifest, out, k["name"], pvc.id)
                assert module.build_flags == flags[k["name"]]
                assert n_regs == (256 if k["name"] == "spill" else 128)
    assert caplog.text.count("from the bundle") == len(kernels)


def test_a_bundle_for_another_target_is_not_loaded(kernels, pvc, modern_ocloc, tmp_path,
                                                   monkeypatch, caplog):  # fmt: skip
    out = tmp_path / "bundle"
    manifest = bundle.precompile(kernels[:1], [_bmg(pvc)], out, ocloc=modern_ocloc)
    monkeypatch.setenv("XPU_ZEBIN_BUNDLE", str(out))
    with caplog.at_level(logging.DEBUG, logger="xpu_zebin.bundle"):
        module, *_ = xt.load_binary("add", kernels[0]["spirv"], 0, "", True, 0)
    with module:
        assert module.native_binary != _native_of(manifest, out, "add", _bmg(pvc).id)
    assert "other targets only" in caplog.text


def test_a_corrupted_entry_is_refused_and_the_kernel_compiled(
    kernels, pvc, modern_ocloc, tmp_path, monkeypatch, caplog
):
    out = tmp_path / "bundle"
    manifest = bundle.precompile(kernels, [pvc], out, ocloc=modern_ocloc)
    victim = next(e for e in manifest["entries"] if e["kernel"] == "spill")
    path = out / victim["file"]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    report = bundle.verify(out)
    assert [k for k, _ in report["bad"]] == [victim["key"]] and "checksum" in report["bad"][0][1]
    with pytest.raises(xpu_zebin.InvalidArgumentError, match="not imported"):
        xt.import_bundle(out, tmp_path / "installed")
    monkeypatch.setenv("XPU_ZEBIN_BUNDLE", str(out))
    with caplog.at_level(logging.DEBUG, logger="xpu_zebin.bundle"):
        module, _, n_regs, *_ = xt.load_binary("spill", kernels[2]["spirv"], 0, "", True, 0)
    with module:
        assert n_regs == 256 and module.attempts[0].build_flags == ""  # built: the ladder ran
    assert "refused" in caplog.text


def test_a_garbled_manifest_is_a_clear_error(tmp_path):
    (tmp_path / "manifest.json").write_text('{"format": "xpu-zebin-bundle/1", "entries": '
                                            '[{"key": "../../etc", "file": "x"}]}')  # fmt: skip
    for call in (bundle.verify, bundle.info):
        with pytest.raises(xpu_zebin.InvalidArgumentError, match="not a usable xpu-zebin bundle"):
            call(tmp_path)


def test_triton_kernels_precompiled_and_loaded_native_by_the_driver(
    pvc, modern_ocloc, tmp_path, monkeypatch
):
    """A Triton kernel's autotune configs through Triton's front end for the profile, then
    the native builds; the wrapped driver later gets each one native, from the bundle."""
    configs = [{"constexprs": {"BLOCK": 256}, "num_warps": 4},
               {"constexprs": {"BLOCK": 1024}, "num_warps": 8}]  # fmt: skip
    out = tmp_path / "bundle"
    with triton_on_cpu(str(tmp_path / "triton-cache")):
        manifest = xt.precompile_kernel(
            softmax_kernel, SOFTMAX_SIG, [pvc], out, configs, ocloc=modern_ocloc
        )
        assert len(manifest["entries"]) == 4 and manifest["triton"]  # load_binary, make_zebin
        loads = [e for e in manifest["entries"] if not e["config"].endswith("(make_zebin)")]
        monkeypatch.setenv("XPU_ZEBIN_BUNDLE", str(out))
        utils = xt.install(RecordingUtils(), backend=False)
        try:
            from triton_helpers import compile_triton

            for config, entry in zip(configs, loads):
                compiled = compile_triton(softmax_kernel, SOFTMAX_SIG, config["constexprs"],
                                          num_warps=config["num_warps"])  # fmt: skip
                name = compiled.metadata.name
                module, *_ = utils.load_binary(name, compiled.asm["spv"], 0, "", True, 0)
                _, native, _flags, is_spv, _ = utils.calls[-1]
                assert is_spv is False and native == entries.held(out / entry["file"])
                module.close()
        finally:
            xt.uninstall()


def test_cli_precompile_verify_info_import(add_spirv, pvc, modern_ocloc, tmp_path):
    (tmp_path / "pvc.json").write_text(json.dumps(pvc.to_json()))
    (tmp_path / "add.spv").write_bytes(add_spirv)
    run = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "xpu_zebin", *a], capture_output=True, text=True, timeout=300
    )
    out = tmp_path / "bundle"
    r = run("precompile", str(tmp_path / "add.spv"), "--target", str(tmp_path / "pvc.json"),
            "-o", str(out), "--ocloc", modern_ocloc)  # fmt: skip
    assert r.returncode == 0 and "1 native entries, 0 failures" in r.stdout, r.stderr
    r = run("bundle", "verify", str(out))
    assert r.returncode == 0 and "1 good, 0 bad" in r.stdout
    r = run("bundle", "info", str(out))
    assert r.returncode == 0 and "add [add.spv]" in r.stdout and "target pvc" in r.stdout
    r = run("bundle", "import", str(out), "--into", str(tmp_path / "imported"))
    assert r.returncode == 0 and (tmp_path / "imported" / "bundle" / "manifest.json").is_file()
    r = run("bundle", "import", str(out), "--into", str(tmp_path / "imported"))  # replaced
    assert r.returncode == 0, r.stderr
    r = run("precompile", str(tmp_path / "add.spv"), "--target", str(tmp_path / "nope.json"),
            "-o", str(out))  # fmt: skip
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_an_imported_bundle_is_used_without_the_variable(
    kernels, pvc, modern_ocloc, tmp_path, monkeypatch, caplog
):
    out = tmp_path / "bundle"
    manifest = bundle.precompile(kernels[:1], [pvc], out, ocloc=modern_ocloc)
    installed = xt.import_bundle(out)  # into the cache's bundles/, tried here at once
    assert installed.parent == Path(xpu_zebin._core.bundles_dir())
    monkeypatch.setenv("XPU_ZEBIN_BUNDLE", str(tmp_path / "nothing-here"))
    with caplog.at_level(logging.DEBUG, logger="xpu_zebin.bundle"):
        module, *_ = xt.load_binary("add", kernels[0]["spirv"], 0, "", True, 0)
    with module:
        assert module.native_binary == _native_of(manifest, out, "add", pvc.id)
    assert "holds no bundle" in caplog.text and "from the bundle" in caplog.text


def test_import_never_deletes_what_is_not_an_installed_bundle(kernels, pvc, modern_ocloc,
                                                               tmp_path):  # fmt: skip
    out = tmp_path / "bundle"
    bundle.precompile(kernels[:1], [pvc], out, ocloc=modern_ocloc)
    home = tmp_path / "home"
    (home / "bundle").mkdir(parents=True)
    (home / "bundle" / "thesis.tex").write_text("years of work")
    with pytest.raises(xpu_zebin.InvalidArgumentError, match="not an installed bundle"):
        xt.import_bundle(out, home)
    assert (home / "bundle" / "thesis.tex").read_text() == "years of work"
    assert sorted(p.name for p in home.iterdir()) == ["bundle"]  # no staging left behind


def test_hostile_bundles_are_skipped_and_good_ones_still_used(
    kernels, pvc, modern_ocloc, tmp_path, monkeypatch, caplog
):
    good = tmp_path / "good"
    manifest = bundle.precompile(kernels[:1], [pvc], good, ocloc=modern_ocloc)
    outside = tmp_path / "outside"
    outside.mkdir()
    linked = tmp_path / "linked"  # its native/ is a link out of the bundle
    linked.mkdir()
    (linked / "native").symlink_to(outside)
    (linked / "manifest.json").write_text((good / "manifest.json").read_text())
    with pytest.raises(xpu_zebin.InvalidArgumentError, match="native/ is not a directory"):
        bundle.precompile(kernels[:1], [pvc], linked, ocloc=modern_ocloc)
    assert list(outside.iterdir()) == []
    assert all("native/ is not a directory" in why for _, why in bundle.verify(linked)["bad"])
    garbled = tmp_path / "garbled"
    garbled.mkdir()
    (garbled / "manifest.json").write_text(
        '{"format": "xpu-zebin-bundle/1", "package": "0", "targets": {"x": 1}}'
    )
    monkeypatch.setenv("XPU_ZEBIN_BUNDLE", f"{garbled}:{linked}:{good}")
    with caplog.at_level(logging.DEBUG, logger="xpu_zebin.bundle"):
        module, *_ = xt.load_binary("add", kernels[0]["spirv"], 0, "", True, 0)
    with module:  # the garbled one is skipped, the linked one refused, the good one used
        assert module.native_binary == _native_of(manifest, good, "add", pvc.id)
    assert "is not a JSON object" in caplog.text and "from the bundle" in caplog.text
    assert "refused" not in caplog.text  # the good bundle had it: no refusal to speak of


def test_an_entry_that_claims_another_kernel_is_refused(kernels, pvc, modern_ocloc, tmp_path,
                                                        monkeypatch, caplog):  # fmt: skip
    out = tmp_path / "bundle"
    manifest = bundle.precompile(kernels[:2], [pvc], out, ocloc=modern_ocloc)
    add, small = (
        next(e for e in manifest["entries"] if e["kernel"] == n) for n in ("add", "small")
    )
    # small's (valid, checksummed) binary filed under add's key
    (out / add["file"]).write_bytes((out / small["file"]).read_bytes())
    forged = dict(small, key=add["key"], file=add["file"])
    data = json.loads((out / "manifest.json").read_text())
    data["entries"] = [forged if e["key"] == add["key"] else e for e in data["entries"]]
    (out / "manifest.json").write_text(json.dumps(data))
    monkeypatch.setenv("XPU_ZEBIN_BUNDLE", str(out))
    with caplog.at_level(logging.DEBUG, logger="xpu_zebin.bundle"):
        module, *_ = xt.load_binary("add", kernels[0]["spirv"], 0, "", True, 0)
    with module:
        assert module.kernel_name == "add" and module.attempts[0].build_flags == ""
    assert "refused" in caplog.text and "from the bundle" not in caplog.text


def test_a_bundle_for_any_driver_and_one_from_another_triton(
    kernels, pvc, modern_ocloc, tmp_path, monkeypatch, caplog
):
    out = tmp_path / "bundle"
    manifest = bundle.precompile(kernels[:1], [pvc.any_driver()], out, ocloc=modern_ocloc)
    monkeypatch.setenv("XPU_ZEBIN_BUNDLE", str(out))
    module, *_ = xt.load_binary("add", kernels[0]["spirv"], 0, "", True, 0)
    with module:
        assert module.native_binary == _native_of(manifest, out, "add", pvc.any_driver().id)
    data = json.loads((out / "manifest.json").read_text())
    data["triton"] = "0.0.1"
    (out / "manifest.json").write_text(json.dumps(data))
    with caplog.at_level(logging.DEBUG, logger="xpu_zebin.bundle"):
        module, *_ = xt.load_binary("add", kernels[0]["spirv"], 0, "", True, 0)
    module.close()
    assert "Triton 0.0.1" in caplog.text and "from the bundle" not in caplog.text


@pytest.mark.parametrize(
    "change, why",
    [
        ({"ocloc_device": "-q"}, "not an ocloc device name"),
        ({"ocloc_device": "pvc²"}, "not an ocloc device name"),
        ({"warp_size": True}, "warp_size"),
        ({"warp_size": 10**30}, "warp_size"),
        ({"arch": {"x": float("nan")}}, "not plain JSON"),
        ({"driver": 7}, "driver"),
    ],
)
def test_profile_files_are_checked(pvc, tmp_path, change, why):
    data = {**pvc.to_json(), **change}
    data.pop("id")
    (tmp_path / "p.json").write_text(json.dumps(data))
    with pytest.raises(xpu_zebin.InvalidArgumentError, match=why):
        targets.load(tmp_path / "p.json")


def test_profile_files_that_are_not_files_or_repeat_keys(pvc, tmp_path):
    import os

    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(xpu_zebin.InvalidArgumentError, match="not a regular file"):
        targets.load(tmp_path / "fifo")  # returns at once: never waits for a writer
    text = json.dumps(pvc.to_json())
    (tmp_path / "twice.json").write_text(text[:-1] + ', "warp_size": 16}')
    with pytest.raises(xpu_zebin.InvalidArgumentError, match="given twice"):
        targets.load(tmp_path / "twice.json")
    (tmp_path / "deep.json").write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(xpu_zebin.InvalidArgumentError):
        targets.load(tmp_path / "deep.json")


def test_yesterdays_triton_cache_becomes_todays_bundle(pvc, modern_ocloc, tmp_path, monkeypatch):
    """Triton's JIT cache (its SPIR-V entries) turned into a bundle, from Python and from
    the CLI; the kernels Triton compiles again then load native from it."""
    from triton_helpers import compile_triton

    cache = tmp_path / "triton-cache"
    blocks = (256, 1024)
    with triton_on_cpu(str(cache)):
        compiled = [compile_triton(softmax_kernel, SOFTMAX_SIG, {"BLOCK": b}) for b in blocks]
        kernels = xt.kernels_in_cache(cache)
        assert sorted(k["spirv"] for k in kernels) == sorted(c.asm["spv"] for c in compiled)
        (tmp_path / "pvc.json").write_text(json.dumps(pvc.to_json()))
        out = tmp_path / "bundle"
        r = subprocess.run(
            [sys.executable, "-m", "xpu_zebin", "precompile", "--from-triton-cache", str(cache),
             "--target", str(tmp_path / "pvc.json"), "-o", str(out), "--ocloc", modern_ocloc],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert r.returncode == 0 and "2 native entries, 0 failures" in r.stdout, r.stderr
        monkeypatch.setenv("XPU_ZEBIN_BUNDLE", str(out))
        utils = xt.install(RecordingUtils(), backend=False)
        natives = {entries.held(out / e["file"]) for e in bundle.info(out)["entries"]}
        try:
            for c in compiled:
                module, *_ = utils.load_binary(c.metadata.name, c.asm["spv"], 0, "", True, 0)
                module.close()
                _, native, _flags, is_spv, _ = utils.calls[-1]
                assert is_spv is False and native in natives  # the bundle's own bytes
        finally:
            xt.uninstall()
    with pytest.raises(xpu_zebin.InvalidArgumentError, match="not a directory"):
        xt.kernels_in_cache(tmp_path / "nope")
    import os

    hostile = tmp_path / "hostile" / "entry"  # FIFOs where Triton's files would be
    hostile.mkdir(parents=True)
    os.mkfifo(hostile / "a.json")
    (hostile / "b.json").write_text('{"name": "b"}')
    os.mkfifo(hostile / "b.spv")
    (hostile / "c.json").write_text('{"name": "../../c"}')
    assert xt.kernels_in_cache(tmp_path / "hostile") == []  # and it returned


def _triton_source(block: int):
    from triton.compiler import ASTSource

    names = list(softmax_kernel.arg_names)
    sig = {n: "constexpr" if n == "BLOCK" else SOFTMAX_SIG[n] for n in names}
    return ASTSource(softmax_kernel, sig, {(names.index("BLOCK"),): block})


def test_triton_finds_a_bundles_kernels_compiled_after_import(
    pvc, modern_ocloc, system_ocloc, tmp_path, monkeypatch
):
    """A bundle's Triton cache entries, shipped as one archive and imported into a fresh
    Triton cache, are Triton cache hits (no stage of Triton's pipeline runs): the SPIR-V
    entry (the drop-in then loads the bundle's native binary) and the native one
    (TRITON_XPU_GEN_NATIVE_CODE). The drop-in make_zebin finds its build in the bundle."""
    import types

    import triton
    from triton.backends import backends

    out, archive = tmp_path / "model.bundle", tmp_path / "model.bundle.tar"
    config = {"constexprs": {"BLOCK": 256}, "num_warps": 4}
    with triton_on_cpu(str(tmp_path / "farm-cache")):
        manifest = xt.precompile_kernel(softmax_kernel, SOFTMAX_SIG, [pvc], out, [config],
                                            ocloc=modern_ocloc)  # fmt: skip
    assert sorted(t["native"] for t in manifest["triton_cache"]) == [False, True]
    with triton_on_cpu(str(tmp_path / "farm-cache")):  # the farm's Triton cache, another ocloc
        other = xt.precompile_kernel(softmax_kernel, SOFTMAX_SIG, [pvc], tmp_path / "other",
                                         [config], ocloc=system_ocloc)  # fmt: skip
    assert other["failures"] == [] and bundle.verify(tmp_path / "other")["bad"] == []
    load_entry, zebin_entry = sorted(manifest["entries"], key=lambda e: "make_zebin" in e["config"])
    assert bundle.pack(out, archive) == 1 + 2 + 2 * 2  # manifest, natives, Triton's files
    assert bundle.verify(archive)["bad"] == []
    user_cache, installed = tmp_path / "user-cache", tmp_path / "installed"
    r = subprocess.run(
        [sys.executable, "-m", "xpu_zebin", "bundle", "import", str(archive), "--into",
         str(installed), "--triton-cache", str(user_cache)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0 and (installed / "model.bundle").is_dir(), r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "xpu_zebin", "bundle", "import", str(archive), "--into",
         str(installed), "--triton-cache", str(user_cache)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr  # an installed bundle (Triton entries too) is replaced

    def no_compile(*_args, **_kwargs):
        raise AssertionError("a stage of Triton's pipeline ran")

    with triton_on_cpu(str(user_cache)):
        monkeypatch.setattr(backends["intel"].compiler, "add_stages", no_compile)
        spv_hit, native_hit = (
            triton.compile(_triton_source(256), target=pvc.gpu_target(),
                           options={"num_warps": 4, "generate_native_code": native})
            for native in (False, True)
        )  # fmt: skip
        assert spv_hit.asm["spv"][:4] == b"\x03\x02\x23\x07"
        assert native_hit.asm["spv"] == entries.held(out / zebin_entry["file"])
        monkeypatch.setenv("XPU_ZEBIN_BUNDLE", str(installed / "model.bundle"))
        monkeypatch.setenv("XPU_ZEBIN_OCLOC", str(tmp_path / "no-ocloc-here"))
        utils = xt.install(RecordingUtils(), backend=False)
        try:
            for hit, is_spv in ((spv_hit, True), (native_hit, False)):
                module, *_ = utils.load_binary(hit.name, hit.asm["spv"], 0,
                                               hit.metadata.build_flags, is_spv, 0)  # fmt: skip
                module.close()
                _, native, _flags, spv, _ = utils.calls[-1]
                wanted = load_entry if is_spv else zebin_entry
                assert spv is False and native == entries.held(out / wanted["file"])
        finally:
            xt.uninstall()
        metadata = {"name": spv_hit.name, "build_flags": ""}
        options = types.SimpleNamespace(grf_mode="default", num_warps=4)
        assert xt.make_zebin(spv_hit.asm["spv"], metadata, options) == native_hit.asm["spv"]


def test_triton_entries_are_not_installed_for_another_triton_build_or_forged(
    pvc, modern_ocloc, tmp_path, monkeypatch, caplog
):
    out = tmp_path / "bundle"
    configs = [{"constexprs": {"BLOCK": b}, "num_warps": 4} for b in (256, 1024)]
    with triton_on_cpu(str(tmp_path / "farm-cache")):  # two profiles, one Triton hash each
        manifest = xt.precompile_kernel(softmax_kernel, SOFTMAX_SIG, [pvc, pvc.any_driver()],
                                            out, configs, ocloc=modern_ocloc)  # fmt: skip
    assert len(bundle.info(out)["triton_cache"]) == 8 and manifest["run_failures"] == []
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "user-cache"))
    data = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**data, "triton_key": "0" * 64}))
    with caplog.at_level(logging.INFO, logger="xpu_zebin.bundle"):
        assert xt.import_triton_entries(out, pvc) == 0
    assert "another Triton build" in caplog.text and not (tmp_path / "user-cache").exists()
    # Metadata that says native code where the binary is SPIR-V (checksum made to match).
    spv_entry = next(t for t in data["triton_cache"] if not t["native"])
    meta = next(f for f in spv_entry["files"] if f["name"].endswith(".json"))
    meta_path = out / "triton" / spv_entry["target"] / spv_entry["hash"] / meta["name"]
    original, listed = meta_path.read_bytes(), dict(meta)
    forged_meta = json.dumps({**json.loads(entries.held(meta_path)), "generate_native_code": True})
    entries.forge_file(meta_path, meta, forged_meta.encode())
    (out / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(xpu_zebin.InvalidArgumentError, match="another kind of binary"):
        xt.import_triton_entries(out, pvc)
    meta_path.write_bytes(original)
    meta.clear()
    meta.update(listed)
    # Native code that is none of the bundle's native entries, in an entry that says it is
    # SPIR-V (checksums made to match): Triton would load it with no trial of its own.
    victim = next(t for t in data["triton_cache"] if not t["native"])
    spv = next(f for f in victim["files"] if f["name"].endswith(".spv"))
    zebin = bytearray(entries.held(out / manifest["entries"][0]["file"]))
    zebin[len(zebin) // 2] ^= 0xFF
    spv_path = out / "triton" / victim["target"] / victim["hash"] / spv["name"]
    entries.forge_file(spv_path, spv, bytes(zebin))
    (out / "manifest.json").write_text(json.dumps(data))
    assert "neither SPIR-V nor" in bundle.verify(out)["bad"][0][1]
    with pytest.raises(xpu_zebin.InvalidArgumentError, match="neither SPIR-V nor"):
        xt.import_triton_entries(out, pvc)
    with pytest.raises(xpu_zebin.InvalidArgumentError, match="neither SPIR-V nor"):
        xt.import_bundle(out, tmp_path / "into")
    assert not (tmp_path / "user-cache").exists() and not (tmp_path / "into").exists()
    # A third file beside the metadata and the binary: not a Triton entry of a bundle.
    victim["files"].append(dict(spv, name="other.spv"))
    (out / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(xpu_zebin.InvalidArgumentError, match=r"<name>\.json and <name>\.spv"):
        bundle.info(out)
    assert len(manifest["triton_cache"]) == 8


@pytest.mark.parametrize(
    "member, why",
    [
        ("symlink", "is not a bundle's file"),
        ("traversal", "is not a bundle's file"),
        ("twice", "twice"),
        ("garbage", "not a tar archive"),
        ("stray", "is not a bundle's file"),
    ],
)
def test_hostile_archives_are_refused_and_nothing_written_outside(tmp_path, member, why):
    import io
    import tarfile

    archive = tmp_path / "hostile.tar"
    manifest = b'{"format": "xpu-zebin-bundle/1", "package": "0"}'
    if member == "garbage":
        archive.write_bytes(b"\x1f\x8b" + bytes(range(256)) * 8)
    else:
        with tarfile.open(archive, "w") as tar:

            def add(name: str, data: bytes = b"x") -> None:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))

            add("manifest.json", manifest)
            if member == "symlink":
                link = tarfile.TarInfo("native/" + "a" * 64 + ".zebin")
                link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
                tar.addfile(link)
            elif member == "traversal":
                add("../../escaped")
            elif member == "twice":
                add("manifest.json", manifest)
            else:
                add("native/notes.txt")
    for act in (bundle.verify, bundle.info, lambda a: xt.import_bundle(a, tmp_path / "into")):
        with pytest.raises(xpu_zebin.InvalidArgumentError, match=why):
            act(archive)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hostile.tar", "tmp"]
    assert list((tmp_path / "tmp").iterdir()) == []  # the unpacked copy is gone


KERNELS_PY = """
import triton
import triton.language as tl


@triton.jit
def double(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


# triton-xpu 3.3 asks the active driver for a benchmarker when the decorator runs, unless
# one is given: on a machine without a GPU, that is the only way to define one.
@triton.autotune(configs=[triton.Config({"BLOCK": 64}, num_warps=4),
                          triton.Config({"BLOCK": 128}, num_warps=2)], key=["n"],
                 do_bench=lambda *args, **kwargs: [0.0, 0.0, 0.0])
@triton.jit
def tuned(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


KERNELS = [{"kernel": double, "signature": {"x_ptr": "*fp32", "n": "i32"},
            "configs": [{"constexprs": {"BLOCK": 64}, "num_warps": 4}]}]
MIXED = KERNELS + [{"kernel": double, "signature": {"x_ptr": "*fp32"},
                    "configs": [{"constexprs": {"BLOCK": 64}}]}]
"""


def test_cli_precompiles_triton_kernels_named_by_spec(pvc, modern_ocloc, tmp_path, capsys):
    """``xpu-zebin precompile FILE.py:NAME``: a kernel with --signature and --config, an
    autotuned kernel (its own configs), or a list of kernel specs; a kernel without a
    signature is a usage error."""
    from xpu_zebin import cli

    (tmp_path / "kernels.py").write_text(KERNELS_PY)
    (tmp_path / "pvc.json").write_text(json.dumps(pvc.to_json()))
    common = ["--target", str(tmp_path / "pvc.json"), "--ocloc", modern_ocloc]
    with triton_on_cpu(str(tmp_path / "triton-cache")):
        config = '{"constexprs": {"BLOCK": 128}, "num_warps": 4}'
        assert cli.main(["precompile", f"{tmp_path}/kernels.py:double", *common, "-o",
                         str(tmp_path / "a"), "--signature", "x_ptr=*fp32, n=i32",
                         "--config", config]) == 0  # fmt: skip
        assert "2 native entries, 0 failures, 2 Triton cache entries" in capsys.readouterr().out
        assert cli.main(["precompile", f"{tmp_path}/kernels.py:KERNELS", *common, "-o",
                         str(tmp_path / "b")]) == 0  # fmt: skip
        configs = {e["config"] for e in bundle.info(tmp_path / "b")["entries"]}
        config = "{'constexprs': {'BLOCK': 64}, 'num_warps': 4}"
        assert configs == {config, f"{config} (make_zebin)"}
        assert cli.main(["precompile", f"{tmp_path}/kernels.py:tuned", *common, "-o",
                         str(tmp_path / "t"), "--signature", "x_ptr=*fp32,n=i32"]) == 0  # fmt: skip
        assert "4 native entries, 0 failures, 4 Triton cache entries" in capsys.readouterr().out
        assert cli.main(["precompile", f"{tmp_path}/kernels.py:double", *common, "-o",
                         str(tmp_path / "c")]) == 2  # fmt: skip
        assert "needs --signature" in capsys.readouterr().err
        (tmp_path / "boom.py").write_text("raise RuntimeError('no GPU here')\n")
        for bad in ([f"{tmp_path}/kernels.py:nothing"], [f"{tmp_path}/boom.py:x"], [".foo:bar"],
                    [f"{tmp_path}/kernels.py:MIXED"],  # its second kernel: nothing is built
                    [f"{tmp_path}/kernels.py:double", "--signature", "x_ptr=*fp32",
                     "--config", '{"constexprs": {"BLOCK": 64}}'],
                    [f"{tmp_path}/kernels.py:double", "--signature", "x_ptr=*fp32,n=i32",
                     "--config", "5"]):  # fmt: skip
            assert cli.main(["precompile", *bad, *common, "-o", str(tmp_path / "c")]) == 2, bad
            assert "Traceback" not in capsys.readouterr().err
        assert not (tmp_path / "c").exists()


def test_the_offline_engine_asks_the_bundles_first_even_without_ocloc(
    kernels, pvc, modern_ocloc, tmp_path, monkeypatch
):
    """make_zebin's native stage asks the bundles through the engine's levels (Rust): a
    bundle hit is the bundle's own bytes, counted once as a bundle hit in the request's
    cache directory; on a host with no ocloc the bundles still answer, and a kernel they do
    not hold is a clear toolchain_missing error."""
    out = tmp_path / "bundle"
    manifest = bundle.precompile(kernels[:2], [pvc], out, ocloc=modern_ocloc)
    assert manifest["failures"] == []
    monkeypatch.setenv("XPU_ZEBIN_BUNDLE", str(out))
    asked = bundle.query("add", 0)
    assert asked is not None
    cache = tmp_path / "engine-cache"  # this test's own (the precompile used the default)
    for ocloc in (modern_ocloc, str(tmp_path / "no-ocloc-here")):
        options = xpu_zebin.Options(cache_dir=str(cache), ocloc=ocloc)
        for k in kernels[:2]:
            result = xpu_zebin._core.compile(k["spirv"], "pvc", options, bundle=asked)
            assert result.source == "bundle" and result.cached
            assert result.binary == _native_of(manifest, out, k["name"], pvc.id)
        spill = kernels[2]
        if ocloc == modern_ocloc:  # not in the bundle: the compiler builds it
            built = xpu_zebin._core.compile(spill["spirv"], "pvc", options, bundle=asked)
            assert built.source == "compiled" and built.build_flags == G256
        else:  # only the cache could answer, under another compiler's key: nothing here
            with pytest.raises(xpu_zebin.ToolchainNotFound):
                xpu_zebin._core.compile(spill["spirv"], "pvc", options, bundle=asked)
    counters = xpu_zebin.stats(cache)["counters"]
    # The miss without a compiler is not counted: the caller's fallback counts the request.
    assert counters["hits_bundle"] == 4 and counters["requests"] == 5, counters


@pytest.mark.parametrize("bad", ["abc", (None, [None], []), [1, 2], (None, [("pvc",)], ["d"])])
def test_a_bundle_argument_that_is_not_a_query_is_refused_by_name(add_spirv, bad):
    with pytest.raises(xpu_zebin.InvalidArgumentError, match=r"bundle=.*is not valid"):
        xpu_zebin.compile(add_spirv, device="pvc", bundle=bad)
    # A malformed batch is refused whole, naming the request (as a request without spirv).
    good = {"spirv": add_spirv, "device": "pvc"}
    with pytest.raises(xpu_zebin.InvalidArgumentError, match=r"requests\[1\]\['bundle'\]"):
        xpu_zebin.compile_many([good, {**good, "bundle": bad}])
