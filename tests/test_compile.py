"""The offline engine against the real compilers: GRF policy, classification, bad input."""

from __future__ import annotations

import os
import re
import signal
import struct
import subprocess
import sys
import time

import pytest

import xpu_zebin

GRF128 = "-cl-intel-128-GRF-per-thread"
GRF256 = "-cl-intel-256-GRF-per-thread"
RECOVERY_LINE = '(I): Build failure recovered by retrying with large GRF mode for "pressure"'


@pytest.mark.slow
@pytest.mark.parametrize("speculative", [False, True], ids=["sequential", "speculative"])
def test_ptss_overflow_recovered_with_large_grf(modern_ocloc, ptss_spirv, capsys, speculative):
    """The fixture sits in the window: it overflows PTSS at default GRF and builds at 256."""
    result = xpu_zebin.compile(
        ptss_spirv, device="pvc", ocloc=modern_ocloc, cache=False, speculative=speculative
    )
    first, second = result.attempts
    assert not first.ok and first.build_flags == ""
    assert first.error.kind == "scratch_overflow", first.error
    assert first.error.required > first.error.limit == 262144
    assert second.ok and second.build_flags == GRF256
    assert result.recovered and result.build_flags == GRF256 and result.n_regs == 256
    assert xpu_zebin.zebin_info(result.binary)["kernels"][0]["grf_count"] == 256
    assert RECOVERY_LINE in capsys.readouterr().err


@pytest.mark.slow
def test_ptss_overflow_with_explicit_grf_raises_required_and_limit(modern_ocloc, ptss_spirv):
    with pytest.raises(xpu_zebin.ScratchOverflowError) as e:
        xpu_zebin.compile(
            ptss_spirv, device="pvc", build_flags=GRF128, ocloc=modern_ocloc, cache=False
        )
    err = e.value
    assert err.kind == "scratch_overflow"
    assert err.limit == 262144 and err.required > err.limit
    assert "max permitted PTSS" in err.log
    assert len(err.attempts) == 1 and err.attempts[0].build_flags == GRF128


@pytest.mark.parametrize("speculative", [False, True], ids=["sequential", "speculative"])
def test_spilling_kernel_retried_into_large_grf(ocloc, spill_spirv, speculative):
    result = xpu_zebin.compile(
        spill_spirv, device="pvc", ocloc=ocloc, cache=False, speculative=speculative
    )
    first, second = result.attempts
    assert first.ok and first.spill_size > 0
    assert second.ok and second.build_flags == GRF256
    assert result.build_flags == GRF256 and result.n_regs == 256
    assert (
        result.spill_size == second.spill_size <= first.spill_size
    )  # IGC 1.x: scratch, rounded up
    assert not result.recovered  # nothing failed; the retry was for spills


def test_spill_policy_never_accepts_default_build(ocloc, spill_spirv):
    result = xpu_zebin.compile(
        spill_spirv, device="pvc", ocloc=ocloc, cache=False, spill_policy="never"
    )
    assert [a.build_flags for a in result.attempts] == [""]
    assert result.n_regs == 128 and result.spill_size > 0


def test_clean_kernel_not_retried(ocloc, add_spirv):
    result = xpu_zebin.compile(add_spirv, device="pvc", ocloc=ocloc, cache=False, speculative=False)
    assert len(result.attempts) == 1 and result.build_flags == ""


def test_speculative_large_grf_build_is_cancelled_when_default_wins(ocloc, add_spirv):
    result = xpu_zebin.compile(add_spirv, device="pvc", ocloc=ocloc, cache=False, speculative=True)
    assert [a.build_flags for a in result.attempts] == [""]
    assert any("speculative large-GRF build cancelled" in n for n in result.notes)


@pytest.mark.parametrize(
    "build_flags, grf_mode, expected",
    [
        (GRF128, "default", GRF128),  # explicit 128: kept, even though it spills
        (GRF256, "default", GRF256),  # explicit 256: kept
        ("", "256", GRF256),  # Triton's grf_mode='256'
        ("", "auto", "-cl-intel-enable-auto-large-GRF-mode"),
    ],
)
def test_explicit_grf_is_respected(system_ocloc, spill_spirv, build_flags, grf_mode, expected):
    result = xpu_zebin.compile(
        spill_spirv,
        device="pvc",
        build_flags=build_flags,
        grf_mode=grf_mode,
        ocloc=system_ocloc,
        cache=False,
    )
    assert [a.build_flags for a in result.attempts] == [expected]
    assert result.build_flags == expected


def test_many_warps_never_retried(system_ocloc, spill_spirv):
    result = xpu_zebin.compile(
        spill_spirv, device="pvc", num_warps=64, ocloc=system_ocloc, cache=False
    )
    assert [a.build_flags for a in result.attempts] == [""]
    result = xpu_zebin.compile(
        spill_spirv, device="pvc", num_warps=32, ocloc=system_ocloc, cache=False
    )
    assert len(result.attempts) == 2


