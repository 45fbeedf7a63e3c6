"""Many hosts, one cache directory. Three "hosts" (mount namespaces, each with its own
tmpfs on /dev/shm, so that no ledger is shared between them, as between machines) of eight
compiling processes each share one cache directory, bounded to force cleaning, compiling
overlapping kernels at once. The directory is on a FUSE passthrough that refuses POSIX
locks (``tests/fixtures/lockless_fs.py``: as Lustre without ``flock`` or NFS without a lock
daemon: upkeep takes a lease) or on XFS in a loop device (POSIX locks, which the kernel
holds across namespaces, as NFS's lock daemon does across clients). Both give the hosts
one page cache (one kernel): what NFS adds, close-to-open caching, is met by writing each
host's accounts with a checksum and closing the file (``src/cache/hosts.rs``)."""

from __future__ import annotations

import json
import os
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from test_file_systems import _ledger_in_shm, lockless_mount, mounted

import xpu_zebin

HOST = Path(__file__).parent / "fixtures" / "multi_host.py"
HOSTS, PER_HOST, KERNELS, EACH = 3, 8, 24, 3
KERNEL = """__kernel void mh_{n:03d}(__global float* a, __global const float* b) {{
    int i = get_global_id(0);
    a[i] = b[i] * {n}.0f + a[i];
}}
"""


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """Where this module's files live: each simulated host mounts a tmpfs of its own on
    /dev/shm, which hides pytest's temporary directory when it is there (scripts/test.sh
    puts TMPDIR on /dev/shm): then a directory on disk."""
    temp = tmp_path_factory.getbasetemp().resolve()
    if Path("/dev/shm") not in temp.parents:
        yield tmp_path_factory.mktemp("multi-host")
        return
    on_disk = Path(tempfile.mkdtemp(prefix="xpu-zebin-multi-host-", dir="/var/tmp"))
    try:
        yield on_disk
    finally:
        shutil.rmtree(on_disk, ignore_errors=True)


@pytest.fixture
def work(base, request, monkeypatch) -> Path:
    """This test's directory under ``base``, its hosts' TMPDIR in it too."""
    here = base / request.node.name
    (here / "tmp").mkdir(parents=True)
    monkeypatch.setenv("TMPDIR", str(here / "tmp"))
    return here


@pytest.fixture(scope="module")
def spirv_dir(system_ocloc, base) -> Path:
    """Twenty-seven small kernels' SPIR-V, ``<n>.spv``, each its own cache key."""
    out = base / "spirv"
    out.mkdir()
    for n in range(KERNELS + HOSTS):  # one more for each host, compiled after the rest
        spirv = xpu_zebin.opencl_to_spirv(KERNEL.format(n=n), device="pvc", ocloc=system_ocloc)
        (out / f"{n}.spv").write_bytes(spirv)
    return out


def read_line(proc: subprocess.Popen, deadline: float) -> str:
    """One line of ``proc``'s output, waiting until ``deadline`` at most."""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
            pytest.fail("a host said nothing before its deadline")
    line = proc.stdout.readline()
    assert line, f"a host ended early (exit {proc.wait(timeout=60)})"
    return line


def ask(hosts: list, command: str, deadline: float) -> list:
    for h in hosts:
        h.stdin.write(command + "\n")
        h.stdin.flush()
    return [json.loads(read_line(h, deadline)) for h in hosts]


def on_disk(cache: Path) -> tuple:
    """(entries, bytes) of the cache as listed."""
    files = list((cache / "zebin-v3").glob("[0-9a-f][0-9a-f]/*.zeentry"))
    return len(files), sum(f.stat().st_size for f in files)


def gone_for_a_day(cache: Path, hosts: list, answered: int, deadline: float) -> None:
    """Every host's file made a day old, then one host's recount folds the others' into
    one (its own is never folded); each host, back, compiles again: every host still counts
    what all did, and its accounts are what is on disk."""
    files = cache / "zebin-v3" / "hosts"
    old = time.time() - 2 * 86400
    for f in files.glob("*.counts"):
        os.utime(f, (old, old))
    ask(hosts[:1], "recount", deadline)
    assert (files / "folded.counts").exists()
    left = [f.name for f in files.glob("*.counts") if f.name != "folded.counts"]
    assert len(left) == 1, f"not folded: {left}"  # the recounting host's own
    for n, h in enumerate(hosts):
        ask([h], f"compile {n}", deadline)
    for h in hosts:
        (stats,) = ask([h], "stats", deadline)
        assert stats["counters"]["requests"] == answered + 2 * HOSTS, stats
        assert (stats["entries"], stats["bytes"]) == on_disk(cache), stats


