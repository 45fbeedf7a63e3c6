"""Lean entries: what the levels keep is compressed (zstd), old entries still answer, and a
hostile compressed entry (a bomb, a length that lies, bytes after the frame, a frame cut
short) is refused with its reason, counted, rebuilt, in bounded memory, on the local cache
and in the fleet's store."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import blake3
import entries
import pytest
import zstandard
from test_remote import RedisServer, _node, keys, server  # noqa: F401  (fixtures)

import xpu_zebin
from xpu_zebin import bundle, remote, samples


def _entry_file(cache: Path) -> Path:
    (path,) = (cache / "zebin-v3").glob("*/*.zeentry")
    return path


def _sealed(key: str, stated: int, frame: bytes) -> bytes:
    """A compressed entry as anyone who may write the cache forges it: checksum included."""
    body = b"XZCACHE3" + struct.pack("<Q", stated) + frame
    return body + blake3.blake3(key.encode() + body).digest()


def _bomb() -> bytes:
    """One frame of 1 GiB of zeros (about 32 KiB), made a MiB at a time."""
    out = zstandard.ZstdCompressor(level=3).compressobj(size=1 << 30)
    chunk = bytes(1 << 20)
    return b"".join(out.compress(chunk) for _ in range(1024)) + out.flush()


def test_entries_are_compressed_and_old_ones_still_answer(add_spirv, system_ocloc, private_cache):
    built = xpu_zebin.compile(add_spirv, device="pvc", ocloc=system_ocloc)
    path = _entry_file(private_cache)
    entry = path.read_bytes()
    key = path.name.removesuffix(".zeentry")
    meta, binary = entries.opened(entry)
    assert binary == built.binary and json.loads(meta)["build_flags"] == built.build_flags
    c = xpu_zebin.stats(private_cache)["counters"]
    assert c["written_bytes"] == len(entry) < c["written_uncompressed_bytes"] / 2, c
    # The last release's entry of the same kernel: still a hit, the same answer, and kept
    # compressed from then on.
    path.write_bytes(entries.sealed_plain(key, meta, binary))
    again = xpu_zebin.compile(add_spirv, device="pvc", ocloc=system_ocloc)
    assert again.source == "cache" and again.binary == built.binary
    assert path.read_bytes().startswith(b"XZCACHE3")
    third = xpu_zebin.compile(add_spirv, device="pvc", ocloc=system_ocloc)
    assert third.source == "cache" and third.binary == built.binary


HOSTILE = {
    # 1 GiB of zeros stated as 1000 bytes, or stated truthfully (more than an entry).
    "bomb": lambda frame: (1000, _bomb(), "its frame states 1073741824 bytes, not 1000"),
    "truthful_bomb": lambda frame: (1 << 30, _bomb(), "more than it may hold here"),
    "length_lies": lambda frame: (200 << 20, frame, "more than ours inflate"),
    "trailing": lambda frame: (None, frame + b"junk", "4 bytes after the compressed body"),
    "cut_short": lambda frame: (None, frame[:-5], "cut short or not zstd"),
}

CHILD = """
import json, sys, xpu_zebin
spirv = open(sys.argv[1], "rb").read()
r = xpu_zebin.compile(spirv, device="pvc", ocloc=sys.argv[2])
peak = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(json.dumps({"source": r.source, "notes": r.notes, "peak_mib": peak / 1024}))
"""


@pytest.mark.parametrize("how", sorted(HOSTILE))
def test_a_hostile_compressed_entry_is_refused_in_bounded_memory(
    add_spirv, system_ocloc, private_cache, tmp_path, how
):
    xpu_zebin.compile(add_spirv, device="pvc", ocloc=system_ocloc)
    path = _entry_file(private_cache)
    entry = path.read_bytes()
    key = path.name.removesuffix(".zeentry")
    (stated,) = struct.unpack("<Q", entry[8:16])
    forged_stated, frame, why = HOSTILE[how](entry[16:-32])
    path.write_bytes(_sealed(key, stated if forged_stated is None else forged_stated, frame))
    spirv = tmp_path / "add.spv"
    spirv.write_bytes(add_spirv)
    env = {**os.environ, "XPU_ZEBIN_CACHE_DIR": str(private_cache)}
    out = subprocess.run([sys.executable, "-c", CHILD, str(spirv), system_ocloc], env=env,
                         capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["source"] == "compiled", got
    assert any("corrupt" in n and why in n for n in got["notes"]), got["notes"]
    assert got["peak_mib"] < 200, got  # never the GiB the bomb holds, nor what a header says
    assert xpu_zebin.stats(private_cache)["counters"]["refused_checksum"] == 1


def test_a_signed_bomb_in_the_store_is_refused(server, keys, add_spirv, system_ocloc,  # noqa: F811
                                               tmp_path, monkeypatch, caplog):  # fmt: skip
    """The signature covers what is stored: a trusted signer's bomb is still refused."""
    _node(monkeypatch, tmp_path, "a", server.url(), "read-write", keys["farm"])
    xpu_zebin.compile(add_spirv, device="pvc", ocloc=system_ocloc)
    client = server.client()
    (name,) = client.keys(remote.PREFIX + "*")
    header, _ = remote.unpack(client.get(name))
    bomb = _sealed(header["key"], 1000, _bomb())
    signer, sig = xpu_zebin._core.sign(remote.signed_message(
        header["key"], header["device"], header["compiler"], bomb))  # fmt: skip
    client.set(name, remote.pack({**header, "signer": signer, "signature": sig}, bomb))
    _node(monkeypatch, tmp_path, "b", server.url(), trusted=keys["farm_public"])
    got = xpu_zebin.compile(add_spirv, device="pvc", ocloc=system_ocloc)
    assert got.source == "compiled"
    assert remote.counts().get("untrusted") == 1, remote.counts()
    assert "bytes, not 1000" in caplog.text, caplog.text  # refused for what it holds


