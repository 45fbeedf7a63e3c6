"""Persistent compiler workers (libocloc in long-lived processes), on both real compilers."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from worker_helpers import first_compiling

import xpu_zebin
from xpu_zebin import _core


def _workers(mark) -> list[int]:
    return [pid for pid, cmd in mark.processes() if "xpu_zebin._worker" in cmd]


def test_worker_and_one_shot_agree(ocloc, add_spirv, spill_spirv, marker, monkeypatch):
    for spirv in (add_spirv, spill_spirv):
        _core.shutdown_workers()
        monkeypatch.setenv("XPU_ZEBIN_PERSISTENT", "0")
        one_shot = xpu_zebin.compile(spirv, device="pvc", ocloc=ocloc, cache=False)
        assert _workers(marker) == []
        monkeypatch.setenv("XPU_ZEBIN_PERSISTENT", "1")
        persistent = xpu_zebin.compile(spirv, device="pvc", ocloc=ocloc, cache=False)
        assert len(_workers(marker)) >= 1, "a persistent worker should be serving"
        assert f"ocloc:{ocloc}" not in [k for k, _ in _core.broken_workers()]
        assert persistent.build_flags == one_shot.build_flags
        assert persistent.spill_size == one_shot.spill_size
        info = [xpu_zebin.zebin_info(r.binary)["kernels"] for r in (one_shot, persistent)]
        assert info[0] == info[1]
        assert "Build succeeded" in persistent.log and "\0" not in persistent.log


def test_worker_classifies_like_ocloc(ocloc, add_spirv, marker):
    with pytest.raises(xpu_zebin.UnsupportedDeviceError) as e:
        xpu_zebin.compile(
            add_spirv, device="no-such-gpu", ocloc=ocloc, cache=False, speculative=False
        )
    assert "no-such-gpu" in e.value.log
    assert len(_workers(marker)) == 1  # the worker survived the failed job


def test_worker_reused_across_compiles(system_ocloc, add_spirv, marker):
    for _ in range(3):
        xpu_zebin.compile(
            add_spirv, device="pvc", ocloc=system_ocloc, cache=False, speculative=False
        )
    assert len(_workers(marker)) == 1


@pytest.mark.slow
def test_worker_crash_falls_back_to_one_shot(modern_ocloc, ptss_spirv, marker):
    """A worker killed mid-compile (as by an IGC crash) costs only a re-run in ocloc."""
    result: dict = {}

    def run():
        try:
            result["ok"] = xpu_zebin.compile(
                ptss_spirv, device="pvc", ocloc=modern_ocloc, cache=False, speculative=False
            )
        except Exception as e:  # pragma: no cover - reported below
            result["error"] = e

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 30
    while not _workers(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    (victim,) = _workers(marker)
    time.sleep(0.5)  # let it get into IGC
    os.kill(victim, signal.SIGSEGV)
    thread.join(120)
    assert "error" not in result, result.get("error")
    assert result["ok"].recovered and result["ok"].n_regs == 256
    # One crash does not retire the compiler's workers for good.
    assert f"ocloc:{modern_ocloc}" not in [k for k, _ in _core.broken_workers()]


def test_timeout_kills_the_worker(modern_ocloc, ptss_spirv, marker):
    with pytest.raises(xpu_zebin.CompileTimeoutError):
        xpu_zebin.compile(
            ptss_spirv,
            device="pvc",
            ocloc=modern_ocloc,
            timeout=1.0,
            cache=False,
            speculative=False,
        )
    assert marker.processes() == []  # neither a worker nor an ocloc is left


def test_worker_that_cannot_start_falls_back(system_ocloc, add_spirv, tmp_path, marker, caplog):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    ocloc = bindir / "ocloc"
    ocloc.symlink_to(system_ocloc)
    (bindir / "ocloc.toolchain").write_text('{"libocloc": "/nonexistent/libocloc.so"}')
    result = xpu_zebin.compile(add_spirv, device="pvc", ocloc=ocloc, cache=False)
    assert result.attempts[0].ok
    assert [k for k, _ in _core.broken_workers()] == [f"ocloc:{ocloc}"]
    assert _workers(marker) == []
    (warning,) = [r for r in caplog.records if r.levelname == "WARNING"]
    assert str(ocloc) in warning.getMessage() and "libocloc" in warning.getMessage()


def _wrapper(tmp_path, real: str) -> str:
    """An ocloc wrapper script with no libocloc beside it and no descriptor."""
    bindir = tmp_path / "wrapped"
    bindir.mkdir()
    ocloc = bindir / "ocloc"
    ocloc.write_text(f'#!/bin/sh\nexec {real} "$@"\n')
    ocloc.chmod(0o755)
    return str(ocloc)


def test_a_compiler_without_libocloc_is_named_once(system_ocloc, add_spirv, tmp_path, caplog):
    ocloc = _wrapper(tmp_path, system_ocloc)
    for _ in range(2):
        assert xpu_zebin.compile(add_spirv, device="pvc", ocloc=ocloc, cache=False).attempts[0].ok
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, warnings
    assert ocloc in warnings[0] and "no libocloc.so beside" in warnings[0]
    assert "every compile starts a new ocloc" in warnings[0]  # the cost
    assert ".toolchain" in warnings[0]  # the fix


def test_doctor_reports_the_toolchain(system_ocloc, add_spirv, tmp_path, private_cache):
    xpu_zebin.compile(add_spirv, device="pvc", ocloc=system_ocloc)
    report = xpu_zebin.doctor(system_ocloc)
    assert report["ocloc"] == system_ocloc and report["compiler_version"]
    assert report["worker_mode"] == "persistent" and report["libocloc"].endswith("libocloc.so")
    assert report["level_zero_devices"][0]["arch"] == "pvc"
    assert report["cache_dir"].startswith(str(private_cache)) and report["cache_entries"] == 1
    wrapped = xpu_zebin.doctor(_wrapper(tmp_path, system_ocloc))
    assert wrapped["worker_mode"] == "one-shot" and "no libocloc.so" in wrapped["worker_note"]
    cli = subprocess.run(
        [sys.executable, "-m", "xpu_zebin", "doctor", "--ocloc", system_ocloc],
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 0, cli.stderr
    assert "offline workers: persistent" in cli.stdout and "Level Zero device 0" in cli.stdout


def test_idle_worker_exits_and_is_replaced(system_ocloc, add_spirv, marker, monkeypatch):
    monkeypatch.setenv("XPU_ZEBIN_WORKER_IDLE_SECONDS", "1")
    xpu_zebin.compile(add_spirv, device="pvc", ocloc=system_ocloc, cache=False,
                      speculative=False)  # fmt: skip
    (first,) = _workers(marker)
    deadline = time.monotonic() + 15
    while _workers(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _workers(marker) == []  # it returned its memory by itself
    monkeypatch.setenv("XPU_ZEBIN_WORKER_IDLE_SECONDS", "60")  # the next one stays to be seen
    again = xpu_zebin.compile(add_spirv, device="pvc", ocloc=system_ocloc, cache=False,
                              speculative=False)  # fmt: skip
    assert again.attempts[0].ok
    (second,) = _workers(marker)
    assert second != first


def test_a_worker_that_could_not_start_is_tried_again_later(
    system_ocloc, add_spirv, tmp_path, marker, monkeypatch
):
    """Not forever: once the wait is over, a compiler whose library has appeared since gets
    its persistent worker (a long-lived process recovers from a failed start)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    ocloc = bindir / "ocloc"
    ocloc.symlink_to(system_ocloc)
    libocloc = tmp_path / "lib" / "libocloc.so"
    (bindir / "ocloc.toolchain").write_text(json.dumps({"libocloc": str(libocloc)}))
    key = f"ocloc:{ocloc}"

    def compiles() -> bool:
        return xpu_zebin.compile(add_spirv, device="pvc", ocloc=ocloc, cache=False).attempts[0].ok

    assert compiles()  # one-shot: the worker could not start
    assert key in [k for k, _ in _core.broken_workers()]
    libocloc.parent.mkdir()
    libocloc.symlink_to(xpu_zebin.doctor(system_ocloc)["libocloc"])
    assert compiles() and _workers(marker) == []  # within the wait: not tried again
    monkeypatch.setenv("XPU_ZEBIN_WORKER_RETRY_SECONDS", "0")  # the wait is over
    assert compiles()
    assert key not in [k for k, _ in _core.broken_workers()]
    assert len(_workers(marker)) == 1


