"""Upstream's rules of today (#8147 and what came with it), on the real compilers and driver.

The spill gate is bytes per hardware thread: rebuild in large GRF from 1024 bytes on a
rolling driver and on the JIT path (driver.c has no LTS input), on any spill for make_zebin
on an LTS driver. Band kernels, generated here and measured on the compiler that runs,
sit where upstream's rules have disagreed: below 1024 bytes (kept on rolling), and from
1024 to 2175 bytes at SIMD32 (#7959 kept them, #8147 rebuilds).

The backend of upstream main's shape below is a stand-in for a Triton this machine cannot
install (only triton-xpu 3.3 installs here), written from upstream's sources: its
``accepts_default_grf``, ``REBUILD_SPILL_BYTES_PER_THREAD``, ``XPUOptions.is_lts``,
``properties['is_lts']``, static ``is_lts(ver)`` and ``add_stages(self, stages, options,
language)``. Every compile below runs the real ocloc or the real Level Zero driver."""

from __future__ import annotations

import json
import logging
import struct
import subprocess
import sys
import types
from types import SimpleNamespace
from typing import Dict, Tuple

import pytest
from triton.runtime.errors import OutOfResources

import xpu_zebin
import xpu_zebin.triton as xt
from xpu_zebin import build_options, samples
from xpu_zebin.triton import dropin, fallback
from xpu_zebin.triton.errors import triton_error

G256 = "-cl-intel-256-GRF-per-thread"

# upstream's own unit table for accepts_default_grf (#8147): (bytes, LTS, accepted)
UPSTREAM_GATE = [
    (0, False, True), (0, True, True), (64, False, True), (64, True, False),
    (960, False, True), (1024, False, False), (1408, False, False), (2048, False, False),
    (960, True, False), (2048, True, False),
]  # fmt: skip


# --- a backend of upstream main's shape (a stand-in written from its sources) ------------


def _is_lts(ver) -> bool:
    """driver.py's is_lts (main since 2026-08): unknown or below 1.6.35096.9 is LTS."""
    if not ver:
        return True
    parts = [int(p) for p in str(ver).replace("+", ".").split(".") if p.isdigit()]
    return tuple(parts) < (1, 6, 35096, 9)


def main_shaped_module(name: str = "stand_in_intel_compiler") -> types.ModuleType:
    module = types.ModuleType(name)
    module.REBUILD_SPILL_BYTES_PER_THREAD = 1024

    def accepts_default_grf(spill_size: int, is_lts: bool) -> bool:
        if is_lts:
            return spill_size <= 0
        return spill_size < module.REBUILD_SPILL_BYTES_PER_THREAD

    accepts_default_grf.__module__ = name
    module.accepts_default_grf = accepts_default_grf

    class XPUBackend:
        device_arch = "pvc"

        def __init__(self, driver_version=None):
            self.properties = {"driver_version": driver_version,
                               "is_lts": _is_lts(driver_version)}  # fmt: skip

        @staticmethod
        def is_lts(ver) -> bool:
            return _is_lts(ver)

        def parse_options(self, opts: dict):
            return SimpleNamespace(is_lts=self.properties["is_lts"], **opts)

        def make_zebin(self, src, metadata, options):  # replaced by the drop-in
            raise AssertionError("upstream's own make_zebin ran: the drop-in is not installed")

        def add_stages(self, stages, options, language):
            stages["spv"] = lambda src, metadata: src
            if options.generate_native_code:
                stages["zebin"] = lambda src, metadata: self.make_zebin(src, metadata, options)

    XPUBackend.__module__ = name
    module.XPUBackend = XPUBackend
    sys.modules[name] = module
    return module


@pytest.fixture
def main_backend(monkeypatch):
    module = main_shaped_module()
    monkeypatch.setitem(sys.modules, module.__name__, module)
    yield module
    for cls, original in list(dropin._installed_backend):
        if cls is module.XPUBackend:
            cls.add_stages = original
            dropin._installed_backend.remove((cls, original))


def run_zebin_stage(backend_cls, driver_version, spirv: bytes, **opts) -> Tuple[bytes, dict]:
    """Triton's zebin stage of the stand-in, with the drop-in installed: (zebin, metadata)."""
    xt.install_backend(backend_cls)
    backend = backend_cls(driver_version)
    options = backend.parse_options(
        dict(generate_native_code=True, grf_mode="default", num_warps=4, **opts)
    )
    stages: Dict = {}
    backend.add_stages(stages, options, "triton")
    metadata = {"build_flags": ""}  # no "name": upstream's make_zebin never reads it
    return stages["zebin"](spirv, metadata), metadata


