"""Bundles as hostile input, after a review: what ``bundle import`` puts into Triton's cache
is exactly what loaded here; Triton's SPIR-V and metadata are checked like anything else; a
native binary belongs to its own config; an import never deletes what it did not check and
never silently replaces another bundle of the same name. Real compilers, real driver (the
simulated PVC), real Triton (triton-xpu 3.3 on the CPU)."""

from __future__ import annotations

import json
import shutil

import entries
import pytest
from triton_helpers import SOFTMAX_SIG, softmax_kernel, triton_on_cpu

import xpu_zebin
import xpu_zebin.triton as xt
from xpu_zebin import bundle, samples, targets

CONFIGS = [{"constexprs": {"BLOCK": b}, "num_warps": 4} for b in (256, 1024)]


@pytest.fixture
def pvc() -> targets.TargetProfile:
    return targets.local()


@pytest.fixture(scope="module")
def built_model(system_ocloc, tmp_path_factory):
    """A Triton kernel's bundle for this device's driver and for any driver, two configs:
    built once for the module, with its own caches (the tests' are per test)."""
    root = tmp_path_factory.mktemp("bundle-trust")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("XPU_ZEBIN_CACHE_DIR", str(root / "cache"))
        (root / "tmp").mkdir()
        env.setenv("TMPDIR", str(root / "tmp"))
        pvc = targets.local()
        with triton_on_cpu(str(root / "farm-cache")):
            manifest = xt.precompile_kernel(softmax_kernel, SOFTMAX_SIG,
                                            [pvc, pvc.any_driver()], root / "model", CONFIGS,
                                            ocloc=system_ocloc)  # fmt: skip
        xpu_zebin._core.shutdown_workers()  # started with this TMPDIR: not the tests'
    assert manifest["run_failures"] == []
    return root / "model"


@pytest.fixture
def model(built_model, tmp_path):
    """This test's own copy of the bundle: tests forge its files."""
    return shutil.copytree(built_model, tmp_path / "model")


def _rewrite(out, data, entry, name, new: bytes) -> None:
    """Replace a Triton entry's file, its checksum made to match (a forger's bundle)."""
    f = next(f for f in entry["files"] if f["name"].endswith(name))
    entries.forge_file(out / "triton" / entry["target"] / entry["hash"] / f["name"], f, new)
    (out / "manifest.json").write_text(json.dumps(data))


def test_an_exact_driver_entry_wins_and_each_key_is_put_once(model, pvc, tmp_path, monkeypatch):
    put = []
    monkeypatch.setattr(xt.cache_entries, "put", lambda t, files: put.append(t))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "user-cache"))
    assert xt.import_triton_entries(model, pvc) == 4  # 2 configs x (SPIR-V, native)
    hashes = [t["hash"] for t in put]
    assert len(hashes) == len(set(hashes)) == 4
    assert {t["target"] for t in put} == {pvc.id}


def test_triton_spirv_is_validated_like_any_spirv(model, pvc, system_ocloc, tmp_path):
    data = json.loads((model / "manifest.json").read_text())
    spv_entry = next(t for t in data["triton_cache"] if not t["native"])
    # Well-formed SPIR-V, but of another kernel: not this entry's.
    other = xpu_zebin.opencl_to_spirv(samples.ADD_KERNEL, device="pvc", ocloc=system_ocloc)
    _rewrite(model, data, spv_entry, ".spv", other)
    assert "not valid SPIR-V of its kernel" in bundle.verify(model)["bad"][0][1]
    # Truncated: the magic is right, the module is not.
    _rewrite(model, data, spv_entry, ".spv", other[:40])
    with pytest.raises(xpu_zebin.InvalidArgumentError, match="not valid SPIR-V of its kernel"):
        xt.import_bundle(model, tmp_path / "into")
    assert not (tmp_path / "into").exists()


@pytest.mark.parametrize(
    "field, value",
    [("num_warps", 3), ("num_warps", 1 << 20), ("num_warps", True), ("threads_per_warp", 7),
     ("shared", -1), ("shared", 1 << 40), ("shared", "0"), ("build_flags", "-x\x00-y"),
     ("build_flags", 5), ("name", "../k"), ("threads_per_warp", 16.0),
     ("build_flags", "-igc_opts 'ShaderDumpEnable=1,DumpToCustomDir=/tmp/x'")],
)  # fmt: skip
def test_triton_metadata_holds_what_triton_writes(model, pvc, field, value):
    data = json.loads((model / "manifest.json").read_text())
    entry = next(t for t in data["triton_cache"] if t["target"] == pvc.id)
    meta_file = next(f for f in entry["files"] if f["name"].endswith(".json"))
    meta_path = model / "triton" / entry["target"] / entry["hash"] / meta_file["name"]
    meta = json.loads(entries.held(meta_path))
    if field == "name":  # the manifest says the same name, so only the metadata check tells
        entry["kernel"] = value
    _rewrite(model, data, entry, ".json", json.dumps({**meta, field: value}).encode())
    with pytest.raises(xpu_zebin.InvalidArgumentError, match=field if field != "name" else "."):
        xt.import_triton_entries(model, pvc)