def _stop_in_crash_handler_state(tid: int) -> None:
    """Stop thread ``tid`` (ptrace, until it dies) with SIGSEGV added to its blocked signals:
    what a thread deadlocked in the compiler's crash handler shows (crash signals blocked, no
    CPU time spent). A real deadlock there cannot be caused on demand."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.restype = ctypes.c_long
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    seize, interrupt, setsigmask = 0x4206, 0x4207, 0x420B
    assert libc.ptrace(seize, tid, None, None) == 0, os.strerror(ctypes.get_errno())
    assert libc.ptrace(interrupt, tid, None, None) == 0, os.strerror(ctypes.get_errno())
    os.waitpid(tid, 0x40000000)  # __WALL: the stop, taken here so nobody else sees it
    mask = ctypes.c_uint64(1 << (signal.SIGSEGV - 1))
    assert libc.ptrace(setsigmask, tid, ctypes.c_void_p(8), ctypes.byref(mask)) == 0


def test_a_worker_stuck_in_a_crash_handler_is_a_crash_at_once(ocloc, ptss_spirv, marker):
    """Its watch ends it, and the caller says compiler_crash with its log: no one-shot
    re-run of the input (which could hang in the same handler until the deadline)."""
    result: dict = {}

    def run():
        try:
            result["ok"] = xpu_zebin.compile(
                ptss_spirv,
                device="pvc",
                ocloc=ocloc,
                build_flags="-cl-intel-256-GRF-per-thread",
                cache=False,
                speculative=False,
            )
        except Exception as e:
            result["error"] = e

    thread = threading.Thread(target=run)
    thread.start()
    victim = first_compiling(lambda: _workers(marker))
    assert victim is not None, "no worker started compiling"
    _stop_in_crash_handler_state(victim)
    started = time.monotonic()
    one_shots = set()
    while thread.is_alive() and time.monotonic() < started + 300:
        one_shots |= {pid for pid, cmd in marker.processes() if "_worker" not in cmd}
        time.sleep(0.05)
    thread.join(1)
    err = result.get("error")
    assert isinstance(err, xpu_zebin.CompilerCrashError), result
    assert "crash handler" in err.message and "crash handler" in err.log, err
    assert one_shots == set(), "the input was compiled again one-shot"
    assert time.monotonic() - started < 60