# --- band kernels, measured on the compiler that runs ---------------------------------


def _spills(spirv: bytes, ocloc: str) -> int:
    r = xpu_zebin.compile(spirv, device="pvc", ocloc=ocloc, cache=False,
                          build_flags="-cl-intel-128-GRF-per-thread")  # fmt: skip
    return r.spill_size


def _jit_spills(spirv: bytes) -> int:
    flags = "-cl-intel-128-GRF-per-thread"
    with xpu_zebin.compile_and_load(spirv, "band", build_flags=flags, cache=False) as k:
        assert k.simd_size == 32
        return k.spill_bytes


@pytest.fixture(scope="module")
def band(system_ocloc, modern_ocloc) -> dict:
    """SPIR-V of band kernels in each window, found by measuring: ``below`` spills 1 to
    1023 bytes and ``above`` 1024 to 2175 bytes (at most 16 slots per lane at SIMD32: #7959
    kept it) with the modern ocloc; ``jit_below`` spills 1 to 1023 and ``jit_above`` 1024 to
    2175 through the simulated PVC's driver. Fails when the generator no longer reaches a
    window on this compiler (then move samples.band_kernel's numbers)."""
    windows = {"below": (1, 1023), "above": (1024, 2175)}
    found: dict = {}
    for extra in range(4, 16):
        spirv = xpu_zebin.opencl_to_spirv(samples.band_kernel(extra), device="pvc",
                                          ocloc=system_ocloc)  # fmt: skip
        offline = _spills(spirv, modern_ocloc)
        jit = _jit_spills(spirv)
        for name, (low, high) in windows.items():
            if low <= offline <= high:
                found.setdefault(name, (spirv, offline))
            if low <= jit <= high:
                found.setdefault(f"jit_{name}", (spirv, jit))
        if len(found) == 2 * len(windows):
            break  # each window has its first kernel: the rest would change nothing
    missing = {"below", "above", "jit_below", "jit_above"} - set(found)
    assert not missing, f"no band kernel spills in the {missing} window on this compiler"
    for spirv, _ in found.values():  # and large GRF removes the spill (the rebuild helps)
        assert xpu_zebin.compile(spirv, device="pvc", ocloc=modern_ocloc, cache=False,
                                 build_flags=G256).spill_size == 0  # fmt: skip
    return found


# --- the gate ---------------------------------------------------------------------------


@pytest.mark.parametrize("spill, lts, accepted", UPSTREAM_GATE)
def test_table_gate_is_upstreams_unit_table(spill, lts, accepted):
    """The package's own table at upstream's current line answers upstream's unit table,
    whatever the SIMD width (0: unknown)."""
    path = "make_zebin" if lts else "make_zebin-rolling"
    rule = xpu_zebin._core.spill_rules(f"upstream:{path}")["offline"]["name"]
    assert rule == ("any" if lts else "min-bytes:1024")
    threshold = 1 if lts else 1024
    assert (spill == 0 or spill < threshold) is accepted


@pytest.mark.parametrize("spill, lts, accepted", UPSTREAM_GATE)
def test_the_installed_backends_gate_is_asked(main_backend, spill, lts, accepted):
    gate = build_options.installed_gate(main_backend.XPUBackend)
    assert gate is main_backend.accepts_default_grf
    rule = build_options.rule_from_gate(gate, lts)
    assert rule == ("any" if lts else "min-bytes:1024")
    rebuilds = spill > 0 and (rule == "any" or spill >= 1024)
    assert rebuilds is (not gate(spill, lts)) is (not accepted)


