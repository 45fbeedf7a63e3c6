"""A cache directory on file systems other than a local ext4, each mounted for real on this
machine: XFS and btrfs in loop devices, overlayfs, and a FUSE mount that refuses POSIX
record locks (``tests/fixtures/lockless_fs.py``, a passthrough answering ``ENOLCK`` as
Lustre without ``flock`` or NFS without a lock daemon does). Every compile succeeds, and
the cache is cleaned to its bound on each."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

import xpu_zebin

LOCKLESS = Path(__file__).parent / "fixtures" / "lockless_fs.py"
KERNEL = """__kernel void fs{n}(__global float* a, __global const float* b) {{
    int i = get_global_id(0);
    a[i] = b[i] * {n}.0f + a[i];
}}
"""


@contextlib.contextmanager
def lockless_mount(root: Path, mountpoint: Path, hang_locks: bool = False) -> Iterator[Path]:
    """``root`` mounted at ``mountpoint`` through the lock-refusing passthrough (or, with
    ``hang_locks``, one that never answers a lock call)."""
    root.mkdir()
    mountpoint.mkdir()
    log = open(root.parent / "lockless_fs.log", "w+")
    hang = ["--hang-locks"] if hang_locks else []
    fs = subprocess.Popen([sys.executable, str(LOCKLESS), str(root), str(mountpoint), *hang],
                          stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    deadline = time.monotonic() + 60
    while not os.path.ismount(mountpoint):
        if fs.poll() is not None or time.monotonic() > deadline:
            subprocess.run(["fusermount3", "-uz", str(mountpoint)], timeout=60, check=False)
            fs.kill()
            fs.wait(timeout=60)
            log.seek(0)
            pytest.fail(f"the FUSE mount did not come up: {log.read()[-2000:]}")
        time.sleep(0.05)  # polling for the mount, under the deadline above
    try:
        yield mountpoint
    finally:
        if hang_locks:
            # The lock call left waiting holds the mount: its server goes first, which
            # fails the call, then the mount.
            fs.kill()
        done = subprocess.run(["fusermount3", "-u", str(mountpoint)], timeout=60, check=False)
        if done.returncode != 0:
            subprocess.run(["fusermount3", "-uz", str(mountpoint)], timeout=60, check=False)
        try:
            fs.wait(timeout=60)
        except subprocess.TimeoutExpired:
            fs.kill()
            fs.wait(timeout=60)
        log.close()


def _ledger_in_shm(layout: Path) -> Path:
    """Where the ledger of a cache directory on this file system lives (``ledger.rs``:
    this host's shared memory, by the directory's device and inode)."""
    st = layout.stat()
    return Path("/dev/shm") / f"xpu-zebin-{os.getuid()}-{st.st_dev}-{st.st_ino}.ledger2"


def run(*args: object) -> None:
    subprocess.run([str(a) for a in args], check=True, timeout=300, capture_output=True)


@contextlib.contextmanager
def mounted(kind: str, tmp_path: Path) -> Iterator[Path]:
    """A fresh file system of ``kind`` mounted under ``tmp_path``: XFS or btrfs in a loop
    device (a sparse 512 MiB image), or overlayfs (a container's writable layer over an
    empty lower one)."""
    mnt = tmp_path / kind
    mnt.mkdir()
    if kind == "overlay":
        parts = {p: tmp_path / f"overlay-{p}" for p in ("lower", "upper", "work")}
        for d in parts.values():
            d.mkdir()
        options = ",".join(f"{p}dir={d}" for p, d in parts.items())
        run("mount", "-t", "overlay", "overlay", "-o", options, mnt)
    else:
        image = tmp_path / f"{kind}.img"
        with open(image, "wb") as f:
            f.truncate(512 << 20)
        run(f"mkfs.{kind}", "-q", "-f", image)
        run("mount", "-o", "loop", image, mnt)
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], timeout=120, check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], timeout=120, check=False)


@pytest.fixture(scope="module")
def small_kernels(system_ocloc) -> list:
    """Twelve small kernels, each its own cache key."""
    return [
        xpu_zebin.opencl_to_spirv(KERNEL.format(n=n), device="pvc", ocloc=system_ocloc)
        for n in range(12)
    ]


def cleaned_to_its_bound(mnt: Path, ocloc: str, spirvs: list, monkeypatch) -> None:
    """Kernels compiled into a cache on ``mnt`` bounded at four entries' bytes: every
    compile succeeds, the cache is cleaned to its bound, the least recently used go, the
    newest still answers, no upkeep lease is left."""
    cache = mnt / "cache"
    compile_ = lambda s: xpu_zebin.compile(s, device="pvc", ocloc=ocloc,  # noqa: E731
                                           cache_dir=cache)  # fmt: skip
    # The layout made first, so that its ledger in /dev/shm is known before any compile: one
    # a failed run left (a loop device and inode numbers come back alike) is removed.
    (cache / "zebin-v3").mkdir(mode=0o700, parents=True)
    ledger = _ledger_in_shm(cache / "zebin-v3")
    ledger.unlink(missing_ok=True)
    try:
        assert not compile_(spirvs[0]).cached
        one = xpu_zebin.stats(cache)["bytes"]
        monkeypatch.setenv("XPU_ZEBIN_CACHE_MAX_BYTES", str(4 * one))
        results = [compile_(s) for s in spirvs[1:]]
        assert not any(r.cached for r in results)
        stats = xpu_zebin.stats(cache)
        assert stats["counters"]["evictions"] > 0, stats
        assert stats["bytes"] <= stats["max_bytes"] and not stats["cleaning"], stats
        assert compile_(spirvs[-1]).cached
        assert not compile_(spirvs[0]).cached, "the least recently used went first"
        assert not (cache / "zebin-v3" / "upkeep.lease").exists(), "a lease was kept"
    finally:
        ledger.unlink(missing_ok=True)


def test_a_mount_without_locks_is_still_cleaned(system_ocloc, small_kernels, tmp_path,
                                                monkeypatch):  # fmt: skip
    """On a mount that refuses POSIX locks, upkeep takes a lease instead (``upkeep.lease``,
    made with O_EXCL, let go after each turn), and the cache is cleaned as anywhere."""
    with lockless_mount(tmp_path / "under", tmp_path / "mnt") as mnt:
        probe = os.open(mnt / "probe", os.O_RDWR | os.O_CREAT, 0o600)
        with pytest.raises(OSError) as refused:
            fcntl.lockf(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(probe)
        assert refused.value.errno == errno.ENOLCK, "the mount must refuse POSIX locks"
        cleaned_to_its_bound(mnt, system_ocloc, small_kernels, monkeypatch)


def test_a_mount_whose_locks_hang_is_still_cleaned(system_ocloc, small_kernels, tmp_path,
                                                   monkeypatch):  # fmt: skip
    """On a mount whose lock calls are never answered (NFS with a lock daemon that does
    not answer), the first upkeep gives the call up after its deadline (two seconds), and
    the directory uses leases from then on: every compile succeeds, and the cache is
    cleaned as anywhere."""
    with lockless_mount(tmp_path / "under", tmp_path / "mnt", hang_locks=True) as mnt:
        # In a thread, so that a compile held by the lock call fails the test (the mount's
        # server, killed on the way out, then fails the call) instead of hanging it.
        failed: list = []

        def run() -> None:
            try:
                cleaned_to_its_bound(mnt, system_ocloc, small_kernels, monkeypatch)
            except BaseException as e:  # given to the test's thread
                failed.append(e)

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        worker.join(timeout=300)
        assert not worker.is_alive(), "a compile waited on a lock call that never answers"
        if failed:
            raise failed[0]


@pytest.mark.parametrize("kind", ["xfs", "btrfs", "overlay"])
def test_a_cache_on_another_file_system_is_cleaned(kind, system_ocloc, small_kernels,
                                                   tmp_path, monkeypatch):  # fmt: skip
    """XFS and btrfs (the ledger in this host's /dev/shm: a store into a mapped page there
    may need new space) and overlayfs (a container's layer): compiles, cleaning, LRU."""
    with mounted(kind, tmp_path) as mnt:
        cleaned_to_its_bound(mnt, system_ocloc, small_kernels, monkeypatch)