def test_a_native_binary_belongs_to_its_own_config(model, pvc):
    """Each config's native Triton entry holds its own build: another config's build of
    the same kernel (a real, checked entry of the bundle) does not pass for it."""
    data = json.loads((model / "manifest.json").read_text())
    natives = [t for t in data["triton_cache"] if t["native"] and t["target"] == pvc.id]
    first, second = sorted(natives, key=lambda t: t["config"])
    other = next(e for e in data["entries"] if e["key"] == second["native_key"])
    assert first["native_key"] != second["native_key"]
    _rewrite(model, data, first, ".spv", entries.held(model / other["file"]))
    assert "native entry of its own config" in bundle.verify(model)["bad"][0][1]
    with pytest.raises(xpu_zebin.InvalidArgumentError, match="native entry of its own config"):
        xt.import_triton_entries(model, pvc)


def test_another_bundle_of_the_same_name_is_not_silently_replaced(
    pvc, system_ocloc, tmp_path, caplog
):
    spirv = xpu_zebin.opencl_to_spirv(samples.ADD_KERNEL, device="pvc", ocloc=system_ocloc)
    ours, theirs = tmp_path / "a" / "model", tmp_path / "b" / "model"
    bundle.precompile([{"spirv": spirv, "name": "add"}], [pvc], ours, ocloc=system_ocloc)
    bundle.precompile([{"spirv": spirv, "name": "add", "config": "other"}], [pvc], theirs,
                      ocloc=system_ocloc)  # fmt: skip
    into = tmp_path / "into"
    installed = xt.import_bundle(ours, into)
    assert xt.import_bundle(ours, into) == installed  # the same bundle again: fine
    with pytest.raises(xpu_zebin.InvalidArgumentError, match="another bundle of the same name"):
        xt.import_bundle(theirs, into)
    assert (installed / "manifest.json").read_bytes() == (ours / "manifest.json").read_bytes()
    assert [p.name for p in into.iterdir()] == ["model"]  # no staging left behind
    xt.import_bundle(theirs, into, replace=True)
    assert (installed / "manifest.json").read_bytes() == (theirs / "manifest.json").read_bytes()


def test_a_directory_swapped_in_during_import_is_never_deleted(
    pvc, system_ocloc, tmp_path, monkeypatch
):
    """Between the import's look at the installed bundle and its rename, another process
    puts a directory of its own there: it is put back untouched, not deleted."""
    spirv = xpu_zebin.opencl_to_spirv(samples.ADD_KERNEL, device="pvc", ocloc=system_ocloc)
    out = tmp_path / "model"
    bundle.precompile([{"spirv": spirv, "name": "add"}], [pvc], out, ocloc=system_ocloc)
    into = tmp_path / "into"
    installed = xt.import_bundle(out, into)
    copy = xpu_zebin._core.bundle_copy

    def copy_then_swap(src, dest):
        copy(src, dest)
        shutil.rmtree(installed)  # the neighbour's directory, where the bundle was
        installed.mkdir()
        (installed / "thesis.tex").write_text("years of work")

    monkeypatch.setattr(xpu_zebin._core, "bundle_copy", copy_then_swap)
    with pytest.raises(xpu_zebin.InvalidArgumentError, match="not an installed bundle"):
        xt.import_bundle(out, into)
    assert (installed / "thesis.tex").read_text() == "years of work"
    assert [p.name for p in into.iterdir()] == ["model"]


def test_an_import_killed_between_its_renames_loses_nothing(pvc, system_ocloc, tmp_path):
    """Killed after it moved the installed bundle aside and before it put the new one in
    place: the next import puts the old one back first (nothing lost, nothing leaked)."""
    import os
    import signal
    import subprocess
    import sys

    spirv = xpu_zebin.opencl_to_spirv(samples.ADD_KERNEL, device="pvc", ocloc=system_ocloc)
    out = tmp_path / "model"
    bundle.precompile([{"spirv": spirv, "name": "add"}], [pvc], out, ocloc=system_ocloc)
    into = tmp_path / "into"
    installed = xt.import_bundle(out, into)
    before = (installed / "manifest.json").read_bytes()
    killed = (
        "import os, signal, sys\n"
        "from xpu_zebin.bundle import importing\n"
        "importing._same_manifest = lambda a, b: os.kill(os.getpid(), signal.SIGKILL)\n"
        "importing.import_bundle(sys.argv[1], sys.argv[2])\n"
    )
    run = subprocess.run([sys.executable, "-c", killed, str(out), str(into)], timeout=300,
                         env={**os.environ, "XPU_ZEBIN_TRITON": "0"})  # fmt: skip
    assert run.returncode == -signal.SIGKILL and not installed.exists()  # moved aside
    xt.import_bundle(out, into)
    assert (installed / "manifest.json").read_bytes() == before
    leftovers = [p for p in into.iterdir() if p.name != "model"]
    assert all(not (p / "old").exists() for p in leftovers)