def test_a_node_keeping_entries_as_built_shares_them_compressed(
    server,  # noqa: F811
    keys,  # noqa: F811
    add_spirv,
    system_ocloc,
    tmp_path,
    monkeypatch,
):
    _node(monkeypatch, tmp_path, "a", server.url(), "read-only", keys["farm"])
    monkeypatch.setenv("XPU_ZEBIN_CACHE_COMPRESS", "0")
    xpu_zebin.compile(add_spirv, device="pvc", ocloc=system_ocloc)
    assert _entry_file(tmp_path / "cache-a").read_bytes().startswith(b"XZCACHE2")
    monkeypatch.setenv("XPU_ZEBIN_OCLOC", system_ocloc)
    monkeypatch.setenv("XPU_ZEBIN_REMOTE_MODE", "read-write")
    assert remote.publish(add_spirv, "pvc", xpu_zebin.Options())
    (name,) = server.client().keys(remote.PREFIX + "*")
    _, value = remote.unpack(server.client().get(name))
    assert value.startswith(b"XZCACHE3"), value[:8]


def test_a_cache_at_its_bound_holds_more_kernels(system_ocloc, tmp_path, monkeypatch):
    """The bound counts bytes on disk: with entries compressed, a cache bounded at four
    uncompressed entries keeps about as many more as the ratio says."""
    spirvs = [xpu_zebin.opencl_to_spirv(samples.register_pressure_kernel(v, name=f"k{v}"),
                                        device="pvc", ocloc=system_ocloc)
              for v in range(2, 14)]  # fmt: skip
    probe = tmp_path / "probe"
    xpu_zebin.compile(spirvs[-1], device="pvc", ocloc=system_ocloc, cache_dir=probe)
    held = xpu_zebin.stats(probe)["counters"]["written_uncompressed_bytes"]
    monkeypatch.setenv("XPU_ZEBIN_CACHE_MAX_BYTES", str(4 * held))
    bounded = tmp_path / "bounded"
    for spirv in spirvs:
        xpu_zebin.compile(spirv, device="pvc", ocloc=system_ocloc, cache_dir=bounded)
    s = xpu_zebin.stats(bounded)
    c = s["counters"]
    ratio = c["written_uncompressed_bytes"] / c["written_bytes"]
    assert s["bytes"] <= 4 * held and ratio > 2, (s["bytes"], held, ratio)
    assert s["entries"] >= min(len(spirvs), int(4 * 0.9 * ratio) - 1), (s["entries"], ratio)


BUNDLE_CHILD = """
import json, sys, xpu_zebin
from xpu_zebin import bundle
try:
    xpu_zebin._core.bundle_native(sys.argv[1], sys.argv[2])
    said = None
except xpu_zebin.InvalidArgumentError as e:
    said = str(e)
bad = bundle.verify(sys.argv[1])["bad"]
peak = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(json.dumps({"said": said, "bad": bad, "peak_mib": peak / 1024}))
"""


