"""The package's own code cannot hang, abort or poison its caller: bad knobs, NULs, hostile
headers, a neighbour's directories, poisoned cache entries, a killed caller, idle workers.

Every case is one a user or a neighbour can cause today; each runs the real compilers and
driver.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import entries
import pytest

import xpu_zebin

BAD_DURATIONS = ["inf", "1e20", "abc", "-5", "nan", "0x10"]


@pytest.mark.parametrize("value", BAD_DURATIONS)
def test_a_bad_timeout_variable_is_an_error_naming_it(add_spirv, system_ocloc, monkeypatch, value):
    monkeypatch.setenv("XPU_ZEBIN_TIMEOUT", value)
    with pytest.raises(xpu_zebin.InvalidArgumentError) as e:
        xpu_zebin.compile(add_spirv, device="pvc", ocloc=system_ocloc, cache=False)
    assert "XPU_ZEBIN_TIMEOUT" in e.value.message and repr(value) in e.value.message.replace(
        '"', "'"
    ), e.value.message
    with pytest.raises(xpu_zebin.InvalidArgumentError):
        xpu_zebin.compile_and_load(add_spirv, "add", cache=False)


@pytest.mark.parametrize(
    "name, value",
    [
        ("XPU_ZEBIN_PERSISTENT", "maybe"),
        ("XPU_ZEBIN_CACHE_MAX_BYTES", "-1"),
        ("XPU_ZEBIN_CACHE_MAX_BYTES", "1GB"),
        ("XPU_ZEBIN_WORKER_IDLE_SECONDS", "inf"),
        ("XPU_ZEBIN_WORKER_RETRY_SECONDS", "-1"),
        ("XPU_ZEBIN_CORE_WAIT_SECONDS", "ten"),
        ("XPU_ZEBIN_ISOLATED", "2"),
        ("XPU_ZEBIN_SHARE_BUILDS", "nan"),
        ("XPU_ZEBIN_SHARE_BUILDS", "2"),
        ("XPU_ZEBIN_SPECULATE_AFTER", "never"),
        ("XPU_ZEBIN_SPECULATE_AFTER", "-0.5"),
        ("XPU_ZEBIN_SPECULATE_AFTER", "inf"),
    ],
)
def test_every_knob_is_parsed_and_a_bad_one_named(
    add_spirv, system_ocloc, monkeypatch, name, value
):
    monkeypatch.setenv(name, value)
    with pytest.raises(xpu_zebin.InvalidArgumentError) as e:
        xpu_zebin.compile(add_spirv, device="pvc", ocloc=system_ocloc, cache=False)
    assert name in e.value.message, e.value.message


@pytest.mark.parametrize("timeout", [1e20, float("inf"), float("nan"), -1.0])
def test_a_timeout_argument_out_of_range_is_invalid_argument(add_spirv, system_ocloc, timeout):
    for call in (
        lambda: xpu_zebin.compile(add_spirv, device="pvc", ocloc=system_ocloc, timeout=timeout),
        lambda: xpu_zebin.compile_and_load(add_spirv, "add", timeout=timeout),
    ):
        with pytest.raises(xpu_zebin.InvalidArgumentError) as e:
            call()
        assert "timeout" in e.value.message


def test_build_flags_with_a_nul_are_refused_not_cut(add_spirv, ocloc):
    flags = "-cl-intel-256-GRF-per-thread\0-cl-opt-disable"
    with pytest.raises(xpu_zebin.InvalidArgumentError) as e:
        xpu_zebin.compile(add_spirv, device="pvc", ocloc=ocloc, build_flags=flags, cache=False)
    assert "build_flags" in e.value.message
    with pytest.raises(xpu_zebin.InvalidArgumentError) as e:
        xpu_zebin.compile_and_load(add_spirv, "add", build_flags=flags, cache=False)
    assert "build_flags" in e.value.message


def _huge_bound_spirv() -> bytes:
    # Header with id bound 2^32-1, then OpCapability Kernel: 28 bytes.
    return struct.pack("<7I", 0x07230203, 0x00010000, 0, 0xFFFFFFFF, 0, (2 << 16) | 17, 6)


def test_a_huge_id_bound_allocates_nothing_under_an_address_space_limit():
    spirv = _huge_bound_spirv()
    assert len(spirv) == 28
    code = (
        "import resource, sys, xpu_zebin\n"
        "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
        "try:\n"
        "    xpu_zebin.validate_spirv(sys.stdin.buffer.read())\n"
        "except xpu_zebin.InvalidSpirvError as e:\n"
        "    print('invalid:', e.message)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], input=spirv, capture_output=True, timeout=120
    )
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    assert out.stdout.startswith(b"invalid:"), out.stdout


def _foreign_private_dir(base: Path) -> Path:
    """What a hostile neighbour leaves: our private directory's name, world-writable,
    owned by someone else (nobody, when we may chown), full of FIFOs."""
    private = base / f"xpu-zebin-{os.getuid()}"
    (private / "cores").mkdir(parents=True)
    (private / "trusted-native").mkdir()
    for i in range(64):
        os.mkfifo(private / "cores" / f"core-{i}")
    for d in (private, private / "cores", private / "trusted-native"):
        os.chmod(d, 0o777)
        if os.getuid() == 0:
            os.chown(d, 65534, 65534)
    return private


def test_a_neighbours_private_directory_is_refused_and_nothing_hangs(add_spirv, tmp_path):
    """Core slots, the trusted-binary record and simulated-device captures live in a private
    directory: one another user made first is refused with a warning, never waited on."""
    tmp = tmp_path / "neighbour"
    tmp.mkdir()
    _foreign_private_dir(tmp)
    code = (
        "import logging, sys, xpu_zebin\n"
        "spirv = sys.stdin.buffer.read()\n"
        "r = xpu_zebin.compile(spirv, device='pvc', cache=False, speculative=True)\n"
        "with xpu_zebin.compile_and_load(r.binary, 'add', is_spv=False) as k:\n"
        "    assert k.kernel_handle\n"
        "print('built', r.build_flags)\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp)}
    env.pop("XPU_ZEBIN_CORE_SLOTS_DIR", None)
    out = subprocess.run(
        [sys.executable, "-c", code], input=add_spirv, capture_output=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith(b"built"), out.stdout
    err = out.stderr.decode()
    assert "core slots are off" in err and f"xpu-zebin-{os.getuid()}" in err, err


def _entry(key: str, meta: bytes, binary: bytes) -> bytes:
    """A cache entry as a writer of the cache forges it: checksum over key and body."""
    return entries.sealed(key, meta, binary)


def test_a_poisoned_cache_entry_is_rebuilt_never_loaded_here(add_spirv, private_cache):
    """A shared cache entry whose native binary was replaced and its checksum recomputed
    loads in a worker first: the crash is classified there, and the kernel is rebuilt."""
    from test_isolation import _dangling_kernel_symbol

    with xpu_zebin.compile_and_load(add_spirv, "add") as first:
        good = first.native_binary
    files = list((private_cache / "zebin-v3").glob("*/*.zeentry"))
    assert files
    poisoned = _dangling_kernel_symbol(good)
    replaced = 0
    for path in files:
        meta, binary = entries.opened(path)
        if binary != good:
            continue
        path.write_bytes(_entry(path.stem, meta, poisoned))
        replaced += 1
    assert replaced == 1
    with xpu_zebin.compile_and_load(add_spirv, "add") as again:
        assert again.kernel_handle and not again.cached
        assert any("did not load" in n for n in again.notes), again.notes


def test_a_killed_caller_leaves_no_compiler_or_worker_behind(
    modern_ocloc, ptss_spirv, marker, tmp_path
):
    """SIGKILL the caller mid-build: its ocloc worker, its one-shot ocloc and its Level Zero
    worker all end within seconds (they watch the caller, or die with it)."""
    spirv = tmp_path / "k.spv"
    spirv.write_bytes(ptss_spirv)
    code = (
        "import signal, sys, xpu_zebin\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "spirv = open(sys.argv[1], 'rb').read()\n"
        "import threading\n"
        "threading.Thread(target=lambda: xpu_zebin.compile_and_load(spirv, 'pressure',\n"
        "    cache=False), daemon=True).start()\n"
        "xpu_zebin.compile(spirv, device='pvc', ocloc=sys.argv[2], cache=False,\n"
        "    speculative=True)\n"
    )
    for persistent in ("1", "0"):
        env = {**os.environ, "XPU_ZEBIN_PERSISTENT": persistent}
        child = subprocess.Popen([sys.executable, "-c", code, str(spirv), modern_ocloc], env=env)
        try:
            deadline = time.monotonic() + 120
            # Wait until compilers run: ocloc builds and a Level Zero worker.
            while len(marker.processes()) < 2:
                assert child.poll() is None, "the caller ended before it was killed"
                assert time.monotonic() < deadline, marker.processes()
                time.sleep(0.1)
        finally:
            child.kill()
            child.wait()
        deadline = time.monotonic() + 30
        while marker.processes():
            assert time.monotonic() < deadline, (persistent, marker.processes())
            time.sleep(0.1)


def test_zero_idle_seconds_keeps_no_worker_and_fails_no_build(
    spill_spirv, add_spirv, marker, monkeypatch
):
    """0 means 'keep no idle worker', never a failed build that drives the GRF ladder."""
    monkeypatch.setenv("XPU_ZEBIN_WORKER_IDLE_SECONDS", "0")
    for _ in range(2):
        with xpu_zebin.compile_and_load(add_spirv, "add", cache=False) as k:
            assert not k.recovered and k.build_flags == "", k.attempts
            assert len(k.attempts) == 1, k.attempts
    assert [p for p in marker.processes() if "_worker" in p[1]] == []


def test_a_worker_that_cannot_start_is_no_build_failure(
    add_spirv, system_ocloc, marker, monkeypatch
):
    """Workers whose Python cannot start are infrastructure: no GRF retry, a clear error
    (Level Zero) or a one-shot compile (ocloc); and they are tried again later."""
    monkeypatch.setenv("PYTHONMALLOC", "no-such-allocator")  # every worker fails at start
    with pytest.raises(xpu_zebin.ToolchainNotFound) as e:
        xpu_zebin.compile_and_load(add_spirv, "add", cache=False)
    assert len(e.value.attempts) == 1, e.value.attempts  # no large-GRF retry
    assert "did not start" in e.value.message and "3 tries" in e.value.message, e.value.message
    r = xpu_zebin.compile(add_spirv, device="pvc", ocloc=system_ocloc, cache=False)
    assert r.attempts[0].ok and len(r.attempts) == 1
    monkeypatch.delenv("PYTHONMALLOC")
    monkeypatch.setenv("XPU_ZEBIN_WORKER_RETRY_SECONDS", "0")  # retry at once
    with xpu_zebin.compile_and_load(add_spirv, "add", cache=False) as k:
        assert k.kernel_handle


def test_a_full_or_read_only_cache_never_fails_a_compile(add_spirv, system_ocloc, tmp_path):
    """A cache that cannot be written (a file-size limit, a read-only directory) is a note;
    the compile succeeds."""
    ro = tmp_path / "ro"
    (ro / "zebin-v3").mkdir(parents=True)
    os.chmod(ro / "zebin-v3", 0o500)
    code = (
        "import resource, sys, xpu_zebin\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))\n"
        "spirv = sys.stdin.buffer.read()\n"
        "for d in sys.argv[1:]:\n"
        "    r = xpu_zebin.compile(spirv, device='pvc', cache_dir=d)\n"
        "    print(len(r.binary), r.notes)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "full"), str(ro)],
        input=add_spirv,
        capture_output=True,
        timeout=300,
        env={**os.environ, "XPU_ZEBIN_OCLOC": system_ocloc},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.decode().splitlines()
    assert len(lines) == 2 and all("cache write" in line for line in lines), lines


def test_foreign_and_corrupt_entries_are_misses(add_spirv, system_ocloc, private_cache):
    r = xpu_zebin.compile(add_spirv, device="pvc", ocloc=system_ocloc)
    (entry,) = (private_cache / "zebin-v3").glob("*/*.zeentry")
    data = entry.read_bytes()
    entry.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # corrupt
    again = xpu_zebin.compile(add_spirv, device="pvc", ocloc=system_ocloc)
    assert not again.cached and again.binary == r.binary
    assert any("corrupt" in n for n in again.notes), again.notes
    if os.getuid() == 0:  # a foreign-owned entry (root can give it away)
        os.chown(entry, 65534, 65534)
        third = xpu_zebin.compile(add_spirv, device="pvc", ocloc=system_ocloc)
        assert not third.cached, third.notes
    os.unlink(entry)
    os.mkfifo(entry)  # a FIFO in its place must not hang the lookup
    fourth = xpu_zebin.compile(add_spirv, device="pvc", ocloc=system_ocloc)
    assert not fourth.cached and fourth.binary == r.binary


@pytest.mark.parametrize("allow_unresolved", [False, True], ids=["linked", "allow_unresolved"])
def test_a_degenerate_zebin_in_ones_own_cache_is_removed_and_rebuilt(
    add_spirv, system_ocloc, private_cache, allow_unresolved
):
    """An own entry whose checksum holds but whose zebin lacks a section IGC always writes
    is refused as corrupt, removed and rebuilt: never a hit (a hit checks section names,
    not the YAML), never an error, whether or not the request allows unresolved symbols."""
    ask = {"device": "pvc", "ocloc": system_ocloc, "allow_unresolved": allow_unresolved}
    r = xpu_zebin.compile(add_spirv, **ask)
    (entry,) = (private_cache / "zebin-v3").glob("*/*.zeentry")
    meta, good = entries.opened(entry)
    assert good == r.binary and good.count(b".symtab\0") == 1
    entry.write_bytes(_entry(entry.stem, meta, good.replace(b".symtab\0", b".symtad\0")))
    again = xpu_zebin.compile(add_spirv, **ask)
    assert not again.cached and again.binary == r.binary, again.notes
    assert any("corrupt" in n and ".symtab" in n for n in again.notes), again.notes
    third = xpu_zebin.compile(add_spirv, **ask)
    assert third.cached and third.binary == r.binary  # the rebuild was kept


def test_workers_never_import_code_from_the_callers_directory(add_spirv, tmp_path):
    """``python -m`` puts the working directory first on sys.path: a neighbour who can
    write where the caller runs must not get a worker to import their ``xpu_zebin``."""
    planted = tmp_path / "shared"
    (planted / "xpu_zebin").mkdir(parents=True)
    ran = tmp_path / "planted-code-ran"
    (planted / "xpu_zebin" / "__init__.py").write_text(
        f"open({str(ran)!r}, 'w').write('ran')\nraise SystemExit(3)\n"
    )
    code = (
        "import sys\n"
        "sys.path.remove('') if '' in sys.path else None\n"
        "import xpu_zebin\n"
        "spirv = sys.stdin.buffer.read()\n"
        "r = xpu_zebin.compile(spirv, device='pvc', cache=False)\n"
        "with xpu_zebin.compile_and_load(spirv, 'add', cache=False) as k:\n"
        "    print('ok', r.build_flags, bool(k.kernel_handle))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], input=add_spirv, capture_output=True, cwd=planted,
        timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert not ran.exists(), "a worker imported the planted package"
    assert b"no persistent compiler worker" not in out.stderr, out.stderr[-2000:]


def test_a_worker_dies_with_its_caller_even_when_a_fork_of_the_caller_lives(
    add_spirv, marker, tmp_path
):
    """A child the caller forked inherits the caller's end of the worker's pipe: the worker
    still sees its caller go (its parent changes) and ends."""
    code = (
        "import os, sys, time, xpu_zebin\n"
        "spirv = sys.stdin.buffer.read()\n"
        "xpu_zebin.compile_and_load(spirv, 'add', cache=False).close()\n"
        "if os.fork() == 0:\n"
        "    time.sleep(120)\n"
        "    os._exit(0)\n"
        "print('ready', flush=True)\n"
        "time.sleep(120)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    child.stdin.write(add_spirv)
    child.stdin.close()
    try:
        assert child.stdout.readline().startswith(b"ready")
        workers = [p for p in marker.processes() if "_worker" in p[1]]
        assert workers, marker.processes()
        child.kill()
        child.wait()
        deadline = time.monotonic() + 30
        while [p for p in marker.processes() if "_worker" in p[1]]:
            assert time.monotonic() < deadline, marker.processes()
            time.sleep(0.1)
    finally:
        child.kill()
        for pid, _cmd in marker.processes():  # the fork, still sleeping
            os.kill(pid, 9)


def test_the_triton_drop_in_never_hands_the_driver_a_poisoned_cached_zebin(
    add_spirv, system_ocloc, private_cache, monkeypatch
):
    """The offline engine's cache answers the drop-in's SPIR-V builds: a zebin from it is
    tried in a worker before the driver's in-process loader sees it, and one that does not
    load is rebuilt from the SPIR-V."""
    from test_isolation import _dangling_kernel_symbol, _Driver

    import xpu_zebin.triton as xt

    class Recording(_Driver):
        def load_binary(self, name, kernel, *args):
            self.binaries = [*getattr(self, "binaries", []), bytes(kernel)]
            return super().load_binary(name, kernel, *args)

    monkeypatch.setenv("XPU_ZEBIN_OCLOC", system_ocloc)
    utils = xt.install(Recording(), backend=False)
    try:
        utils.load_binary("add", add_spirv, 0, "", True, 0, "pvc")  # builds, caches
        (entry,) = (private_cache / "zebin-v3").glob("*/*.zeentry")
        meta, good = entries.opened(entry)
        assert good[:4] == b"\x7fELF"
        poisoned = _dangling_kernel_symbol(good)
        entry.write_bytes(_entry(entry.stem, meta, poisoned))
        utils.load_binary("add", add_spirv, 0, "", True, 0, "pvc")
        assert utils.binaries == [good, good]  # the poisoned zebin never reached it
    finally:
        xt.uninstall()