def test_large_grf_on_cri_is_512(modern_ocloc, spill_spirv):
    result = xpu_zebin.compile(spill_spirv, device="cri", ocloc=modern_ocloc, cache=False)
    assert [a.build_flags for a in result.attempts] == ["", "-cl-intel-512-GRF-per-thread"]


def _header(bound: int = 10) -> bytes:
    return struct.pack("<5I", 0x07230203, 0x00010000, 0, bound, 0)


@pytest.mark.parametrize(
    "name, make, message",
    [
        ("random bytes", lambda s: os.urandom(4096), "magic"),
        ("empty", lambda s: b"", "empty"),
        ("header only", lambda s: _header(), "header only"),
        ("truncated mid-instruction", lambda s: s[: len(s) // 2], "truncated"),
        ("odd length", lambda s: s[:-1], "32-bit words"),
        ("wrong magic", lambda s: b"\x00\x00\x00\x00" + s[4:], "magic"),
        ("big endian", lambda s: struct.pack(">I", 0x07230203) + s[4:], "big-endian"),
        ("bad version", lambda s: s[:4] + struct.pack("<I", 0x00090000) + s[8:], "version"),
    ],
)
def test_bad_spirv_is_rejected_before_the_compiler(ocloc, add_spirv, name, make, message):
    with pytest.raises(xpu_zebin.InvalidSpirvError, match=message) as e:
        xpu_zebin.compile(make(add_spirv), device="pvc", ocloc=ocloc, cache=False)
    assert e.value.kind == "invalid_spirv"
    assert e.value.attempts == []  # never reached ocloc


def _naming_an_undefined_id(spirv: bytes) -> bytes:
    """``spirv`` with one more id in its bound and an OpName of it at the end: the key's
    reading of the words (entry points, GRF modes) is whole, the module is not."""
    bound = struct.unpack_from("<I", spirv, 12)[0]
    header = spirv[:12] + struct.pack("<I", bound + 1) + spirv[16:20]
    return header + spirv[20:] + struct.pack("<3I", (3 << 16) | 5, bound, 0x78)  # OpName "x"


@pytest.mark.parametrize("cache", [True, False])
def test_a_module_whole_to_its_key_but_invalid_is_rejected_before_the_compiler(
    ocloc, add_spirv, tmp_path, cache
):
    """The cache key reads only entry points and GRF modes (a hit hands no byte to a
    compiler); a miss validates in full before ocloc sees a byte, and before a missing
    compiler is the answer."""
    bad = _naming_an_undefined_id(add_spirv)
    assert xpu_zebin.validate_spirv(add_spirv) == ["add"]
    # Invalid SPIR-V is the answer before a missing compiler or an unknown kernel is, as
    # when the whole module was validated before the lookup.
    for compiler, kernel in ((ocloc, None), (str(tmp_path / "no-ocloc"), None), (ocloc, "nope")):
        with pytest.raises(xpu_zebin.InvalidSpirvError, match="no instruction defines") as e:
            xpu_zebin.compile(bad, device="pvc", ocloc=compiler, cache=cache, kernel_name=kernel,
                              cache_dir=str(tmp_path / "cache"))  # fmt: skip
        assert e.value.attempts == []  # never reached ocloc
    assert xpu_zebin.compile(add_spirv, device="pvc", ocloc=ocloc, cache=cache,
                             cache_dir=str(tmp_path / "cache")).attempts  # fmt: skip


def test_unknown_kernel_lists_entry_points(ocloc, add_spirv):
    with pytest.raises(xpu_zebin.KernelNotFoundError, match=r"entry points: \[add\]"):
        xpu_zebin.compile(add_spirv, device="pvc", kernel_name="nope", ocloc=ocloc)


def test_unknown_device_is_classified(ocloc, add_spirv):
    with pytest.raises(xpu_zebin.UnsupportedDeviceError) as e:
        xpu_zebin.compile(add_spirv, device="no-such-gpu", ocloc=ocloc, cache=False)
    assert "no-such-gpu" in e.value.log
    assert len(e.value.attempts) == 1  # not worth a large-GRF retry


def test_bad_grf_mode_is_an_argument_error(system_ocloc, add_spirv):
    with pytest.raises(xpu_zebin.InvalidArgumentError, match="grf_mode"):
        xpu_zebin.compile(add_spirv, device="pvc", grf_mode="huge", ocloc=system_ocloc)


@pytest.mark.parametrize("persistent", ["0", "1"], ids=["one-shot", "worker"])
def test_timeout_kills_the_compiler(modern_ocloc, ptss_spirv, marker, monkeypatch, persistent):
    monkeypatch.setenv("XPU_ZEBIN_PERSISTENT", persistent)
    with pytest.raises(xpu_zebin.CompileTimeoutError) as e:
        xpu_zebin.compile(ptss_spirv, device="pvc", ocloc=modern_ocloc, timeout=1.0, cache=False)
    assert e.value.kind == "timeout"
    assert len(e.value.attempts) == 1  # a timeout is not retried
    assert marker.processes() == []  # ocloc, its process group, or the worker: all gone


# Ctrl-C's default handler first: a child inherits an ignored SIGINT from a test run started
# in the background (bash `cmd &`, nohup), and Python then leaves it ignored.
CTRL_C_SCRIPT = """
import signal
signal.signal(signal.SIGINT, signal.default_int_handler)
import sys, xpu_zebin
spirv = open(sys.argv[1], "rb").read()
print("compiling", flush=True)
xpu_zebin.compile(spirv, device="pvc", ocloc=sys.argv[2], cache=False)
"""


@pytest.mark.parametrize("persistent", ["0", "1"], ids=["one-shot", "worker"])
def test_ctrl_c_kills_the_compilers(
    modern_ocloc, ptss_spirv, tmp_path, marker, monkeypatch, persistent
):
    monkeypatch.setenv("XPU_ZEBIN_PERSISTENT", persistent)
    spv = tmp_path / "pressure.spv"
    spv.write_bytes(ptss_spirv)
    child = subprocess.Popen(
        [sys.executable, "-c", CTRL_C_SCRIPT, str(spv), modern_ocloc],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout.readline().strip() == "compiling"
    deadline = time.monotonic() + 60  # wait for the compilers (a build takes seconds)
    while not marker.processes():
        assert child.poll() is None, child.communicate()
        assert time.monotonic() < deadline, "the child should have started compilers"
        time.sleep(0.05)
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=60)
    assert child.returncode != 0 and "KeyboardInterrupt" in err
    deadline = time.monotonic() + 10  # an idle worker sees its closed stdin at once
    while len(marker.processes()) > 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.processes() == []


@pytest.mark.slow
def test_pressure_sample_still_builds_on_old_igc(system_ocloc, ptss_spirv):
    """IGC 1.x has no PTSS check: the same kernel builds there, spilling. One build: a
    spilling build's retry is test_spilling_kernel_retried_into_large_grf's subject."""
    result = xpu_zebin.compile(
        ptss_spirv, device="pvc", ocloc=system_ocloc, cache=False, spill_policy="never"
    )
    assert len(result.attempts) == 1
    assert result.attempts[0].ok and result.attempts[0].spill_size > 0
    assert result.build_flags == "" and not result.recovered  # the spilling build kept


@pytest.mark.slow
def test_cli_json_attempts_carry_structured_errors(tmp_path, modern_ocloc, ptss_spirv):
    import json
    import sys

    spv = tmp_path / "pressure.spv"
    spv.write_bytes(ptss_spirv)
    run = subprocess.run(
        [sys.executable, "-m", "xpu_zebin", "compile", str(spv), "--device", "pvc",
         "--ocloc", modern_ocloc, "--json"],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout.strip().splitlines()[-1])
    first, second = report["attempts"]
    assert first["error"]["kind"] == "scratch_overflow"
    assert first["error"]["required"] > first["error"]["limit"] == 262144
    assert "PTSS" in first["error"]["message"]
    assert second["ok"] and second["error"] is None


def test_cli_compile_json_and_exit_codes(tmp_path, system_ocloc, add_spirv):
    import json
    import sys

    spv = tmp_path / "add.spv"
    spv.write_bytes(add_spirv)
    out = tmp_path / "add.zebin"
    cli = [sys.executable, "-m", "xpu_zebin"]
    ok = subprocess.run(
        [
            *cli,
            "compile",
            str(spv),
            "--device",
            "pvc",
            "--ocloc",
            system_ocloc,
            "--json",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stderr
    report = json.loads(ok.stdout.strip().splitlines()[-1])
    assert report["ok"] and report["kernel"] == "add" and report["n_regs"] == 128
    assert report["attempts"][0]["ok"] and out.read_bytes()[:4] == b"\x7fELF"
    info = subprocess.run([*cli, "info", str(out)], capture_output=True, text=True)
    assert info.returncode == 0 and "kernel add" in info.stdout

    bad = tmp_path / "bad.spv"
    bad.write_bytes(b"garbage!")
    fail = subprocess.run(
        [*cli, "compile", str(bad), "--device", "pvc", "--ocloc", system_ocloc, "--json"],
        capture_output=True,
        text=True,
    )
    assert fail.returncode == 1
    report = json.loads(fail.stdout.strip().splitlines()[-1])
    assert not report["ok"] and report["error"]["kind"] == "invalid_spirv"

    usage = subprocess.run(
        [*cli, "compile", str(tmp_path / "missing.spv"), "--device", "pvc"],
        capture_output=True,
        text=True,
    )
    assert usage.returncode == 2 and "cannot read" in usage.stderr
    usage = subprocess.run([*cli, "compile", str(spv)], capture_output=True, text=True)
    assert usage.returncode == 2  # --device is required


def test_cli_batch(tmp_path, system_ocloc, add_spirv, spill_spirv):
    import json

    files = []
    for name, data in (("add", add_spirv), ("spill", spill_spirv), ("bad", b"nope")):
        path = tmp_path / f"{name}.spv"
        path.write_bytes(data)
        files.append(str(path))
    out_dir = tmp_path / "out"
    cli = [sys.executable, "-m", "xpu_zebin", "batch", *files, "--device", "pvc"]
    run = subprocess.run(
        [*cli, "--ocloc", system_ocloc, "--jobs", "2", "--json", "--output-dir", str(out_dir)],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 1  # one input failed
    reports = [json.loads(line) for line in run.stdout.splitlines()]
    assert [r["ok"] for r in reports] == [True, True, False]
    assert reports[1]["build_flags"] == GRF256
    assert reports[2]["error"]["kind"] == "invalid_spirv"
    assert sorted(p.name for p in out_dir.iterdir()) == ["add.zebin", "spill.zebin"]
    one = [sys.executable, "-m", "xpu_zebin", "batch", files[0], "--device", "pvc"]
    text = subprocess.run([*one, "--ocloc", system_ocloc], capture_output=True, text=True)
    assert text.returncode == 0 and "1 built, 0 failed" in text.stdout


SIMD8_KERNEL = """__attribute__((intel_reqd_sub_group_size(8)))
__kernel void simd8(__global float* p) { p[get_global_id(0)] *= 2.0f; }
"""


def test_both_attempts_fail_raises_the_first_error(ocloc, system_ocloc):
    """SIMD8 is unsupported on PVC in every GRF mode: both builds fail, the first is raised."""
    spirv = xpu_zebin.opencl_to_spirv(SIMD8_KERNEL, device="pvc", ocloc=system_ocloc)
    with pytest.raises(xpu_zebin.BuildError) as e:
        xpu_zebin.compile(spirv, device="pvc", ocloc=ocloc, cache=False)
    err = e.value
    assert [(a.build_flags, a.ok) for a in err.attempts] == [("", False), (GRF256, False)]
    assert str(err.attempts[0].error) == f"{err.kind}: {err.message}"
    assert err.attempts[0].error.kind == err.kind
    assert "8" in err.log


def test_compiler_killed_by_a_signal_is_a_crash(modern_ocloc, ptss_spirv, marker, monkeypatch):
    """A real ocloc dying by SIGSEGV mid-build is classified as a crash, with its log."""
    import threading

    monkeypatch.setenv("XPU_ZEBIN_PERSISTENT", "0")
    caught: dict = {}

    def build():
        try:
            xpu_zebin.compile(ptss_spirv, device="pvc", ocloc=modern_ocloc, cache=False,
                              build_flags=GRF256)  # fmt: skip
        except xpu_zebin.BuildError as e:
            caught["error"] = e

    thread = threading.Thread(target=build)
    thread.start()
    deadline = time.monotonic() + 30
    while not marker.processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    for pid, _ in marker.processes():
        os.kill(pid, signal.SIGSEGV)
    thread.join(60)
    err = caught["error"]
    assert isinstance(err, xpu_zebin.CompilerCrashError), err
    # Named as the compiler died: by the SIGSEGV, or by the abort() of its own crash
    # handling (seen once in a CI run: "killed by SIGABRT (6)"), never as anything else.
    said = re.search(r"killed by (SIG\w+) \(\d+\)", err.message)
    assert said and said.group(1) in ("SIGSEGV", "SIGABRT"), err.message
    assert len(err.attempts) == 1


def test_legacy_binary_is_degenerate(system_ocloc, add_spirv, tmp_path):
    """Old ocloc without IGC_EnableZEBinary writes a patch-token binary, not a zebin."""
    spv = tmp_path / "add.spv"
    spv.write_bytes(add_spirv)
    env = {k: v for k, v in os.environ.items() if k != "IGC_EnableZEBinary"}
    subprocess.run(
        [system_ocloc, "compile", "-file", str(spv), "-spirv_input", "-device", "pvc",
         "-output", "legacy", "-out_dir", str(tmp_path), "-output_no_suffix", "-q"],
        check=True, env=env, capture_output=True,
    )  # fmt: skip
    legacy = next(p for p in tmp_path.iterdir() if p.name.startswith("legacy"))
    with pytest.raises(xpu_zebin.DegenerateBinaryError, match=r"\.text"):
        xpu_zebin.zebin_info(legacy.read_bytes())