def test_a_moved_gate_reaches_users_without_a_release(main_backend, monkeypatch):
    """Upstream moves its constant: the drop-ins follow the installed backend at once."""
    monkeypatch.setattr(main_backend, "REBUILD_SPILL_BYTES_PER_THREAD", 2048)
    policy, source = build_options.rule_in_force(xt.LOAD_BINARY_RULE, main_backend.XPUBackend)
    assert policy == "min-bytes:2048" and "accepts_default_grf" in source
    # A gate that is no threshold is not guessed at: the table answers, with one warning.
    monkeypatch.setattr(main_backend, "accepts_default_grf", lambda s, lts: s % 2 == 0)
    policy, source = build_options.rule_in_force(xt.LOAD_BINARY_RULE, main_backend.XPUBackend)
    assert policy == "upstream:load_binary" and source.startswith("table")
    # An older line by name, and a fixed rule, stay the user's choice.
    monkeypatch.setenv("XPU_ZEBIN_SPILL_POLICY", "upstream@7959")
    assert build_options.spill_policy(xt.MAKE_ZEBIN_RULE) == "upstream@7959:make_zebin"
    monkeypatch.setenv("XPU_ZEBIN_SPILL_POLICY", "slots:16")
    assert build_options.spill_policy(xt.MAKE_ZEBIN_RULE) is None


@pytest.mark.parametrize("answer", [
    lambda s, lts: "False", lambda s, lts: None, lambda s, lts: 1 / 0,
    lambda s, lts: s % 2 == 0, lambda s, lts: s == 0 or s > 10**9,
])  # fmt: skip
def test_a_gate_that_is_no_threshold_leaves_the_table(main_backend, monkeypatch, answer):
    """Non-bool answers, a raising gate, a non-monotonic one: the table's #8147 answers;
    a gate of a user's subclass of upstream's backend is still upstream's."""
    monkeypatch.setattr(main_backend, "accepts_default_grf", answer)
    assert build_options.rule_in_force(xt.MAKE_ZEBIN_ROLLING_RULE, main_backend.XPUBackend) == (
        "upstream:make_zebin-rolling", "table (upstream line #8147)")  # fmt: skip


def test_a_subclass_keeps_upstreams_gate(main_backend):
    class Mine(main_backend.XPUBackend):
        pass

    policy, source = build_options.rule_in_force(xt.MAKE_ZEBIN_ROLLING_RULE, Mine)
    assert policy == "min-bytes:1024" and main_backend.__name__ in source