def shared_by_three_hosts(cache: Path, spirv_dir: Path, ocloc: str, monkeypatch) -> None:
    """The hosts compile (each process three kernels; each kernel asked by three processes,
    of two or three hosts) into ``cache``, bounded at six entries' bytes: no compile fails,
    each answer is its own kernel's, every host's counters are what all did, the cache is
    within a slice of its bound, and within it after the next write of each host, and,
    once listed (a listing races with other hosts' writes, as with other processes'), every
    host's accounts are what is on disk."""
    probe = cache.parent / "probe"
    (probe / "zebin-v3").mkdir(mode=0o700, parents=True)
    ledger = _ledger_in_shm(probe / "zebin-v3")  # one a loop device's last run left
    ledger.unlink(missing_ok=True)
    one = xpu_zebin.compile((spirv_dir / "0.spv").read_bytes(), device="pvc", ocloc=ocloc,
                            cache_dir=probe)  # fmt: skip
    ledger.unlink(missing_ok=True)
    size = on_disk(probe)[1]
    assert not one.cached and size > 0
    monkeypatch.setenv("XPU_ZEBIN_CACHE_MAX_BYTES", str(6 * size))
    deadline = time.monotonic() + 600
    hosts = []
    try:
        for h in range(HOSTS):
            plan = [[(h * PER_HOST + w + j) % KERNELS for j in range(EACH)]
                    for w in range(PER_HOST)]  # fmt: skip
            hosts.append(subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", sys.executable, str(HOST),
                 "host", str(cache), str(spirv_dir), ocloc, json.dumps(plan)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))  # fmt: skip
        done = [json.loads(read_line(h, deadline)) for h in hosts]
        answers = [a for host in done for worker in host for a in worker]
        assert len(answers) == HOSTS * PER_HOST * EACH
        failed = [a for a in answers if "error" in a]
        assert not failed, failed
        wrong = [a for a in answers if a["names"] != [f"mh_{a['kernel']:03d}"]]
        assert not wrong, f"an answer that was not its kernel's: {wrong}"
        hits = sum(a["cached"] for a in answers)
        for stats in ask(hosts, "stats", deadline):
            c = stats["counters"]
            assert stats["other_hosts"] == HOSTS - 1, stats
            assert c["requests"] == len(answers), stats
            # A kernel another process was building is waited for, not built (issue 64).
            assert (c["compiles"], c["hits_local"] + c["waits"]) == (len(answers) - hits, hits), (
                stats
            )
            assert c["evictions"] > 0, stats
        # Within a slice: a write that finds another process at the upkeep leaves the
        # cleaning to it, which may have judged the cache just before that write landed;
        # the next write, on any host, cleans it to its bound.
        entries, held = on_disk(cache)
        print(f"on disk: {entries} entries, {held} bytes; bound {6 * size}")
        assert held <= 2048 * size, f"{entries} entries, {held} bytes: bound not held"
        for n, h in enumerate(hosts, start=KERNELS):
            ask([h], f"compile {n}", deadline)
            entries, held = on_disk(cache)
            assert held <= 6 * size, f"after host {n - KERNELS}'s next write: {entries} entries"
        ask(hosts[:1], "recount", deadline)
        for h in hosts:  # one after the other: a host whose ledger is new recounts first
            (stats,) = ask([h], "stats", deadline)
            assert (stats["entries"], stats["bytes"]) == (entries, held), stats
        gone_for_a_day(cache, hosts, len(answers), deadline)
        assert not (cache / "zebin-v3" / "upkeep.lease").exists(), "a lease was kept"
    finally:
        for h in hosts:
            if h.poll() is None:
                h.stdin.close()
                try:
                    h.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    h.kill()
                    h.wait(timeout=60)


@pytest.mark.slow
def test_three_hosts_share_a_lockless_mount(system_ocloc, spirv_dir, work, monkeypatch):
    with lockless_mount(work / "under", work / "mnt") as mnt:
        shared_by_three_hosts(mnt / "cache", spirv_dir, system_ocloc, monkeypatch)


@pytest.mark.slow
def test_three_hosts_share_an_xfs_directory(system_ocloc, spirv_dir, work, monkeypatch):
    with mounted("xfs", work) as mnt:
        shared_by_three_hosts(mnt / "cache", spirv_dir, system_ocloc, monkeypatch)