@pytest.fixture(scope="module")
def lean_bundle(tmp_path_factory, system_ocloc):
    """A bundle of one native entry (the add sample's zebin), written as this package
    writes bundles: its file compressed."""
    spirv = xpu_zebin.opencl_to_spirv(samples.ADD_KERNEL, device="pvc", ocloc=system_ocloc)
    zebin = xpu_zebin.compile(spirv, device="pvc", ocloc=system_ocloc, cache=False).binary
    out = tmp_path_factory.mktemp("bundle") / "b"
    entry = {"key": "a" * 64, "kernel": "add", "target": "t" * 64, "build_flags": "",
             "spill_bytes": 0, "n_spills": 0, "compiler": "c", "file": "", "blake3": "",
             "size": 0}  # fmt: skip
    header = {"format": "", "package": "test"}
    xpu_zebin._core.bundle_write(str(out), header, [(entry, zebin)], [], [])
    return out, zebin


def test_a_bundle_keeps_its_files_compressed(lean_bundle, tmp_path):
    out, zebin = lean_bundle
    manifest = json.loads((out / "manifest.json").read_text())
    (listed,) = manifest["entries"]
    stored = (out / listed["file"]).read_bytes()
    assert listed["size"] == len(zebin) and listed["stored"]["size"] == len(stored) < len(zebin)
    assert zstandard.ZstdDecompressor().decompress(stored) == zebin
    assert xpu_zebin._core.bundle_native(str(out), "a" * 64) == zebin
    # Format 1 kept files as built: a manifest of it listing compressed files is not one.
    old = tmp_path / "old"
    (old / "native").mkdir(parents=True)
    (old / listed["file"]).write_bytes(stored)
    (old / "manifest.json").write_text(json.dumps({**manifest, "format": "xpu-zebin-bundle/1"}))
    with pytest.raises(xpu_zebin.InvalidArgumentError, match="lists compressed files"):
        bundle.info(old)


@pytest.mark.parametrize("how", sorted(HOSTILE))
def test_a_hostile_compressed_bundle_file_is_refused_in_bounded_memory(lean_bundle, tmp_path, how):
    """A bundle's file forged as any writer of the directory can (the manifest's checksums
    made to match the stored bytes: the signature's part is the trust tests'): refused with
    its reason by a lookup and by verify, in bounded memory."""
    import shutil

    out = tmp_path / "b"
    shutil.copytree(lean_bundle[0], out)
    manifest = json.loads((out / "manifest.json").read_text())
    (listed,) = manifest["entries"]
    path = out / listed["file"]
    stated, frame, why = HOSTILE[how](path.read_bytes())
    path.write_bytes(frame)
    listed["stored"] = {"size": len(frame), "blake3": blake3.blake3(frame).hexdigest()}
    listed["size"] = listed["size"] if stated is None else stated
    (out / "manifest.json").write_text(json.dumps(manifest))
    run = subprocess.run([sys.executable, "-c", BUNDLE_CHILD, str(out), "a" * 64],
                         capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
    got = json.loads(run.stdout.splitlines()[-1])
    assert got["said"] and why in got["said"], got
    assert len(got["bad"]) == 1 and why in got["bad"][0][1], got
    assert got["peak_mib"] < 200, got


def test_the_local_cache_may_keep_entries_as_built(
    add_spirv, system_ocloc, private_cache, monkeypatch
):
    """``XPU_ZEBIN_CACHE_COMPRESS=0``: the entries this host builds are kept as built (the
    cheapest warm hit), and answer; a value that is no boolean is refused, not ignored."""
    monkeypatch.setenv("XPU_ZEBIN_CACHE_COMPRESS", "0")
    built = xpu_zebin.compile(add_spirv, device="pvc", ocloc=system_ocloc)
    entry = _entry_file(private_cache).read_bytes()
    assert entry.startswith(b"XZCACHE2") and entries.opened(entry)[1] == built.binary
    again = xpu_zebin.compile(add_spirv, device="pvc", ocloc=system_ocloc)
    assert again.source == "cache" and again.binary == built.binary
    c = xpu_zebin.stats(private_cache)["counters"]
    assert c["written_bytes"] == c["written_uncompressed_bytes"] == len(entry), c
    monkeypatch.setenv("XPU_ZEBIN_CACHE_COMPRESS", "sometimes")
    with pytest.raises(xpu_zebin.InvalidArgumentError, match="XPU_ZEBIN_CACHE_COMPRESS"):
        xpu_zebin.compile(add_spirv, device="pvc", ocloc=system_ocloc)