def test_a_bad_line_names_the_variable(monkeypatch):
    monkeypatch.setenv("XPU_ZEBIN_SPILL_POLICY", "upstream@7595")
    with pytest.raises(xpu_zebin.BuildError) as e:
        build_options.spill_policy(xt.LOAD_BINARY_RULE)
    assert "XPU_ZEBIN_SPILL_POLICY" in str(e.value) and "upstream@7595" in str(e.value)
    out = subprocess.run([sys.executable, "-m", "xpu_zebin.cli", "doctor"],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0 and "XPU_ZEBIN_SPILL_POLICY" in out.stdout, out


def test_triton_33_has_no_gate_so_the_table_answers():
    """triton-xpu 3.3 (installed here) exports no gate: the table's #8147 answers."""
    assert build_options.installed_gate() is None
    assert build_options.rule_in_force(xt.LOAD_BINARY_RULE) == (
        "upstream:load_binary", "table (upstream line #8147)")  # fmt: skip


@pytest.mark.parametrize(
    "policy, jit, offline",
    [(None, "min-bytes:1024", "any"), ("upstream@3.3", "bytes:1000", "any"),
     ("upstream@7959", "slots:16", "slots:16"), ("upstream@8115", "slots:16", "any"),
     ("upstream@#7615:make_zebin-rolling", "any", "any")],
)  # fmt: skip
def test_every_upstream_line_is_selectable(policy, jit, offline):
    rules = xpu_zebin._core.spill_rules(policy)
    assert (rules["jit"]["name"], rules["offline"]["name"]) == (jit, offline)
    assert [line["id"] for line in rules["lines"]] == ["3.3", "7615", "7959", "8115", "8147"]


# --- LTS, per kernel ----------------------------------------------------------------------


def test_lts_is_the_kernels_own_answer(main_backend):
    backend = main_backend.XPUBackend("1.6.35096.9")
    assert build_options.lts_answer(backend) == (False, "properties['is_lts']")
    assert build_options.lts_answer(backend, SimpleNamespace(is_lts=True)) == (
        True, "XPUOptions.is_lts")  # fmt: skip
    del backend.properties["is_lts"]
    assert build_options.lts_answer(backend) == (False, "is_lts('1.6.35096.9')")
    assert build_options.lts_answer(main_backend.XPUBackend("1.3.29735.27"))[0] is True
    assert build_options.lts_answer(main_backend.XPUBackend(None))[0] is True
    # triton-xpu 3.3's backend has no answer at all: LTS, as upstream assumes.
    assert build_options.lts_answer(object()) == (
        True, "unknown driver: LTS, as upstream assumes")  # fmt: skip


# --- both drop-ins on the band kernels --------------------------------------------------


def test_make_zebin_on_band_kernels(band, main_backend, modern_ocloc, monkeypatch):
    """Through the stand-in's zebin stage (the drop-in installed, no name in the metadata):
    rolling keeps a spill below 1024 bytes and rebuilds from 1024 (#7959 kept it: at most
    16 slots per lane); LTS rebuilds on any spill."""
    monkeypatch.setenv("XPU_ZEBIN_OCLOC", modern_ocloc)
    cls = main_backend.XPUBackend
    below, above = band["below"][0], band["above"][0]
    rolling, lts = "1.6.35096.9", "1.3.29735.27"
    _, meta = run_zebin_stage(cls, rolling, below)
    assert meta["build_flags"] == ""
    _, meta = run_zebin_stage(cls, rolling, above)
    assert meta["build_flags"] == G256
    assert band["above"][1] // (4 * 32) <= 16, "#7959 would have kept this kernel"
    zebin, meta = run_zebin_stage(cls, lts, below)
    assert meta["build_flags"] == G256
    assert xpu_zebin.zebin_info(zebin)["kernels"][0]["grf_count"] == 256


def test_make_zebin_on_band_kernels_with_triton_33(band, modern_ocloc, monkeypatch):
    """The drop-in as triton-xpu 3.3 calls it (no gate installed): the table's #8147."""
    monkeypatch.setenv("XPU_ZEBIN_OCLOC", modern_ocloc)
    opts = SimpleNamespace(grf_mode="default", num_warps=4)
    for kernel, lts, chosen in [("below", False, ""), ("above", False, G256),
                                ("below", True, G256)]:  # fmt: skip
        meta = {"build_flags": ""}
        xt.make_zebin(band[kernel][0], meta, opts, "pvc", lts=lts)
        assert meta["build_flags"] == chosen, (kernel, lts)


def test_compile_follows_upstream_on_band_kernels(band, modern_ocloc):
    """``compile`` knows no driver: make_zebin's LTS rule (any spill); the rolling rule by
    name keeps what spills below 1024 bytes."""
    below, above = band["below"][0], band["above"][0]
    r = xpu_zebin.compile(below, device="pvc", ocloc=modern_ocloc, cache=False)
    assert r.build_flags == G256 and [a.build_flags for a in r.attempts] == ["", G256]
    rolling = "upstream:make_zebin-rolling"
    r = xpu_zebin.compile(below, device="pvc", ocloc=modern_ocloc, spill_policy=rolling)
    assert r.build_flags == "" and 0 < r.spill_size < 1024
    r = xpu_zebin.compile(above, device="pvc", ocloc=modern_ocloc, spill_policy=rolling)
    assert r.build_flags == G256
    old = xpu_zebin.compile(above, device="pvc", ocloc=modern_ocloc, spill_policy="upstream@7959")
    assert old.build_flags == "", "the band #7959 kept"


def test_load_binary_on_band_kernels(band):
    """The JIT path gates on bytes on every driver: from 1024 bytes it rebuilds (#7959 kept
    these: at most 16 slots per lane at SIMD32); below, it keeps the default build."""
    spirv, spilled = band["jit_above"]
    module, _, n_regs, n_spills, _ = xt.load_binary("band", spirv, 0, "", True, 0)
    with module:
        assert [a.build_flags for a in module.attempts] == ["", G256]
        assert n_regs == 256 and module.build_flags == G256
        assert n_spills == module.spill_bytes // (4 * module.simd_size)
    assert spilled // (4 * 32) <= 16
    spirv, spilled = band["jit_below"]
    module, _, n_regs, n_spills, _ = xt.load_binary("band", spirv, 0, "", True, 0)
    with module:
        assert [a.build_flags for a in module.attempts] == [""]
        assert n_regs == 128 and n_spills == spilled // 128


# --- the kernel's own GRF mode (SPV_INTEL_maximum_registers) ------------------------------


def _words(data: bytes) -> list:
    return list(struct.unpack(f"<{len(data) // 4}I", data))


def _string(text: str) -> list:
    raw = text.encode() + b"\0"
    return _words(raw + b"\0" * (-len(raw) % 4))


def with_max_registers(spirv: bytes, kernel: str, *modes) -> bytes:
    """``spirv`` with ``kernel`` asking for its GRF mode itself, as upstream off LTS writes
    it: capability RegisterLimitsINTEL, the extension, and each of ``modes`` as an execution
    mode: a number (MaximumRegistersINTEL N), "auto" (NamedMaximumRegistersINTEL AutoINTEL)
    or ("id", N) (MaximumRegistersIdINTEL naming a new 32-bit constant N)."""
    words = _words(spirv)
    out, at, bound = words[:5], 5, words[3]
    instructions = []
    while at < len(words):
        count = words[at] >> 16
        instructions.append(words[at : at + count])
        at += count
    entries = [i for i, ins in enumerate(instructions) if ins[0] & 0xFFFF == 15]
    function = next(
        ins[2] for ins in (instructions[i] for i in entries)
        if struct.pack(f"<{len(ins) - 3}I", *ins[3:]).split(b"\0")[0].decode() == kernel
    )  # fmt: skip
    int32 = next(ins[1] for ins in instructions  # OpTypeInt 32 (any signedness)
                 if ins[0] & 0xFFFF == 21 and ins[2] == 32)  # fmt: skip
    constants, added = [], False
    for i, ins in enumerate(instructions):
        if not added and ins[0] & 0xFFFF != 17:  # after the OpCapability instructions
            extension = _string("SPV_INTEL_maximum_registers")
            out += [(2 << 16) | 17, 6460, ((1 + len(extension)) << 16) | 10, *extension]
            added = True
        if ins[0] & 0xFFFF == 54 and constants:  # the first OpFunction: constants before it
            out += constants
            constants = []
        out += ins
        if i == entries[-1]:
            for mode in modes:
                if mode == "auto":
                    out += [(4 << 16) | 16, function, 6463, 0]
                elif isinstance(mode, tuple):
                    out += [(4 << 16) | 331, function, 6462, bound]  # OpExecutionModeId
                    constants += [(4 << 16) | 43, int32, bound, mode[1]]  # OpConstant
                    bound += 1
                else:
                    out += [(4 << 16) | 16, function, 6461, mode]
    out[3] = bound
    return struct.pack(f"<{len(out)}I", *out)


@pytest.fixture(scope="module")
def spilling(system_ocloc) -> bytes:
    source = samples.register_pressure_kernel(300, name="spill")
    return xpu_zebin.opencl_to_spirv(source, device="pvc", ocloc=system_ocloc)


def test_a_mode_by_constant_is_read(spilling, system_ocloc):
    """MaximumRegistersIdINTEL (the mode in a constant) is explicit too: IGC 1.x does not
    know OpExecutionModeId and fails the build, and that failure is not retried in large
    GRF (a kernel without a mode would be)."""
    spirv = with_max_registers(spilling, "spill", ("id", 256))
    with pytest.raises(xpu_zebin.BuildError) as e:
        xpu_zebin.compile(spirv, device="pvc", ocloc=system_ocloc, cache=False)
    assert e.value.kind == "build_failure" and "opcode: 331" in str(e.value)
    assert [a.build_flags for a in e.value.attempts] == [""]


@pytest.mark.parametrize("mode", [256, 128, "auto"])
def test_kernels_own_grf_mode_is_explicit(spilling, system_ocloc, mode):
    """A kernel that carries its GRF mode is never retried, on either path, and no GRF flag
    is added (upstream's test_explicit_grf_mode_uses_maximum_registers, off LTS). n_regs is
    what the compiler built (measured: IGC 1.x accepts the mode and builds 128 GRF)."""
    spirv = with_max_registers(spilling, "spill", mode)
    assert xpu_zebin.validate_spirv(spirv) == ["spill"]
    r = xpu_zebin.compile(spirv, device="pvc", ocloc=system_ocloc, cache=False)
    assert [a.build_flags for a in r.attempts] == [""] and r.spill_size > 0
    built = xpu_zebin.zebin_info(r.binary)["kernels"][0]["grf_count"]
    assert (r.build_flags, r.n_regs) == ("", built)
    module, _, got, _, _ = xt.load_binary("spill", spirv, 0, "", True, 0)
    with module:
        assert [a.build_flags for a in module.attempts] == [""]
        built = xpu_zebin.zebin_info(module.native_binary)["kernels"][0]["grf_count"]
        assert (module.build_flags, got) == ("", built)
    # The same kernel without the mode is retried: the mode is what stops it.
    plain = xpu_zebin.compile(spilling, device="pvc", ocloc=system_ocloc, cache=False)
    assert [a.build_flags for a in plain.attempts] == ["", G256]


@pytest.mark.parametrize("modes, said", [
    ((256, 128), "asks for two GRF modes"), ((("id", 256), 512), "asks for two GRF modes"),
])  # fmt: skip
def test_conflicting_grf_modes_are_invalid(spilling, modes, said):
    with pytest.raises(xpu_zebin.BuildError) as e:
        xpu_zebin.validate_spirv(with_max_registers(spilling, "spill", *modes))
    assert e.value.kind == "invalid_spirv" and said in str(e.value)
    # The same mode twice is one request.
    assert xpu_zebin.validate_spirv(with_max_registers(spilling, "spill", 256, 256)) == ["spill"]


def test_many_modes_on_one_constant_stay_bounded(spilling):
    """Thousands of MaximumRegistersIdINTEL modes naming one constant, and that constant
    defined again and again: a result id defined twice is invalid, and the modes' table
    is one entry per named constant (a hostile module cannot grow it quadratically)."""
    words = _words(with_max_registers(spilling, "spill", ("id", 256)))
    at = next(i for i in range(5, len(words)) if words[i] & 0xFFFF == 331)
    mode = words[at : at + 4]
    const_at = next(i for i in range(5, len(words)) if words[i] & 0xFFFF == 43
                    and words[i + 2] == mode[3])  # fmt: skip
    constant = words[const_at : const_at + 4]
    many = words[:at] + mode * 4000 + words[at:const_at] + constant * 4000 + words[const_at:]
    with pytest.raises(xpu_zebin.BuildError) as e:
        xpu_zebin.validate_spirv(struct.pack(f"<{len(many)}I", *many))
    assert "a second time" in str(e.value)
    once = words[:at] + mode * 4000 + words[at:]
    assert xpu_zebin.validate_spirv(struct.pack(f"<{len(once)}I", *once)) == ["spill"]


def test_modern_ocloc_refuses_the_extension_with_its_reason(spilling, modern_ocloc):
    """Measured: IGC 2.x's ocloc disables SPV_INTEL_maximum_registers by default: the
    compiler's own answer, classified, with its log (upstream's make_zebin fails too)."""
    spirv = with_max_registers(spilling, "spill", 256)
    with pytest.raises(xpu_zebin.BuildError) as e:
        xpu_zebin.compile(spirv, device="pvc", ocloc=modern_ocloc, cache=False)
    assert e.value.kind == "invalid_spirv" and "SPV_INTEL_maximum_registers" in str(e.value)
    assert [a.build_flags for a in e.value.attempts] == [""]


# --- make_zebin details -------------------------------------------------------------------


@pytest.mark.slow
def test_make_zebin_without_a_name_on_every_path(ptss_spirv, add_spirv, modern_ocloc, system_ocloc,
                                                 monkeypatch):  # fmt: skip
    """upstream's make_zebin never reads metadata["name"]: the recovered (PTSS, then 256)
    path, a plain build trial-loaded on this host, and a farm build all work without it."""
    opts = SimpleNamespace(grf_mode="default", num_warps=4)
    monkeypatch.setenv("XPU_ZEBIN_OCLOC", modern_ocloc)
    meta = {"build_flags": ""}
    zebin = xt.make_zebin(ptss_spirv, meta, opts, "pvc")
    assert meta["build_flags"] == G256 and zebin[:4] == b"\x7fELF"
    monkeypatch.setenv("XPU_ZEBIN_OCLOC", system_ocloc)
    meta = {"build_flags": ""}  # the simulated PVC: trial-loaded here
    assert xt.make_zebin(add_spirv, meta, opts, "pvc")[:4] == b"\x7fELF"
    with dropin.building_for("pvc", system_ocloc):
        meta = {"build_flags": ""}
        assert xt.make_zebin(add_spirv, meta, opts)[:4] == b"\x7fELF"


def test_ptss_without_numbers_is_out_of_resources():
    """upstream raises OutOfResources(0, 0, ...) whenever a PTSS marker matches (#7285)."""
    e = xpu_zebin.ScratchOverflowError("scratch_overflow: per-thread scratch space (PTSS)")
    e.required = e.limit = None
    converted = triton_error(e)
    assert isinstance(converted, OutOfResources)
    assert (converted.required, converted.limit) == (0, 0)


def test_kept_default_build_warns_once(spilling, modern_ocloc, caplog, monkeypatch):
    """A spilling default build whose rebuild fails is kept (upstream's make_zebin raises the
    rebuild's error): one warning per process says so. Made here with a large rung IGC 2.x
    refuses on PVC (512 GRF: "explicit 512 on pvc" in test_conformance), so the default
    build stands."""
    monkeypatch.setattr(fallback, "_said_once", set())
    opts = SimpleNamespace(grf_mode="default", num_warps=4)
    with caplog.at_level(logging.WARNING, logger="xpu_zebin.triton"):
        for _ in range(2):
            meta = {"build_flags": "", "max_grf_mode": "512"}
            with dropin.building_for("pvc", modern_ocloc):
                zebin = xt.make_zebin(spilling, meta, opts)
            assert meta["build_flags"] == ""
            assert xpu_zebin.zebin_info(zebin)["kernels"][0]["spill_size"] > 0
    said = [r for r in caplog.records if "large-GRF rebuild failed" in r.getMessage()]
    assert len(said) == 1, caplog.text


def test_shader_dump_goes_to_the_cache_dir(add_spirv, system_ocloc, tmp_path, monkeypatch):
    """knobs.intel.dump_shader_info (TRITON_INTEL_ENABLE_IGC_SHADER_DUMP): IGC dumps into
    metadata["cache_dir"]; the dump option never reaches the kernel's build flags."""
    dumps = tmp_path / "triton-cache"
    dumps.mkdir()
    monkeypatch.setenv(dropin.SHADER_DUMP_ENV, "1")
    opts = SimpleNamespace(grf_mode="default", num_warps=4)
    meta = {"build_flags": "", "cache_dir": str(dumps)}
    with dropin.building_for("pvc", system_ocloc):
        xt.make_zebin(add_spirv, meta, opts)
    assert meta["build_flags"] == ""
    assert any(dumps.rglob("*")), "IGC wrote no dump"
    monkeypatch.delenv(dropin.SHADER_DUMP_ENV)
    quiet = tmp_path / "quiet"
    quiet.mkdir()
    with dropin.building_for("pvc", system_ocloc):
        xt.make_zebin(add_spirv, {"build_flags": "", "cache_dir": str(quiet)}, opts)
    assert not any(quiet.rglob("*"))


def test_native_stage_reports_to_upstreams_tracking(add_spirv, system_ocloc, monkeypatch):
    """Upstream's track.py (TRITON_TRACK_DUMP) sees the native stage: name, time, size.
    triton-xpu 3.3 has no track.py: a stand-in with its interface (track(name) -> a context
    manager with item assignment) stands in for upstream main's."""
    seen = []

    class Tracked(dict):
        def __init__(self, name):
            super().__init__(name=name)

        def __enter__(self):
            seen.append(self)
            return self

        def __exit__(self, *exc):
            self["time"] = 0.0

    track = types.ModuleType("triton.backends.intel.track")
    track.track = Tracked
    monkeypatch.setitem(sys.modules, "triton.backends.intel.track", track)
    opts = SimpleNamespace(grf_mode="default", num_warps=4)
    with dropin.building_for("pvc", system_ocloc):
        zebin = xt.make_zebin(add_spirv, {"build_flags": ""}, opts)
    names = [t["name"] for t in seen]
    assert names == ["make_zebin", "generate_native_code"]
    assert seen[1]["size"] == len(zebin) and "time" in seen[0]


def test_doctor_shows_the_rule_in_force(monkeypatch):
    env = {"XPU_ZEBIN_SPILL_POLICY": ""}
    out = subprocess.run([sys.executable, "-m", "xpu_zebin.cli", "doctor", "--json"],
                         capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, **env})  # fmt: skip
    assert out.returncode == 0, out.stderr
    rules = json.loads(out.stdout)["spill_rules"]
    assert rules["load_binary"]["rule"] == "min-bytes:1024"
    assert rules["load_binary"]["source"] == "table (upstream line #8147)"
    assert rules["lts"]["answer"] is True  # triton-xpu 3.3 cannot tell
    assert rules["make_zebin"]["rule"] == "any"
    text = subprocess.run([sys.executable, "-m", "xpu_zebin.cli", "doctor"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert "load_binary: rebuild in large GRF on at least 1024 bytes" in text.stdout
