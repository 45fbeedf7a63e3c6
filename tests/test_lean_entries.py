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
from xpu_zebin import remote, samples


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
    # The last release's entry of the same kernel: still a hit, the same answer.
    path.write_bytes(entries.sealed_plain(key, meta, binary))
    again = xpu_zebin.compile(add_spirv, device="pvc", ocloc=system_ocloc)
    assert again.source == "cache" and again.binary == built.binary


HOSTILE = {
    # 1 GiB of zeros stated as 1000 bytes, or stated truthfully (more than an entry).
    "bomb": lambda frame: (1000, _bomb(), "its frame states 1073741824 bytes, its header 1000"),
    "truthful_bomb": lambda frame: (1 << 30, _bomb(), "not an entry here"),
    "length_lies": lambda frame: (200 << 20, frame, "more than an entry inflates"),
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
    assert "its header 1000" in caplog.text, caplog.text  # refused for what it holds


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
